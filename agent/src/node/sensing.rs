//! What the node asks of the sensors ([`SensorControl`]: which cgroups to watch, whose they are,
//! their statistics), and what it does with their events: oom_score_adj for new processes, OOM
//! kills and memcg events in the metrics and the status. A trait so the node's tests run without
//! a kernel.

use tracing::warn;

use super::Node;
use crate::{
    cgroup::{self, CgroupRef},
    hub::metrics::{ContainerLabels, MemcgEventLabels},
    sensors::{CgroupOwner, CpuUsage, SensorEvent, Sensors, WatchedCgroup, kmaps::ProgramCost},
};

pub(crate) trait SensorControl {
    fn watch(&self, cgroup: WatchedCgroup);
    fn unwatch(&self, id: u64);
    fn set_owner(&self, id: u64, owner: CgroupOwner);
    /// The run-queue statistics of a cgroup (`None`: not watched, or no eBPF CPU sensor).
    fn cpu_stats(&self, id: u64) -> Option<CpuUsage>;
    fn program_costs(&self) -> Vec<ProgramCost>;
    fn events_lost(&self) -> u64;
}

impl SensorControl for Sensors {
    fn watch(&self, cgroup: WatchedCgroup) {
        Sensors::watch(self, cgroup);
    }

    fn unwatch(&self, id: u64) {
        Sensors::unwatch(self, id);
    }

    fn set_owner(&self, id: u64, owner: CgroupOwner) {
        Sensors::set_owner(self, id, owner);
    }

    fn cpu_stats(&self, id: u64) -> Option<CpuUsage> {
        Sensors::cpu_stats(self, id).ok().flatten()
    }

    fn program_costs(&self) -> Vec<ProgramCost> {
        Sensors::program_costs(self)
    }

    fn events_lost(&self) -> u64 {
        Sensors::events_lost(self)
    }
}

impl Node {
    pub(crate) fn on_sensor_event(&self, e: &SensorEvent) {
        match e {
            SensorEvent::Process { pid, cgroup_id, .. } => {
                if let Some(t) = &self.cgroups.targets {
                    let _ = cgroup::apply_oom_score(
                        self.cgroups.fs(),
                        t,
                        *pid as i32,
                        CgroupRef::Id(*cgroup_id),
                        self.cgroups.mode(),
                    );
                }
            }
            SensorEvent::OomVictim(v) => {
                let (ns, pod, container) = v
                    .owner
                    .as_ref()
                    .and_then(|o| {
                        self.tracked
                            .pods
                            .keys()
                            .find(|k| k.uid == o.pod_uid)
                            .map(|k| (k.namespace.clone(), k.name.clone(), o.container.clone()))
                    })
                    .unwrap_or_default();
                if !pod.is_empty() {
                    self.report
                        .state
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
                self.report.event(
                    &format!("{ns}/{pod}"),
                    format!("kernel OOM kill: pid {} ({})", v.pid, v.comm),
                );
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
                    ..self
                        .tracked
                        .memcg_owners
                        .get(memcg_id)
                        .cloned()
                        .unwrap_or_default()
                };
                self.report
                    .state
                    .metrics
                    .memcg_events
                    .get_or_create(&labels)
                    .inc_by(*count);
            }
            _ => {}
        }
    }
}
