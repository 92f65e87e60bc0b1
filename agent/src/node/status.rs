//! The status page's node line and pod table, rebuilt from the plan, the executor's statuses
//! and the last statistics sample (nothing is read from the kernel here).

use std::collections::BTreeMap;

use super::{Node, pod_status::PodStatus};
use crate::{eviction::NodeCondition, hub::status::PodRow, policy::pod::PodKey};

impl Node {
    pub(super) fn refresh_status(&self, conditions: &[NodeCondition], statuses: Vec<PodStatus>) {
        self.summary.set_statuses(&statuses);
        let Some(plan) = &self.plan else { return };
        let statuses: BTreeMap<PodKey, PodStatus> =
            statuses.into_iter().map(|s| (s.key.clone(), s)).collect();
        let evicted: Vec<PodKey> = crate::support::lock(&self.persisted).evicted().collect();
        let rows = plan
            .pods
            .iter()
            .map(|p| {
                let entry = self.tracked.pods.iter().find(|(k, _)| k.uid == p.uid);
                let status = entry.and_then(|(k, _)| statuses.get(k));
                let was_evicted = entry.is_some_and(|(k, _)| evicted.contains(k));
                let phase = match status {
                    Some(s) => match &s.reason {
                        Some(r) => format!("{:?} ({r})", s.phase),
                        None => format!("{:?}", s.phase),
                    },
                    None if was_evicted => "Failed (Evicted)".into(),
                    None if self.cgroups.enforce() => "Pending".into(),
                    None => "Planned".into(),
                };
                PodRow {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    qos_class: p.qos_class.as_str().into(),
                    phase,
                    cpu_weight: p.cpu_weight,
                    oom_score_adj: p
                        .containers
                        .iter()
                        .map(|c| format!("{}={}", c.name, c.oom_score_adj))
                        .collect(),
                    working_set_bytes: entry.and_then(|(_, e)| e.working_set),
                    memory_request_bytes: entry.map(|(_, e)| e.view.requests().memory_bytes()),
                    memory_limit_bytes: p.memory_limit_bytes,
                    runqueue_p99_seconds: entry.and_then(|(_, e)| e.runq_p99),
                    restarts: status
                        .map_or(0, |s| s.containers.iter().map(|c| c.restart_count).sum()),
                    message: status.and_then(|s| s.message.clone()),
                }
            })
            .collect();
        let mode = if self.cgroups.enforce() {
            "enforce"
        } else {
            "observe"
        };
        self.report.state.status.update(|s| {
            s.node.mode = mode.into();
            s.node.memory_pressure = conditions.contains(&NodeCondition::MemoryPressure);
            s.node.pid_pressure = conditions.contains(&NodeCondition::PidPressure);
            s.pods = rows;
        });
    }
}
