//! Eviction in cluster mode, as the kubelet's eviction manager does it (`evictionMethod:
//! kubelet`, the default), in an order that never shows a pod terminal while its code runs:
//!
//! 1. **freeze** the pod's cgroup ([`PodCgroups::freeze`]): within a millisecond of the decision
//!    the offender stops running and allocating;
//! 2. **publish** `pods/status`: phase Failed, reason Evicted, the kubelet's message and the
//!    `DisruptionTarget` condition, waiting for the API server to take it
//!    ([`STATUS_BEFORE_KILL`] at most);
//! 3. **annotate** the pod ([`ApiWrite::EvictedAt`], `qoslet.dev/evicted-at`), once the status
//!    was taken: a metadata change makes the kubelet's pod worker sync the pod from a copy that
//!    says Failed, so its status manager holds Failed from then on;
//! 4. **see** the annotated, Failed copy in the pod watch ([`SEEN_BEFORE_KILL`] at most), as the
//!    kubelet's own watch sees it;
//! 5. **kill** the frozen processes ([`CgroupKill`] with no grace: a frozen process cannot run a
//!    SIGTERM handler, and thawing it for one would run it while the API says Failed), then thaw
//!    the emptied cgroup. Here qoslet is not the kubelet: at a hard threshold the kubelet's
//!    eviction manager passes `immediateEvictionGracePeriodSeconds` (1 s,
//!    pkg/kubelet/eviction/eviction_manager.go `synchronize`), which `killContainer`
//!    (pkg/kubelet/kuberuntime/kuberuntime_container.go) raises to `minimumGracePeriodInSeconds`
//!    (2 s): SIGTERM, then SIGKILL 2 s later. qoslet kills at once: on a fast ramp a 2 s grace
//!    loses the race to the kernel's OOM killer;
//! 6. **guard** the status for [`GUARD_AFTER_KILL`]: a phase the kubelet's status manager writes
//!    back over it is answered by sending it again, so that the kill's sync finds Failed.
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
    writes::{ApiWrite, EVICTED_AT, EventObject, now},
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
pub(crate) const STATUS_BEFORE_KILL: Duration = Duration::from_secs(1);

/// The API server taking the Failed status does not mean the kubelet holds it. A status-only
/// update reaches the kubelet's copy of the pod through its own watch and makes it sync nothing
/// (v1.37.2 `HandlePodReconcile`); the kill makes it sync, from whatever its copy says then. And
/// its status manager writes its own cached phase (Running) back over a status that differs from
/// it: when its own status changes (`mergePodStatus` keeps the kubelet's phase), and in its
/// reconcile every 10 s (`syncBatch` / `needsReconcile`). If the copy says Running when the
/// kill's sync comes (the generic PLEG's relist, up to 1 s after the kill), the kubelet restarts
/// the container (restartPolicy Always) and the pod runs again. The churn test on the real
/// cluster saw that about once in 20 evictions. Waiting for qoslet's watch to show the status
/// and answering every write-back narrows that race; it cannot close it. A metadata change is an
/// UPDATE to the kubelet (config.go `podsDifferSemantically`): its pod worker syncs at once from
/// the copy that says Failed, its status manager takes Failed (`generateAPIPodStatus` keeps a
/// terminal API phase) and stops writing Running back, and the pod is torn down, not restarted.
/// So the status is followed by the [`ApiWrite::EvictedAt`] annotation, and qoslet kills once
/// its own pod watch shows the annotated copy Failed (the kubelet's watch of the same API server
/// has it then too), at most [`SEEN_BEFORE_KILL`] after the API server took both; a phase still
/// written back over it is answered, until [`GUARD_AFTER_KILL`] after the kill, by sending the
/// status again at once.
pub(crate) const SEEN_BEFORE_KILL: Duration = Duration::from_secs(1);

/// How long after the kill a phase written back over the Failed status is answered (the PLEG's
/// 1 s relist and the sync after it, with margin).
pub(crate) const GUARD_AFTER_KILL: Duration = Duration::from_secs(3);

/// How often the pod watch is looked at before and after the kill.
const WATCH_POLL: Duration = Duration::from_millis(10);

/// The pod as `store` has it (same UID): its phase (empty without one) and its [`EVICTED_AT`]
/// annotation; `None` when the pod is gone (or replaced under its name).
fn watched(store: &Store<Pod>, pod: &PodKey) -> Option<(String, Option<String>)> {
    let key = ObjectRef::new(&pod.name).within(&pod.namespace);
    let p = store.get(&key)?;
    (p.metadata.uid.as_deref() == Some(pod.uid.as_str())).then(|| {
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let at = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(EVICTED_AT).cloned());
        (phase, at)
    })
}

fn watched_phase(store: &Store<Pod>, pod: &PodKey) -> Option<String> {
    watched(store, pod).map(|(phase, _)| phase)
}

