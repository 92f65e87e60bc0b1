//! Each write as the API server receives it (method, path, query, content type and body,
//! exactly), and how its answers sort into done, retry and rejected.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::cluster::mock::{Mock, Recorded, Routes, status};

const UID: &str = "00000000-0000-0000-0000-00000000000a";

fn pod() -> PodKey {
    PodKey {
        namespace: "ns".into(),
        name: "hog".into(),
        uid: UID.into(),
    }
}

/// Delivers `w` to an API server that answers every request `code` with `body`.
async fn deliver_to(code: u16, body: Value, w: &ApiWrite) -> (Delivery, Mock) {
    let (client, api) = Routes::new().on("*", "*", code, body).client();
    (deliver(&client, w).await, api)
}

/// Delivers `w` to an API server that takes it (`code`, answering `body`): done, in one
/// request, which it returns.
async fn taken(code: u16, body: Value, w: &ApiWrite) -> Recorded {
    let (got, api) = deliver_to(code, body, w).await;
    assert_eq!(got, Delivery::Done, "{w:?}");
    only(&api)
}

/// The one request the API server received.
fn only(api: &Mock) -> Recorded {
    let reqs = api.requests();
    assert_eq!(reqs.len(), 1, "{reqs:#?}");
    reqs[0].clone()
}

fn evicted() -> ApiWrite {
    ApiWrite::PodEvicted {
        pod: pod(),
        message: "The node was low on resource: memory.".into(),
        at: "2026-11-30T10:00:00Z".into(),
        seen: SeenPod::default(),
    }
}

fn pod_event(count: i32) -> ApiWrite {
    ApiWrite::Event {
        name: "hog.qoslet-1".into(),
        namespace: "ns".into(),
        object: EventObject {
            kind: "Pod".into(),
            namespace: Some("ns".into()),
            name: "hog".into(),
            uid: UID.into(),
        },
        reason: "Evicted".into(),
        message:
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi."
                .into(),
        type_: "Warning".into(),
        node: "node-a".into(),
        at: "2026-11-30T10:00:00Z".into(),
        count,
        annotations: BTreeMap::new(),
    }
}

fn condition() -> ApiWrite {
    ApiWrite::NodeCondition {
        node: "node-a".into(),
        type_: "QosletMemoryPressure".into(),
        status: true,
        reason: "ThresholdMet".into(),
        message: "memory.available<100Mi".into(),
        at: "2026-11-30T10:00:00Z".into(),
    }
}

/// Not kube's `Api::evict` body (snake case `delete_options`): the `policy/v1` Eviction, whose
/// grace and UID precondition the API server reads.
#[tokio::test]
async fn a_soft_eviction_posts_a_policy_v1_eviction_with_grace_and_uid() {
    let w = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 30,
    };
    taken(201, status(201, "", ""), &w).await.assert_is(
        "POST",
        "/api/v1/namespaces/ns/pods/hog/eviction",
        "application/json",
        &json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "hog", "namespace": "ns"},
            "deleteOptions": {"gracePeriodSeconds": 30, "preconditions": {"uid": UID}},
        }),
    );
}

#[tokio::test]
async fn a_pdb_429_is_retried_and_nothing_is_ever_deleted() {
    let w = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 0,
    };
    let refusal = status(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
    );
    let (got, api) = deliver_to(429, refusal, &w).await;
    assert!(matches!(got, Delivery::Retry { .. }), "{got:?}");
    assert_eq!(only(&api).method, "POST", "no delete after a refusal");
}

