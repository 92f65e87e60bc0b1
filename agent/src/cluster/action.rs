//! Eviction in cluster mode, as the kubelet's eviction manager does it (`evictionMethod:
//! kubelet`, the default), in an order that never shows a pod terminal while its code runs:
//!
//! 1. **freeze** the pod's cgroup ([`PodCgroups::freeze`]): within a millisecond of the decision
//!    the offender stops running and allocating;
//! 2. **publish** `pods/status`: phase Failed, reason Evicted, the kubelet's message and the
//!    `DisruptionTarget` condition, waiting for the API server to take it
//!    ([`STATUS_BEFORE_KILL`] at most);
//! 3. **settle**: the status must stand on the API server for [`STATUS_SETTLE`] as the pod watch
//!    shows it, sent again when the kubelet's phase is written back over it, so that the
//!    kubelet's copy of the pod says Failed when the kill makes it sync;
//! 4. **kill** the frozen processes ([`CgroupKill`] with no grace: a frozen process cannot run a
//!    SIGTERM handler, and thawing it for one would run it while the API says Failed), then thaw
//!    the emptied cgroup.
//!
//! The status must reach the kubelet before its PLEG sees the containers die, or it restarts
//! them (restartPolicy Always) and writes Running back; and it must not be published while they
//! run, or a StatefulSet's controller deletes the pod and starts its replacement beside the old
//! containers, and the scheduler counts their memory as free. Frozen, they do neither. The
//! kubelet's pod worker then tears the pod down; the pod object is never deleted and
//! PodDisruptionBudgets are not consulted, as the kubelet does not. A graceful stop at a soft
//! threshold is `evictionMethod: api`'s. A write still queued at the kill stays queued until
//! delivered; the pod's eviction mark (`marks.rs`) covers a queue that was lost.
//!
//! `evictionMethod: api` asks the Eviction API instead at a soft threshold (PodDisruptionBudgets
//! honoured, a 429 retried) and kills nothing locally; a hard threshold is handled as above.
//!
//! Every write goes through the persistent [`WriteQueue`] bound to the pod's UID, with a Warning
//! Event `Evicted` annotated as the kubelet's (`AnnotatedEventf` in eviction_manager.go
//! `evictPod`, line 643: `offending_containers`, `offending_containers_usage`,
//! `starved_resource`, ...). With `gangEviction: unit`, a pod that goes with a `disruptionMode: all` unit
//! also takes the unit's members on other nodes, resolved to their UIDs when the decision is made
//! and evicted through the Eviction API.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};

use super::{
    queue::WriteQueue,
    unit::UnitMembers,
    writes::{ApiWrite, EventObject, now as now_rfc3339},
};
use crate::{
    config::{EvictionMethod, GangEviction},
    eviction::{
        CgroupKill, EvictionAction, EvictionRequest, Outcome,
        action::{ActionError, EvictedStatus},
    },
    policy::pod::PodKey,
};

/// How long the decision waits for the API server to name a unit's members on other nodes.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a frozen pod waits for its Failed status to reach the API server before the kill:
/// an API server on the node's network answers in milliseconds; one that does not is in
/// trouble. The frozen pod allocates nothing meanwhile, but holds what it has, so the node's
/// memory is not left waiting longer.
pub const STATUS_BEFORE_KILL: Duration = Duration::from_secs(1);

/// How long the pod's Failed status must stand on the API server, as the pod watch shows it,
/// before the kill. The API server taking the status does not mean the kubelet holds it: a
/// status-only update reaches the kubelet's copy of the pod through its own watch (v1.37.2
/// `HandlePodReconcile` stores it and syncs nothing), and its status manager may write its own
/// phase back over it (`mergePodStatus` keeps the kubelet's phase), for one when a container
/// just became ready. The kill makes the kubelet sync the pod; if its copy does not say Failed
/// by then, it restarts the container (restartPolicy Always) and writes Running back: the churn
/// test on the real cluster saw that once in 22 evictions. A status seen standing for this long
/// in qoslet's watch has reached the kubelet's too (both watch the same API server).
pub const STATUS_SETTLE: Duration = Duration::from_millis(300);

