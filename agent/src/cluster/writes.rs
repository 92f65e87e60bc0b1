//! The API writes of cluster mode and their delivery, each one of kube's typed calls.
//!
//! [`deliver`] sends one [`ApiWrite`] and says whether it is done, to be retried, or refused for
//! good: answers that mean "already done" (the pod is gone, the event exists) count as done, so
//! a write delivered twice after a crash has no second effect. Only answers that no retry can
//! change are [`Delivery::Rejected`]: a failed UID precondition (422 for a status patch, 409 with
//! "Precondition failed" for an eviction), 410 Gone and a body the API server cannot take (400,
//! 413, 415, 422, among them an admission policy's denial). 401, 403 and any other 409 are
//! retried within the queue's TTL: an API server restarting, a token being rotated or an RBAC
//! binding being applied answer so for a while.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::{
        core::v1::{Event, EventSource, Node, ObjectReference, Pod, Taint},
        policy::v1::Eviction,
    },
    apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    core::Status,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{
    eviction::{EvictedStatus, SeenPod},
    policy::pod::PodKey,
};

/// The component that writes events, conditions and the lease.
pub(crate) const COMPONENT: &str = "qoslet";

/// One write to the API server, as queued (and persisted) until delivered. Every write about a
/// pod names its UID, which the API server checks: a pod re-created under the same name is never
/// touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "write", rename_all = "camelCase")]
pub(crate) enum ApiWrite {
    /// `pods/status` as the kubelet's eviction manager leaves it: phase Failed, reason Evicted,
    /// the eviction message, the `DisruptionTarget` condition (reason `TerminationByKubelet`),
    /// `Ready` and `ContainersReady` False (reason `PodFailed`) and the observed generation
    /// ([`EvictedStatus`]). The kubelet's pod worker tears down a pod the API shows Failed, and
    /// its containers are not restarted; the pod object stays (the kubelet never deletes it
    /// either).
    #[serde(rename_all = "camelCase")]
    PodEvicted {
        pod: PodKey,
        message: String,
        at: String,
        /// The pod's generation and conditions when the eviction was decided (absent from a
        /// write queued by an older qoslet: generation 0, no condition kept).
        #[serde(default)]
        seen: SeenPod,
    },
    /// The annotation [`EVICTED_AT`] on the pod (metadata, not status), sent once its Failed
    /// status was taken. A change of a pod's annotations is an UPDATE to the kubelet's pod config
    /// (v1.37.2 config.go `podsDifferSemantically`), which makes its pod worker sync the pod with
    /// the copy that says Failed: its status manager then holds Failed and the pod is torn down,
    /// not restarted. A status-only change is a RECONCILE and syncs nothing (`action.rs` says
    /// more). The node-binding admission policy allows qoslet only this annotation, only on its
    /// own node's pods.
    #[serde(rename_all = "camelCase")]
    EvictedAt { pod: PodKey, at: String },
    /// The Eviction API (`evictionMethod: api`, and a unit's members on other nodes): honours
    /// PodDisruptionBudgets; a 429 is retried.
    #[serde(rename_all = "camelCase")]
    Evict { pod: PodKey, grace_secs: u32 },
    /// A Warning Event on a pod or the node.
    #[serde(rename_all = "camelCase")]
    Event {
        /// The Event's name: the first delivery creates it; a repeat (`count` > 1) of the same
        /// name updates its count and last timestamp instead of making another Event.
        name: String,
        namespace: String,
        object: EventObject,
        reason: String,
        message: String,
        type_: String,
        node: String,
        at: String,
        #[serde(default = "one")]
        count: i32,
        /// `metadata.annotations` (the kubelet's eviction Event: `AnnotatedEventf` with
        /// `evictionMessage`'s annotations); none on other Events.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        annotations: BTreeMap<String, String>,
    },
    /// A node condition of qoslet's own type on `nodes/status`; the newest replaces older ones.
    #[serde(rename_all = "camelCase")]
    NodeCondition {
        node: String,
        type_: String,
        status: bool,
        reason: String,
        message: String,
        at: String,
    },
    /// qoslet's NoSchedule taint on the node (`taintOnPressure`), set or removed.
    #[serde(rename_all = "camelCase")]
    NodeTaint { node: String, on: bool },
}

fn one() -> i32 {
    1
}

/// The annotation of [`ApiWrite::EvictedAt`]: the eviction's time (RFC 3339), on a pod qoslet
/// evicted in the kubelet's way.
pub(crate) const EVICTED_AT: &str = "qoslet.dev/evicted-at";

/// The taint `taintOnPressure` sets while a qoslet pressure condition is true.
pub(crate) const TAINT_KEY: &str = "qoslet.dev/pressure";

impl ApiWrite {
    /// Which of the writes due goes first (lowest): a pod's Failed status, which the kubelet
    /// must see before the kill, then Eviction API calls, then Events and node writes.
    pub(crate) fn priority(&self) -> u8 {
        match self {
            Self::PodEvicted { .. } | Self::EvictedAt { .. } => 0,
            Self::Evict { .. } => 1,
            Self::Event { .. } => 2,
            Self::NodeCondition { .. } => 3,
            Self::NodeTaint { .. } => 4,
        }
    }