/// 404: the pod is gone, done. A refusal no retry can change (a failed UID precondition: 422
/// from a status patch, uid is immutable; 409 "Precondition failed" from the Eviction API; 410;
/// an invalid body; an admission policy's denial): rejected, never retried. 401, 403, any other
/// 409, 408, 429, 5xx and an unreachable server: retried, the answer's Retry-After kept. The
/// same for every write.
#[tokio::test]
async fn answers_sort_into_done_rejected_and_retry() {
    let evict = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 0,
    };
    for w in [&evict, &evicted(), &condition()] {
        for code in [
            400u16, 401, 403, 404, 408, 409, 410, 413, 415, 422, 429, 500, 503,
        ] {
            let (got, _api) = deliver_to(code, status(code, "x", "x"), w).await;
            match code {
                404 => assert_eq!(got, Delivery::Done, "{code}"),
                401 | 403 | 408 | 409 | 429 | 500 | 503 => assert!(
                    matches!(got, Delivery::Retry { after: None, .. }),
                    "{code}: {got:?}"
                ),
                _ => assert!(
                    matches!(got, Delivery::Rejected { code: c, .. } if c == code),
                    "{code}: {got:?}"
                ),
            }
        }
        let mut precondition = status(
            409,
            "Conflict",
            "Precondition failed: UID in precondition: a, UID in object meta: b",
        );
        let (got, _api) = deliver_to(409, precondition.clone(), w).await;
        assert!(
            matches!(got, Delivery::Rejected { code: 409, .. }),
            "{got:?}"
        );
        // The API server's Retry-After (priority and fairness, a PDB): kept for the queue.
        precondition["details"] = json!({"retryAfterSeconds": 7});
        precondition["message"] = json!("Too many requests, please try again later.");
        let (got, _api) = deliver_to(429, precondition, w).await;
        assert!(
            matches!(got, Delivery::Retry { after: Some(a), .. } if a == Duration::from_secs(7)),
            "{got:?}"
        );
    }
}

#[tokio::test]
async fn a_2xx_that_does_not_decode_is_done() {
    for w in [&evicted(), &condition(), &pod_event(1)] {
        taken(200, json!("not an object"), w).await;
    }
}

/// The status the kubelet's eviction manager leaves (pkg/kubelet/eviction/eviction_manager.go
/// `evictPod`), sent as its status manager sends it (pkg/util/pod `PatchPodStatus`: a strategic
/// merge patch with `metadata.uid` as the precondition).
#[tokio::test]
async fn an_evicted_pod_is_failed_evicted_with_the_disruption_target_on_pod_status() {
    let answer = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "hog"}});
    taken(200, answer, &evicted()).await.assert_is(
        "PATCH",
        "/api/v1/namespaces/ns/pods/hog/status",
        "application/strategic-merge-patch+json",
        &json!({"metadata": {"uid": UID}, "status": {
            "phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
            "message": "The node was low on resource: memory.",
            "lastTransitionTime": "2026-11-30T10:00:00Z"}, {
            "type": "Ready", "status": "False", "reason": "PodFailed", "message": "",
            "lastTransitionTime": "2026-11-30T10:00:00Z"}, {
            "type": "ContainersReady", "status": "False", "reason": "PodFailed", "message": "",
            "lastTransitionTime": "2026-11-30T10:00:00Z"}]}}),
    );
}

/// The generation the kubelet observes (pkg/api/v1/pod/util.go
/// `CalculatePodConditionObservedGeneration`, `CalculatePodStatusObservedGeneration`, the
/// `PodObservedGenerationTracking` gate locked on in 1.37): on every condition and on the
/// status. A condition the pod already had at the same status (here Ready False, a failing
/// readiness probe) keeps its lastTransitionTime (status_manager.go
/// `updateLastTransitionTime`): the patch leaves it out, so the merge keeps the pod's; one that
/// changes (ContainersReady True -> False) or is new takes the eviction's time.
#[tokio::test]
async fn an_evicted_pod_status_carries_the_observed_generation() {
    let w = ApiWrite::PodEvicted {
        pod: pod(),
        message: "The node was low on resource: memory.".into(),
        at: "2026-11-30T10:00:00Z".into(),
        seen: SeenPod {
            generation: 3,
            conditions: BTreeMap::from([
                ("Ready".into(), "False".into()),
                ("ContainersReady".into(), "True".into()),
                ("PodScheduled".into(), "True".into()),
            ]),
        },
    };
    let answer = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "hog"}});
    taken(200, answer, &w).await.assert_is(
        "PATCH",
        "/api/v1/namespaces/ns/pods/hog/status",
        "application/strategic-merge-patch+json",
        &json!({"metadata": {"uid": UID}, "status": {
            "phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "observedGeneration": 3,
            "conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
            "message": "The node was low on resource: memory.", "observedGeneration": 3,
            "lastTransitionTime": "2026-11-30T10:00:00Z"}, {
            "type": "Ready", "status": "False", "reason": "PodFailed", "message": "",
            "observedGeneration": 3}, {
            "type": "ContainersReady", "status": "False", "reason": "PodFailed", "message": "",
            "observedGeneration": 3, "lastTransitionTime": "2026-11-30T10:00:00Z"}]}}),
    );
}

