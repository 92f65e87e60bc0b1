//! kube-rs against qoslet's fake API server (`qoslet_tests::fake_api`): the kube client and
//! kube-runtime's watcher and reflector, unmodified, over real HTTP on loopback. No root needed.

use std::{
    net::TcpStream,
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client, Config,
    api::{
        DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, Preconditions,
        WatchEvent, WatchParams,
    },
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        reflector::{self, Store},
        watcher::{self, Event},
    },
};
use qoslet_tests::fake_api::{FakeApi, Options, Outage, RequestRecord};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Generous: the machine is shared with other builds.
const WAIT: Duration = Duration::from_secs(30);

fn scratch_file(name: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "qoslet-fake-api-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Starts a fake and a kube client configured through the kubeconfig file the fake writes,
/// without kube's default retry of 429 and 503 answers, so that tests see them.
async fn start(options: Options) -> (FakeApi, Client) {
    start_with(options, false).await
}

async fn start_with(options: Options, default_retry: bool) -> (FakeApi, Client) {
    let fake = FakeApi::start(options)
        .await
        .expect("start the fake API server");
    let path = scratch_file("kubeconfig");
    fake.write_kubeconfig(&path).unwrap();
    let kubeconfig = Kubeconfig::read_from(&path).expect("read the kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert!(
        config.default_retry,
        "kube retries 429, 503 and 504 unless told not to"
    );
    config.default_retry = default_retry;
    assert_eq!(
        config.cluster_url.to_string().trim_end_matches('/'),
        fake.url()
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
    (fake, Client::try_from(config).expect("kube client"))
}

fn pod(namespace: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace, "labels": { "app": "web" } },
        "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "busybox" }] },
        "status": { "phase": "Running" },
    })
}

fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": name },
        "status": { "conditions": [
            { "type": "Ready", "status": "True", "reason": "KubeletReady" },
            { "type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory" },
        ]},
    })
}

/// Runs a watcher (with kube-runtime's default backoff) feeding a reflector store; every event
/// or error goes to the returned channel as a short description.
fn reflect(
    api: Api<Pod>,
    config: watcher::Config,
) -> (Store<Pod>, mpsc::UnboundedReceiver<String>) {
    let (reader, writer) = reflector::store();
    let (tx, rx) = mpsc::unbounded_channel();
    let stream = reflector::reflector(
        writer,
        kube::runtime::WatchStreamExt::default_backoff(watcher::watcher(api, config)),
    );
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            let text = match item {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(p)) => {
                    format!("init-apply {}", p.metadata.name.unwrap_or_default())
                }
                Ok(Event::InitDone) => "init-done".to_string(),
                Ok(Event::Apply(p)) => format!("apply {}", p.metadata.name.unwrap_or_default()),
                Ok(Event::Delete(p)) => format!("delete {}", p.metadata.name.unwrap_or_default()),
                Err(watcher::Error::WatchError(status)) => {
                    format!("error {} {}", status.code, status.reason)
                }
                Err(err) => format!("failed {err}"),
            };
            if tx.send(text).is_err() {
                return;
            }
        }
    });
    (reader, rx)
}

/// Waits for the next event description that satisfies `want`; returns it and those skipped.
async fn next_matching(
    rx: &mut mpsc::UnboundedReceiver<String>,
    want: impl Fn(&str) -> bool,
) -> (String, Vec<String>) {
    let mut skipped = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(text)) if want(&text) => return (text, skipped),
            Ok(Some(text)) => skipped.push(text),
            _ => panic!("no matching watcher event within {WAIT:?}; saw {skipped:?}"),
        }
    }
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn names(store: &Store<Pod>) -> Vec<String> {
    let mut names: Vec<String> = store
        .state()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    names
}

fn requests_to(fake: &FakeApi, method: &str, path: &str) -> Vec<RequestRecord> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == method && r.path == path)
        .collect()
}