/// The cluster eviction action.
pub(crate) struct ApiEviction {
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
    pub(crate) fn new(
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
    pub(crate) fn with_pod_store(mut self, pods: Store<Pod>) -> Self {
        self.pods = Some(pods);
        self
    }

    /// Waits until the pod watch shows the pod annotated [`EVICTED_AT`] `at` with phase Failed
    /// in the same copy (the copy the kubelet's pod worker syncs), or the pod gone (a
    /// StatefulSet's controller deletes a Failed pod at once: a terminal pod needs no graceful
    /// deletion, and its replacement may start while this one waits), at most
    /// [`SEEN_BEFORE_KILL`]; whether it did. A copy annotated but Running again (the kubelet's
    /// status manager wrote its phase back between the two writes) gets `status` and a new
    /// annotation again. Without a store, at once.
    async fn kubelet_synced(
        &self,
        req: &EvictionRequest,
        at: &str,
        status: &(String, ApiWrite),
    ) -> bool {
        let Some(store) = &self.pods else {
            return true;
        };
        let pod = &req.pod;
        let deadline = tokio::time::Instant::now() + SEEN_BEFORE_KILL;
        let mut at = at.to_owned();
        loop {
            match watched(store, pod) {
                None => return true,
                Some((phase, seen)) if seen.as_deref() == Some(at.as_str()) => {
                    if phase == "Failed" {
                        return true;
                    }
                    tracing::info!(%pod, "The kubelet wrote the phase back before the pod was annotated; sending the status and the annotation again.");
                    at = now();
                    self.push(req, vec![status.clone(), evicted_at(pod, &at)]);
                }
                Some(_) => {}
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(WATCH_POLL).await;
        }
    }

    /// Until [`GUARD_AFTER_KILL`] from now, answers a phase written back over the pod's Failed
    /// status (after the watch showed it Failed) by queueing `status` again, in a task of its
    /// own: the eviction does not wait for it.
    fn guard_status(&self, pod: &PodKey, status: (String, ApiWrite)) {
        let Some(store) = self.pods.clone() else {
            return;
        };
        let (queue, pod) = (self.queue.clone(), pod.clone());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + GUARD_AFTER_KILL;
            let mut failed = false;
            let mut sent_again = 0;
            while tokio::time::Instant::now() < deadline {
                match watched_phase(&store, &pod).as_deref() {
                    Some("Failed") => failed = true,
                    Some(_) if failed => {
                        failed = false;
                        sent_again += 1;
                        tracing::info!(%pod, sent_again, "The kubelet wrote the evicted pod's phase back over its Failed status; sending it again.");
                        if let Err(e) = queue.push(&status.0, &pod.uid, status.1.clone()) {
                            tracing::error!(%pod, error = %e, "Could not queue the evicted pod's status again.");
                        }
                    }
                    _ => {}
                }
                tokio::time::sleep(WATCH_POLL).await;
            }
        });
    }

    /// Whether this eviction kills locally (else the Eviction API alone acts).
    fn kills_locally(&self, req: &EvictionRequest) -> bool {
        self.method == EvictionMethod::Kubelet || req.hard
    }

    /// The writes one eviction of this node's pod makes, with their idempotency ids, in
    /// delivery order.
    pub(crate) fn writes(&self, req: &EvictionRequest, at: &str) -> Vec<(String, ApiWrite)> {
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
        // Same key (the UID): the queue sends them in this order, the annotation once the
        // status was taken, so the annotated copy says Failed.
        let annotated = self.kills_locally(req).then(|| evicted_at(p, at));
        [first]
            .into_iter()
            .chain(annotated)
            .chain([(
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
            )])
            .collect()
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
pub(crate) fn member_writes(members: &[PodKey], grace_secs: u32) -> Vec<(String, ApiWrite)> {
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

/// The [`ApiWrite::EvictedAt`] of an eviction at `at`, with its idempotency id.
fn evicted_at(pod: &PodKey, at: &str) -> (String, ApiWrite) {
    (
        format!("evicted-at-{}", pod.uid),
        ApiWrite::EvictedAt {
            pod: pod.clone(),
            at: at.into(),
        },
    )
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
            // The order is the module doc's: freeze, publish, annotate, see, kill, guard.
            let frozen_at = req.cgroups.freeze().await;
            let at = now();
            let writes = self.writes(req, &at);
            let status = writes[0].clone();
            let annotation_id = evicted_at(&req.pod, &at).0;
            self.push(req, writes);
            if !self.queue.settled(&annotation_id, STATUS_BEFORE_KILL).await {
                tracing::warn!(pod = %req.pod, waited = ?STATUS_BEFORE_KILL, "The API server did not take the pod's Failed status and annotation in time; killing it anyway (the kubelet may restart its containers until the status arrives).");
            } else if !self.kubelet_synced(req, &at, &status).await {
                tracing::warn!(pod = %req.pod, waited = ?SEEN_BEFORE_KILL, "The pod watch did not show the pod Failed and annotated in time; killing it anyway.");
            }
            self.guard_status(&req.pod, status);
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
            self.push(req, self.writes(req, &now()));
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