/// The most the settle may take with the status written back and sent again; the kill goes
/// then (the node's memory cannot wait longer).
pub const SETTLE_BEFORE_KILL: Duration = Duration::from_secs(3);

/// How often the settle looks at the pod watch.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// The cluster eviction action.
pub struct ApiEviction {
    kill: CgroupKill,
    queue: Arc<WriteQueue>,
    node: String,
    method: EvictionMethod,
    /// Set with `gangEviction: unit` (and a cluster that serves the Workload API).
    members: Option<UnitMembers>,
    /// The node's pods as the source's watch keeps them: while a frozen pod waits for the
    /// kubelet, a phase the kubelet wrote back over the Failed status is seen here.
    pods: Option<Store<Pod>>,
}

impl ApiEviction {
    pub fn new(
        queue: Arc<WriteQueue>,
        node: &str,
        method: EvictionMethod,
        gang: GangEviction,
        members: Option<UnitMembers>,
    ) -> Self {
        Self {
            kill: CgroupKill,
            queue,
            node: node.into(),
            method,
            members: members.filter(|_| gang == GangEviction::Unit),
            pods: None,
        }
    }

    /// Watches `pods` (the source's store) for a phase written back over an eviction's status.
    pub fn with_pod_store(mut self, pods: Store<Pod>) -> Self {
        self.pods = Some(pods);
        self
    }

    /// The pod's phase as the watch last showed it (same UID); `None` without a store or pod.
    fn watched_phase(&self, pod: &PodKey) -> Option<String> {
        let key = ObjectRef::new(&pod.name).within(&pod.namespace);
        let p = self.pods.as_ref()?.get(&key)?;
        (p.metadata.uid.as_deref() == Some(pod.uid.as_str()))
            .then(|| p.status.as_ref()?.phase.clone())
            .flatten()
    }

