use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    Client,
    api::{ApiResource, DynamicObject},
    runtime::{
        reflector::{Store, store::Writer},
        watcher::Event,
    },
};
use serde_json::{Value, json};

use super::*;
use crate::{
    cluster::{
        mock::{self, Mock, Routes, TempDir},
        source::workload_resources,
        writes::deliver,
    },
    eviction::{PodCgroups, SeenPod},
};

const UID: &str = "00000000-0000-0000-0000-0000000000aa";

fn req(unit: bool, hard: bool) -> EvictionRequest {
    EvictionRequest {
        pod: PodKey {
            namespace: "ns".into(),
            name: "m1".into(),
            uid: UID.into(),
        },
        cgroups: PodCgroups::default(),
        grace: Duration::from_secs(if hard { 0 } else { 5 }),
        message:
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 40Mi."
                .into(),
        annotations: Default::default(),
        seen: Default::default(),
        signal: "memory.available".into(),
        hard,
        unit: unit.then(|| "ns/PodGroup/top".into()),
        revision: 0,
    }
}

/// A store holding `objs`, as a reflector would.
fn store<K>(dt: K::DynamicType, objs: Vec<K>) -> Store<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut w = Writer::new(dt);
    for o in objs {
        w.apply_watcher_event(&Event::Apply(o));
    }
    w.as_reader()
}

fn dynamic(ar: &ApiResource, v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{ar:?}: {e}"))
}

/// Where the unit's members are found: the API server, and the node's pod m1 of PodGroup `a`.
fn members(client: Client) -> UnitMembers {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "m1", "namespace": "ns", "uid": UID},
        "spec": {"nodeName": "node-a", "schedulingGroup": {"podGroupName": "a"},
                 "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"},
    }))
    .unwrap();
    UnitMembers {
        client,
        pods: store((), vec![pod]),
    }
}

/// The namespace's objects as JSON: a CompositePodGroup `top` (all) over PodGroups `a` (all,
/// this node's pod m1) and `b` (all), and an unrelated PodGroup `other`.
fn namespace_json() -> [Vec<Value>; 3] {
    let [_, pg, cpg] = workload_resources();
    let all = json!({"all": {}});
    let group = |name: &str, parent: Option<&str>| {
        let mut spec =
            json!({"schedulingPolicy": {"gang": {"minCount": 1}}, "disruptionMode": all});
        if let Some(p) = parent {
            spec["parentCompositePodGroupName"] = p.into();
        }
        json!({"apiVersion": pg.api_version, "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns"}, "spec": spec})
    };
    let top = json!({"apiVersion": cpg.api_version, "kind": "CompositePodGroup",
        "metadata": {"name": "top", "namespace": "ns"},
        "spec": {"workloadRef": {"workloadName": "w", "templateName": "t"},
                 "schedulingPolicy": {"gang": {"minGroupCount": 2}}, "disruptionMode": all}});
    [
        vec![],
        vec![
            group("a", Some("top")),
            group("b", Some("top")),
            group("other", None),
        ],
        vec![top],
    ]
}

fn namespace_objects() -> Vec<(ApiResource, Vec<Arc<DynamicObject>>)> {
    workload_resources()
        .into_iter()
        .zip(namespace_json())
        .map(|(ar, objs)| {
            let objs = objs
                .into_iter()
                .map(|v| Arc::new(dynamic(&ar, v)))
                .collect();
            (ar, objs)
        })
        .collect()
}

#[tokio::test]
async fn a_unit_member_finds_the_whole_unit() {
    let (client, _api) = Routes::new().client();
    let mut groups = members(client)
        .unit_groups(&req(true, false).pod, &namespace_objects())
        .unwrap();
    groups.sort();
    assert_eq!(groups, ["a", "b"]);
}