#[tokio::test]
async fn watcher_with_field_selector_sees_adds_updates_and_deletes() {
    let (fake, client) = start(Options::default()).await;
    fake.seed([
        node("n1"),
        pod("ns", "before", "n1"),
        pod("ns", "elsewhere", "n2"),
    ])
    .unwrap();
    let pods: Api<Pod> = Api::all(client.clone());
    let (store, mut events) = reflect(pods, watcher::Config::default().fields("spec.nodeName=n1"));
    next_matching(&mut events, |e| e == "init-done").await;
    assert_eq!(names(&store), ["before"]);

    // Creates through the API and through the test control; only n1's pods are seen.
    let ns_pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    let created: Pod = serde_json::from_value(pod("ns", "api-made", "n1")).unwrap();
    let created = ns_pods
        .create(&PostParams::default(), &created)
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    fake.create_json(pod("ns", "other-node", "n2")).unwrap();
    fake.create_json(pod("ns", "added", "n1")).unwrap();
    let (_, skipped) = next_matching(&mut events, |e| e == "apply added").await;
    assert_eq!(skipped, ["apply api-made"]);
    assert_eq!(names(&store), ["added", "api-made", "before"]);

    // An update is an Apply with the new state; scheduling a pod onto n1 makes it appear
    // (ADDED from the watch cache), moving it away makes it disappear (DELETED).
    fake.modify::<Pod>("ns", "added", |p| p["status"]["phase"] = json!("Succeeded"))
        .unwrap();
    next_matching(&mut events, |e| e == "apply added").await;
    let phase = store
        .state()
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("added"))
        .unwrap()
        .status
        .clone()
        .unwrap()
        .phase;
    assert_eq!(phase.as_deref(), Some("Succeeded"));
    fake.modify::<Pod>("ns", "elsewhere", |p| p["spec"]["nodeName"] = json!("n1"))
        .unwrap();
    next_matching(&mut events, |e| e == "apply elsewhere").await;
    fake.modify::<Pod>("ns", "elsewhere", |p| p["spec"]["nodeName"] = json!("n3"))
        .unwrap();
    next_matching(&mut events, |e| e == "delete elsewhere").await;

    // Deletes: immediate through the control, graceful through the API (a terminating pod
    // first, then gone once the stand-in kubelet removes it).
    fake.remove::<Pod>("ns", "before").unwrap();
    next_matching(&mut events, |e| e == "delete before").await;
    ns_pods
        .delete("api-made", &DeleteParams::default())
        .await
        .expect("delete");
    let (_, skipped) = next_matching(&mut events, |e| e == "delete api-made").await;
    assert_eq!(
        skipped,
        ["apply api-made"],
        "the deletionTimestamp update comes first"
    );
    eventually("the store holds only n1's remaining pod", || {
        names(&store) == ["added"]
    })
    .await;

    // What the watcher asked for: a list then a watch, both with the selector.
    let lists: Vec<_> = requests_to(&fake, "GET", "/api/v1/pods")
        .into_iter()
        .filter(|r| !r.is_watch())
        .collect();
    assert_eq!(
        lists[0].param("fieldSelector").as_deref(),
        Some("spec.nodeName=n1")
    );
    assert_eq!(lists[0].code, 200);
    let watches: Vec<_> = requests_to(&fake, "GET", "/api/v1/pods")
        .into_iter()
        .filter(RequestRecord::is_watch)
        .collect();
    assert_eq!(
        watches[0].param("allowWatchBookmarks").as_deref(),
        Some("true")
    );
    assert_eq!(
        watches[0].param("fieldSelector").as_deref(),
        Some("spec.nodeName=n1")
    );
    assert!(watches[0].param("resourceVersion").is_some());

    // A list with a label selector and one with an unknown field.
    let web = ns_pods
        .list(&ListParams::default().labels("app=web,app notin (db)"))
        .await
        .unwrap();
    assert_eq!(
        web.items.len(),
        3,
        "added, other-node and elsewhere are left in ns"
    );
    let bad = ns_pods
        .list(&ListParams::default().fields("spec.bogus=1"))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = bad else {
        panic!("want an API error, got {bad:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
    assert_eq!(status.message, "field label not supported: spec.bogus");
}

#[tokio::test]
async fn bookmarks_arrive_and_streaming_lists_end_with_one() {
    let options = Options {
        bookmark_interval: Duration::from_millis(200),
        ..Options::default()
    };
    let (fake, client) = start(options).await;
    fake.seed([pod("ns", "a", "n1")]).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    let rv = fake.resource_version().to_string();
    let mut stream = pods
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("a bookmark in time")
        .unwrap();
    let Some(WatchEvent::Bookmark(bookmark)) = event else {
        panic!("want a bookmark, got {event:?}")
    };
    assert_eq!(bookmark.metadata.resource_version, rv);

    // Streaming list: the current objects, then the initial-events-end bookmark.
    let mut stream = pods
        .watch(&WatchParams::streaming_lists(), "0")
        .await
        .unwrap()
        .boxed();
    let first = stream.try_next().await.unwrap();
    assert!(
        matches!(&first, Some(WatchEvent::Added(p)) if p.metadata.name.as_deref() == Some("a")),
        "{first:?}"
    );
    let second = stream.try_next().await.unwrap();
    let Some(WatchEvent::Bookmark(end)) = second else {
        panic!("want the end bookmark, got {second:?}")
    };
    assert_eq!(
        end.metadata
            .annotations
            .get("k8s.io/initial-events-end")
            .map(String::as_str),
        Some("true")
    );

    // kube-runtime's watcher in streaming-list mode works too.
    let (store, mut events) = reflect(pods, watcher::Config::default().streaming_lists());
    next_matching(&mut events, |e| e == "init-done").await;
    assert_eq!(names(&store), ["a"]);
}

#[tokio::test]
async fn an_expired_watch_makes_the_watcher_relist() {
    let (fake, client) = start(Options::default()).await;
    fake.seed([pod("ns", "a", "n1"), pod("ns", "b", "n1")])
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");

    // A watch from before the kept history gets 410 Expired as an ERROR event.
    let old = fake.resource_version();
    fake.create_json(pod("ns", "c", "n1")).unwrap();
    fake.compact();
    let mut stream = pods
        .watch(&WatchParams::default(), &old.to_string())
        .await
        .unwrap()
        .boxed();
    let event = stream.try_next().await.unwrap();
    let Some(WatchEvent::Error(status)) = event else {
        panic!("want an ERROR event, got {event:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    assert!(
        stream.try_next().await.unwrap().is_none(),
        "the stream ends after the error"
    );

    // The watcher: compaction expires its open watch; it relists (a restart: Init .. InitDone)
    // and the store then holds exactly what exists, including changes made meanwhile.
    let watches = || fake.requests().iter().filter(|r| r.is_watch()).count();
    let watches_before = watches();
    let (store, mut events) = reflect(pods, watcher::Config::default());
    next_matching(&mut events, |e| e == "init-done").await;
    assert_eq!(names(&store), ["a", "b", "c"]);
    let lists_before = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/namespaces/ns/pods" && !r.is_watch())
        .count();
    eventually("the watcher's watch is open", || watches() > watches_before).await;
    fake.compact();
    fake.remove::<Pod>("ns", "a").unwrap();
    fake.create_json(pod("ns", "d", "n1")).unwrap();
    next_matching(&mut events, |e| e == "error 410 Expired").await;
    let (_, between) = next_matching(&mut events, |e| e == "init-done").await;
    assert_eq!(
        between.first().map(String::as_str),
        Some("init"),
        "{between:?}"
    );
    assert_eq!(names(&store), ["b", "c", "d"]);
    let lists_after = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/namespaces/ns/pods" && !r.is_watch())
        .count();
    assert_eq!(lists_after, lists_before + 1);

    // And it watches on from the new list.
    fake.create_json(pod("ns", "e", "n1")).unwrap();
    next_matching(&mut events, |e| e == "apply e").await;
}

#[tokio::test]
async fn eviction_answers_201_429_and_404() {
    let options = Options {
        kubelet_delete_after: Some(Duration::from_millis(50)),
        ..Options::default()
    };
    let (fake, client) = start(options).await;
    fake.seed([pod("ns", "free", "n1"), pod("ns", "guarded", "n1")])
        .unwrap();
    fake.block_eviction("ns", "guarded", "web-pdb");
    let pods: Api<Pod> = Api::namespaced(client, "ns");

    let ok = pods
        .evict("free", &EvictParams::default())
        .await
        .expect("eviction succeeds");
    assert!(ok.is_success());
    assert_eq!(ok.code, 201);
    eventually("the evicted pod is gone", || {
        fake.get::<Pod>("ns", "free").is_none()
    })
    .await;

    let blocked = pods
        .evict("guarded", &EvictParams::default())
        .await
        .unwrap_err();
    let kube::Error::Api(status) = blocked else {
        panic!("want an API error, got {blocked:?}")
    };
    assert_eq!(
        (status.code, status.reason.as_str()),
        (429, "TooManyRequests")
    );
    assert_eq!(
        status.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert!(fake.get::<Pod>("ns", "guarded").is_some());
    fake.unblock_eviction("ns", "guarded");
    pods.evict("guarded", &EvictParams::default())
        .await
        .expect("unblocked eviction succeeds");

    let missing = pods
        .evict("missing", &EvictParams::default())
        .await
        .unwrap_err();
    let kube::Error::Api(status) = missing else {
        panic!("want an API error, got {missing:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(status.message, "pods \"missing\" not found");

    let log = requests_to(&fake, "POST", "/api/v1/namespaces/ns/pods/guarded/eviction");
    assert_eq!(log.iter().map(|r| r.code).collect::<Vec<_>>(), [429, 201]);
    assert_eq!(log[0].body.as_ref().unwrap()["metadata"]["name"], "guarded");
    assert_eq!(log[0].content_type.as_deref(), Some("application/json"));
}

/// kube's default client retries a 429 (up to 15 times, backing off from 5 ms), so with it a
/// blocked eviction waits for the budget instead of failing.
#[tokio::test]
async fn kube_default_retry_repeats_a_blocked_eviction() {
    let (fake, client) = start_with(Options::default(), true).await;
    fake.seed([pod("ns", "guarded", "n1")]).unwrap();
    fake.block_eviction("ns", "guarded", "web-pdb");
    let pods: Api<Pod> = Api::namespaced(client, "ns");
    let eviction =
        tokio::spawn(async move { pods.evict("guarded", &EvictParams::default()).await });
    let path = "/api/v1/namespaces/ns/pods/guarded/eviction";
    eventually("kube has retried twice", || {
        requests_to(&fake, "POST", path).len() >= 3
    })
    .await;
    fake.unblock_eviction("ns", "guarded");
    let status = tokio::time::timeout(WAIT, eviction)
        .await
        .expect("eviction returns")
        .unwrap()
        .expect("evicted");
    assert_eq!(status.code, 201);
    let codes: Vec<u16> = requests_to(&fake, "POST", path)
        .iter()
        .map(|r| r.code)
        .collect();
    assert!(
        codes.len() >= 4 && codes[..codes.len() - 1].iter().all(|c| *c == 429),
        "{codes:?}"
    );
    assert_eq!(codes.last(), Some(&201));
}

#[tokio::test]
async fn delete_checks_the_uid_precondition() {
    let (fake, client) = start(Options::default()).await;
    fake.seed([pod("ns", "p", "n1")]).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "ns");
    let uid = fake.get::<Pod>("ns", "p").unwrap().metadata.uid.unwrap();

    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let err = pods.delete("p", &wrong).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("want an API error, got {err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        format!(
            "Operation cannot be fulfilled on pods \"p\": Precondition failed: UID in precondition: not-the-uid, UID in object meta: {uid}"
        )
    );
    assert!(fake.get::<Pod>("ns", "p").is_some());

    let right = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete("p", &right)
        .await
        .expect("delete with the right uid");
    assert!(
        fake.get::<Pod>("ns", "p").is_none(),
        "grace period 0 deletes at once"
    );
    let log = requests_to(&fake, "DELETE", "/api/v1/namespaces/ns/pods/p");
    assert_eq!(log.iter().map(|r| r.code).collect::<Vec<_>>(), [409, 200]);
    assert_eq!(
        log[1].body.as_ref().unwrap()["preconditions"]["uid"],
        json!(uid)
    );
    assert_eq!(
        log[1].body.as_ref().unwrap()["gracePeriodSeconds"],
        json!(0)
    );
}

#[tokio::test]
async fn strategic_merge_status_patch_replaces_the_condition_of_its_type() {
    let (fake, client) = start(Options::default()).await;
    fake.seed([node("n1")]).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({ "status": { "conditions": [
        { "type": "MemoryPressure", "status": "True", "reason": "QosletMemoryPressure" },
    ]}});
    let patched = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("patch");
    let conditions: Vec<(String, String, Option<String>)> = patched
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason))
        .collect();
    assert_eq!(
        conditions,
        [
            ("Ready".into(), "True".into(), Some("KubeletReady".into())),
            (
                "MemoryPressure".into(),
                "True".into(),
                Some("QosletMemoryPressure".into())
            ),
        ]
    );
    let log = requests_to(&fake, "PATCH", "/api/v1/nodes/n1/status");
    assert_eq!(
        log[0].content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    assert_eq!(log[0].body.as_ref(), Some(&patch));

    // A merge patch replaces the whole list, as RFC 7386 says.
    let merged = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(merged.status.unwrap().conditions.unwrap().len(), 1);

    // Status writes leave the spec alone; object writes leave the status alone.
    let labelled = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "labels": { "a": "b" } }, "status": { "phase": "x" } }),
            ),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.labels.unwrap()["a"], "b");
    assert_eq!(labelled.status.unwrap().phase, None);
}

