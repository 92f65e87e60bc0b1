//! The node's periodic work and its reactions to the eviction manager.
//!
//! Every housekeeping interval: stale cgroups, eBPF program costs and lost records, and whether
//! a managed cgroup was written or removed behind qoslet's back (then a pass puts it back). Per
//! pod statistics (run-queue latency, working sets, the Summary API's CPU samples) and the scan
//! of every container's processes for their oom_score_adj run at the slower statistics interval:
//! they are reads per pod, nothing acts on them sooner (the eviction manager ranks on the usage
//! less the `inactive_file` read here and reads `memory.stat` only for the pods its decision
//! turns on, `eviction/usage.rs`), and new processes get their score from the sensors' events
//! already.

use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

use super::{Node, sensing::SensorControl};
use crate::{
    cgroup,
    eviction::{
        Decision, NodeCondition, Stages, thresholds::Observations, thresholds::threshold_amount,
    },
    hub::metrics::{
        ConditionLabels, EvictionLabels, PodEvictionLabels, PodLabels, ProgramLabels, RingLabels,
        SignalLabels, StageLabels, ThresholdLabels,
    },
};

/// How long after start the memory only start-up used is handed back: the first pass, the
/// sensors' loading and the pods' first start are behind by then.
pub(super) const START_UP_SETTLE: Duration = Duration::from_secs(30);

impl Node {
    /// One housekeeping tick; true when a pass should run now (a managed cgroup was changed or
    /// removed by someone else, or the CPU-pressure controller changed its level).
    pub(crate) fn housekeeping(&mut self, sensors: &impl SensorControl) -> bool {
        if self
            .release_start_up_at
            .is_some_and(|t| Instant::now() >= t)
        {
            self.release_start_up_at = None;
            match release_start_up_memory() {
                Ok(bytes) => info!(
                    mapped_bytes = bytes,
                    "Start-up's code paged out; qoslet's code is locked in memory as it runs."
                ),
                // Without CAP_IPC_LOCK the kernel locks at most RLIMIT_MEMLOCK (8 MiB by default).
                Err(e) => {
                    warn!(error = %e, "Could not lock qoslet's code in memory (CAP_IPC_LOCK lets it): under memory pressure the kernel may drop it, and an eviction then waits for it to be read back from disk.");
                }
            }
            if let Some(n) = &self.start_up_released {
                n.notify_one();
            }
        }
        self.cgroups.remove_stale();
        self.report
            .state
            .metrics
            .evicted_pods
            .expire(Instant::now());
        self.record_ebpf_costs(sensors);
        let cpu_pressure_changed = self.cpu_pressure_tick(sensors);
        if self.next_stats.is_none_or(|t| Instant::now() >= t) {
            self.next_stats = Some(Instant::now() + self.stats_interval);
            self.sample_stats(sensors);
        }
        // Both are asked: the change feed's events are consumed either way.
        self.cgroups.changed_since_pass() | cpu_pressure_changed
    }

    fn record_ebpf_costs(&mut self, sensors: &impl SensorControl) {
        let metrics = &self.report.state.metrics;
        for cost in sensors.program_costs() {
            let last = self
                .ebpf_seen
                .run_ns
                .insert(cost.program.clone(), cost.run_time_ns);
            let delta = cost.run_time_ns.saturating_sub(last.unwrap_or(0));
            metrics
                .ebpf_program_run
                .get_or_create(&ProgramLabels {
                    program: cost.program,
                })
                .inc_by(delta as f64 * 1e-9);
        }
        let lost = sensors.events_lost();
        metrics
            .ebpf_events_lost
            .get_or_create(&RingLabels {
                ring: "EVENTS".into(),
            })
            .inc_by(lost.saturating_sub(self.ebpf_seen.lost));
        self.ebpf_seen.lost = lost;
    }

