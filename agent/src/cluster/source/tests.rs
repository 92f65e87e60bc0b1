use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::cluster::mock::{self, Routes, events, list, status};
use crate::source::build::build;

fn pod(name: &str, uid: &str, phase: &str, group: Option<&str>) -> Value {
    let mut spec = json!({"nodeName": "node-a", "containers": [{"name": "c", "image": "busybox"}]});
    if let Some(g) = group {
        spec["schedulingGroup"] = json!({"podGroupName": g});
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1"},
        "spec": spec,
        "status": {"phase": phase},
    })
}

fn pod_group(name: &str) -> Value {
    json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}},
    })
}

/// API discovery's answer for scheduling.k8s.io/v1beta1 serving `resources`.
fn discovery(resources: &[&str]) -> Value {
    let resources: Vec<Value> = resources
        .iter()
        .map(|r| json!({"name": r, "singularName": "", "namespaced": true, "kind": "X", "verbs": ["get", "list", "watch"]}))
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "scheduling.k8s.io/v1beta1", "resources": resources})
}

/// [`loaded`] with nothing admitted before: the objects to admit and those to watch.
fn loaded_fresh(
    pods: &[Arc<Pod>],
    workloads: &[(ApiResource, Vec<Arc<DynamicObject>>)],
) -> (Loaded, BTreeSet<(String, String, String)>) {
    let f = loaded(pods, workloads, &PodSet::default());
    (f.loaded, f.wanted)
}

const UID_A: &str = "00000000-0000-0000-0000-00000000000a";
const UID_B: &str = "00000000-0000-0000-0000-00000000000b";

/// The node's pods and the Node itself, as the API server lists them.
fn node_a(pods: Vec<Value>, node: Value) -> Routes {
    Routes::new().list("/api/v1/pods", "Pod", "5", pods).list(
        "/api/v1/nodes",
        "Node",
        "5",
        vec![node],
    )
}

/// `routes`, and API discovery saying the Workload API (Workloads, PodGroups) is served.
fn with_workload_api(routes: Routes) -> Routes {
    routes.on(
        "GET",
        "/apis/scheduling.k8s.io/v1beta1",
        200,
        discovery(&["workloads", "podgroups"]),
    )
}

/// A list answer as the API server gives it under `fieldSelector=metadata.name=X`: the object of
/// `objects` named X, if there is one. A watch is left to the next route.
fn by_name(kind: &'static str, objects: Vec<Value>) -> impl FnMut(&mock::Recorded) -> mock::Reply {
    move |r| {
        let want = r.query("fieldSelector").unwrap_or_default();
        let items = objects
            .iter()
            .filter(|o| {
                want == format!("metadata.name={}", o["metadata"]["name"].as_str().unwrap())
            })
            .cloned()
            .collect();
        (!r.is_watch()).then(|| (200, list(kind, "5", items)))
    }
}

/// The PodGroup g0 under CompositePodGroups g1 under ... g`len - 1`, which names `top_parent`
/// (a root without): the PodGroup and the composites.
fn group_chain(len: usize, top_parent: Option<&str>) -> (Value, Vec<Value>) {
    let group = |kind: &str, name: &str, parent: Option<String>| {
        let mut v = pod_group(name);
        v["kind"] = kind.into();
        if let Some(parent) = parent {
            v["spec"]["parentCompositePodGroupName"] = parent.into();
        }
        v
    };
    let composites = (1..len)
        .map(|i| {
            let parent = if i + 1 == len {
                top_parent.map(str::to_owned)
            } else {
                Some(format!("g{}", i + 1))
            };
            group("CompositePodGroup", &format!("g{i}"), parent)
        })
        .collect();
    (group("PodGroup", "g0", Some("g1".into())), composites)
}