/// The kubelet's status patch carries the pod's uid as a precondition: a pod re-created under
/// the same name (another uid) refuses it with 422 (uid is immutable), as the API server does.
#[tokio::test]
async fn a_status_patch_naming_another_uid_is_invalid() {
    let (fake, client) = start(Options::default()).await;
    fake.seed([pod("ns", "p", "n1")]).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    let uid = pods.get("p").await.unwrap().metadata.uid.unwrap();
    let patch = |uid: &str| json!({"metadata": {"uid": uid}, "status": {"phase": "Failed", "reason": "Evicted"}});
    let err = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(patch("other")),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains("metadata.uid"), "{status:?}");
    assert_eq!(
        pods.get("p")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );
    let done = pods
        .patch_status("p", &PatchParams::default(), &Patch::Strategic(patch(&uid)))
        .await
        .unwrap();
    assert_eq!(done.status.unwrap().phase.as_deref(), Some("Failed"));
}

/// A cluster without the Workload API: discovery and every request of its kinds answer 404.
#[tokio::test]
async fn the_workload_api_can_be_left_unserved() {
    let options = Options {
        workload_api: false,
        ..Options::default()
    };
    let (_fake, client) = start(options).await;
    let err = client
        .list_api_group_resources("scheduling.k8s.io/v1beta1")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 404),
        "{err:?}"
    );
    let groups = client.list_api_groups().await.unwrap();
    assert!(!groups.groups.iter().any(|g| g.name == "scheduling.k8s.io"));
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", "PodGroup"),
        "podgroups",
    );
    let api: Api<kube::api::DynamicObject> = Api::all_with(client, &ar);
    let err = api.list(&ListParams::default()).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 404),
        "{err:?}"
    );
}

