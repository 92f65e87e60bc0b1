use serde_json::json;

use super::*;
use crate::cluster::mock::{self, status};

fn pod() -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: "hog".into(),
        uid: "00000000-0000-0000-0000-00000000000a".into(),
    }
}

#[tokio::test]
async fn a_soft_eviction_posts_a_policy_v1_eviction_with_grace_and_uid() {
    let (client, api) = mock::client(|_| Some((201, status(201, "", ""))));
    let w = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 30,
    };
    assert_eq!(deliver(&client, &w).await, Delivery::Done);
    let r = &api.requests()[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path(), "/api/v1/namespaces/ns/pods/hog/eviction");
    assert_eq!(
        r.body,
        json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "hog", "namespace": "ns"},
            "deleteOptions": {"gracePeriodSeconds": 30, "preconditions": {"uid": pod().uid}},
        })
    );
}

#[tokio::test]
async fn a_pdb_429_is_retried_and_nothing_is_ever_deleted() {
    let (client, api) = mock::client(|_| {
        Some((
            429,
            status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ),
        ))
    });
    let w = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 0,
    };
    assert!(matches!(deliver(&client, &w).await, Delivery::Retry(_)));
    let reqs = api.requests();
    assert_eq!(reqs.len(), 1, "no delete after a refusal: {reqs:?}");
}

/// 404: the pod is gone, done. A failed UID precondition (409 from the Eviction API, 422 from
/// a status patch: uid is immutable) and any other permanent 4xx: rejected, never retried.
/// 408, 429, 5xx and an unreachable server: retried.
#[tokio::test]
async fn answers_sort_into_done_rejected_and_retry() {
    let evict = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 0,
    };
    let evicted = ApiWrite::PodEvicted {
        pod: pod(),
        message: "m".into(),
        at: "2026-11-30T10:00:00Z".into(),
    };
    for w in [&evict, &evicted] {
        for code in [400u16, 403, 404, 408, 409, 410, 422, 429, 500, 503] {
            let (client, _api) = mock::client(move |_| Some((code, status(code, "x", "x"))));
            let got = deliver(&client, w).await;
            match code {
                404 => assert_eq!(got, Delivery::Done, "{code}"),
                408 | 429 | 500 | 503 => {
                    assert!(matches!(got, Delivery::Retry(_)), "{code}: {got:?}");
                }
                _ => assert!(
                    matches!(got, Delivery::Rejected { code: c, .. } if c == code),
                    "{code}: {got:?}"
                ),
            }
        }
    }
}

/// The status the kubelet's eviction manager leaves (pkg/kubelet/eviction/eviction_manager.go
/// `evictPod`), sent as its status manager sends it (pkg/util/pod `PatchPodStatus`: a strategic
/// merge patch with `metadata.uid` as the precondition).
#[tokio::test]
async fn an_evicted_pod_is_failed_evicted_with_the_disruption_target_on_pod_status() {
    let (client, api) = mock::client(|_| {
        Some((
            200,
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "hog"}}),
        ))
    });
    let w = ApiWrite::PodEvicted {
        pod: pod(),
        message: "The node was low on resource: memory.".into(),
        at: "2026-11-30T10:00:00Z".into(),
    };
    assert_eq!(deliver(&client, &w).await, Delivery::Done);
    let r = &api.requests()[0];
    assert_eq!(r.method, "PATCH");
    assert_eq!(r.path(), "/api/v1/namespaces/ns/pods/hog/status");
    assert_eq!(r.content_type, "application/strategic-merge-patch+json");
    assert_eq!(
        r.body,
        json!({"metadata": {"uid": pod().uid}, "status": {
            "phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
            "message": "The node was low on resource: memory.",
            "lastTransitionTime": "2026-11-30T10:00:00Z"}]}})
    );
}

#[tokio::test]
async fn an_eviction_event_is_a_warning_on_the_pod_and_a_duplicate_is_done() {
    let (client, api) = mock::client(|_| Some((409, status(409, "AlreadyExists", "exists"))));
    let w = ApiWrite::Event {
        name: "hog.qoslet-1".into(),
        namespace: "ns".into(),
        object: EventObject {
            kind: "Pod".into(),
            namespace: Some("ns".into()),
            name: "hog".into(),
            uid: pod().uid,
        },
        reason: "Evicted".into(),
        message:
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi."
                .into(),
        type_: "Warning".into(),
        node: "node-a".into(),
        at: "2026-11-30T10:00:00Z".into(),
        count: 1,
    };
    assert_eq!(deliver(&client, &w).await, Delivery::Done);
    assert_eq!(api.requests().len(), 1, "a duplicate of the first is done");
    let r = &api.requests()[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path(), "/api/v1/namespaces/ns/events");
    let b = &r.body;
    assert_eq!(b["metadata"]["name"], "hog.qoslet-1");
    assert_eq!(b["type"], "Warning");
    assert_eq!(b["reason"], "Evicted");
    assert_eq!(
        b["involvedObject"],
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "hog", "uid": pod().uid})
    );
    assert_eq!(
        b["source"],
        json!({"component": "qoslet", "host": "node-a"})
    );
    assert_eq!(b["firstTimestamp"], "2026-11-30T10:00:00Z");
    assert_eq!(b["count"], 1);
}

