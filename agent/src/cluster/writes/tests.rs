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
        hard: false,
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
async fn a_pdb_429_is_retried_for_a_soft_threshold() {
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
        grace_secs: 30,
        hard: false,
    };
    assert!(matches!(deliver(&client, &w).await, Delivery::Retry(_)));
    let reqs = api.requests();
    assert_eq!(reqs.len(), 1, "no delete for a soft threshold: {reqs:?}");
}

#[tokio::test]
async fn a_hard_threshold_deletes_with_a_uid_precondition_when_a_pdb_refuses() {
    let (client, api) = mock::client(|r| {
        Some(if r.path().ends_with("/eviction") {
            (429, status(429, "TooManyRequests", "disruption budget"))
        } else {
            (200, status(200, "", ""))
        })
    });
    let w = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 0,
        hard: true,
    };
    assert_eq!(deliver(&client, &w).await, Delivery::Done);
    let reqs = api.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(reqs[0].body["deleteOptions"]["gracePeriodSeconds"], 0);
    assert_eq!(reqs[1].method, "DELETE");
    assert_eq!(reqs[1].path(), "/api/v1/namespaces/ns/pods/hog");
    assert_eq!(
        reqs[1].body,
        json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
               "preconditions": {"uid": pod().uid}})
    );
}

#[tokio::test]
async fn a_gone_pod_or_a_uid_conflict_is_done() {
    for code in [404, 409] {
        let (client, _api) = mock::client(move |_| Some((code, status(code, "x", "x"))));
        let w = ApiWrite::Evict {
            pod: pod(),
            grace_secs: 0,
            hard: true,
        };
        assert_eq!(deliver(&client, &w).await, Delivery::Done, "{code}");
    }
    // Unreachable (the mock answers 503): retried.
    let (client, _api) = mock::client(|_| Some((503, status(503, "ServiceUnavailable", "x"))));
    let w = ApiWrite::Evict {
        pod: pod(),
        grace_secs: 0,
        hard: true,
    };
    assert!(matches!(deliver(&client, &w).await, Delivery::Retry(_)));
}

#[tokio::test]
async fn the_disruption_target_condition_is_a_strategic_merge_patch_of_pod_status() {
    let (client, api) = mock::client(|_| Some((200, json!({"kind": "Pod"}))));
    let w = ApiWrite::PodCondition {
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
        json!({"metadata": {"uid": pod().uid}, "status": {"conditions": [{
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
    };
    assert_eq!(deliver(&client, &w).await, Delivery::Done);
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
        hard: true,
    };
    let text = serde_json::to_string(&w).unwrap();
    assert_eq!(serde_json::from_str::<ApiWrite>(&text).unwrap(), w);
    assert!(now().ends_with('Z'), "{}", now());
}
