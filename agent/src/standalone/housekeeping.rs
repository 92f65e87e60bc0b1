//! The periodic housekeeping (stale cgroups, eBPF costs, run-queue latency, oom_score_adj,
//! eviction results) and the reactions to sensor events.

use std::sync::{Arc, Mutex};

use tracing::warn;

use super::{status::event, sync::Synced};
use crate::{
    cgroup::{self, CgroupRef},
    eviction::{EvictionStats, NodeCondition},
    sensors::{CpuUsage, SensorEvent, Sensors},
    server::metrics::{
        ContainerLabels, EvictionLabels, MemcgEventLabels, PodLabels, ProgramLabels, RingLabels,
    },
};

impl Synced {
    /// Every housekeeping interval: oom_score_adj of new processes, eviction results, status.
    pub fn housekeeping(
        &mut self,
        stats: &Arc<Mutex<EvictionStats>>,
        conditions: &[NodeCondition],
        sensors: &Sensors,
    ) {
        self.remove_stale();
        for cost in sensors.program_costs() {
            let last = self
                .last_run_ns
                .insert(cost.program.clone(), cost.run_time_ns);
            let delta = cost.run_time_ns.saturating_sub(last.unwrap_or(0));
            self.state
                .metrics
                .ebpf_program_run
                .get_or_create(&ProgramLabels {
                    program: cost.program,
                })
                .inc_by(delta as f64 * 1e-9);
        }
        let lost = sensors.events_lost();
        self.state
            .metrics
            .ebpf_events_lost
            .get_or_create(&RingLabels {
                ring: "EVENTS".into(),
            })
            .inc_by(lost.saturating_sub(self.last_lost));
        self.last_lost = lost;
        // Run-queue latency per pod, from the eBPF CPU sensor's kernel histograms.
        for (key, entry) in &mut self.pods {
            let mut seen = false;
            let (mut count, mut total) = (0, 0);
            let mut hist = [0u64; qoslet_common::sched::RUNQ_HIST_BUCKETS];
            for id in &entry.container_ids {
                // Only the eBPF sensor sees run-queue waits; its fallback leaves `runq` empty.
                if let Ok(Some(CpuUsage { runq: Some(w), .. })) = sensors.cpu_stats(*id) {
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
        if let Some(t) = &self.targets {
            // Failures are logged by the scan itself, once per process and value.
            cgroup::scan_oom_scores(self.fs(), t, self.reconciler.mode());
        }
        let stats = stats.lock().map(|s| s.clone()).unwrap_or_default();
        for d in stats
            .recent
            .iter()
            .skip(self.evictions_seen.min(stats.recent.len()))
        {
            for pod in &d.pods {
                let qos = self
                    .plan
                    .as_ref()
                    .and_then(|p| {
                        p.pods
                            .iter()
                            .find(|pp| pp.namespace == pod.namespace && pp.name == pod.name)
                    })
                    .map_or("unknown".into(), |pp| format!("{:?}", pp.qos_class));
                self.state
                    .metrics
                    .evictions
                    .get_or_create(&EvictionLabels {
                        signal: d.signal.clone(),
                        qos_class: qos,
                    })
                    .inc();
                self.state.status.push_event(event(
                    &pod.to_string(),
                    format!(
                        "evicted: {} observed {} threshold {} ({})",
                        d.signal, d.observed, d.threshold, d.reason
                    ),
                ));
            }
            if let Some(l) = d.latency {
                self.state
                    .metrics
                    .eviction_decision_latency
                    .observe(l.as_secs_f64());
            }
        }
        self.evictions_seen = stats.recent.len();
        // The base of the Summary API's usageNanoCores.
        self.summary.sample_cpu();
        self.refresh_status(conditions, self.runtime.status());
    }

    pub fn on_sensor_event(&mut self, e: &SensorEvent) {
        match e {
            SensorEvent::Process { pid, cgroup_id, .. } => {
                if let Some(t) = &self.targets {
                    let _ = cgroup::apply_oom_score(
                        self.fs(),
                        t,
                        *pid as i32,
                        CgroupRef::Id(*cgroup_id),
                        self.reconciler.mode(),
                    );
                }
            }
            SensorEvent::OomVictim(v) => {
                let (ns, pod, container) = v
                    .owner
                    .as_ref()
                    .and_then(|o| {
                        self.pods
                            .iter()
                            .find(|(_, p)| p.view.uid == o.pod_uid)
                            .map(|(k, _)| {
                                (k.namespace.clone(), k.name.clone(), o.container.clone())
                            })
                    })
                    .unwrap_or_default();
                if !pod.is_empty() {
                    self.state
                        .metrics
                        .oom_kills
                        .get_or_create(&ContainerLabels {
                            namespace: ns.clone(),
                            pod: pod.clone(),
                            container: container.clone(),
                        })
                        .inc();
                }
                warn!(pid = v.pid, comm = %v.comm, pod = %format!("{ns}/{pod}"), container = %container, "Kernel OOM killer chose a victim.");
                self.state.status.push_event(event(
                    &format!("{ns}/{pod}"),
                    format!("kernel OOM kill: pid {} ({})", v.pid, v.comm),
                ));
            }
            SensorEvent::Memcg {
                memcg_id,
                kind,
                count,
                ..
            } => {
                // Node-level cgroups (node root, kubepods, QoS tiers) have no pod: empty labels.
                let labels = MemcgEventLabels {
                    event: kind.as_str().into(),
                    ..self.memcg_owners.get(memcg_id).cloned().unwrap_or_default()
                };
                self.state
                    .metrics
                    .memcg_events
                    .get_or_create(&labels)
                    .inc_by(*count);
            }
            _ => {}
        }
    }
}