/// evictionMethod kubelet: the status the kubelet leaves, then the event; never the Eviction
/// API for this node's pod. evictionMethod api: the Eviction API with the grace period at a soft
/// threshold, evictionMethod kubelet's way at a hard one.
#[test]
fn an_eviction_writes_the_kubelets_status_or_the_eviction_api_by_method() {
    let (_dir, q) = mock::queue("action-writes");
    let ids = |a: &ApiEviction, hard: bool| -> Vec<String> {
        a.writes(&req(true, hard), "2026-11-30T10:00:00Z")
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    };
    let kubelet = ApiEviction::new(
        q.clone(),
        "node-a",
        EvictionMethod::Kubelet,
        GangEviction::Node,
        None,
    );
    for hard in [false, true] {
        assert_eq!(
            ids(&kubelet, hard),
            [
                format!("evicted-{UID}"),
                format!("evicted-at-{UID}"),
                format!("event-{UID}")
            ]
        );
    }
    assert!(matches!(
        &kubelet.writes(&req(false, false), "2026-11-30T10:00:00Z")[1].1,
        ApiWrite::EvictedAt { pod, at } if pod.uid == UID && at == "2026-11-30T10:00:00Z"
    ));
    let w = kubelet.writes(&req(false, false), "2026-11-30T10:00:00Z");
    let ApiWrite::PodEvicted { pod, message, .. } = &w[0].1 else {
        panic!("{w:?}")
    };
    assert_eq!(
        (pod.uid.as_str(), message.as_str()),
        (UID, req(false, false).message.as_str())
    );
    let api = ApiEviction::new(q, "node-a", EvictionMethod::Api, GangEviction::Node, None);
    assert_eq!(
        ids(&api, false),
        [format!("evict-{UID}"), format!("event-{UID}")]
    );
    assert!(matches!(
        &api.writes(&req(false, false), "t")[0].1,
        ApiWrite::Evict { grace_secs: 5, .. }
    ));
    assert_eq!(
        ids(&api, true)[..2],
        [format!("evicted-{UID}"), format!("evicted-at-{UID}")]
    );
    assert_eq!(event_name("m1", UID), "m1.qoslet-evicted-00000000");
}

/// The API server of the unit tests below: the namespace's workload objects and pods; writes
/// succeed.
/// The Event carries the request's annotations (the kubelet's `AnnotatedEventf`), and the
/// status write the pod's generation and conditions, for both methods' Events.
#[test]
fn the_writes_carry_the_annotations_and_the_pods_generation() {
    let (_dir, q) = mock::queue("action-annotations");
    let mut r = req(false, true);
    r.annotations = BTreeMap::from([
        ("offending_containers".into(), "app".into()),
        ("offending_containers_usage".into(), "300Mi".into()),
        ("starved_resource".into(), "memory".into()),
    ]);
    r.seen = SeenPod {
        generation: 2,
        conditions: BTreeMap::from([("Ready".into(), "True".into())]),
    };
    for method in [EvictionMethod::Kubelet, EvictionMethod::Api] {
        let a = ApiEviction::new(q.clone(), "node-a", method, GangEviction::Node, None);
        let w = a.writes(&r, "2026-11-30T10:00:00Z");
        let ApiWrite::PodEvicted { seen, .. } = &w[0].1 else {
            panic!("{w:?}")
        };
        assert_eq!(seen, &r.seen);
        let ApiWrite::Event { annotations, .. } = &w.last().unwrap().1 else {
            panic!("{w:?}")
        };
        assert_eq!(annotations, &r.annotations);
    }
    let a = ApiEviction::new(q, "node-a", EvictionMethod::Api, GangEviction::Node, None);
    let w = a.writes(&req(false, false), "2026-11-30T10:00:00Z");
    assert!(matches!(&w[1].1, ApiWrite::Event { annotations, .. } if annotations.is_empty()));
}

fn unit_api() -> Routes {
    let [w, pg, cpg] = namespace_json();
    let pod = |name: &str, uid: &str, node: &str, group: &str| {
        json!({"metadata": {"name": name, "namespace": "ns", "uid": uid},
         "spec": {"nodeName": node, "schedulingGroup": {"podGroupName": group}, "containers": []}})
    };
    let v1beta1 = "/apis/scheduling.k8s.io/v1beta1/namespaces/ns";
    Routes::new()
        .list(&format!("{v1beta1}/workloads"), "Workload", "9", w)
        .list(&format!("{v1beta1}/podgroups"), "PodGroup", "9", pg)
        .list(
            "/apis/scheduling.k8s.io/v1alpha3/namespaces/ns/compositepodgroups",
            "CompositePodGroup",
            "9",
            cpg,
        )
        .list(
            "/api/v1/namespaces/ns/pods",
            "Pod",
            "9",
            vec![
                pod("m1", UID, "node-a", "a"),
                pod("m2", "u2", "node-b", "b"),
                pod("x", "u3", "node-b", "other"),
            ],
        )
        .on(
            "PATCH",
            "*",
            200,
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "m1"}}),
        )
        .on(
            "POST",
            "*",
            201,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
        )
}

/// A cluster eviction (`evictionMethod: kubelet`) with `gang`, its queue and the API server.
fn evicting(gang: GangEviction) -> (ApiEviction, Arc<WriteQueue>, TempDir, Client, Mock) {
    let (dir, q) = mock::queue("action");
    let (client, api) = unit_api().client();
    let a = ApiEviction::new(
        q.clone(),
        "node-a",
        EvictionMethod::Kubelet,
        gang,
        Some(members(client.clone())),
    );
    (a, q, dir, client, api)
}