    /// Per-pod statistics: run-queue latency from the kernel's histograms, working sets, the
    /// Summary API's CPU base, and the oom_score_adj safety scan.
    fn sample_stats(&mut self, sensors: &impl SensorControl) {
        let read_at = Instant::now();
        let mut inactive = Vec::new();
        for (key, entry) in &mut self.tracked.pods {
            let reading = entry
                .memory
                .as_ref()
                .and_then(|m| m.reading_without_limit().ok());
            entry.working_set = reading.map(|r| r.working_set().max(0) as u64);
            if let Some(r) = reading {
                inactive.push((key.clone(), r.inactive_file_bytes));
            }
            let mut seen = false;
            let (mut count, mut total) = (0, 0);
            let mut hist = [0u64; qoslet_common::sched::RUNQ_HIST_BUCKETS];
            for id in &entry.container_ids {
                // Only the eBPF sensor sees run-queue waits; its fallback leaves `runq` empty.
                if let Some(w) = sensors.cpu_stats(*id).and_then(|u| u.runq) {
                    seen = true;
                    count += w.count;
                    total += w.total_ns;
                    for (h, n) in hist.iter_mut().zip(w.hist) {
                        *h += n;
                    }
                }
            }
            if seen {
                let h = self
                    .report
                    .state
                    .metrics
                    .runqueue_latency
                    .get_or_create_owned(&PodLabels {
                        namespace: key.namespace.clone(),
                        pod: key.name.clone(),
                    });
                h.set(count, total, &hist);
                entry.runq_p99 = h.quantile_upper_bound(0.99);
            }
        }
        if let Some(usage) = &self.usage {
            let pods = &self.tracked.pods;
            usage.record_all(inactive.iter().map(|(k, v)| (k, *v)), read_at, |k| {
                pods.contains_key(k)
            });
        }
        if let Some(t) = &self.cgroups.targets {
            // Failures are logged by the scan itself, once per process and value.
            cgroup::scan_oom_scores(self.cgroups.fs(), t, self.cgroups.mode());
        }
        self.summary.sample_cpu();
    }

    /// An eviction the manager made: metrics and the status events. The eviction pipeline has
    /// recorded it in the state file already (`eviction/pipeline.rs`).
    pub(crate) fn on_eviction(&self, d: &Decision) {
        let (at, now) = (SystemTime::now(), Instant::now());
        let metrics = &self.report.state.metrics;
        for pod in &d.pods {
            let qos = d.qos.get(pod).map_or("unknown", |q| q.as_str());
            metrics
                .evictions
                .get_or_create(&EvictionLabels {
                    signal: d.signal.clone(),
                    qos_class: qos.into(),
                })
                .inc();
            metrics.evicted_pods.record(
                PodEvictionLabels {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    signal: d.signal.clone(),
                    qos_class: qos.into(),
                },
                at,
                now,
            );
            self.report.event(
                &pod.to_string(),
                format!(
                    "evicted: {} observed {} threshold {} ({})",
                    d.signal, d.observed, d.threshold, d.reason
                ),
            );
        }
        if let Some(l) = d.latency {
            metrics.eviction_decision_latency.observe(l.as_secs_f64());
        }
        for (stage, d) in d.stages.iter().flat_map(Stages::labelled) {
            metrics
                .eviction_stage_latency
                .get_or_create(&StageLabels {
                    stage: stage.into(),
                })
                .observe(d.as_secs_f64());
        }
        self.save_state();
    }

    /// The eviction signals as the manager last observed them: metrics, and the node line of
    /// the status.
    pub(crate) fn on_observations(&self, obs: &Observations) {
        let metrics = &self.report.state.metrics;
        for (signal, o) in obs {
            metrics
                .node_signal_available
                .get_or_create(&SignalLabels {
                    signal: signal.clone(),
                })
                .set(o.available);
        }
        for (t, kind) in &self.thresholds {
            if let Some(o) = obs.get(&t.signal) {
                metrics
                    .node_eviction_threshold
                    .get_or_create(&ThresholdLabels {
                        signal: t.signal.clone(),
                        kind: (*kind).into(),
                    })
                    .set(threshold_amount(t, o.capacity, false));
            }
        }
        let available = obs.get("memory.available").map(|o| o.available);
        self.report
            .state
            .status
            .update(|s| s.node.memory_available_bytes = available);
    }

    /// The node conditions changed: metrics, status, the published conditions (cluster mode
    /// reports them to the API) and (for admission) a pass.
    pub(crate) fn on_conditions(&self, conditions: &[NodeCondition]) {
        for c in [NodeCondition::MemoryPressure, NodeCondition::PidPressure] {
            self.report
                .state
                .metrics
                .node_condition
                .get_or_create(&ConditionLabels {
                    condition: c.as_str().into(),
                })
                .set(conditions.contains(&c).into());
        }
        self.report.state.conditions.send_if_modified(|now| {
            let changed = now.as_slice() != conditions;
            if changed {
                *now = conditions.to_vec();
            }
            changed
        });
    }