/// A repeat of an Event that exists updates its count and last timestamp: one Event per series.
#[tokio::test]
async fn a_repeated_event_counts_on_the_existing_one() {
    let (client, api) = mock::client(|r| {
        Some(match r.method.as_str() {
            "POST" => (409, status(409, "AlreadyExists", "exists")),
            _ => (
                200,
                json!({"kind": "Event", "apiVersion": "v1", "metadata": {"name": "n.qoslet-x-1"},
                "involvedObject": {}}),
            ),
        })
    });
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
    };
    assert_eq!(deliver(&client, &w).await, Delivery::Done);
    let reqs = api.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(
        (reqs[1].method.as_str(), reqs[1].path()),
        ("PATCH", "/api/v1/namespaces/default/events/n.qoslet-x-1")
    );
    assert_eq!(reqs[1].content_type, "application/merge-patch+json");
    assert_eq!(
        reqs[1].body,
        json!({"count": 3, "message": "m", "lastTimestamp": "2026-11-30T10:05:00Z"})
    );
}

/// The taint is added beside the node's other taints, with the resourceVersion it was computed
/// from; present already, nothing is written.
#[tokio::test]
async fn the_pressure_taint_keeps_other_taints_and_is_optimistic() {
    let (client, api) = mock::client(|r| {
        Some(match r.method.as_str() {
            "GET" => (
                200,
                json!({"kind": "Node", "apiVersion": "v1",
                "metadata": {"name": "node-a", "resourceVersion": "42"},
                "spec": {"taints": [{"key": "other", "effect": "NoExecute"}]}}),
            ),
            _ => (
                200,
                json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "node-a"}}),
            ),
        })
    });
    let on = ApiWrite::NodeTaint {
        node: "node-a".into(),
        on: true,
    };
    assert_eq!(deliver(&client, &on).await, Delivery::Done);
    let reqs = api.requests();
    assert_eq!(reqs[1].method, "PATCH");
    assert_eq!(reqs[1].path(), "/api/v1/nodes/node-a");
    assert_eq!(
        reqs[1].body,
        json!({"metadata": {"resourceVersion": "42"}, "spec": {"taints": [
            {"key": "other", "effect": "NoExecute"},
            {"key": TAINT_KEY, "effect": "NoSchedule"}]}})
    );
    let off = ApiWrite::NodeTaint {
        node: "node-a".into(),
        on: false,
    };
    assert_eq!(deliver(&client, &off).await, Delivery::Done);
    assert_eq!(api.requests().len(), 3, "absent already: only the GET");
}

#[tokio::test]
async fn a_node_condition_patches_node_status_with_its_own_type() {
    let (client, api) = mock::client(|_| Some((200, json!({"kind": "Node"}))));
    let w = ApiWrite::NodeCondition {
        node: "node-a".into(),
        type_: "QosletMemoryPressure".into(),
        status: true,
        reason: "ThresholdMet".into(),
        message: "memory.available<100Mi".into(),
        at: "2026-11-30T10:00:00Z".into(),
    };
    assert_eq!(deliver(&client, &w).await, Delivery::Done);
    let r = &api.requests()[0];
    assert_eq!(r.method, "PATCH");
    assert_eq!(r.path(), "/api/v1/nodes/node-a/status");
    assert_eq!(r.content_type, "application/strategic-merge-patch+json");
    let c = &r.body["status"]["conditions"][0];
    assert_eq!(c["type"], "QosletMemoryPressure");
    assert_eq!(c["status"], "True");
}

#[test]
fn writes_survive_a_round_trip_through_json() {
    let w = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 3,
    };
    let text = serde_json::to_string(&w).unwrap();
    assert_eq!(serde_json::from_str::<ApiWrite>(&text).unwrap(), w);
    assert!(now().ends_with('Z'), "{}", now());
}
