use std::time::Duration;

use kube::runtime::{reflector::store::Writer, watcher::Event};
use serde_json::{Value, json};

use super::*;
use crate::{
    cluster::{mock, source::workload_resources, writes::deliver},
    eviction::PodCgroups,
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
        signal: "memory.available".into(),
        hard,
        unit: unit.then(|| "ns/Group(top)".into()),
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

/// A CompositePodGroup `top` (all) over PodGroups `a` (all, this node's pod m1) and `b` (all),
/// and an unrelated PodGroup `other`.
fn gangs() -> Gangs {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "m1", "namespace": "ns", "uid": UID},
        "spec": {"nodeName": "node-a", "schedulingGroup": {"podGroupName": "a"},
                 "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"},
    }))
    .unwrap();
    let [w, pg, cpg] = workload_resources();
    let all = json!({"all": {}});
    let group = |name: &str, parent: Option<&str>| {
        let mut spec =
            json!({"schedulingPolicy": {"gang": {"minCount": 1}}, "disruptionMode": all});
        if let Some(p) = parent {
            spec["parentCompositePodGroupName"] = p.into();
        }
        dynamic(
            &pg,
            json!({"apiVersion": pg.api_version, "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns"}, "spec": spec}),
        )
    };
    let top = dynamic(
        &cpg,
        json!({"apiVersion": cpg.api_version, "kind": "CompositePodGroup",
        "metadata": {"name": "top", "namespace": "ns"},
        "spec": {"workloadRef": {"workloadName": "w", "templateName": "t"},
                 "schedulingPolicy": {"gang": {"minGroupCount": 2}}, "disruptionMode": all}}),
    );
    let groups = vec![
        group("a", Some("top")),
        group("b", Some("top")),
        group("other", None),
    ];
    Gangs {
        pods: store((), vec![pod]),
        workloads: vec![
            (w.clone(), store(w, vec![])),
            (pg.clone(), store(pg.clone(), groups)),
            (cpg.clone(), store(cpg, vec![top])),
        ],
    }
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
fn temp(name: &str) -> TempDir {
    let p = std::env::temp_dir().join(format!("qoslet-action-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    TempDir(p)
}

#[test]
fn a_unit_member_finds_the_whole_unit() {
    let g = gangs();
    let mut groups = g.unit_groups(&req(true, false).pod).unwrap();
    groups.sort();
    assert_eq!(groups, ["a", "b"]);
}

#[test]
fn an_eviction_writes_condition_eviction_event_and_the_unit_in_that_order() {
    let dir = temp("writes");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    let a = ApiEviction::new(q.clone(), "node-a", GangEviction::Unit, Some(gangs()));
    let w = a.writes(&req(true, false), "2026-11-30T10:00:00Z");
    let ids: Vec<&str> = w.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        [
            format!("condition-{UID}"),
            format!("evict-{UID}"),
            format!("event-{UID}"),
            format!("unit-{UID}")
        ]
    );
    assert!(matches!(
        &w[1].1,
        ApiWrite::Evict {
            grace_secs: 5,
            hard: false,
            ..
        }
    ));
    let ApiWrite::EvictUnitMembers { groups, node, .. } = &w[3].1 else {
        panic!("{:?}", w[3])
    };
    assert_eq!((groups.len(), node.as_str()), (2, "node-a"));
    // gangEviction: node keeps the unit on this node; a pod alone has no unit write.
    let a = ApiEviction::new(q.clone(), "node-a", GangEviction::Node, Some(gangs()));
    assert_eq!(a.writes(&req(true, false), "t").len(), 3);
    let a = ApiEviction::new(q, "node-a", GangEviction::Unit, Some(gangs()));
    assert_eq!(a.writes(&req(false, false), "t").len(), 3);
    assert_eq!(event_name("m1", UID), "m1.qoslet-evicted-00000000");
}

#[tokio::test]
async fn the_queued_writes_reach_the_api_in_order_and_the_unit_members_elsewhere_go_too() {
    let dir = temp("deliver");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    let a = ApiEviction::new(q.clone(), "node-a", GangEviction::Unit, Some(gangs()));
    let out = a.evict(&req(true, true)).await.unwrap();
    assert_eq!(out.signalled, 0, "no process in an empty cgroup set");
    assert_eq!(q.pending().len(), 4);
    let (client, api) = mock::client(|r| {
        Some(match (r.method.as_str(), r.path()) {
            ("GET", "/api/v1/namespaces/ns/pods") => (
                200,
                json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
                    {"metadata": {"name": "m1", "namespace": "ns", "uid": UID},
                     "spec": {"nodeName": "node-a", "schedulingGroup": {"podGroupName": "a"}, "containers": []}},
                    {"metadata": {"name": "m2", "namespace": "ns", "uid": "u2"},
                     "spec": {"nodeName": "node-b", "schedulingGroup": {"podGroupName": "b"}, "containers": []}},
                    {"metadata": {"name": "x", "namespace": "ns", "uid": "u3"},
                     "spec": {"nodeName": "node-b", "schedulingGroup": {"podGroupName": "other"}, "containers": []}},
                ]}),
            ),
            _ => (
                200,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
            ),
        })
    });
    let task = tokio::spawn(q.clone().run(move |w| {
        let c = client.clone();
        async move { deliver(&c, &w).await }
    }));
    api.wait_for("every write", |l| l.len() >= 5).await;
    tokio::time::timeout(Duration::from_secs(5), async {
        while !q.pending().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    task.abort();
    let seen: Vec<(String, String)> = api
        .requests()
        .into_iter()
        .map(|r| (r.method.clone(), r.path().to_owned()))
        .collect();
    let s = |m: &str, p: &str| (m.to_owned(), p.to_owned());
    assert_eq!(
        seen,
        [
            s("PATCH", "/api/v1/namespaces/ns/pods/m1/status"),
            s("POST", "/api/v1/namespaces/ns/pods/m1/eviction"),
            s("POST", "/api/v1/namespaces/ns/events"),
            s("GET", "/api/v1/namespaces/ns/pods"),
            s("POST", "/api/v1/namespaces/ns/pods/m2/eviction"),
        ]
    );
}
