//! `/stats/summary` from the cgroup files at request time, filled as the kubelet fills the
//! Summary API (cadvisor's `setMemoryStats`, the kubelet's `cadvisorInfoToContainerStats` and its
//! CRI stats provider):
//!
//! - workingSetBytes = usage - inactive_file, floor 0 (v1 `memory.usage_in_bytes` -
//!   `total_inactive_file`, v2 `memory.current` - `inactive_file`); availableBytes = limit -
//!   workingSet, only for a limited cgroup; rssBytes = v1 `total_rss`, v2 `anon`; pageFaults and
//!   majorPageFaults = `pgfault` and `pgmajfault` of `memory.stat` (on v1 these are the cgroup's
//!   own, not its children's, as cadvisor reads them).
//! - usageCoreNanoSeconds = cgroup v2 `cpu.stat` `usage_usec` x 1000. qoslet puts every
//!   container in a v2 tree, on hybrid hosts too (the controller-less one), and its `cpu.stat`
//!   counts usage without the cpu controller; the kubelet's v1 source, `cpuacct.usage`, counts the
//!   same time. usageNanoCores = the rate from the last housekeeping sample to the request, as
//!   the kubelet's CRI provider rates against one cached sample per container.

use std::{
    collections::HashMap,
    fs,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use crate::{
    cgroup::{Access, CgroupBeneath},
    eviction::{MemoryCgroup, held::HeldFiles, signals::stat_field},
    hub::{
        Summary, SummarySource,
        summary::{ContainerStats, CpuStats, MemoryStats, NodeStats, PodReference, PodStats},
    },
    node::pod_status::{ContainerState, ContainerStatus, PodStatus},
    policy::pod::PodKey,
    support::lock,
};

/// Where one cgroup's numbers are read.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatsCgroup {
    pub(crate) memory: Option<MemoryCgroup>,
    /// A cgroup v2 directory (for its `cpu.stat`).
    pub(crate) cpu: Option<CgroupBeneath>,
}

#[derive(Debug, Clone)]
pub(crate) struct PodTarget {
    pub(crate) pod_ref: PodReference,
    pub(crate) key: PodKey,
    pub(crate) cgroup: StatsCgroup,
    pub(crate) containers: Vec<(String, StatsCgroup)>,
}

/// What the last sync pass put on the node: system containers by the kubelet's names (`pods`,
/// `kubelet`, `misc`) and pods.
#[derive(Debug, Clone, Default)]
pub(crate) struct SummaryTargets {
    pub(crate) system: Vec<(String, StatsCgroup)>,
    pub(crate) pods: Vec<PodTarget>,
}

#[derive(Debug, Clone, Copy)]
struct CpuSample {
    at: Instant,
    usage_ns: u64,
}

/// Shared by the node (targets, container statuses, CPU samples) and the HTTP server (requests).
#[derive(Clone)]
pub(crate) struct CgroupSummary {
    inner: Arc<Inner>,
}

struct Inner {
    node_name: String,
    node_start: String,
    node: StatsCgroup,
    /// The executor's container statuses at the node's last status refresh (start times).
    statuses: Mutex<HashMap<PodKey, Vec<ContainerStatus>>>,
    targets: Mutex<SummaryTargets>,
    samples: Mutex<HashMap<PathBuf, CpuSample>>,
    /// Every target's `cpu.stat`, held open from the pass that placed it until a pass drops it:
    /// each sample and request reads it with one `pread`, not an open, a read and a close.
    cpu_files: HeldFiles,
}

impl CgroupSummary {
    /// `node_name`: the Node object's name; `None` takes the hostname.
    pub(crate) fn new(node: StatsCgroup, node_name: Option<String>) -> Self {
        let node_name = node_name.unwrap_or_else(|| {
            fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_default()
        });
        Self {
            inner: Arc::new(Inner {
                node_name,
                node_start: boot_time().map(rfc3339).unwrap_or_default(),
                node,
                statuses: Mutex::default(),
                targets: Mutex::default(),
                samples: Mutex::default(),
                cpu_files: HeldFiles::new(),
            }),
        }
    }

    /// The cgroups the pass placed; their `cpu.stat` files are held open from now on, and those
    /// of cgroups the pass dropped are closed.
    pub(crate) fn set_targets(&self, targets: SummaryTargets) {
        let failed = self
            .inner
            .cpu_files
            .hold_only(cpu_dirs(&self.inner.node, &targets).map(|d| (d, "cpu.stat", Access::Read)));
        if let Some((path, e)) = failed.first() {
            tracing::debug!(path = %path.display(), error = %e, failed = failed.len(), "Could not keep cpu.stat files open; they are opened when read.");
        }
        *lock(&self.inner.targets) = targets;
    }

