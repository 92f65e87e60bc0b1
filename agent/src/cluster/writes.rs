//! The API writes of cluster mode, each a small request builder and one delivery step.
//!
//! Builders return plain `http::Request`s so request-level tests see exactly what the API server
//! would (the eviction body in particular: kube's `Api::evict` sends `delete_options` in snake
//! case, which the API server does not read, so the grace period would be lost; it is built here
//! as a `policy/v1` Eviction). [`deliver`] sends one [`ApiWrite`] and says whether it is done,
//! with the API server's answers that mean "already done" (the pod is gone, the event exists)
//! counted as done, so a write delivered twice after a crash has no second effect.

use std::time::SystemTime;

use http::Request;
use k8s_openapi::{
    api::{
        core::v1::{Event, EventSource, ObjectReference},
        policy::v1::Eviction,
    },
    apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions, Time},
    jiff::Timestamp,
};
use kube::{Client, core::Status};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The component that writes events, conditions and the lease.
pub const COMPONENT: &str = "qoslet";

/// A pod by name and UID: every write about a pod is for that UID only.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One write to the API server, as queued (and persisted) until delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "write", rename_all = "camelCase")]
pub enum ApiWrite {
    /// The `DisruptionTarget` condition on `pods/status`, as the kubelet sets it.
    #[serde(rename_all = "camelCase")]
    PodCondition {
        pod: PodRef,
        message: String,
        at: String,
    },
    /// The Eviction API (honours PodDisruptionBudgets). With `hard`, a refusal falls back to a
    /// delete with a UID precondition, as the kubelet's node-pressure eviction ignores PDBs.
    #[serde(rename_all = "camelCase")]
    Evict {
        pod: PodRef,
        grace_secs: u32,
        hard: bool,
    },
    /// The members of a `disruptionMode: all` unit on other nodes: every pod of the namespace
    /// whose PodGroup is one of `groups` and that runs elsewhere, through the Eviction API (with
    /// the same fallback as [`ApiWrite::Evict`]). Resolved when delivered, so the API server
    /// being down at eviction time loses nothing.
    #[serde(rename_all = "camelCase")]
    EvictUnitMembers {
        namespace: String,
        groups: Vec<String>,
        /// This node: its members were killed locally and have their own writes.
        node: String,
        grace_secs: u32,
        hard: bool,
    },
    /// A Warning Event on a pod or the node.
    #[serde(rename_all = "camelCase")]
    Event {
        /// The Event's name: unique per write, so a second delivery is refused as existing.
        name: String,
        namespace: String,
        object: EventObject,
        reason: String,
        message: String,
        type_: String,
        node: String,
        at: String,
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
}

/// What an Event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventObject {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
}

/// The result of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Done, or nothing left to do (the object is gone).
    Done,
    /// Try again later: the API server is unreachable, or refused for now (a PDB's 429).
    Retry(String),
}

/// Now, in the API's RFC 3339 form.
pub fn now() -> String {
    Timestamp::try_from(SystemTime::now())
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

fn time(at: &str) -> Option<Time> {
    at.parse::<Timestamp>().ok().map(Time)
}

fn json_request(
    method: http::Method,
    uri: String,
    content_type: &str,
    body: &impl Serialize,
) -> Request<Vec<u8>> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(serde_json::to_vec(body).unwrap_or_default())
        .unwrap_or_default()
}

fn pod_path(p: &PodRef) -> String {
    format!("/api/v1/namespaces/{}/pods/{}", p.namespace, p.name)
}

/// `POST pods/{name}/eviction` with a `policy/v1` Eviction: grace and a UID precondition.
pub fn eviction_request(pod: &PodRef, grace_secs: u32) -> Request<Vec<u8>> {
    let body = Eviction {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(delete_options(pod, grace_secs)),
    };
    json_request(
        http::Method::POST,
        format!("{}/eviction", pod_path(pod)),
        "application/json",
        &body,
    )
}

fn delete_options(pod: &PodRef, grace_secs: u32) -> DeleteOptions {
    DeleteOptions {
        grace_period_seconds: Some(grace_secs.into()),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteOptions::default()
    }
}

/// `DELETE pods/{name}` with grace and a UID precondition (a pod of the same name created since
/// is not touched: the API server answers 409).
pub fn delete_request(pod: &PodRef, grace_secs: u32) -> Request<Vec<u8>> {
    let mut body = serde_json::to_value(delete_options(pod, grace_secs)).unwrap_or_default();
    body["apiVersion"] = "v1".into();
    body["kind"] = "DeleteOptions".into();
    json_request(
        http::Method::DELETE,
        pod_path(pod),
        "application/json",
        &body,
    )
}

/// A strategic merge patch of `pods/status` adding the `DisruptionTarget` condition
/// (reason `TerminationByKubelet`, as the kubelet's eviction manager sets it). The patch carries
/// the pod's UID, which the API server checks as a precondition.
pub fn pod_condition_request(pod: &PodRef, message: &str, at: &str) -> Request<Vec<u8>> {
    let body = json!({
        "metadata": {"uid": pod.uid},
        "status": {"conditions": [{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "TerminationByKubelet",
            "message": message,
            "lastTransitionTime": at,
        }]},
    });
    json_request(
        http::Method::PATCH,
        format!("{}/status", pod_path(pod)),
        "application/strategic-merge-patch+json",
        &body,
    )
}

