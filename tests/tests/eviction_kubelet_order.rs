//! The eviction manager on the real kernel: a node root cgroup with a memory limit and a hard
//! memory.available threshold, one pod of each class plus a Burstable pod over its request.
//! Memory grows in the BestEffort and the Burstable-over pods; the manager must evict BestEffort
//! first, then the Burstable pod over its request, before the kernel OOM killer acts.

use std::time::Duration;

use qoslet::{
    eviction::{Inventory, Order},
    policy::qos::QosClass,
};
use qoslet_tests::{EvictionRun, NodeRoot, hard_memory_config, managed_pod, require_root};

const MI: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_then_burstable_over_request_are_evicted_before_the_oom_killer() {
    require_root();
    // Pressure once the pods' working set passes 384 - 96 = 288 MiB.
    let Some(node) = NodeRoot::create(384 * MI) else {
        return;
    };
    let v1 = node.v1;
    let g = node.pod("guaranteed");
    let bu = node.pod("burstable-under");
    let be = node.pod("best-effort");
    let bo = node.pod("burstable-over");
    let inventory = Inventory {
        pods: vec![
            managed_pod("guaranteed", &g, v1, QosClass::Guaranteed, 64, 0),
            managed_pod("burstable-under", &bu, v1, QosClass::Burstable, 64, 0),
            managed_pod("best-effort", &be, v1, QosClass::BestEffort, 0, 0),
            managed_pod("burstable-over", &bo, v1, QosClass::Burstable, 16, 0),
        ],
        forests: Default::default(),
    };
    let cfg = hard_memory_config("96Mi", Order::GangAware, Duration::from_secs(1));
    let run = EvictionRun::start(&node, cfg, inventory, true, Some(Duration::from_millis(10)));

    let mut hog_g = g.start_hog(56, None);
    let mut hog_bu = bu.start_hog(32, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // BestEffort grows faster, so at the first crossing it is further over its (zero) request.
    let mut hog_be = be.start_hog(250, Some(80.0));
    let mut hog_bo = bo.start_hog(240, Some(30.0));

    let decisions = run.wait_decisions(2, Duration::from_secs(40)).await;
    assert_eq!(
        decisions,
        vec![
            vec!["best-effort".to_owned()],
            vec!["burstable-over".to_owned()]
        ],
        "eviction order"
    );
    let sig = |h: &mut qoslet_tests::Hog| {
        tokio::task::block_in_place(|| h.wait_signal(Duration::from_secs(5)))
    };
    assert_eq!(sig(&mut hog_be), Some(libc::SIGKILL));
    assert_eq!(sig(&mut hog_bo), Some(libc::SIGKILL));
    // Let the survivors run on a moment after the last eviction: nothing else may go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(hog_g.alive(), "the Guaranteed pod must survive");
    assert!(
        hog_bu.alive(),
        "the Burstable pod under its request must survive"
    );
    assert_eq!(
        node.oom_kills(),
        0,
        "the kernel OOM killer must not have acted"
    );

    let stats = run.stats.lock().unwrap().clone();
    assert_eq!(stats.evictions.get("memory.available"), Some(&2));
    assert_eq!(stats.decision_latency.count, 2);
    for d in &stats.recent {
        assert_eq!(d.signal, "memory.available");
        assert_eq!(d.threshold, 96 * MI as i64);
        assert!(d.observed < d.threshold, "{d:?}");
        assert!(d.latency.is_some());
        let (_, status) = &d.statuses[0];
        assert_eq!((status.phase, status.reason), ("Failed", "Evicted"));
        assert_eq!(status.conditions[0].type_, "DisruptionTarget");
        assert!(
            status
                .message
                .starts_with("The node was low on resource: memory.")
        );
    }
}
