//! CPU use of a watched cgroup, as `Sensors::cpu_stats` returns it: from the scheduler programs'
//! map when they run, otherwise from the cgroup's own CPU files (the fallback), read when asked
//! (the agent's housekeeping asks every interval, so the fallback costs nothing in between).
//!
//! The two sources fill different fields. Only eBPF sees run-queue waits per cgroup (the kernel
//! keeps no per-cgroup wait histogram); only the files carry CFS throttling and CPU pressure.
//! A field the source cannot fill is `None`, never a made-up zero.

use std::io;

use qoslet_common::sched::{CpuStats, RUNQ_HIST_BUCKETS};

use crate::cgroup::{CgroupBeneath, value::flat_keyed};

/// Where a [`CpuUsage`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuSource {
    /// The `tp_btf/sched_*` programs' per-cgroup map.
    Ebpf,
    /// `cpu.stat` / `cpuacct.usage` / `cpu.pressure` of the cgroup (fallback).
    CgroupFiles,
}

/// Run-queue waits (wakeup or preemption to running) of one cgroup's tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunQueueWaits {
    pub count: u64,
    pub total_ns: u64,
    /// Bucket `i`: waits of `[2^i, 2^(i+1))` µs.
    pub hist: [u64; RUNQ_HIST_BUCKETS],
}

/// CFS bandwidth throttling (a cpu quota was hit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttling {
    pub periods: u64,
    pub total_ns: u64,
}

/// CPU use of one watched cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuUsage {
    pub source: CpuSource,
    /// CPU time its tasks used, in nanoseconds: on-CPU time between switches (eBPF), or
    /// `cpu.stat usage_usec` (v2, also the controller-less unified tree) / `cpuacct.usage` (v1).
    pub usage_ns: u64,
    /// eBPF only.
    pub runq: Option<RunQueueWaits>,
    /// Fallback only, and only where the cgroup has the cpu controller with its `cpu.stat`.
    pub throttled: Option<Throttling>,
    /// `cpu.pressure` `some` total in µs; fallback only, v2 (or unified tree) with PSI on.
    pub pressure_some_us: Option<u64>,
}

impl From<CpuStats> for CpuUsage {
    fn from(s: CpuStats) -> Self {
        Self {
            source: CpuSource::Ebpf,
            usage_ns: s.oncpu_ns,
            runq: Some(RunQueueWaits {
                count: s.runq_count,
                total_ns: s.runq_total_ns,
                hist: s.runq_hist,
            }),
            throttled: None,
            pressure_some_us: None,
        }
    }
}

/// Reads the fallback figures of a cgroup: `v2_dir` is its v2 (or unified-tree) directory,
/// `v1_cpu_dir` its v1 cpu,cpuacct directory on hybrid and v1 hosts. Usage comes from the v2
/// `cpu.stat` when there is one (it is kept on the default hierarchy with or without the cpu
/// controller), else from `cpuacct.usage`. `NotFound` means the cgroup is gone. The files are
/// opened beneath the node root.
pub(crate) fn read_cgroup_cpu(
    v2_dir: Option<&CgroupBeneath>,
    v1_cpu_dir: Option<&CgroupBeneath>,
) -> io::Result<CpuUsage> {
    let read = CgroupBeneath::read_file;
    let v2 = v2_dir.map(|d| read(d, "cpu.stat")).transpose()?;
    let v2 = v2.as_deref().map(parse_cpu_stat);
    let v1 = v1_cpu_dir
        .map(|d| -> io::Result<_> {
            let usage = read(d, "cpuacct.usage")
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            let stat = read(d, "cpu.stat").map(|t| parse_cpu_stat(&t));
            match (usage, stat) {
                (None, Err(e)) => Err(e),
                (usage, stat) => Ok((usage, stat.ok())),
            }
        })
        .transpose()?;
    let usage_ns = v2
        .and_then(|s| s.usage_usec.map(|u| u * 1000))
        .or(v1.and_then(|(u, _)| u))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no CPU usage counter"))?;
    // v2 reports throttling in µs, v1 in ns.
    let throttled = v2
        .and_then(|s| s.throttled(1000))
        .or(v1.and_then(|(_, s)| s.and_then(|s| s.throttled(1))));
    let pressure_some_us = v2_dir
        .and_then(|d| read(d, "cpu.pressure").ok())
        .and_then(|t| parse_pressure_some_total(&t));
    Ok(CpuUsage {
        source: CpuSource::CgroupFiles,
        usage_ns,
        runq: None,
        throttled,
        pressure_some_us,
    })
}