    /// Persists what must survive a crash; a failure is logged, the node goes on.
    pub(super) fn save_state(&self) {
        let mut state = crate::support::lock(&self.persisted);
        state.set_created_cgroups(&self.cgroups.created());
        if let Err(e) = state.save(true) {
            warn!(error = %e, source = ?std::error::Error::source(&e), "Could not save the node state.");
        }
    }
}

/// Start-up runs code that never runs again (decoding the configuration and the manifests,
/// parsing the kernel's BTF, the first pass over every pod): the kernel keeps the pages of the
/// binary it touched mapped, and glibc the heap it freed. Both are handed back once: the
/// binary's read-only mappings are paged out (`MADV_PAGEOUT`, Linux 5.4; an older kernel refuses
/// it and nothing changes) and what runs from then on faults its pages back in.
///
/// Then those mappings are locked as they fault (`mlock2` with `MLOCK_ONFAULT`, Linux 4.4), as
/// earlyoom locks itself (`mlockall`): what runs from then on, the eviction manager's rehearsal
/// of a decision among it, stays in memory. Under memory pressure the kernel drops the clean
/// pages of a binary first, and an eviction that must read its code back from a disk the
/// pressure keeps busy comes late. Only the binary's pages are locked, as they are touched, not
/// its heap (glibc could not hand that back: `MADV_DONTNEED` refuses locked pages) nor what
/// start-up alone ran. The bytes of the mappings locked, or why none were.
fn release_start_up_memory() -> Result<usize, std::io::Error> {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let code = binary_read_only(&maps, release_start_up_memory as *const () as usize);
    for &(start, end) in &code {
        // SAFETY: [start, end) is a read-only mapping of this process's own binary as the kernel
        // listed it; MADV_PAGEOUT only drops its clean pages, which the next access reads back,
        // and MADV_RANDOM only turns off read-ahead for them.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
            // A page faulted back brings no neighbours it does not need: they would be locked
            // with it. Code that runs again is locked once faulted, so read-ahead would buy
            // nothing later.
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_RANDOM);
        }
    }
    let mut locked = 0;
    for &(start, end) in &code {
        // SAFETY: the same mapping; locking changes only whether its pages may be reclaimed.
        let r = unsafe {
            libc::mlock2(
                start as *const libc::c_void,
                end - start,
                libc::MLOCK_ONFAULT,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        locked += end - start;
    }
    Ok(locked)
}

/// The read-only mappings (start, end) of the file mapped at `code` (the binary), from a
/// `/proc/self/maps` text: `start-end perms offset dev inode path`.
fn binary_read_only(maps: &str, code: usize) -> Vec<(usize, usize)> {
    let Some(binary) = maps
        .lines()
        .filter_map(Mapping::parse)
        .find(|m| (m.start..m.end).contains(&code))
        .map(|m| m.file)
    else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(Mapping::parse)
        .filter(|m| m.file == binary && !m.perms.contains('w'))
        .map(|m| (m.start, m.end))
        .collect()
}

/// One line of `/proc/self/maps` that maps a file.
struct Mapping<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    /// Device and inode.
    file: (&'a str, &'a str),
}

impl<'a> Mapping<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (start, end) = f.first()?.split_once('-')?;
        let m = Self {
            start: usize::from_str_radix(start, 16).ok()?,
            end: usize::from_str_radix(end, 16).ok()?,
            perms: f.get(1)?,
            file: (f.get(3)?, f.get(4)?),
        };
        // An anonymous mapping's inode is 0.
        (m.file.1 != "0").then_some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binarys_read_only_mappings_are_found_by_the_file_of_its_code() {
        let maps = "\
5000-6000 r--p 00000000 fe:00 42 /usr/bin/qoslet
6000-9000 r-xp 00001000 fe:00 42 /usr/bin/qoslet
9000-a000 r--p 00004000 fe:00 42 /usr/bin/qoslet
a000-b000 rw-p 00005000 fe:00 42 /usr/bin/qoslet
b000-c000 rw-p 00000000 00:00 0 [heap]
7000000-7001000 r-xp 00000000 fe:00 7 /usr/lib/libc.so.6
";
        assert_eq!(
            binary_read_only(maps, 0x6100),
            [(0x5000, 0x6000), (0x6000, 0x9000), (0x9000, 0xa000)]
        );
        assert_eq!(binary_read_only(maps, 0x7000100), [(0x7000000, 0x7001000)]);
        assert!(binary_read_only(maps, 0xb100).is_empty(), "not a file");
        assert!(binary_read_only(maps, 0x1).is_empty(), "not mapped");
    }
}