/// Writes queued by an older qoslet read back: a status without `seen` (generation 0, left
/// out of the patch), an Event without annotations.
#[test]
fn writes_of_an_older_qoslet_read_back() {
    let old = json!({"write": "podEvicted", "pod": {"namespace": "ns", "name": "hog", "uid": UID},
        "message": "The node was low on resource: memory.", "at": "2026-11-30T10:00:00Z"});
    assert_eq!(serde_json::from_value::<ApiWrite>(old).unwrap(), evicted());
    // An Event without annotations (every Event before, node Events now) is written and read
    // without the field.
    let old_event = serde_json::to_value(pod_event(1)).unwrap();
    assert_eq!(old_event.get("annotations"), None, "{old_event}");
    assert_eq!(
        serde_json::from_value::<ApiWrite>(old_event).unwrap(),
        pod_event(1)
    );
}

#[tokio::test]
async fn an_eviction_event_is_a_warning_on_the_pod_and_a_duplicate_is_done() {
    // A duplicate of the first is done.
    let exists = status(409, "AlreadyExists", "exists");
    taken(409, exists, &pod_event(1)).await.assert_is(
        "POST",
        "/api/v1/namespaces/ns/events",
        "application/json",
        &eviction_event(
            json!({"name": "hog.qoslet-1", "namespace": "ns"}),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi.",
        ),
    );
}

/// The eviction Event of `pod_event(1)` as the API server receives it, with `metadata` and
/// `message`.
fn eviction_event(metadata: Value, message: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": metadata,
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "hog", "uid": UID},
        "reason": "Evicted",
        "message": message,
        "type": "Warning",
        "source": {"component": "qoslet", "host": "node-a"},
        "reportingComponent": "qoslet",
        "reportingInstance": "node-a",
        "firstTimestamp": "2026-11-30T10:00:00Z",
        "lastTimestamp": "2026-11-30T10:00:00Z",
        "count": 1,
    })
}

/// The eviction Event carries the kubelet's annotations (`AnnotatedEventf` with
/// `evictionMessage`'s: pkg/kubelet/eviction/eviction_manager.go `evictPod`) in its metadata.
#[tokio::test]
async fn an_eviction_event_carries_the_kubelets_annotations() {
    let message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container hog was using 300Mi, request is 100Mi, has larger consumption of memory. ";
    let mut w = pod_event(1);
    if let ApiWrite::Event {
        annotations,
        message: m,
        ..
    } = &mut w
    {
        *m = message.into();
        *annotations = BTreeMap::from([
            ("offending_containers".into(), "hog".into()),
            ("offending_containers_usage".into(), "300Mi".into()),
            ("starved_resource".into(), "memory".into()),
        ]);
    }
    let answer = json!({"kind": "Event", "apiVersion": "v1", "metadata": {"name": "hog.qoslet-1"},
        "involvedObject": {}});
    taken(201, answer, &w).await.assert_is(
        "POST",
        "/api/v1/namespaces/ns/events",
        "application/json",
        &eviction_event(
            json!({"name": "hog.qoslet-1", "namespace": "ns", "annotations": {
                "offending_containers": "hog",
                "offending_containers_usage": "300Mi",
                "starved_resource": "memory",
            }}),
            message,
        ),
    );
    // Queued, the annotations read back.
    let text = serde_json::to_string(&w).unwrap();
    assert_eq!(serde_json::from_str::<ApiWrite>(&text).unwrap(), w);
}