#[tokio::test]
async fn leases_create_update_and_apply() {
    let (fake, client) = start(Options::default()).await;
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "n1" }, "spec": { "holderIdentity": "qoslet-n1", "leaseDurationSeconds": 40 },
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let err = leases
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"));

    let mut renewed = created.clone();
    renewed.spec.as_mut().unwrap().lease_duration_seconds = Some(41);
    let updated = leases
        .replace("n1", &PostParams::default(), &renewed)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    // Updating from the stale version conflicts, as optimistic concurrency requires.
    let err = leases
        .replace("n1", &PostParams::default(), &renewed)
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"));

    let apply = json!({ "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": { "holderIdentity": "other" } });
    let applied = leases
        .patch("n1", &PatchParams::apply("qoslet"), &Patch::Apply(&apply))
        .await
        .unwrap();
    assert_eq!(
        applied.spec.unwrap().holder_identity.as_deref(),
        Some("other")
    );
    let made = leases
        .patch("n2", &PatchParams::apply("qoslet"), &Patch::Apply(&apply))
        .await
        .unwrap();
    assert_eq!(
        made.metadata.name.as_deref(),
        Some("n2"),
        "apply creates a missing object"
    );
    assert_eq!(
        fake.get::<Lease>("kube-node-lease", "n2")
            .unwrap()
            .metadata
            .uid,
        made.metadata.uid
    );
}