    /// Waits until the pod watch has shown the Failed status standing for [`STATUS_SETTLE`],
    /// sending it again whenever the kubelet's phase is written back over it, at most
    /// [`SETTLE_BEFORE_KILL`]. Whether it settled. Without a store: the settle time alone.
    async fn settle_status(&self, req: &EvictionRequest) -> bool {
        if self.pods.is_none() {
            tokio::time::sleep(STATUS_SETTLE).await;
            return true;
        }
        let deadline = tokio::time::Instant::now() + SETTLE_BEFORE_KILL;
        let mut failed_since: Option<tokio::time::Instant> = None;
        let mut sent_again = 0;
        loop {
            let now = tokio::time::Instant::now();
            if self.watched_phase(&req.pod).as_deref() == Some("Failed") {
                if now - *failed_since.get_or_insert(now) >= STATUS_SETTLE {
                    return true;
                }
            } else if failed_since.take().is_some() {
                // Failed was seen, and now another phase: written back. (Before Failed is seen
                // at all, the watch has not delivered it yet.)
                sent_again += 1;
                tracing::info!(pod = %req.pod, sent_again, "The kubelet wrote the evicted pod's phase back over its Failed status; sending it again.");
                let writes = self.writes(req, &now_rfc3339());
                self.push(req, writes.into_iter().take(1).collect());
            }
            if now > deadline {
                return false;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// Whether this eviction kills locally (else the Eviction API alone acts).
    fn kills_locally(&self, req: &EvictionRequest) -> bool {
        self.method == EvictionMethod::Kubelet || req.hard
    }

    /// The writes one eviction of this node's pod makes, with their idempotency ids, in
    /// delivery order.
    pub fn writes(&self, req: &EvictionRequest, at: &str) -> Vec<(String, ApiWrite)> {
        let p = &req.pod;
        let first = if self.kills_locally(req) {
            (
                format!("evicted-{}", p.uid),
                ApiWrite::PodEvicted {
                    pod: p.clone(),
                    message: req.message.clone(),
                    at: at.into(),
                    seen: req.seen.clone(),
                },
            )
        } else {
            (
                format!("evict-{}", p.uid),
                ApiWrite::Evict {
                    pod: p.clone(),
                    grace_secs: grace_secs(req),
                },
            )
        };
        vec![
            first,
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
                    reason: crate::eviction::action::EVICTED.into(),
                    message: req.message.clone(),
                    type_: "Warning".into(),
                    node: self.node.clone(),
                    at: at.into(),
                    count: 1,
                    annotations: req.annotations.clone(),
                },
            ),
        ]
    }

    /// The unit's live members on other nodes, by UID, now; empty when the pod goes alone or
    /// the API server cannot say in time (they are then left, and a later decision on their own
    /// nodes handles them).
    async fn members_elsewhere(&self, req: &EvictionRequest) -> Vec<PodKey> {
        let (Some(m), Some(_)) = (&self.members, &req.unit) else {
            return Vec::new();
        };
        match tokio::time::timeout(RESOLVE_TIMEOUT, m.resolve(&req.pod, &self.node)).await {
            Ok(Ok(members)) => members,
            Ok(Err(e)) => {
                tracing::warn!(pod = %req.pod, error = %e, "Could not list the unit's members on other nodes; they are not evicted.");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!(pod = %req.pod, timeout = ?RESOLVE_TIMEOUT, "The API server did not name the unit's members on other nodes in time; they are not evicted.");
                Vec::new()
            }
        }
    }

    fn push(&self, req: &EvictionRequest, writes: Vec<(String, ApiWrite)>) {
        for (id, w) in writes {
            let key = match &w {
                ApiWrite::Evict { pod, .. } => pod.uid.clone(),
                _ => req.pod.uid.clone(),
            };
            if let Err(e) = self.queue.push(&id, &key, w) {
                tracing::error!(pod = %req.pod, error = %e, "Could not queue an API write of an eviction; the API server will not hear of it.");
            }
        }
    }
}

fn grace_secs(req: &EvictionRequest) -> u32 {
    u32::try_from(req.grace.as_secs()).unwrap_or(u32::MAX)
}

/// The Eviction API writes for a unit's members on other nodes.
pub fn member_writes(members: &[PodKey], grace_secs: u32) -> Vec<(String, ApiWrite)> {
    members
        .iter()
        .map(|pod| {
            (
                format!("evict-{}", pod.uid),
                ApiWrite::Evict {
                    pod: pod.clone(),
                    grace_secs,
                },
            )
        })
        .collect()
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
    fn awaiting(&self) -> Option<PodKey> {
        self.queue.pending_eviction()
    }

    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        if self.kills_locally(req) {
            // The order is the module doc's: freeze, publish, settle, kill.
            let frozen_at = req.cgroups.freeze().await;
            let writes = self.writes(req, &now_rfc3339());
            let status_id = writes.first().map(|(id, _)| id.clone()).unwrap_or_default();
            self.push(req, writes);
            if !self.queue.settled(&status_id, STATUS_BEFORE_KILL).await {
                tracing::warn!(pod = %req.pod, waited = ?STATUS_BEFORE_KILL, "The API server did not take the pod's Failed status in time; killing it anyway (the kubelet may restart its containers until the status arrives).");
            } else if !self.settle_status(req).await {
                tracing::warn!(pod = %req.pod, waited = ?SETTLE_BEFORE_KILL, "The pod's Failed status did not stand on the API server in time; killing it anyway (the kubelet may restart its containers).");
            }
            let kill = EvictionRequest {
                grace: Duration::ZERO,
                ..req.clone()
            };
            let queued = self.members_elsewhere(req);
            let (local, members) = tokio::join!(self.kill.evict(&kill), queued);
            self.push(req, member_writes(&members, grace_secs(req)));
            // The kill returns once the cgroups are empty; a pod it could not empty stays frozen.
            let mut outcome = local?;
            req.cgroups.thaw();
            outcome.first_signal_at = frozen_at.into_iter().chain(outcome.first_signal_at).min();
            Ok(outcome)
        } else {
            self.push(req, self.writes(req, &now_rfc3339()));
            let members = self.members_elsewhere(req).await;
            self.push(req, member_writes(&members, grace_secs(req)));
            Ok(Outcome {
                first_signal_at: None,
                signalled: 0,
                status: EvictedStatus::new(req.message.clone(), &req.seen),
            })
        }
    }
}

#[cfg(test)]
mod tests;