    pub(crate) fn set_statuses(&self, statuses: &[PodStatus]) {
        *lock(&self.inner.statuses) = statuses
            .iter()
            .map(|s| (s.key.clone(), s.containers.clone()))
            .collect();
    }

    /// A CPU sample of every cgroup, the base of the next requests' usageNanoCores (taken at
    /// housekeeping; cgroups gone since are forgotten).
    pub(crate) fn sample_cpu(&self) {
        let targets = lock(&self.inner.targets);
        let samples: HashMap<PathBuf, CpuSample> = cpu_dirs(&self.inner.node, &targets)
            .filter_map(|d| {
                let usage_ns = self.cpu_usage_ns(d)?;
                Some((
                    d.display(),
                    CpuSample {
                        at: Instant::now(),
                        usage_ns,
                    },
                ))
            })
            .collect();
        drop(targets);
        *lock(&self.inner.samples) = samples;
    }

    /// `usage_usec` of a cgroup v2 `cpu.stat`, in nanoseconds.
    fn cpu_usage_ns(&self, dir: &CgroupBeneath) -> Option<u64> {
        let text = self.inner.cpu_files.read_or_open(dir, "cpu.stat").ok()?;
        stat_field(&text, "usage_usec").map(|us| us.max(0) as u64 * 1000)
    }

    fn stats(&self, c: &StatsCgroup, time: &str) -> (Option<CpuStats>, Option<MemoryStats>) {
        let cpu = c.cpu.as_ref().and_then(|dir| {
            let usage_ns = self.cpu_usage_ns(dir)?;
            let now = Instant::now();
            let base = lock(&self.inner.samples).get(&dir.display()).copied();
            Some(CpuStats {
                time: time.into(),
                usage_nano_cores: base.and_then(|b| nano_cores(b, usage_ns, now)),
                usage_core_nano_seconds: Some(usage_ns),
            })
        });
        (cpu, c.memory.as_ref().and_then(|m| memory_stats(m, time)))
    }

    fn container(&self, name: &str, c: &StatsCgroup, start: String, time: &str) -> ContainerStats {
        let (cpu, memory) = self.stats(c, time);
        ContainerStats {
            name: name.into(),
            start_time: start,
            cpu,
            memory,
        }
    }
}

impl SummarySource for CgroupSummary {
    fn summary(&self) -> Summary {
        let time = rfc3339(SystemTime::now());
        let targets = lock(&self.inner.targets).clone();
        let statuses = lock(&self.inner.statuses).clone();
        let (cpu, memory) = self.stats(&self.inner.node, &time);
        let system_containers = targets
            .system
            .iter()
            .map(|(name, c)| self.container(name, c, self.inner.node_start.clone(), &time))
            .collect();
        let pods = targets
            .pods
            .iter()
            .map(|p| {
                let status = statuses.get(&p.key);
                let started = |name: &str| {
                    status
                        .and_then(|cs| cs.iter().find(|c| c.name == name))
                        .and_then(started_at)
                };
                let containers: Vec<ContainerStats> = p
                    .containers
                    .iter()
                    .map(|(name, c)| {
                        let start = started(name).map_or_else(|| time.clone(), rfc3339);
                        self.container(name, c, start, &time)
                    })
                    .collect();
                let (cpu, memory) = self.stats(&p.cgroup, &time);
                PodStats {
                    pod_ref: p.pod_ref.clone(),
                    start_time: status
                        .and_then(|cs| cs.iter().filter_map(started_at).min())
                        .map_or_else(|| time.clone(), rfc3339),
                    containers,
                    cpu,
                    memory,
                }
            })
            .collect();
        Summary {
            node: NodeStats {
                node_name: self.inner.node_name.clone(),
                system_containers,
                start_time: self.inner.node_start.clone(),
                cpu,
                memory,
            },
            pods,
        }
    }
}

fn memory_stats(m: &MemoryCgroup, time: &str) -> Option<MemoryStats> {
    let (r, stat) = m.read_with_stat().ok()?;
    let rss = if m.is_v2() { "anon" } else { "total_rss" };
    let field = |k: &str| stat_field(&stat, k).map(|v| v.max(0) as u64);
    let working_set = r.working_set();
    Some(MemoryStats {
        time: time.into(),
        available_bytes: r.limit_bytes.map(|l| (l - working_set).max(0) as u64),
        usage_bytes: Some(r.usage_bytes.max(0) as u64),
        working_set_bytes: Some(working_set as u64),
        rss_bytes: field(rss),
        page_faults: field("pgfault"),
        major_page_faults: field("pgmajfault"),
    })
}

/// The v2 directories of the node, the system containers, the pods and their containers.
fn cpu_dirs<'a>(
    node: &'a StatsCgroup,
    targets: &'a SummaryTargets,
) -> impl Iterator<Item = &'a CgroupBeneath> {
    std::iter::once(node)
        .chain(targets.system.iter().map(|(_, c)| c))
        .chain(
            targets.pods.iter().flat_map(|p| {
                std::iter::once(&p.cgroup).chain(p.containers.iter().map(|(_, c)| c))
            }),
        )
        .filter_map(|c| c.cpu.as_ref())
}