/// The source of node `node-a`, started on `client`, and its first diff once every watch synced
/// (5 s at most).
async fn synced(client: Client) -> (ApiSource, Diff) {
    let mut src = ApiSource::start(
        client,
        Default::default(),
        "node-a",
        ValidationOptions::default(),
    );
    let first = tokio::time::timeout(Duration::from_secs(5), src.wait_synced())
        .await
        .unwrap()
        .unwrap();
    (src, first)
}

/// Takes the source's changes until `done` holds (5 s at most).
async fn changes_until(src: &mut ApiSource, what: &str, done: impl Fn(&ApiSource) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done(src) {
        assert!(Instant::now() < deadline, "{what} never came");
        tokio::time::timeout(Duration::from_secs(5), src.changed())
            .await
            .unwrap()
            .unwrap();
    }
}

fn names(p: &PodSet) -> Vec<String> {
    p.pods.keys().map(|k| k.name.clone()).collect()
}

#[tokio::test]
async fn watches_carry_the_node_selectors_and_build_the_pod_set() {
    let (client, api) = with_workload_api(node_a(
        vec![
            pod("a", UID_A, "Running", Some("g")),
            pod("done", UID_B, "Succeeded", None),
        ],
        json!({"metadata": {"name": "node-a", "uid": "n1"}}),
    ))
    // The API server applies the field selector: only the named object.
    .route(
        "GET",
        "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups",
        by_name("PodGroup", vec![pod_group("g"), pod_group("unrelated")]),
    )
    .list("/apis/scheduling.k8s.io/*", "X", "5", vec![])
    .client();
    let (mut src, first) = synced(client).await;
    let reqs = api.requests();
    let pods_list = reqs.iter().find(|r| r.path() == "/api/v1/pods").unwrap();
    assert_eq!(pods_list.method, "GET");
    assert_eq!(
        pods_list.query("fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    let node_list = reqs.iter().find(|r| r.path() == "/api/v1/nodes").unwrap();
    assert_eq!(
        node_list.query("fieldSelector").as_deref(),
        Some("metadata.name=node-a")
    );
    assert_eq!(src.node().unwrap().metadata.uid.as_deref(), Some("n1"));
    // The Succeeded pod holds no cgroups; the running one is there with its uid.
    assert_eq!(names(src.pods()), ["a"]);
    assert_eq!(src.pods().pods.keys().next().unwrap().uid, UID_A);
    assert_eq!(first.pods_added.len(), 1);
    // The PodGroup the pod references arrives (now or with the next change); the other does not.
    changes_until(&mut src, "the PodGroup", |s| !s.pods().objects.is_empty()).await;
    let objects: Vec<&String> = src.pods().objects.keys().map(|k| &k.2).collect();
    assert_eq!(objects, ["g"]);
    assert_eq!(*src.gang_awareness().lock().unwrap(), GangAwareness::On);
    // Lists may be served from the API server's cache (resourceVersion=0, any_semantic); the
    // only workload request is for the referenced object, in its namespace: no cluster-wide list.
    let reqs = api.requests();
    for r in reqs
        .iter()
        .filter(|r| !r.is_watch() && r.path().ends_with('s'))
    {
        assert_eq!(r.query("resourceVersion").as_deref(), Some("0"), "{r:?}");
    }
    let workload_reqs: Vec<String> = reqs
        .iter()
        .filter(|r| r.path().starts_with("/apis/scheduling.k8s.io/v1beta1/"))
        .map(|r| {
            format!(
                "{} {}",
                r.path(),
                r.query("fieldSelector").unwrap_or_default()
            )
        })
        .collect();
    assert!(
        workload_reqs
            .iter()
            .all(|r| r == "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups metadata.name=g"),
        "{workload_reqs:?}"
    );
    // The pod watch resumes from the list's resourceVersion with bookmarks.
    api.wait_for("the pod watch", |l| {
        l.iter().any(|r| r.path() == "/api/v1/pods" && r.is_watch())
    })
    .await;
    let w = api
        .requests()
        .into_iter()
        .find(|r| r.path() == "/api/v1/pods" && r.is_watch())
        .unwrap();
    assert_eq!(w.query("resourceVersion").as_deref(), Some("5"));
    assert_eq!(w.query("allowWatchBookmarks").as_deref(), Some("true"));
    assert_eq!(
        w.query("fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
}

#[tokio::test]
async fn a_410_gone_relists_and_the_diff_shows_it() {
    let mut pod_lists = 0;
    let mut pod_watches = 0;
    let (client, api) = mock::client(move |r| match (r.path(), r.is_watch()) {
        ("/api/v1/pods", false) => {
            pod_lists += 1;
            let items = if pod_lists == 1 {
                vec![pod("a", UID_A, "Running", None)]
            } else {
                vec![pod("b", UID_B, "Running", None)]
            };
            Some((200, list("Pod", &format!("{}", pod_lists * 10), items)))
        }
        ("/api/v1/pods", true) => {
            pod_watches += 1;
            // The first watch is too old: the API server answers with an ERROR event 410.
            (pod_watches == 1).then(|| {
                (
                    200,
                    events(&[("ERROR", status(410, "Expired", "too old resource version"))]),
                )
            })
        }
        (_, true) => None,
        ("/api/v1/nodes", false) => Some((200, list("Node", "1", vec![]))),
        _ => Some((200, list("X", "1", vec![]))),
    });
    let (mut src, _) = synced(client).await;
    assert_eq!(names(src.pods()), ["a"]);
    let mut added = Vec::new();
    let mut removed = Vec::new();
    while names(src.pods()) != ["b"] {
        let d = tokio::time::timeout(Duration::from_secs(10), src.changed())
            .await
            .expect("no relist after 410")
            .unwrap();
        added.extend(d.pods_added.into_iter().map(|k| k.name));
        removed.extend(d.pods_removed.into_iter().map(|k| k.name));
    }
    assert_eq!(added, ["b"]);
    assert_eq!(removed, ["a"]);
    let lists = api
        .requests()
        .iter()
        .filter(|r| r.path() == "/api/v1/pods" && !r.is_watch())
        .count();
    assert_eq!(lists, 2, "one list, one relist after 410");
    assert!(src.watch_states().summary().contains("pods synced"));
}

/// The Node's status updates (heartbeats) reach its store and start no rebuild of the pods.
#[tokio::test]
async fn a_node_heartbeat_changes_nothing_and_wakes_nothing() {
    let mut beats = 0u32;
    let (client, _api) = mock::client(move |r| match (r.path(), r.is_watch()) {
        ("/api/v1/pods", false) => Some((
            200,
            list("Pod", "1", vec![pod("a", UID_A, "Running", None)]),
        )),
        ("/api/v1/nodes", false) => Some((
            200,
            list(
                "Node",
                "1",
                vec![json!({"metadata": {"name": "node-a", "resourceVersion": "1"}})],
            ),
        )),
        ("/api/v1/nodes", true) => {
            beats += 1;
            let node = json!({"metadata": {"name": "node-a", "resourceVersion": format!("{}", beats + 1)},
                "status": {"conditions": [{"type": "Ready", "status": "True",
                    "lastHeartbeatTime": format!("2026-12-04T00:00:{:02}Z", beats % 60)}]}});
            Some((200, events(&[("MODIFIED", node)])))
        }
        (_, true) => None,
        _ => Some((404, status(404, "NotFound", "no Workload API"))),
    });
    let (mut src, _) = synced(client).await;
    let rv = |src: &ApiSource| -> u32 {
        src.node()
            .and_then(|n| n.metadata.resource_version.clone())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while *lock(&src.gang_awareness()) == GangAwareness::Unknown || rv(&src) < 3 {
        assert!(
            Instant::now() < deadline,
            "no heartbeat in the Node's store"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The discovery's answer (gang-awareness off) was a change of its own: taken here.
    let _ = tokio::time::timeout(Duration::from_millis(100), src.changed()).await;
    let before = rv(&src);
    let woke = tokio::time::timeout(Duration::from_secs(3), src.changed()).await;
    assert!(
        rv(&src) > before,
        "heartbeats kept coming ({before} -> {})",
        rv(&src)
    );
    assert!(woke.is_err(), "a heartbeat woke the pass: {woke:?}");
}

#[tokio::test]
async fn an_invalid_pod_is_reported_and_skipped() {
    let mut bad = pod(
        "bad",
        "aaaaaaaa-0000-4000-8000-0000000000bd",
        "Running",
        None,
    );
    bad["spec"]["containers"][0]["resources"] = json!({"requests": {"memory": "lots"}});
    let (client, _api) = node_a(
        vec![pod("a", UID_A, "Running", None), bad],
        json!({"metadata": {"name": "node-a"}}),
    )
    .list("/apis/*", "X", "1", vec![])
    .client();
    let (src, d) = synced(client).await;
    assert_eq!(names(src.pods()), ["a"]);
    assert_eq!(d.new_problems.len(), 1, "{:?}", d.new_problems);
    assert!(
        d.new_problems[0].starts_with("api: Pod/ns/bad: schema:"),
        "{:?}",
        d.new_problems
    );
}

/// A bound pod whose PodGroup does not exist yet (a forward reference, which the scheduler holds
/// until the group exists, unless the pod was bound by hand) is managed as the pod it is: no
/// problem line, no skipped object, and its group is watched for by name.
#[tokio::test]
async fn a_pod_whose_group_does_not_exist_yet_is_managed_with_no_problem() {
    let (client, api) = with_workload_api(node_a(
        vec![pod("a", UID_A, "Running", Some("later"))],
        json!({"metadata": {"name": "node-a"}}),
    ))
    .list("/apis/scheduling.k8s.io/*", "X", "5", vec![])
    .client();
    let (src, d) = synced(client).await;
    assert_eq!(names(src.pods()), ["a"]);
    assert!(d.new_problems.is_empty(), "{:?}", d.new_problems);
    let watched = || {
        api.requests().iter().any(|r| {
            r.path() == "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups"
                && r.query("fieldSelector").as_deref() == Some("metadata.name=later")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !watched() {
        assert!(Instant::now() < deadline, "the group never asked for");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(src.pods().problems.is_empty(), "{:?}", src.pods().problems);
}

/// A server that ignores the `spec.nodeName` selector (as this mock does) lists another node's
/// pod: it is left out of the node's pods, which hold only those bound to this node.
#[tokio::test]
async fn a_pod_of_another_node_is_never_admitted() {
    let mut other = pod(
        "other",
        "aaaaaaaa-0000-4000-8000-0000000000b0",
        "Running",
        None,
    );
    other["spec"]["nodeName"] = json!("node-b");
    let (client, _api) = node_a(
        vec![pod("a", UID_A, "Running", None), other],
        json!({"metadata": {"name": "node-a"}}),
    )
    .list("/apis/*", "X", "1", vec![])
    .client();
    let (src, d) = synced(client).await;
    assert_eq!(names(src.pods()), ["a"]);
    assert!(d.new_problems.is_empty(), "{:?}", d.new_problems);
    assert_eq!(src.foreign.len(), 1);
}

/// A cluster without the Workload API (discovery: 404): gang-awareness off, no workload watch,
/// the pods still managed, and readiness needs the pod watch only.
#[tokio::test]
async fn without_the_workload_api_gang_awareness_is_off_and_pods_are_managed() {
    // Nothing else is served: discovery and every workload kind answer 404.
    let (client, api) = node_a(
        vec![pod("a", UID_A, "Running", Some("g"))],
        json!({"metadata": {"name": "node-a"}}),
    )
    .client();
    let (mut src, _) = synced(client).await;
    changes_until(&mut src, "gang-awareness off", |s| {
        *s.gang_awareness().lock().unwrap() == GangAwareness::Off
    })
    .await;
    assert_eq!(names(src.pods()), ["a"]);
    assert!(src.pods().objects.is_empty());
    let states = src.watch_states();
    assert!(states.synced(), "{}", states.summary());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let workload: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.path().starts_with("/apis/scheduling.k8s.io/"))
        .map(|r| r.uri.clone())
        .collect();
    assert_eq!(
        workload,
        ["/apis/scheduling.k8s.io/v1beta1"],
        "discovery only"
    );
}

/// A chain of 300 CompositePodGroups above a pod's PodGroup is read no higher than the depth
/// limit: the objects to watch are the limit's levels (the PodGroup and the three
/// CompositePodGroups above it), the door says the chain is too deep (the parent the top level
/// names counts as a level), once, and a loop, closed above the limit or within it, is read once.
#[test]
fn a_group_chain_is_walked_no_deeper_than_its_limit() {
    use crate::workload::validate::MAX_DEPTH;
    let pods = [Arc::new(
        serde_json::from_value::<Pod>(pod("p", UID_A, "Running", Some("g0"))).unwrap(),
    )];
    let resource = |kind: &str| {
        workload_resources()
            .into_iter()
            .find(|r| r.kind == kind)
            .unwrap()
    };
    let chain = |len: usize, top_parent: Option<&str>| {
        let object = |v: Value| Arc::new(serde_json::from_value::<DynamicObject>(v).unwrap());
        let (pod_group, composites) = group_chain(len, top_parent);
        [
            (resource("PodGroup"), vec![object(pod_group)]),
            (
                resource("CompositePodGroup"),
                composites.into_iter().map(object).collect(),
            ),
        ]
    };
    let levels = |n: usize| -> BTreeSet<(String, String, String)> {
        std::iter::once(("ns".into(), "PodGroup".into(), "g0".into()))
            .chain((1..n).map(|i| ("ns".into(), "CompositePodGroup".into(), format!("g{i}"))))
            .collect()
    };
    let depth_problems = |objects: Loaded| -> Vec<String> {
        let (set, _) = build(
            objects,
            &PodSet::default(),
            &ValidationOptions::default(),
            BTreeSet::new(),
            None,
        );
        set.problems
            .into_iter()
            .filter(|p| p.contains("depth-limit") || p.contains("no-cycles"))
            .collect()
    };
    // The workload objects given to the door, typed (none as a document).
    let groups = |l: &Loaded| {
        assert!(l.objects.is_empty(), "every group decodes");
        l.typed
            .iter()
            .filter(|(_, t)| !matches!(t, Typed::Pod(_)))
            .count()
    };
    let (objects, wanted) = loaded_fresh(&pods, &chain(300, Some("g300")));
    assert_eq!(wanted, levels(MAX_DEPTH));
    assert_eq!(groups(&objects), MAX_DEPTH);
    assert_eq!(
        depth_problems(objects),
        ["api: PodGroup/ns/g0: depth-limit: at depth 5 or more, at most 4"]
    );
    // A loop back to the bottom of the chain: no more, and the same one problem.
    let (objects, wanted) = loaded_fresh(&pods, &chain(300, Some("g1")));
    assert_eq!(wanted, levels(MAX_DEPTH));
    assert_eq!(depth_problems(objects).len(), 1);
    // A chain at the limit, its top a root: every level read, nothing too deep.
    let (objects, wanted) = loaded_fresh(&pods, &chain(MAX_DEPTH, None));
    assert_eq!(wanted, levels(MAX_DEPTH));
    assert_eq!(depth_problems(objects), Vec::<String>::new());
    // A loop within the limit (g0 under g1 under g2 under g1): each group read once.
    let (objects, wanted) = loaded_fresh(&pods, &chain(3, Some("g1")));
    assert_eq!(wanted, levels(3));
    assert_eq!(groups(&objects), 3);
}

/// The API's workload objects reach the door typed; one that does not decode as its kind goes
/// as a document, and the door names the object and the field, as it would a manifest's.
#[test]
fn workload_objects_go_typed_and_one_that_does_not_decode_is_reported() {
    let pods = [Arc::new(
        serde_json::from_value::<Pod>(pod("p", UID_A, "Running", Some("good"))).unwrap(),
    )];
    let mut bad = pod_group("bad");
    bad["spec"]["schedulingPolicy"]["gang"]["minCount"] = json!("many");
    let object = |v: Value| Arc::new(serde_json::from_value::<DynamicObject>(v).unwrap());
    let resource = workload_resources()
        .into_iter()
        .find(|r| r.kind == "PodGroup")
        .unwrap();
    let objects = vec![(resource, vec![object(pod_group("good")), object(bad)])];
    let all = loaded_all(&pods, &objects);
    let kinds: Vec<&str> = all
        .typed
        .iter()
        .map(|(_, t)| match t {
            Typed::Pod(_) => "Pod",
            Typed::PodGroup(_) => "PodGroup",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["Pod", "PodGroup"]);
    assert_eq!(all.objects.len(), 1, "the one that does not decode");
    let (set, _) = build(
        all,
        &PodSet::default(),
        &ValidationOptions::default(),
        BTreeSet::new(),
        None,
    );
    let problems: Vec<&String> = set.problems.iter().collect();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with(
            "api: PodGroup/ns/bad: schema: spec.schedulingPolicy.gang.minCount: invalid type"
        ),
        "{problems:?}"
    );
    assert_eq!(names(&set), ["p"]);
    assert_eq!(set.objects.len(), 1, "the good PodGroup");
}

/// A node whose pod's PodGroup hangs below a chain of 300 CompositePodGroups, its top naming
/// `top_parent` (absent, or the chain's own first composite: a loop): the node opens one watch
/// for each level the depth limit allows, and says the chain is too deep in one line, however
/// many passes follow.
async fn a_long_chain_costs_the_limits_watches_and_one_line(top_parent: &str) {
    use crate::workload::validate::MAX_DEPTH;
    let logs = crate::test_log::LogBuffer::default();
    // The test's runtime has one thread: the source's passes log to this subscriber.
    let _log = tracing::subscriber::set_default(logs.subscriber());
    let (pod_group, composites) = group_chain(300, Some(top_parent));
    let (client, api) = with_workload_api(node_a(
        vec![pod("p", UID_A, "Running", Some("g0"))],
        json!({"metadata": {"name": "node-a"}}),
    ))
    .route(
        "GET",
        "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups",
        by_name("PodGroup", vec![pod_group]),
    )
    .route(
        "GET",
        "/apis/scheduling.k8s.io/v1alpha3/namespaces/ns/compositepodgroups",
        by_name("CompositePodGroup", composites),
    )
    .client();
    let (mut src, _) = synced(client).await;
    changes_until(&mut src, "the limit's levels", |s| {
        s.pods().objects.len() == MAX_DEPTH
    })
    .await;
    let workload_watches = |requests: &[mock::Recorded]| -> Vec<String> {
        requests
            .iter()
            .filter(|r| r.is_watch() && r.path().starts_with("/apis/scheduling.k8s.io/"))
            .map(|r| r.query("fieldSelector").unwrap_or_default())
            .collect()
    };
    api.wait_for("a watch of each level", |l| {
        workload_watches(l).len() >= MAX_DEPTH
    })
    .await;
    // Many more passes, each rebuilding from the stores: no further watch, no second line.
    for _ in 0..20 {
        src.tx.send_modify(|n| *n += 1);
        tokio::time::timeout(Duration::from_secs(5), src.changed())
            .await
            .unwrap()
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut watched = workload_watches(&api.requests());
    watched.sort();
    assert_eq!(
        watched,
        (0..MAX_DEPTH)
            .map(|i| format!("metadata.name=g{i}"))
            .collect::<Vec<_>>(),
        "one watch for each level"
    );
    let too_deep: Vec<&String> = src
        .pods()
        .problems
        .iter()
        .filter(|p| p.contains("depth-limit"))
        .collect();
    assert_eq!(
        too_deep,
        ["api: PodGroup/ns/g0: depth-limit: at depth 5 or more, at most 4"]
    );
    assert_eq!(logs.count("depth-limit"), 1, "{}", logs.text());
}

#[tokio::test]
async fn a_long_group_chain_costs_the_limits_watches_and_one_line() {
    a_long_chain_costs_the_limits_watches_and_one_line("g300").await;
}

#[tokio::test]
async fn a_long_group_loop_costs_the_limits_watches_and_one_line() {
    a_long_chain_costs_the_limits_watches_and_one_line("g1").await;
}

/// A watch's log says its first sync, a failure at most once a minute however often the server
/// fails it in new words or flaps, a change held back once the minute has passed, and a
/// recovery only after a failure it said.
#[tokio::test(start_paused = true)]
async fn a_watch_says_each_problem_once_and_at_most_a_failure_a_minute() {
    let mut said = WatchLog::default();
    assert_eq!(said.synced(), Some(Synced::First));
    assert_eq!(said.synced(), None, "a relist says nothing");
    assert!(said.failed(true));
    assert!(!said.failed(false), "the same error again");
    // Flapping: failing in ever new words, synced in between, every 5 s for a minute.
    let mut lines = 0;
    for _ in 0..11 {
        tokio::time::advance(Duration::from_secs(5)).await;
        lines += usize::from(said.synced().is_some());
        lines += usize::from(said.failed(true));
    }
    assert_eq!(lines, 1, "the recovery of the failure said");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(
        said.failed(false),
        "the change held back, a minute after the last failure said"
    );
    assert!(!said.failed(false));
    assert_eq!(said.synced(), Some(Synced::Recovered));
    assert_eq!(said.synced(), None);
    // A change held back and recovered from before the minute is not said after it.
    assert!(!said.failed(true));
    assert_eq!(said.synced(), None);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(!said.failed(false));
}

/// A watch request the API server answers HTTP 410 (its version is gone) brings a new list,
/// and the watch goes on from the new list's version: kube-runtime alone would ask from the old
/// version for good.
#[tokio::test]
async fn a_watch_answered_http_410_lists_again() {
    let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lists.clone();
    let (client, api) = Routes::new()
        .route("GET", "/api/v1/pods", move |r| {
            if !r.is_watch() {
                let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let rv = if n == 0 { "5" } else { "6" };
                return Some((200, list("Pod", rv, vec![pod("a", UID_A, "Running", None)])));
            }
            (r.query("resourceVersion").as_deref() == Some("5")).then(|| {
                (
                    410,
                    status(410, "Expired", "too old resource version: 5 (6)"),
                )
            })
        })
        .list(
            "/api/v1/nodes",
            "Node",
            "5",
            vec![json!({"metadata": {"name": "node-a"}})],
        )
        .on(
            "GET",
            "/apis/scheduling.k8s.io/v1beta1",
            404,
            status(404, "NotFound", "no"),
        )
        .client();
    let (src, _) = synced(client).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let watched_from = |rv: &str| {
        api.requests().iter().any(|r| {
            r.is_watch()
                && r.path() == "/api/v1/pods"
                && r.query("resourceVersion").as_deref() == Some(rv)
        })
    };
    while !watched_from("6") {
        assert!(
            Instant::now() < deadline,
            "no watch from the new list: {:#?}",
            api.requests()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lists.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(names(src.pods()), ["a"]);
    assert_eq!(
        src.watch_states().get().get("pods"),
        Some(&ApiWatchState::Synced)
    );
}

/// A synced watch whose stream the server cuts (kube-runtime sees no error, only an end) is
/// named failing on `/readyz`, with how, while the node stays ready (its pods were listed); a
/// re-established watch clears it once it has lasted a second, though it yields nothing.
#[tokio::test(start_paused = true)]
async fn a_synced_watch_that_is_cut_is_failing_on_readyz_until_a_watch_lasts() {
    use crate::cluster::client::{SHORT_WATCH, WATCH_CUT};
    let answered = Answered::default();
    let states = ApiWatchStates::new(answered.clone());
    states.set("pods", "/api/v1/pods", ApiWatchState::Synced);
    states.set("node", "/api/v1/nodes", ApiWatchState::Synced);
    assert_eq!(states.summary(), "node synced, pods synced");
    let opened = Instant::now();
    answered.watch_opened("/api/v1/pods", opened);
    tokio::time::advance(Duration::from_millis(50)).await;
    answered.watch_ended("/api/v1/pods", opened, Some(WATCH_CUT));
    assert_eq!(
        states.summary(),
        format!("node synced, pods failing ({WATCH_CUT})")
    );
    assert!(states.synced(), "listed once: still ready");
    let again = Instant::now();
    answered.watch_opened("/api/v1/pods", again);
    tokio::time::advance(SHORT_WATCH / 2).await;
    assert!(
        states.summary().contains("pods failing"),
        "{}",
        states.summary()
    );
    tokio::time::advance(SHORT_WATCH / 2).await;
    assert_eq!(states.summary(), "node synced, pods synced");
}

/// A pod event costs the admission of that pod: the pods the last build admitted with the same
/// uid and resourceVersion are kept as they were, wherever the store lists them, and the set is
/// the one admitting every pod afresh gives.
#[test]
fn a_pod_is_admitted_once_per_resource_version() {
    let typed = |v: Value| Arc::new(serde_json::from_value::<Pod>(v).unwrap());
    let pods: Vec<Arc<Pod>> = [
        ("a", UID_A),
        ("b", UID_B),
        ("c", "00000000-0000-0000-0000-00000000000c"),
    ]
    .into_iter()
    .map(|(name, uid)| typed(pod(name, uid, "Running", None)))
    .collect();
    let opts = ValidationOptions::default();
    let door = |f: FromApi, before: &PodSet| {
        let next = build_set(f.unchanged, f.loaded, before, &opts, BTreeSet::new(), None);
        let diff = diff(before, &next);
        (next, diff)
    };
    let counts = |f: &FromApi| (f.loaded.typed.len(), f.unchanged.len());
    let first = loaded(&pods, &[], &PodSet::default());
    assert_eq!(counts(&first), (3, 0));
    let (before, _) = door(first, &PodSet::default());
    assert_eq!(before.pods.len(), 3, "{:?}", before.problems);
    // The same pods again: none admitted again, nothing changed.
    let again = loaded(&pods, &[], &before);
    assert_eq!(counts(&again), (0, 3));
    let (same, diff) = door(again, &before);
    assert!(diff.is_empty(), "{diff:?}");
    assert_eq!(same.pods, before.pods);
    // b changes (a new resourceVersion and a memory request) and is listed first now.
    let mut b = pod("b", UID_B, "Running", None);
    b["metadata"]["resourceVersion"] = json!("2");
    b["spec"]["containers"][0]["resources"] = json!({"requests": {"memory": "64Mi"}});
    let listed = vec![typed(b), pods[0].clone(), pods[2].clone()];
    let next = loaded(&listed, &[], &before);
    assert_eq!(counts(&next), (1, 2), "only b is admitted again");
    let (incremental, diff) = door(next, &before);
    let changed: Vec<&str> = diff.pods_changed.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(changed, ["b"]);
    assert!(diff.pods_added.is_empty() && diff.pods_removed.is_empty());
    let (afresh, _) = door(loaded(&listed, &[], &PodSet::default()), &before);
    assert_eq!(incremental.pods, afresh.pods);
}