#[tokio::test]
async fn down_and_up_on_the_same_port() {
    let (fake, client) = start(Options::default()).await;
    fake.seed([pod("ns", "a", "n1")]).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    let (store, mut events) = reflect(pods.clone(), watcher::Config::default());
    next_matching(&mut events, |e| e == "init-done").await;
    let addr = fake.addr();

    fake.go_down(Outage::Refuse).await;
    assert!(
        TcpStream::connect(addr).is_err(),
        "connections are refused while down"
    );
    fake.create_json(pod("ns", "while-down", "n1")).unwrap();
    next_matching(&mut events, |e| e.starts_with("failed")).await;

    fake.come_up().await.expect("bind the same port again");
    assert_eq!(fake.addr(), addr);
    eventually("the watcher catches up after the outage", || {
        names(&store) == ["a", "while-down"]
    })
    .await;

    // 503 mode: requests answer ServiceUnavailable, then work again.
    fake.go_down(Outage::Unavailable).await;
    let err = pods.get("a").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(s) if s.code == 503 && s.reason == "ServiceUnavailable")
    );
    fake.come_up().await.unwrap();
    assert_eq!(
        pods.get("a").await.unwrap().metadata.name.as_deref(),
        Some("a")
    );
    fake.create_json(pod("ns", "after", "n1")).unwrap();
    eventually("the watcher sees writes after the 503 outage", || {
        names(&store) == ["a", "after", "while-down"]
    })
    .await;
}