/// A repeat of an Event that exists updates its count and last timestamp: one Event per series.
#[tokio::test]
async fn a_repeated_event_counts_on_the_existing_one() {
    let (client, api) = Routes::new()
        .on("POST", "*", 409, status(409, "AlreadyExists", "exists"))
        .on(
            "PATCH",
            "*",
            200,
            json!({"kind": "Event", "apiVersion": "v1", "metadata": {"name": "n.qoslet-x-1"},
            "involvedObject": {}}),
        )
        .client();
    let w = ApiWrite::Event {
        name: "n.qoslet-x-1".into(),
        namespace: "default".into(),
        object: EventObject {
            kind: "Node".into(),
            namespace: None,
            name: "n".into(),
            uid: "u".into(),
        },
        reason: "MemoryPressureThresholdMet".into(),
        message: "m".into(),
        type_: "Warning".into(),
        node: "n".into(),
        at: "2026-11-30T10:05:00Z".into(),
        count: 3,
        annotations: BTreeMap::new(),
    };
    assert_eq!(deliver(&client, &w).await, Delivery::Done);
    let reqs = api.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].path()),
        ("POST", "/api/v1/namespaces/default/events")
    );
    assert_eq!(reqs[0].body["count"], 3);
    reqs[1].assert_is(
        "PATCH",
        "/api/v1/namespaces/default/events/n.qoslet-x-1",
        "application/merge-patch+json",
        &json!({"count": 3, "message": "m", "lastTimestamp": "2026-11-30T10:05:00Z"}),
    );
}

/// The taint is added beside the node's other taints, with the resourceVersion it was computed
/// from; present already, nothing is written. A conflict (the node was written in between) is
/// retried.
#[tokio::test]
async fn the_pressure_taint_keeps_other_taints_and_is_optimistic() {
    let mut patches = 0;
    let (client, api) = Routes::new()
        .on(
            "GET",
            "/api/v1/nodes/node-a",
            200,
            json!({"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": "node-a", "resourceVersion": "42"},
            "spec": {"taints": [{"key": "other", "effect": "NoExecute"}]}}),
        )
        .route("PATCH", "/api/v1/nodes/node-a", move |_| {
            patches += 1;
            Some(if patches == 1 {
                (
                    200,
                    json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "node-a"}}),
                )
            } else {
                (409, status(409, "Conflict", "the object has been modified"))
            })
        })
        .client();
    let on = ApiWrite::NodeTaint {
        node: "node-a".into(),
        on: true,
    };
    assert_eq!(deliver(&client, &on).await, Delivery::Done);
    let reqs = api.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].path()),
        ("GET", "/api/v1/nodes/node-a")
    );
    reqs[1].assert_is(
        "PATCH",
        "/api/v1/nodes/node-a",
        "application/merge-patch+json",
        &json!({"metadata": {"resourceVersion": "42"}, "spec": {"taints": [
            {"key": "other", "effect": "NoExecute"},
            {"key": TAINT_KEY, "effect": "NoSchedule"}]}}),
    );
    let off = ApiWrite::NodeTaint {
        node: "node-a".into(),
        on: false,
    };
    assert_eq!(deliver(&client, &off).await, Delivery::Done);
    assert_eq!(api.requests().len(), 3, "absent already: only the GET");
    assert!(matches!(
        deliver(&client, &on).await,
        Delivery::Retry { why, .. } if why.contains("409")
    ));
}

#[tokio::test]
async fn a_node_condition_patches_node_status_with_its_own_type() {
    let answer = json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "node-a"}});
    taken(200, answer, &condition()).await.assert_is(
        "PATCH",
        "/api/v1/nodes/node-a/status",
        "application/strategic-merge-patch+json",
        &json!({"status": {"conditions": [{
            "type": "QosletMemoryPressure", "status": "True", "reason": "ThresholdMet",
            "message": "memory.available<100Mi",
            "lastHeartbeatTime": "2026-11-30T10:00:00Z",
            "lastTransitionTime": "2026-11-30T10:00:00Z"}]}}),
    );
}

/// A write queued before this version (its pod as `{namespace, name, uid}`) reads back.
#[test]
fn writes_survive_a_round_trip_through_json() {
    let w = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 3,
    };
    let text = serde_json::to_string(&w).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"write": "evict", "pod": {"namespace": "ns", "name": "hog", "uid": UID}, "graceSecs": 3})
    );
    assert_eq!(serde_json::from_str::<ApiWrite>(&text).unwrap(), w);
    assert!(now().ends_with('Z'), "{}", now());
}