    /// The write's kind, for metrics and logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::PodEvicted { .. } => "podEvicted",
            Self::EvictedAt { .. } => "evictedAt",
            Self::Evict { .. } => "evict",
            Self::Event { .. } => "event",
            Self::NodeCondition { .. } => "nodeCondition",
            Self::NodeTaint { .. } => "nodeTaint",
        }
    }
}

/// What an Event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EventObject {
    pub(crate) kind: String,
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// The result of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Done, or nothing left to do (the object is gone).
    Done,
    /// Try again later: the API server is unreachable, overloaded, refused for now (a PDB's 429)
    /// or not yet allowing it (401, 403). `after`: its Retry-After, when it gave one.
    Retry {
        why: String,
        after: Option<Duration>,
    },
    /// Refused for good (a UID precondition that failed because the pod is another one now, an
    /// invalid body, a denial by an admission policy): never retried. The queue counts and logs
    /// it and drops the write.
    Rejected { code: u16, message: String },
}

impl Delivery {
    /// A retry with no Retry-After.
    pub(crate) fn retry(why: impl Into<String>) -> Self {
        Self::Retry {
            why: why.into(),
            after: None,
        }
    }
}

/// Now, in the API's RFC 3339 form.
pub(crate) fn now() -> String {
    Timestamp::try_from(SystemTime::now())
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

fn time(at: &str) -> Option<Time> {
    at.parse::<Timestamp>().ok().map(Time)
}

/// The `policy/v1` Eviction of `pods/{name}/eviction`: grace and a UID precondition.
pub(crate) fn eviction_body(pod: &PodKey, grace_secs: u32) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(delete_options(pod, grace_secs)),
    }
}

fn delete_options(pod: &PodKey, grace_secs: u32) -> DeleteOptions {
    DeleteOptions {
        grace_period_seconds: Some(grace_secs.into()),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteOptions::default()
    }
}

/// The strategic merge patch of `pods/status` the kubelet's status manager sends after an
/// eviction (pkg/util/pod `PatchPodStatus`: `metadata.uid` in the patch is the precondition; the
/// API server answers 422, uid immutable, when the pod is another one now), with the status of
/// [`EvictedStatus`]. Conditions merge by type; one the pod already had at the same status
/// carries no `lastTransitionTime`, so the pod's stays (status_manager.go
/// `updateLastTransitionTime`); the others' is the eviction's time. A generation of 0 (a pod
/// without one) is left out, as the API's `omitempty` does.
pub(crate) fn pod_evicted_patch(
    pod: &PodKey,
    message: &str,
    seen: &SeenPod,
    at: &str,
) -> serde_json::Value {
    // The status an eviction leaves is said once (`eviction::action::EvictedStatus`).
    let status = EvictedStatus::new(message.to_owned(), seen);
    let conditions: Vec<serde_json::Value> = status
        .conditions
        .iter()
        .map(|c| {
            let mut v = json!({
                "type": c.type_,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
            });
            if c.observed_generation != 0 {
                v["observedGeneration"] = json!(c.observed_generation);
            }
            if !c.unchanged {
                v["lastTransitionTime"] = json!(at);
            }
            v
        })
        .collect();
    let mut patch = json!({
        "metadata": {"uid": pod.uid},
        "status": {
            "phase": status.phase,
            "reason": status.reason,
            "message": status.message,
            "conditions": conditions,
        },
    });
    if status.observed_generation != 0 {
        patch["status"]["observedGeneration"] = json!(status.observed_generation);
    }
    patch
}

/// The merge patch of [`ApiWrite::EvictedAt`]: the annotation alone, with `metadata.uid` as the
/// precondition (a pod that is another one now answers 422, uid immutable).
pub(crate) fn evicted_at_patch(pod: &PodKey, at: &str) -> serde_json::Value {
    json!({"metadata": {"uid": pod.uid, "annotations": {EVICTED_AT: at}}})
}

/// The core/v1 Event: `POST namespaces/{ns}/events`.
pub(crate) fn event_body(w: &ApiWrite) -> Option<Event> {
    let ApiWrite::Event {
        name,
        namespace,
        object,
        reason,
        message,
        type_,
        node,
        at,
        count,
        annotations,
    } = w
    else {
        return None;
    };
    let t = time(at);
    Some(Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            annotations: (!annotations.is_empty()).then(|| annotations.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some(object.kind.clone()),
            namespace: object.namespace.clone(),
            name: Some(object.name.clone()),
            uid: Some(object.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some(reason.clone()),
        message: Some(message.clone()),
        type_: Some(type_.clone()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node.clone()),
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.clone()),
        first_timestamp: t.clone(),
        last_timestamp: t,
        count: Some(*count),
        ..Event::default()
    })
}

