//! Eviction in cluster mode: the local kill first, then the API.
//!
//! At a hard threshold the node cannot wait for an API round trip, so the pod's processes stop
//! exactly as in standalone mode ([`CgroupKill`]: SIGTERM, the grace period, the cgroup kill).
//! Then, through the persistent [`WriteQueue`] (delivered when the API server is reachable, once
//! each, also across a restart): the `DisruptionTarget` condition, the Eviction API (soft
//! thresholds honour PodDisruptionBudgets and retry a 429; hard thresholds fall back to a delete
//! with a UID precondition), and a Warning Event `Evicted` with the kubelet's message. A pod that
//! goes with a `disruptionMode: all` unit also takes the unit's members on other nodes with it
//! (`gangEviction: unit`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{ApiResource, DynamicObject},
    runtime::reflector::Store,
};

use super::{
    queue::WriteQueue,
    source,
    writes::{ApiWrite, EventObject, PodRef, now},
};
use crate::{
    config::GangEviction,
    eviction::{CgroupKill, EvictionAction, EvictionRequest, Outcome, action::ActionError},
    policy::pod::PodKey,
    workload::{self, Forest, Kind, UnitRoot, disruption_unit},
};

/// The cluster's workload objects and the node's pods, to find a unit's groups.
#[derive(Clone)]
pub struct Gangs {
    pub pods: Store<Pod>,
    pub workloads: Vec<(ApiResource, Store<DynamicObject>)>,
}

impl Gangs {
    /// The PodGroups of the `disruptionMode: all` unit `key` belongs to (every leaf below the
    /// highest `all` ancestor), or `None` when the pod goes alone.
    pub fn unit_groups(&self, key: &PodKey) -> Option<Vec<String>> {
        let pod = self
            .pods
            .find(|p| p.metadata.uid.as_deref() == Some(key.uid.as_str()))?;
        let ns = key.namespace.as_str();
        let workloads: Vec<(ApiResource, Vec<Arc<DynamicObject>>)> = self
            .workloads
            .iter()
            .map(|(ar, s)| {
                let objs = s.state_filter(|o| o.metadata.namespace.as_deref() == Some(ns));
                (ar.clone(), objs)
            })
            .collect();
        let loaded = source::loaded_all(&[pod], &workloads);
        let objects = loaded
            .objects
            .iter()
            .filter_map(|raw| workload::decode(raw).ok());
        let forest = Forest::new(ns, objects);
        let unit = disruption_unit(&forest, &key.name)?;
        let UnitRoot::Group(top) = unit.root else {
            return None;
        };
        let groups: Vec<String> = forest
            .subtree(&top)
            .into_iter()
            .filter(|r| r.kind == Kind::PodGroup)
            .map(|r| r.name)
            .collect();
        (!groups.is_empty()).then_some(groups)
    }
}

/// The cluster eviction action.
pub struct ApiEviction {
    kill: CgroupKill,
    queue: Arc<WriteQueue>,
    node: String,
    gang: GangEviction,
    gangs: Option<Gangs>,
}

impl ApiEviction {
    pub fn new(
        queue: Arc<WriteQueue>,
        node: &str,
        gang: GangEviction,
        gangs: Option<Gangs>,
    ) -> Self {
        Self {
            kill: CgroupKill,
            queue,
            node: node.into(),
            gang,
            gangs,
        }
    }

    /// The writes one eviction makes, with their idempotency ids, in delivery order.
    pub fn writes(&self, req: &EvictionRequest, at: &str) -> Vec<(String, ApiWrite)> {
        let p = &req.pod;
        let pod = PodRef {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
        };
        let grace_secs = u32::try_from(req.grace.as_secs()).unwrap_or(u32::MAX);
        let mut out = vec![
            (
                format!("condition-{}", p.uid),
                ApiWrite::PodCondition {
                    pod: pod.clone(),
                    message: req.message.clone(),
                    at: at.into(),
                },
            ),
            (
                format!("evict-{}", p.uid),
                ApiWrite::Evict {
                    pod: pod.clone(),
                    grace_secs,
                    hard: req.hard,
                },
            ),
            (
                format!("event-{}", p.uid),
                ApiWrite::Event {
                    name: event_name(&p.name, &p.uid),
                    namespace: p.namespace.clone(),
                    object: EventObject {
                        kind: "Pod".into(),
                        namespace: Some(p.namespace.clone()),
                        name: p.name.clone(),
                        uid: p.uid.clone(),
                    },
                    reason: "Evicted".into(),
                    message: req.message.clone(),
                    type_: "Warning".into(),
                    node: self.node.clone(),
                    at: at.into(),
                },
            ),
        ];
        if req.unit.is_some()
            && self.gang == GangEviction::Unit
            && let Some(groups) = self.gangs.as_ref().and_then(|g| g.unit_groups(p))
        {
            out.push((
                format!("unit-{}", p.uid),
                ApiWrite::EvictUnitMembers {
                    namespace: p.namespace.clone(),
                    groups,
                    node: self.node.clone(),
                    grace_secs,
                    hard: req.hard,
                },
            ));
        }
        out
    }
}

/// `<pod>.qoslet-evicted-<first 8 of the uid>`: one event per evicted pod, a valid name.
fn event_name(pod: &str, uid: &str) -> String {
    let short: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    let mut name = format!("{pod}.qoslet-evicted-{}", short.to_ascii_lowercase());
    name.truncate(253);
    name
}

impl EvictionAction for ApiEviction {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        let local = self.kill.evict(req).await;
        // The API hears of it whether or not the local kill emptied the cgroups.
        let at = now();
        for (id, w) in self.writes(req, &at) {
            if let Err(e) = self.queue.push(&id, &req.pod.uid, w) {
                tracing::error!(pod = %req.pod, error = %e, "Could not queue an API write of an eviction; the API server will not hear of it.");
            }
        }
        local
    }
}

#[cfg(test)]
mod tests;
