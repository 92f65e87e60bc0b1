//! The standalone eviction action on the real kernel: SIGTERM first, the grace period, then the
//! whole cgroup killed (cgroup.kill on v2 and in the unified tree of hybrid hosts, SIGKILL to
//! every pid on v1 until the cgroup is empty).

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use qoslet::eviction::{EvictionAction as _, PodKey, StandaloneAction};
use qoslet_tests::{NodeRoot, require_root};

const MI: u64 = 1 << 20;

fn key() -> PodKey {
    PodKey {
        namespace: "default".into(),
        name: "pod".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_exits_on_sigterm_is_not_killed() {
    require_root();
    let Some(node) = NodeRoot::create(128 * MI) else {
        return;
    };
    let pod = node.pod("pod");
    let mut hog = pod.start_hog(4, None);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    let out = StandaloneAction
        .evict(
            &key(),
            &pod.eviction_cgroups(node.v1),
            Duration::from_secs(5),
            "m",
        )
        .await
        .expect("eviction");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "SIGTERM was enough: no full grace wait"
    );
    assert!(out.first_signal_at.is_some_and(|t| t >= t0));
    let sig = tokio::task::block_in_place(|| hog.wait_signal(Duration::from_secs(2)));
    assert_eq!(sig, Some(libc::SIGTERM));
    assert_eq!((out.status.phase, out.status.reason), ("Failed", "Evicted"));
    assert!(pod.memory.pids().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_ignores_sigterm_is_killed_whole_after_the_grace_period() {
    require_root();
    let Some(node) = NodeRoot::create(128 * MI) else {
        return;
    };
    let pod = node.pod("pod");
    // A shell that ignores SIGTERM and keeps starting children: only a cgroup-wide kill ends it.
    let mut sh = Command::new("sh")
        .args(["-c", "trap '' TERM; read go; while :; do sleep 0.05; done"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("starting sh");
    pod.add(sh.id());
    {
        use std::io::Write as _;
        let stdin = sh.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("releasing sh");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let grace = Duration::from_millis(500);
    let t0 = Instant::now();
    StandaloneAction
        .evict(&key(), &pod.eviction_cgroups(node.v1), grace, "m")
        .await
        .expect("eviction");
    assert!(t0.elapsed() >= grace, "the grace period was honoured");
    let status = tokio::task::block_in_place(|| sh.wait()).expect("waiting for sh");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(pod.memory.pids().is_empty());
    if let Some(u) = &pod.unified {
        assert!(u.pids().is_empty());
    }
}