/// The core/v1 Event: `POST namespaces/{ns}/events`.
pub fn event_body(w: &ApiWrite) -> Option<Event> {
    let ApiWrite::Event {
        name,
        namespace,
        object,
        reason,
        message,
        type_,
        node,
        at,
    } = w
    else {
        return None;
    };
    let t = time(at);
    Some(Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
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
        count: Some(1),
        ..Event::default()
    })
}

pub fn event_request(w: &ApiWrite) -> Option<Request<Vec<u8>>> {
    let e = event_body(w)?;
    let ns = e.metadata.namespace.clone().unwrap_or_default();
    Some(json_request(
        http::Method::POST,
        format!("/api/v1/namespaces/{ns}/events"),
        "application/json",
        &e,
    ))
}

/// A strategic merge patch of `nodes/status` with one condition of qoslet's own type (merged by
/// type: the kubelet's conditions are left alone).
pub fn node_condition_request(
    node: &str,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    at: &str,
) -> Request<Vec<u8>> {
    let body = json!({"status": {"conditions": [{
        "type": type_,
        "status": if status { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": at,
        "lastTransitionTime": at,
    }]}});
    json_request(
        http::Method::PATCH,
        format!("/api/v1/nodes/{node}/status"),
        "application/strategic-merge-patch+json",
        &body,
    )
}

/// `GET namespaces/{ns}/pods`: the unit's live pods on other nodes.
pub async fn unit_members(
    client: &Client,
    namespace: &str,
    groups: &[String],
    node: &str,
) -> Result<Vec<PodRef>, kube::Error> {
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), namespace);
    let pods = api.list(&kube::api::ListParams::default()).await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| {
            let spec = p.spec.as_ref();
            let group = spec
                .and_then(|s| s.scheduling_group.as_ref())
                .and_then(|g| g.pod_group_name.as_deref());
            let elsewhere = spec.and_then(|s| s.node_name.as_deref()) != Some(node);
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            elsewhere
                && group.is_some_and(|g| groups.iter().any(|x| x == g))
                && !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| {
            Some(PodRef {
                namespace: namespace.to_owned(),
                name: p.metadata.name?,
                uid: p.metadata.uid?,
            })
        })
        .collect())
}

/// The HTTP status of a failed request, when the API server answered.
fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

async fn send(client: &Client, req: Request<Vec<u8>>) -> Result<(), kube::Error> {
    client.request_text(req).await.map(drop)
}

/// Sends one write. 404 (the object is gone) and, for events, 409 (this event exists) are done;
/// a 409 on a pod write is a UID precondition failing: the pod is another one now, also done.
pub async fn deliver(client: &Client, w: &ApiWrite) -> Delivery {
    let retry = |what: &str, e: kube::Error| Delivery::Retry(format!("{what}: {e}"));
    let gone = |e: &kube::Error| matches!(code(e), Some(404 | 409));
    match w {
        ApiWrite::PodCondition { pod, message, at } => {
            match send(client, pod_condition_request(pod, message, at)).await {
                Ok(()) => Delivery::Done,
                Err(e) if gone(&e) => Delivery::Done,
                Err(e) => retry("pod condition", e),
            }
        }
        ApiWrite::Evict {
            pod,
            grace_secs,
            hard,
        } => match client
            .request::<Status>(eviction_request(pod, *grace_secs))
            .await
        {
            Ok(_) => Delivery::Done,
            Err(e) if gone(&e) => Delivery::Done,
            // 429: a PodDisruptionBudget forbids it now (500 when several PDBs match).
            Err(e) if *hard && matches!(code(&e), Some(429 | 500)) => {
                tracing::info!(pod = %pod.name, namespace = %pod.namespace, "The Eviction API refused a hard-threshold eviction; deleting the pod as the kubelet would.");
                match send(client, delete_request(pod, 0)).await {
                    Ok(()) => Delivery::Done,
                    Err(e) if gone(&e) => Delivery::Done,
                    Err(e) => retry("delete", e),
                }
            }
            Err(e) => retry("eviction", e),
        },
        ApiWrite::EvictUnitMembers {
            namespace,
            groups,
            node,
            grace_secs,
            hard,
        } => {
            let members = match unit_members(client, namespace, groups, node).await {
                Ok(m) => m,
                Err(e) => return retry("listing the unit's pods", e),
            };
            let mut left = Vec::new();
            for pod in members {
                let w = ApiWrite::Evict {
                    pod,
                    grace_secs: *grace_secs,
                    hard: *hard,
                };
                if let Delivery::Retry(why) = Box::pin(deliver(client, &w)).await {
                    left.push(why);
                }
            }
            if left.is_empty() {
                Delivery::Done
            } else {
                Delivery::Retry(left.join("; "))
            }
        }
        ApiWrite::Event { .. } => {
            let Some(req) = event_request(w) else {
                return Delivery::Done;
            };
            match send(client, req).await {
                Ok(()) => Delivery::Done,
                Err(e) if matches!(code(&e), Some(409)) => Delivery::Done,
                Err(e) => retry("event", e),
            }
        }
        ApiWrite::NodeCondition {
            node,
            type_,
            status,
            reason,
            message,
            at,
        } => match send(
            client,
            node_condition_request(node, type_, *status, reason, message, at),
        )
        .await
        {
            Ok(()) => Delivery::Done,
            Err(e) => retry("node condition", e),
        },
    }
}

#[cfg(test)]
mod tests;
