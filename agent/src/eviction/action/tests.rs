use std::{os::fd::AsFd as _, process::Command};

use super::*;
use crate::{
    cgroup::{CgroupFs, CgroupPath, Mounts, Tree},
    persist::EvictionMark,
};
use std::sync::Arc;

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn request(cgroups: PodCgroups) -> EvictionRequest {
    EvictionRequest {
        pod: PodKey {
            namespace: "ns".into(),
            name: "a".into(),
            uid: "aaaaaaaa-0000-4000-8000-00000000000a".into(),
        },
        cgroups,
        grace: Duration::ZERO,
        message: "The node was low on resource: memory. ".into(),
        annotations: Default::default(),
        seen: Default::default(),
        signal: "memory.available".into(),
        hard: true,
        unit: None,
        revision: 0,
    }
}

/// A node root whose pod directory, or an ancestor of it, was replaced by a symlink to a
/// directory outside the root that lists a live process of the test and has a `cgroup.kill`:
/// the eviction fails at the open, signals nothing, writes nothing, and marks nothing.
#[tokio::test]
async fn a_pod_directory_replaced_by_a_symlink_out_of_the_root_is_not_opened() {
    let t = TempDir(std::env::temp_dir().join(format!("qoslet-beneath-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&t.0);
    let (root, outside) = (t.0.join("root"), t.0.join("outside"));
    std::fs::create_dir_all(root.join("kubepods/podreal")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(outside.join("cgroup.procs"), format!("{}\n", child.id())).unwrap();
    std::fs::write(outside.join("cgroup.kill"), "").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("podlink")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("kubelink")).unwrap();

    let fs = Arc::new(
        CgroupFs::open(
            Mounts {
                kind: crate::cgroup::LayoutKind::Unified,
                trees: [(Tree::V2, root.clone())].into(),
            },
            CgroupPath::root(),
        )
        .unwrap(),
    );
    let dir = |path: &str| CgroupBeneath {
        fs: fs.clone(),
        tree: Tree::V2,
        path: CgroupPath::parse(path).unwrap(),
    };
    // The control: a real directory opens, and its (plain) procs file is read.
    std::fs::write(root.join("kubepods/podreal/cgroup.procs"), "").unwrap();
    assert!(dir("/kubepods/podreal").open().is_ok());
    assert_eq!(
        dir("/kubepods/podreal").read_procs().unwrap(),
        Vec::<i32>::new()
    );

    for path in ["/podlink", "/kubelink/x", "/kubelink"] {
        let d = dir(path);
        let e = d.open().expect_err(path);
        // ENOTDIR for a symlink as the last component (O_NOFOLLOW), ELOOP on the way.
        assert!(
            matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
            "{path}: {e}"
        );
        assert!(d.read_procs().is_err(), "{path}");
        let err = CgroupKill
            .evict(&request(PodCgroups {
                procs: vec![d.clone()],
                unified: Some(d.clone()),
            }))
            .await
            .expect_err(path);
        assert!(matches!(err, ActionError::Kill { .. }), "{path}: {err}");
        // Without a v2 directory the SIGKILL loop reads the pids first: that fails too.
        let err = CgroupKill
            .evict(&request(PodCgroups {
                procs: vec![d],
                unified: None,
            }))
            .await
            .expect_err(path);
        assert!(matches!(err, ActionError::Read(_)), "{path}: {err}");
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the outside process lives"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("cgroup.kill")).unwrap(),
        ""
    );

    // The mark is written through a descriptor opened beneath the root, or not at all.
    let fd = dir("/kubepods/podreal").open().unwrap();
    let key = request(PodCgroups::default()).pod;
    EvictionMark::new(&key, 1, "m", 1)
        .write(fd.as_fd())
        .unwrap();
    assert_eq!(EvictionMark::read(fd.as_fd()).map(|m| m.key()), Some(key));
    assert!(dir("/podlink").open().is_err());

    child.kill().unwrap();
    child.wait().unwrap();
}

/// After `cgroup.kill` the action waits for the kernel's word that the cgroup is empty
/// (`populated 0` in `cgroup.events`, a modification inotify reports) and signals nothing
/// meanwhile: here the "kernel" is the test, over a plain directory that lists a live process of
/// the test's. That process lives on while `cgroup.events` says populated (a walk every 10 ms
/// would have sent it SIGKILL at once), and `cgroup.kill` is written again while it stays so;
/// once the file says empty, the action returns with the one process it listed at the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_cgroup_kill_the_action_waits_for_populated_0_and_signals_nothing_meanwhile() {
    let t = TempDir(std::env::temp_dir().join(format!("qoslet-unpop-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&t.0);
    let pod = t.0.join("kubepods/poda");
    std::fs::create_dir_all(&pod).unwrap();
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(pod.join("cgroup.procs"), format!("{}\n", child.id())).unwrap();
    std::fs::write(pod.join("cgroup.kill"), "").unwrap();
    std::fs::write(pod.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
    let fs = Arc::new(
        CgroupFs::open(
            Mounts {
                kind: crate::cgroup::LayoutKind::Unified,
                trees: [(Tree::V2, t.0.clone())].into(),
            },
            CgroupPath::root(),
        )
        .unwrap(),
    );
    let dir = CgroupBeneath {
        fs,
        tree: Tree::V2,
        path: CgroupPath::parse("/kubepods/poda").unwrap(),
    };
    let req = request(PodCgroups {
        procs: vec![dir.clone()],
        unified: Some(dir),
    });
    let evicting = tokio::spawn(async move { CgroupKill.evict(&req).await });
    // Past several 100 ms re-reads of cgroup.events.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        std::fs::read_to_string(pod.join("cgroup.kill")).unwrap(),
        "1"
    );
    assert!(!evicting.is_finished(), "still waiting for populated 0");
    assert!(
        child.try_wait().unwrap().is_none(),
        "no SIGKILL while the kernel has not said the cgroup is empty"
    );
    // Still populated without a word from the kernel: `cgroup.kill` is written again (a
    // process moved in since the kill goes too).
    std::fs::write(pod.join("cgroup.kill"), "").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        std::fs::read_to_string(pod.join("cgroup.kill")).unwrap(),
        "1"
    );
    std::fs::write(pod.join("cgroup.procs"), "").unwrap();
    std::fs::write(pod.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), evicting)
        .await
        .expect("the action returns once the cgroup is empty")
        .unwrap()
        .unwrap();
    assert_eq!(out.signalled, 1, "the process listed at the kill, once");
    assert!(out.first_signal_at.is_some());
    assert!(child.try_wait().unwrap().is_none());
    child.kill().unwrap();
    child.wait().unwrap();
}