/// One HTTP/1.1 request over a fresh connection, as a client other than kube sends it.
async fn raw(fake: &FakeApi, method: &str, path: &str, body: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(fake.addr()).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        fake.addr(),
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response[9..12].parse().unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn controls_over_http_for_a_separate_process() {
    let (fake, client) = start(Options::default()).await;
    let (code, stored) = raw(
        &fake,
        "POST",
        "/_fake/objects",
        &json!([node("n1"), pod("ns", "p", "n1")]).to_string(),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(stored.as_array().unwrap().len(), 2);
    let pods: Api<Pod> = Api::namespaced(client, "ns");
    assert!(pods.get("p").await.unwrap().metadata.uid.is_some());

    let (code, _) = raw(
        &fake,
        "POST",
        "/_fake/block-eviction",
        r#"{"namespace": "ns", "name": "p", "budget": "b"}"#,
    )
    .await;
    assert_eq!(code, 200);
    let err = pods.evict("p", &EvictParams::default()).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 429));

    let (code, _) = raw(&fake, "POST", "/_fake/unavailable", "").await;
    assert_eq!(code, 200);
    let (code, status) = raw(&fake, "GET", "/api/v1/namespaces/ns/pods/p", "").await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    raw(&fake, "POST", "/_fake/available", "").await;

    let (code, status) = raw(
        &fake,
        "POST",
        "/_fake/remove",
        r#"{"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "p"}"#,
    )
    .await;
    assert_eq!(
        (code, status["metadata"]["name"].as_str()),
        (200, Some("p"))
    );
    let (_, log) = raw(&fake, "GET", "/_fake/requests", "").await;
    let log: Vec<(String, u16)> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                format!(
                    "{} {}",
                    r["method"].as_str().unwrap(),
                    r["path"].as_str().unwrap()
                ),
                r["code"].as_u64().unwrap() as u16,
            )
        })
        .collect();
    assert_eq!(
        log,
        [
            ("GET /api/v1/namespaces/ns/pods/p".to_string(), 200),
            (
                "POST /api/v1/namespaces/ns/pods/p/eviction".to_string(),
                429
            ),
            ("GET /api/v1/namespaces/ns/pods/p".to_string(), 503),
        ],
        "API requests only, not the controls"
    );
}
