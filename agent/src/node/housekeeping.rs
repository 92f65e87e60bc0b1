//! The node's periodic work and its reactions to the eviction manager.
//!
//! Every housekeeping interval: stale cgroups, eBPF program costs and lost records, and whether
//! a managed cgroup was written or removed behind qoslet's back (then a pass puts it back). Per
//! pod statistics (run-queue latency, working sets, the Summary API's CPU samples) and the scan
//! of every container's processes for their oom_score_adj run at the slower statistics interval:
//! they are reads per pod, nothing acts on them sooner (the eviction manager reads usage fresh at
//! decision time), and new processes get their score from the sensors' events already.

use std::time::Instant;

use tracing::warn;

use super::{Node, sensing::SensorControl};
use crate::{
    cgroup,
    eviction::{
        Decision, NodeCondition, Stages, thresholds::Observations, thresholds::threshold_amount,
    },
    server::metrics::{
        ConditionLabels, EvictionLabels, PodLabels, ProgramLabels, RingLabels, SignalLabels,
        StageLabels, ThresholdLabels,
    },
};

impl Node {
    /// One housekeeping tick; true when a pass should run now (a managed cgroup was changed or
    /// removed by someone else, or the CPU-pressure controller changed its level).
    pub fn housekeeping(&mut self, sensors: &impl SensorControl) -> bool {
        self.cgroups.remove_stale();
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
        for (key, entry) in &mut self.tracked.pods {
            entry.working_set = entry
                .memory
                .as_ref()
                .and_then(|m| m.read().ok())
                .map(|r| r.working_set().max(0) as u64);
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
        if let Some(t) = &self.cgroups.targets {
            // Failures are logged by the scan itself, once per process and value.
            cgroup::scan_oom_scores(self.cgroups.fs(), t, self.cgroups.mode());
        }
        self.summary.sample_cpu();
    }

    /// An eviction the manager made: metrics and the status events. The eviction pipeline has
    /// recorded it in the state file already (`eviction/pipeline.rs`).
    pub fn on_eviction(&mut self, d: &Decision) {
        for pod in &d.pods {
            let qos = d.qos.get(pod).map_or("unknown", |q| q.as_str());
            self.report
                .state
                .metrics
                .evictions
                .get_or_create(&EvictionLabels {
                    signal: d.signal.clone(),
                    qos_class: qos.into(),
                })
                .inc();
            self.report.event(
                &pod.to_string(),
                format!(
                    "evicted: {} observed {} threshold {} ({})",
                    d.signal, d.observed, d.threshold, d.reason
                ),
            );
        }
        if let Some(l) = d.latency {
            self.report
                .state
                .metrics
                .eviction_decision_latency
                .observe(l.as_secs_f64());
        }
        for (stage, d) in d.stages.iter().flat_map(Stages::labelled) {
            self.report
                .state
                .metrics
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
    pub fn on_observations(&self, obs: &Observations) {
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
    pub fn on_conditions(&self, conditions: &[NodeCondition]) {
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
        let mut state = crate::lock(&self.persisted);
        state.set_created_cgroups(&self.cgroups.created());
        if let Err(e) = state.save(true) {
            warn!(error = %e, source = ?std::error::Error::source(&e), "Could not save the node state.");
        }
    }
}
