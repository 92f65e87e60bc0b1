use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde_json::json;

use super::*;
use crate::{
    cluster::{mock, writes::deliver},
    config::{EvictionMethod, GangEviction},
    policy::pod::PodKey,
};

const RUNNING: &str = "00000000-0000-0000-0000-0000000000aa";
const FAILED: &str = "00000000-0000-0000-0000-0000000000bb";
const OTHER: &str = "00000000-0000-0000-0000-0000000000cc";
/// The marks' eviction time (seconds since the Unix epoch).
const EVICTED_AT: u64 = 1_800_000_000;

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
fn temp(name: &str) -> TempDir {
    let p = std::env::temp_dir().join(format!("qoslet-marks-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    TempDir(p)
}

/// A plain directory of the test, opened as the node root is.
fn open(d: &Path) -> OwnedFd {
    beneath::openat2(
        libc::AT_FDCWD,
        d.to_str().unwrap(),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
        0,
    )
    .unwrap()
}

fn key(name: &str, uid: &str) -> PodKey {
    PodKey {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// The kubelet's cgroupfs tree below a node root: a Burstable pod and a Guaranteed one (no
/// tier), each marked as the eviction pipeline marks before its kill, and a third pod whose
/// cgroup carries a mark naming another pod.
fn kubelet_tree(root: &Path) {
    let dir = |rel: &str| {
        let d = root.join(rel);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    let message = "The node was low on resource: memory. ";
    let mark = |d: &Path, k: &PodKey| {
        let fd = open(d);
        EvictionMark::new(k, 7, message, EVICTED_AT)
            .with_annotations(&event_annotations())
            .write(fd.as_fd())
            .unwrap();
    };
    // A container's cgroup below the pod's, as the runtime makes it.
    dir(&format!("kubepods/burstable/pod{RUNNING}/ctr"));
    mark(
        &dir(&format!("kubepods/burstable/pod{RUNNING}")),
        &key("running", RUNNING),
    );
    mark(
        &dir(&format!("kubepods/pod{FAILED}")),
        &key("failed", FAILED),
    );
    mark(
        &dir("kubepods/besteffort/podsomeoneelse"),
        &key("other", OTHER),
    );
    // Not the kubelet's tree: never walked.
    mark(&dir(&format!("system/pod{OTHER}")), &key("other", OTHER));
}

#[test]
fn marks_are_read_on_the_pod_cgroups_they_name_only() {
    let t = temp("find");
    kubelet_tree(&t.0);
    let mut uids: Vec<String> = find(
        open(&t.0).as_fd(),
        &CgroupPath::root(),
        CgroupDriver::Cgroupfs,
    )
    .into_iter()
    .map(|f| f.mark.uid)
    .collect();
    uids.sort();
    assert_eq!(uids, [RUNNING, FAILED]);
}

/// A crash after the mark and before the queue's fsync: nothing queued, only the mark. The next
/// start finds it, the API server still shows the pod Running, and the status the eviction
/// would have written reaches the API server; the pod the API server shows Failed gets nothing.
#[tokio::test]
async fn after_a_crash_between_the_mark_and_the_queue_the_api_gets_the_status() {
    let t = temp("crash");
    let tree = t.0.join("cgroup");
    kubelet_tree(&tree);
    let queue = Arc::new(WriteQueue::open(&t.0.join("api-writes")).unwrap());
    assert!(queue.pending().is_empty(), "the crash left nothing queued");
    let (client, api) = mock::client(|r| {
        Some((
            200,
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": r.path()}}),
        ))
    });
    let action = kubelet_action(&queue);
    let marks = found_marks(&tree);
    // Its containers started before the eviction (a second at most: the API's resolution).
    let live = |uid: &str| match uid {
        RUNNING => Some(live_pod(false, Some(EVICTED_AT))),
        FAILED => Some(live_pod(true, None)),
        _ => None,
    };
    assert_eq!(
        requeue(&marks, live, &action, &queue),
        Requeued {
            queued: 1,
            ran_again: vec![]
        }
    );

    let task = tokio::spawn(queue.clone().run(move |w| {
        let c = client.clone();
        async move { deliver(&c, &w).await }
    }));
    api.wait_for("the status patch and the event", |r| r.len() >= 2)
        .await;
    task.abort();
    let requests = api.requests();
    let patch = requests
        .iter()
        .find(|r| r.method == "PATCH")
        .unwrap_or_else(|| panic!("no status patch: {requests:#?}"));
    assert_eq!(patch.path(), "/api/v1/namespaces/ns/pods/running/status");
    assert_eq!(patch.body["status"]["phase"], "Failed");
    assert_eq!(patch.body["status"]["reason"], "Evicted");
    assert_eq!(patch.body["metadata"]["uid"], RUNNING);
    assert!(
        requests.iter().all(|r| !r.path().contains("/failed")),
        "{requests:#?}"
    );
    // The Event is the kubelet's whole: its annotations came back with the mark.
    let event = requests
        .iter()
        .find(|r| r.method == "POST" && r.path().ends_with("/events"))
        .unwrap_or_else(|| panic!("no Event: {requests:#?}"));
    assert_eq!(
        event.body["metadata"]["annotations"]["starved_resource"], "memory",
        "{:#}",
        event.body
    );
    assert_eq!(
        event.body["metadata"]["annotations"]["offending_containers_usage"],
        "300Mi"
    );
}

#[test]
fn a_mark_too_large_with_its_annotations_keeps_the_eviction_without_them() {
    let many: std::collections::BTreeMap<String, String> = (0..200)
        .map(|i| (format!("offending_containers_{i}"), "x".repeat(40)))
        .collect();
    let m = EvictionMark::new(&key("a", RUNNING), 1, "m", EVICTED_AT).with_annotations(&many);
    assert!(m.annotations.is_empty());
    let m = EvictionMark::new(&key("a", RUNNING), 1, "m", EVICTED_AT)
        .with_annotations(&event_annotations());
    assert_eq!(m.annotations, event_annotations());
}

/// The kubelet's eviction Event annotations, as the mark keeps them.
fn event_annotations() -> std::collections::BTreeMap<String, String> {
    [
        ("offending_containers", "c"),
        ("offending_containers_usage", "300Mi"),
        ("starved_resource", "memory"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn kubelet_action(queue: &Arc<WriteQueue>) -> ApiEviction {
    ApiEviction::new(
        queue.clone(),
        "node-a",
        EvictionMethod::Kubelet,
        GangEviction::Node,
        None,
    )
}

fn found_marks(tree: &Path) -> Vec<EvictionMark> {
    find(
        open(tree).as_fd(),
        &CgroupPath::root(),
        CgroupDriver::Cgroupfs,
    )
    .into_iter()
    .map(|f| f.mark)
    .collect()
}

fn live_pod(terminal: bool, running_since: Option<u64>) -> LivePod {
    LivePod {
        terminal,
        grace: Duration::from_secs(30),
        seen: Default::default(),
        running_since,
    }
}

/// The kubelet restarted the marked pod after its eviction (its Failed status was lost): at the
/// next start the pod runs again, so nothing is queued and it is reported to have its mark
/// removed; a mark of an older qoslet (no time) is queued as before.
#[test]
fn a_marked_pod_that_ran_again_is_not_evicted_again_at_start() {
    let t = temp("ran-again");
    let tree = t.0.join("cgroup");
    kubelet_tree(&tree);
    let queue = Arc::new(WriteQueue::open(&t.0.join("api-writes")).unwrap());
    let action = kubelet_action(&queue);
    let marks = found_marks(&tree);
    let live = |uid: &str| (uid == RUNNING).then(|| live_pod(false, Some(EVICTED_AT + 1)));
    assert_eq!(
        requeue(&marks, live, &action, &queue),
        Requeued {
            queued: 0,
            ran_again: vec![RUNNING.to_owned()]
        }
    );
    assert!(queue.pending().is_empty());

    let mut old = marks.clone();
    for m in &mut old {
        m.at = 0;
    }
    assert_eq!(requeue(&old, live, &action, &queue).queued, 1);
}

#[test]
fn a_mark_is_removed_once_and_reads_back_as_none() {
    let t = temp("clear");
    let dir = open(&t.0);
    EvictionMark::new(&key("a", RUNNING), 1, "m", EVICTED_AT)
        .write(dir.as_fd())
        .unwrap();
    assert_eq!(
        EvictionMark::read(dir.as_fd()).map(|m| m.at),
        Some(EVICTED_AT)
    );
    EvictionMark::clear(dir.as_fd()).unwrap();
    assert!(EvictionMark::read(dir.as_fd()).is_none());
    // Again: nothing to remove is not an error.
    EvictionMark::clear(dir.as_fd()).unwrap();
}

/// A restart with the eviction's writes still in the queue's files: the reopened queue holds
/// them, so the mark queues nothing more (no "lost" line) and the API server gets one status
/// PATCH, not two.
#[tokio::test]
async fn after_a_restart_with_writes_pending_the_status_is_patched_once() {
    let t = temp("pending");
    let tree = t.0.join("cgroup");
    kubelet_tree(&tree);
    let marks = found_marks(&tree);
    let live = |uid: &str| (uid == RUNNING).then(|| live_pod(false, Some(EVICTED_AT)));
    {
        // The run before the restart: the writes were queued, on disk, and never delivered.
        let queue = Arc::new(WriteQueue::open(&t.0.join("api-writes")).unwrap());
        assert_eq!(
            requeue(&marks, live, &kubelet_action(&queue), &queue).queued,
            1
        );
        queue.flush();
    }
    let queue = Arc::new(WriteQueue::open(&t.0.join("api-writes")).unwrap());
    assert!(queue.has_pending(RUNNING), "{:?}", queue.pending());
    let before = queue.pending().len();
    assert_eq!(
        requeue(&marks, live, &kubelet_action(&queue), &queue),
        Requeued::default()
    );
    assert_eq!(queue.pending().len(), before);

    let (client, api) = mock::client(|r| {
        Some((
            200,
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": r.path()}}),
        ))
    });
    let task = tokio::spawn(queue.clone().run(move |w| {
        let c = client.clone();
        async move { deliver(&c, &w).await }
    }));
    api.wait_for("every queued write", |r| r.len() >= before)
        .await;
    assert!(
        queue
            .settled(&format!("event-{RUNNING}"), Duration::from_secs(5))
            .await
    );
    task.abort();
    let requests = api.requests();
    let patches = requests
        .iter()
        .filter(|r| r.method == "PATCH" && r.path().ends_with("/running/status"))
        .count();
    assert_eq!(patches, 1, "{requests:#?}");
}