/// The strategic merge patch of `nodes/status` with one condition of qoslet's own type (merged
/// by type: the kubelet's conditions are left alone).
pub(crate) fn node_condition_patch(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    at: &str,
) -> serde_json::Value {
    json!({"status": {"conditions": [{
        "type": type_,
        "status": if status { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": at,
        "lastTransitionTime": at,
    }]}})
}

/// The HTTP status of a failed request, when the API server answered.
fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// How a failed request ends (see the module doc): 404 (the object is gone) is done; a refusal
/// no retry can change is rejected; everything else, a transport error included, is retried,
/// no sooner than the API server's Retry-After (`details.retryAfterSeconds`, which it sets with
/// the header on a 429 and a 503).
fn failed(what: &str, e: &kube::Error) -> Delivery {
    let message = format!("{what}: {e}");
    let kube::Error::Api(status) = e else {
        return Delivery::retry(message);
    };
    let precondition = status.code == 409 && status.message.contains("Precondition failed");
    match status.code {
        404 => Delivery::Done,
        400 | 410 | 413 | 415 | 422 => Delivery::Rejected {
            code: status.code,
            message,
        },
        409 if precondition => Delivery::Rejected {
            code: status.code,
            message,
        },
        _ => Delivery::Retry {
            why: message,
            after: status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s.into())),
        },
    }
}

/// How a write's answer sorts. The typed calls decode the object the API server answers with;
/// an answer that does not decode still came with a 2xx (an error status is
/// [`kube::Error::Api`]), so the write was taken: done, as a raw request's was.
fn sorted<T>(what: &str, answer: Result<T, kube::Error>) -> Delivery {
    match answer {
        Ok(_) | Err(kube::Error::SerdeError(_)) => Delivery::Done,
        Err(e) => failed(what, &e),
    }
}

/// Sends one write.
pub(crate) async fn deliver(client: &Client, w: &ApiWrite) -> Delivery {
    match w {
        ApiWrite::PodEvicted {
            pod,
            message,
            at,
            seen,
        } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
            let patch = Patch::Strategic(pod_evicted_patch(pod, message, seen, at));
            sorted(
                "pod status",
                api.patch_status(&pod.name, &PatchParams::default(), &patch)
                    .await,
            )
        }
        ApiWrite::EvictedAt { pod, at } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
            let patch = Patch::Merge(evicted_at_patch(pod, at));
            sorted(
                "pod annotation",
                api.patch(&pod.name, &PatchParams::default(), &patch).await,
            )
        }
        // Not `Api::evict`: kube (5.0) sends its `delete_options` in snake case, which the API
        // server does not read, so the grace period and the UID precondition would be lost. The
        // same POST with a `policy/v1` Eviction as the body.
        ApiWrite::Evict { pod, grace_secs } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
            let answer = api
                .create_subresource::<_, Status>(
                    "eviction",
                    &pod.name,
                    &PostParams::default(),
                    &eviction_body(pod, *grace_secs),
                )
                .await;
            sorted("eviction", answer)
        }
        ApiWrite::Event {
            name,
            namespace,
            message,
            at,
            count,
            ..
        } => {
            let Some(event) = event_body(w) else {
                return Delivery::Done;
            };
            let api: Api<Event> = Api::namespaced(client.clone(), namespace);
            match api.create(&PostParams::default(), &event).await {
                // The Event exists: the first delivery of this one (done), or an earlier one of
                // the same series, whose count this repeat carries on.
                Err(e) if code(&e) == Some(409) && *count <= 1 => Delivery::Done,
                Err(e) if code(&e) == Some(409) => {
                    let patch = Patch::Merge(json!({
                        "count": count,
                        "message": message,
                        "lastTimestamp": at,
                    }));
                    sorted(
                        "event repeat",
                        api.patch(name, &PatchParams::default(), &patch).await,
                    )
                }
                answer => sorted("event", answer),
            }
        }
        ApiWrite::NodeCondition {
            node,
            type_,
            status,
            reason,
            message,
            at,
        } => {
            let api: Api<Node> = Api::all(client.clone());
            let patch = Patch::Strategic(node_condition_patch(type_, *status, reason, message, at));
            sorted(
                "node condition",
                api.patch_status(node, &PatchParams::default(), &patch)
                    .await,
            )
        }
        ApiWrite::NodeTaint { node, on } => set_taint(client, node, *on).await,
    }
}

/// Adds or removes qoslet's taint, the node's other taints kept. `spec.taints` is replaced
/// whole by a patch, so the patch carries the resourceVersion it was computed from: a write of
/// the node in between makes it a 409, retried against the new taints.
async fn set_taint(client: &Client, node: &str, on: bool) -> Delivery {
    let api: Api<Node> = Api::all(client.clone());
    let current = match api.get(node).await {
        Ok(n) => n,
        Err(e) => return failed("node taint", &e),
    };
    let mut taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
    let had = taints.iter().any(|t| t.key == TAINT_KEY);
    if had == on {
        return Delivery::Done;
    }
    taints.retain(|t| t.key != TAINT_KEY);
    if on {
        taints.push(Taint {
            key: TAINT_KEY.into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        });
    }
    let patch = Patch::Merge(json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": {"taints": taints},
    }));
    match api.patch(node, &PatchParams::default(), &patch).await {
        Err(e) if code(&e) == Some(409) => Delivery::retry(format!("node taint: {e}")),
        answer => sorted("node taint", answer),
    }
}

#[cfg(test)]
mod tests;
