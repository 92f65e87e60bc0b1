//! The status page's pod table and event log: manifest problems reported once, rows rebuilt from
//! the plan and the runtime.

use std::collections::BTreeMap;

use tracing::warn;

use super::sync::Synced;
use crate::{
    eviction::NodeCondition,
    runtime::{PodKey, PodStatus},
    server::status::{EventRow, PodRow},
};

impl Synced {
    /// Reports each problem line once (the watch reports new ones; spec errors are ours).
    pub fn log_problems(&mut self, lines: &[String]) {
        for l in lines {
            if self.reported.insert(l.clone()) {
                warn!(problem = %l, "Manifest skipped.");
                self.state
                    .status
                    .push_event(event("", format!("skipped: {l}")));
            }
        }
    }

    /// Problems the manifest watch has already logged: status events only.
    pub fn note_problems(&mut self, lines: &[String]) {
        for l in lines {
            if self.reported.insert(l.clone()) {
                self.state
                    .status
                    .push_event(event("", format!("skipped: {l}")));
            }
        }
    }

    /// A pod's runtime status changed: the table follows at once rather than at the next
    /// housekeeping tick.
    pub fn on_runtime_change(&self, conditions: &[NodeCondition]) {
        self.refresh_status(conditions, self.runtime.status());
    }

    pub(super) fn refresh_status(&self, conditions: &[NodeCondition], statuses: Vec<PodStatus>) {
        let Some(plan) = &self.plan else { return };
        let statuses: BTreeMap<PodKey, _> =
            statuses.into_iter().map(|s| (s.key.clone(), s)).collect();
        let rows = plan
            .pods
            .iter()
            .map(|p| {
                let entry = self
                    .pods
                    .iter()
                    .find(|(k, _)| k.namespace == p.namespace && k.name == p.name);
                let status = entry.and_then(|(k, _)| statuses.get(k));
                let working_set = entry
                    .and_then(|(_, e)| e.memory.as_ref())
                    .and_then(|m| m.read().ok())
                    .map(|r| r.working_set() as u64);
                PodRow {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    qos_class: format!("{:?}", p.qos_class),
                    phase: status.map_or_else(
                        || {
                            if self.enforce() {
                                "Pending".into()
                            } else {
                                "Planned".into()
                            }
                        },
                        |s| match &s.reason {
                            Some(r) => format!("{:?} ({r})", s.phase),
                            None => format!("{:?}", s.phase),
                        },
                    ),
                    cpu_weight: p.cpu_weight,
                    oom_score_adj: p
                        .containers
                        .iter()
                        .map(|c| format!("{}={}", c.name, c.oom_score_adj))
                        .collect(),
                    working_set_bytes: working_set,
                    memory_request_bytes: entry.map(|(_, e)| e.view.requests().memory_bytes()),
                    memory_limit_bytes: p.memory_limit_bytes,
                    runqueue_p99_seconds: entry.and_then(|(_, e)| e.runq_p99),
                    restarts: status
                        .map_or(0, |s| s.containers.iter().map(|c| c.restart_count).sum()),
                }
            })
            .collect();
        let mode = if self.enforce() { "enforce" } else { "observe" };
        self.state.status.update(|s| {
            s.node.mode = mode.into();
            s.node.memory_pressure = conditions.contains(&NodeCondition::MemoryPressure);
            s.node.pid_pressure = conditions.contains(&NodeCondition::PidPressure);
            s.pods = rows;
        });
    }
}

pub(super) fn event(pod: &str, message: String) -> EventRow {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    EventRow {
        time: format!("{}.{:03}", now.as_secs(), now.subsec_millis()),
        pod: pod.into(),
        message,
    }
}