/// Cores used between `base` and now, in billionths; `None` when the counter went back (the
/// cgroup was recreated) or no time passed.
fn nano_cores(base: CpuSample, usage_ns: u64, now: Instant) -> Option<u64> {
    let elapsed = now.checked_duration_since(base.at)?.as_nanos();
    let used = u128::from(usage_ns.checked_sub(base.usage_ns)?);
    (elapsed > 0).then(|| (used * 1_000_000_000 / elapsed) as u64)
}

fn started_at(c: &ContainerStatus) -> Option<SystemTime> {
    match &c.state {
        ContainerState::Running { started_at, .. } => Some(*started_at),
        ContainerState::Terminated(t) => t.started_at,
        ContainerState::Waiting { .. } => c.last_termination.as_ref()?.started_at,
    }
}

/// `btime` of /proc/stat: the kubelet's node start time is the root cgroup's, the boot.
fn boot_time() -> Option<SystemTime> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let secs = stat_field(&stat, "btime")?;
    Some(UNIX_EPOCH + std::time::Duration::from_secs(secs.max(0) as u64))
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    jiff::Timestamp::from_second(secs as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn nano_cores_is_the_rate_between_two_samples() {
        let at = Instant::now();
        let base = CpuSample {
            at,
            usage_ns: 1_000,
        };
        // 1 s of CPU in 2 s: half a core.
        assert_eq!(
            nano_cores(base, 1_000_001_000, at + Duration::from_secs(2)),
            Some(500_000_000)
        );
        assert_eq!(nano_cores(base, 999, at + Duration::from_secs(1)), None);
        assert_eq!(nano_cores(base, 2_000, at), None);
    }

    /// A target's `cpu.stat` is held from the pass that placed it: a sample reads it through that
    /// descriptor (a file put in its place since is not opened), and a pass that drops the target
    /// closes it, after which the file is opened when read.
    #[test]
    fn cpu_stat_is_read_through_the_descriptor_held_since_the_pass() {
        let base = std::env::temp_dir().join(format!("qoslet-summary-held-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(base.join("pod")).unwrap();
        fs::write(base.join("pod/cpu.stat"), "usage_usec 7\n").unwrap();
        let root = CgroupBeneath::own(&base, crate::cgroup::Tree::V2).unwrap();
        let pod = CgroupBeneath {
            path: crate::cgroup::CgroupPath::parse("/pod").unwrap(),
            ..root
        };
        let summary = CgroupSummary::new(StatsCgroup::default(), Some("node".into()));
        summary.set_targets(SummaryTargets {
            system: vec![(
                "pods".into(),
                StatsCgroup {
                    memory: None,
                    cpu: Some(pod.clone()),
                },
            )],
            pods: Vec::new(),
        });
        assert_eq!(summary.inner.cpu_files.count(), 1);
        fs::write(base.join("cpu.stat.new"), "usage_usec 9\n").unwrap();
        fs::rename(base.join("cpu.stat.new"), base.join("pod/cpu.stat")).unwrap();
        summary.sample_cpu();
        let sampled = |s: &CgroupSummary| {
            lock(&s.inner.samples)
                .get(&pod.display())
                .map(|c| c.usage_ns)
        };
        assert_eq!(
            sampled(&summary),
            Some(7_000),
            "read through the held descriptor"
        );
        summary.set_targets(SummaryTargets::default());
        assert_eq!(summary.inner.cpu_files.count(), 0);
        assert_eq!(summary.cpu_usage_ns(&pod), Some(9_000), "opened when read");
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn memory_stats_follow_cadvisor() {
        let dir = std::env::temp_dir().join(format!("qoslet-summary-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("memory.usage_in_bytes"), "1000\n").unwrap();
        fs::write(dir.join("memory.limit_in_bytes"), "4096\n").unwrap();
        fs::write(
            dir.join("memory.stat"),
            "rss 1\ninactive_file 5\npgfault 7\npgmajfault 2\ntotal_rss 300\ntotal_inactive_file 200\n",
        )
        .unwrap();
        let v1 = crate::cgroup::Tree::V1(crate::cgroup::layout::Controller::Memory);
        let s = memory_stats(&MemoryCgroup::own(&dir, v1).unwrap(), "t").unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(s.usage_bytes, Some(1000));
        assert_eq!(s.working_set_bytes, Some(800));
        assert_eq!(s.available_bytes, Some(4096 - 800));
        assert_eq!(s.rss_bytes, Some(300));
        assert_eq!((s.page_faults, s.major_page_faults), (Some(7), Some(2)));
    }
}
