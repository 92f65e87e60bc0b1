//! The standard process metrics of the Prometheus client guidelines (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`), read from procfs at each scrape.
//!
//! prometheus-client has no process collector, and the one crate that adds it to that client
//! (kubert-prometheus-process, 0.2.3) is built against prometheus-client 0.23, whose registry is
//! another type than the 0.26 the agent uses, and pulls in procfs; reading two procfs files
//! here costs less than either.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

/// The series this collector writes, as `Metrics::series_names` lists them.
pub(crate) const SERIES: [&str; 6] = [
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// What `/proc/self/stat` says, in its own units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// User and system CPU time, in clock ticks.
    cpu_ticks: u64,
    /// When the process started, in clock ticks since boot.
    start_ticks: u64,
}

/// Fields 14 (utime), 15 (stime) and 22 (starttime) of a `/proc/PID/stat` line, counted after
/// the command name, which may itself hold spaces and parentheses (proc(5)).
fn parse_stat(line: &str) -> Option<Stat> {
    let after_comm = &line[line.rfind(')')? + 1..];
    // The fields after the name start at field 3 (state).
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        start_ticks: field(22)?,
    })
}

/// A `kB` line of `/proc/PID/status` (`VmRSS:  1234 kB`), in bytes.
fn status_bytes(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(n).ok().filter(|&n| n > 0)
}

/// One reading of the process's own numbers; each is `None` where procfs did not give it.
#[derive(Debug, Default)]
struct Reading {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<u64>,
    virtual_bytes: Option<u64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
    start_time_seconds: Option<f64>,
}

impl Reading {
    fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s));
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let ticks = clock_ticks_per_second();
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let start_time_seconds = match (stat, ticks, boot) {
            (Some(s), Some(t), Some(b)) => Some(b as f64 + s.start_ticks as f64 / t as f64),
            _ => None,
        };
        Self {
            cpu_seconds: stat.zip(ticks).map(|(s, t)| s.cpu_ticks as f64 / t as f64),
            resident_bytes: status_bytes(&status, "VmRSS"),
            virtual_bytes: status_bytes(&status, "VmSize"),
            // The listing's own descriptor is open while it runs: not one of the agent's.
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| (d.count() as u64).saturating_sub(1)),
            max_fds: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .ok()
                .map(|(soft, _)| soft),
            start_time_seconds,
        }
    }
}

/// Reads procfs at each scrape; a number procfs does not give is left out of that scrape.
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = Reading::now();
        if let Some(v) = r.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                m.metric_type(),
            )?)?;
        }
        for (name, help, unit, value) in [
            (
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(Unit::Bytes),
                r.resident_bytes,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(Unit::Bytes),
                r.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                None,
                r.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (the soft RLIMIT_NOFILE)",
                None,
                r.max_fds,
            ),
        ] {
            if let Some(v) = value {
                let m = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
                m.encode(encoder.encode_descriptor(name, help, unit.as_ref(), m.metric_type())?)?;
            }
        }
        if let Some(v) = r.start_time_seconds {
            let m = ConstGauge::new(v);
            m.encode(encoder.encode_descriptor(
                "process_start_time",
                "Start time of the process since the Unix epoch in seconds",
                Some(&Unit::Seconds),
                m.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis, as a process may name itself.
        let line = "4242 (qos) let) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    150 50 0 0 20 0 7 0 123456 52428800 3000 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                cpu_ticks: 200,
                start_ticks: 123456,
            })
        );
        assert_eq!(parse_stat("4242 (qoslet) S 1"), None);
    }

    #[test]
    fn status_and_boot_time_lines_are_read_in_their_units() {
        let status = "Name:\tqoslet\nVmSize:\t  204800 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_bytes(status, "VmRSS"), Some(10 << 20));
        assert_eq!(status_bytes(status, "VmSize"), Some(200 << 20));
        assert_eq!(status_bytes(status, "VmSwap"), None);
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1764720000\nprocesses 9\n"),
            Some(1_764_720_000)
        );
    }

    #[test]
    fn this_process_reads_every_number() {
        let r = Reading::now();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = r.start_time_seconds.expect("start time");
        // The test binary started before this line and within the last day.
        assert!(started <= now + 1.0 && started > now - 86_400.0, "{r:?}");
        assert!(r.cpu_seconds.is_some_and(|s| s >= 0.0), "{r:?}");
        assert!(r.resident_bytes.is_some_and(|b| b > 0), "{r:?}");
        assert!(r.virtual_bytes >= r.resident_bytes, "{r:?}");
        // stdin, stdout and stderr at least.
        assert!(r.open_fds.is_some_and(|n| n >= 3), "{r:?}");
        assert!(r.max_fds >= r.open_fds, "{r:?}");
    }
}