/// gangEviction: unit resolves the members on other nodes to their UIDs when the eviction is
/// decided (lists made during `evict`), and queues an Eviction API write per member: m2 (group
/// b, under the same `all` composite) goes, x (an unrelated group) stays.
#[tokio::test]
async fn unit_members_elsewhere_are_resolved_at_decision_and_evicted_by_uid() {
    let (a, q, _dir, client, api) = evicting(GangEviction::Unit);
    let out = a.evict(&req(true, true)).await.unwrap();
    assert_eq!(out.signalled, 0, "no process in an empty cgroup set");
    let pending: Vec<String> = q.pending().into_iter().map(|(id, _)| id).collect();
    assert_eq!(
        pending,
        [
            format!("evicted-{UID}"),
            format!("evicted-at-{UID}"),
            format!("event-{UID}"),
            "evict-u2".into()
        ]
    );
    // The lists the decision made: the namespace's three workload kinds (from the API server's
    // cache) and its pods.
    // (method, path, query)
    type Call = (String, String, Vec<(String, String)>);
    let lists: Vec<Call> = api
        .requests()
        .into_iter()
        .map(|r| (r.method.clone(), r.path().to_owned(), r.query_pairs()))
        .collect();
    let cached = || {
        vec![
            ("resourceVersion".to_owned(), "0".to_owned()),
            ("resourceVersionMatch".to_owned(), "NotOlderThan".to_owned()),
        ]
    };
    let get = |p: &str, q| ("GET".to_owned(), p.to_owned(), q);
    assert_eq!(
        lists,
        [
            get(
                "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/workloads",
                cached()
            ),
            get(
                "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups",
                cached()
            ),
            get(
                "/apis/scheduling.k8s.io/v1alpha3/namespaces/ns/compositepodgroups",
                cached()
            ),
            get("/api/v1/namespaces/ns/pods", vec![]),
        ]
    );
    let resolved = lists.len();
    let task = tokio::spawn(q.clone().run(move |w| {
        let c = client.clone();
        async move { deliver(&c, &w).await }
    }));
    tokio::time::timeout(Duration::from_secs(5), async {
        while !q.pending().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    task.abort();
    let mut seen: Vec<(String, String)> = api.requests()[resolved..]
        .iter()
        .map(|r| (r.method.clone(), r.path().to_owned()))
        .collect();
    seen.sort();
    let s = |m: &str, p: &str| (m.to_owned(), p.to_owned());
    assert_eq!(
        seen,
        [
            s("PATCH", "/api/v1/namespaces/ns/pods/m1"),
            s("PATCH", "/api/v1/namespaces/ns/pods/m1/status"),
            s("POST", "/api/v1/namespaces/ns/events"),
            s("POST", "/api/v1/namespaces/ns/pods/m2/eviction"),
        ]
    );
    // The status before the annotation (one key, in order), the annotation alone with the UID
    // as its precondition.
    let paths: Vec<String> = api.requests()[resolved..]
        .iter()
        .map(|r| r.path().to_owned())
        .filter(|p| p.contains("/pods/m1"))
        .collect();
    assert_eq!(
        paths,
        [
            "/api/v1/namespaces/ns/pods/m1/status",
            "/api/v1/namespaces/ns/pods/m1"
        ]
    );
    let annotation = api
        .requests()
        .into_iter()
        .find(|r| r.path() == "/api/v1/namespaces/ns/pods/m1")
        .unwrap();
    let at = annotation.body["metadata"]["annotations"]["qoslet.dev/evicted-at"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(at.parse::<Timestamp>().is_ok(), "the eviction's time: {at}");
    annotation.assert_is(
        "PATCH",
        "/api/v1/namespaces/ns/pods/m1",
        "application/merge-patch+json",
        &json!({"metadata": {"uid": UID, "annotations": {"qoslet.dev/evicted-at": at}}}),
    );
    let m2 = api
        .requests()
        .into_iter()
        .find(|r| r.path().ends_with("m2/eviction"))
        .unwrap();
    m2.assert_is(
        "POST",
        "/api/v1/namespaces/ns/pods/m2/eviction",
        "application/json",
        &json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "m2", "namespace": "ns"},
            "deleteOptions": {"gracePeriodSeconds": 0, "preconditions": {"uid": "u2"}}}),
    );
}

/// gangEviction: node (the default) writes nothing about other nodes' pods and asks nothing.
#[tokio::test]
async fn by_default_only_this_nodes_pod_is_written() {
    let (a, q, _dir, _client, api) = evicting(GangEviction::Node);
    a.evict(&req(true, false)).await.unwrap();
    assert_eq!(q.pending().len(), 3);
    assert!(api.requests().is_empty(), "{:?}", api.requests());
}
