//! The node root watcher on the real kernel, notifications only (no level check): on v1 the
//! memory threshold notification (cgroup.event_control + eventfd) fires when usage crosses the
//! level; on v2 inotify reports memory.events changing when the node root passes memory.high.

use std::time::Duration;

use qoslet::eviction::{WakeSource, WatchConfig, spawn_watcher};
use qoslet_tests::{NodeRoot, require_root};

const MI: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_wakes_on_the_kernels_notification() {
    require_root();
    let Some(node) = NodeRoot::create(256 * MI) else {
        return;
    };
    let expected = if node.v1 {
        WakeSource::UsageThreshold
    } else {
        // memory.high throttles and counts `high` events without any OOM kill.
        node.memory.write("memory.high", &(64 * MI).to_string());
        WakeSource::MemoryEvents
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let watcher = spawn_watcher(
        WatchConfig {
            node_root: node.memory_cgroup(),
            level_bytes: (64 * MI) as i64,
            poll: None,
        },
        tx,
    )
    .expect("starting the watcher");
    let pod = node.pod("pod");
    // Nothing crossed yet: no wake-up.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "a wake-up before any crossing"
    );
    let mut hog = pod.start_hog(128, Some(200.0));
    let wake = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a wake-up within 10 s of the crossing")
        .expect("the watcher is running");
    assert_eq!(wake.source, expected);
    assert!(hog.alive());
    assert_eq!(node.oom_kills(), 0);
    watcher.abort();
}