/// The keys of a `cpu.stat` that matter here (v2: `usage_usec`, `nr_throttled`,
/// `throttled_usec`; v1: `nr_throttled`, `throttled_time` in ns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CpuStat {
    usage_usec: Option<u64>,
    nr_throttled: Option<u64>,
    /// `throttled_usec` or `throttled_time`, in the file's own unit.
    throttled: Option<u64>,
}

impl CpuStat {
    fn throttled(&self, to_ns: u64) -> Option<Throttling> {
        Some(Throttling {
            periods: self.nr_throttled?,
            total_ns: self.throttled? * to_ns,
        })
    }
}

fn parse_cpu_stat(text: &str) -> CpuStat {
    let mut s = CpuStat::default();
    for (key, v) in flat_keyed(text) {
        match key {
            "usage_usec" => s.usage_usec = Some(v),
            "nr_throttled" => s.nr_throttled = Some(v),
            "throttled_usec" | "throttled_time" => s.throttled = Some(v),
            _ => {}
        }
    }
    s
}

/// `some avg10=0.00 avg60=0.00 avg300=0.00 total=123` -> 123.
fn parse_pressure_some_total(text: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_cpu_stat_with_and_without_the_cpu_controller() {
        let with = "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\nnr_periods 10\nnr_throttled 3\nthrottled_usec 40\nnr_bursts 0\nburst_usec 0\n";
        let s = parse_cpu_stat(with);
        assert_eq!(s.usage_usec, Some(2500));
        assert_eq!(
            s.throttled(1000),
            Some(Throttling {
                periods: 3,
                total_ns: 40_000
            })
        );
        let without = parse_cpu_stat("usage_usec 7\nuser_usec 7\nsystem_usec 0\n");
        assert_eq!(without.usage_usec, Some(7));
        assert_eq!(without.throttled(1000), None);
    }

    #[test]
    fn v1_cpu_stat_reports_throttled_time_in_ns() {
        let s = parse_cpu_stat("nr_periods 5\nnr_throttled 2\nthrottled_time 123456\n");
        assert_eq!(s.usage_usec, None);
        assert_eq!(
            s.throttled(1),
            Some(Throttling {
                periods: 2,
                total_ns: 123_456
            })
        );
    }

    #[test]
    fn pressure_some_total() {
        let text = "some avg10=1.00 avg60=0.50 avg300=0.10 total=98765\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=5\n";
        assert_eq!(parse_pressure_some_total(text), Some(98765));
        assert_eq!(parse_pressure_some_total("full total=5\n"), None);
    }

    #[test]
    fn files_of_a_missing_cgroup_are_not_found() {
        let root = CgroupBeneath::own(&std::env::temp_dir(), crate::cgroup::Tree::V2).unwrap();
        let gone = CgroupBeneath {
            path: crate::cgroup::CgroupPath::parse("/qoslet-nonexistent").unwrap(),
            ..root
        };
        let e = read_cgroup_cpu(Some(&gone), None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn ebpf_stats_fill_the_run_queue_and_nothing_else() {
        let mut s = CpuStats::ZERO;
        s.oncpu_ns = 9;
        s.runq_count = 2;
        s.runq_hist[3] = 2;
        let u = CpuUsage::from(s);
        assert_eq!(u.source, CpuSource::Ebpf);
        assert_eq!(u.usage_ns, 9);
        assert_eq!(u.runq.as_ref().map(|r| r.hist[3]), Some(2));
        assert_eq!((u.throttled, u.pressure_some_us), (None, None));
    }
}
