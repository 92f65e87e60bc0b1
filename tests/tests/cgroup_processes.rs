//! Processes in container cgroups on the real kernel. oom_score_adj: processes started in a
//! Burstable container cgroup get the container's score from the scan, a process that joins
//! later gets it from the per-process entry point the sensors call, and one forked later with
//! its own score is corrected by the next scan. Memory limits lowered below usage: cgroup v1
//! refuses the write (EBUSY) when it cannot reclaim, and the reconciler then sets the limit to
//! the usage, as the kubelet's retrySetMemoryReserve does, and reports it; cgroup v2 accepts the
//! write and the OOM killer ends the process when nothing can be reclaimed. Only processes these
//! tests start are touched.

use std::{
    fs,
    io::Write as _,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use qoslet::{
    cgroup::{
        CgroupPath, CgroupRef, ContainerIds, ContainerRuntime, Mode, Naming, OomTargets,
        Reconciler, Tree, WriteResult, apply_oom_score, desired_state, layout::Controller,
        scan_oom_scores,
    },
    policy::plan::plan_node,
};
use qoslet_tests::{Hog, Layout, NodeRoot, layout, node_settings, pod_view, require_root};

const UID: &str = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee";
const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Kills the processes this test started when it ends, also on failure.
struct Started(Vec<Child>);

impl Drop for Started {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn score(pid: i32) -> i32 {
    fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .unwrap_or_else(|e| panic!("reading the score of {pid}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

fn procs(root: &NodeRoot, container: &str) -> Vec<i32> {
    let tree = root.mounts.procs_tree().unwrap();
    fs::read_to_string(root.path(tree, container).join("cgroup.procs"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

fn wait_for_procs(root: &NodeRoot, container: &str, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p = procs(root, container);
        if p.len() >= n {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "{container} has {p:?}, expected {n} processes"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Moves `pid` into the container cgroup in every hierarchy, as a runtime does.
fn join(root: &NodeRoot, container: &str, pid: u32) {
    for tree in root.mounts.trees.keys() {
        let p = root.path(*tree, container).join("cgroup.procs");
        fs::write(&p, pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} to {}: {e}", p.display()));
    }
}

#[test]
fn container_processes_get_the_container_score_including_later_ones() {
    require_root();
    let root = NodeRoot::create();
    let s = node_settings("");
    // Burstable, 2Gi requested on an 8Gi node: 1000 - 1000*2/8 = 750.
    let pods = [pod_view("web", UID, &[("app", "250m", "2Gi", "1", "4Gi")])];
    let plan = plan_node(&s, &pods).unwrap();
    assert_eq!(plan.pods[0].containers[0].oom_score_adj, 750);
    let naming = Naming {
        driver: s.cgroup_driver,
        runtime: ContainerRuntime::Containerd,
        node_root: CgroupPath::parse(&root.name).unwrap(),
        runner: qoslet::cgroup::Runner::Qoslet,
        enforce: Default::default(),
    };
    let ids: ContainerIds = [((UID.to_string(), "app".to_string()), ID.to_string())].into();
    let desired = desired_state(&plan, &naming, &ids);
    let reconciler = Reconciler::new(root.open(), Mode::Enforce);
    let r = reconciler.reconcile(&desired);
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    let fs_ = reconciler.fs();
    let targets = OomTargets::new(fs_, &desired);
    let container = format!("kubepods/burstable/pod{UID}/{ID}");
    let own = score(std::process::id() as i32);

    // A shell in the container: it forks a sleeper at once, and later (on a line) a process
    // that sets its own score back to 0, as an exec'd process with another score would be.
    let mut started = Started(Vec::new());
    let mut shell = Command::new("sh")
        .args([
            "-c",
            "read go; sleep 60 & read later; sh -c 'echo 0 > /proc/self/oom_score_adj; exec sleep 60' & wait",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .expect("starting sh");
    join(&root, &container, shell.id());
    shell.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    started.0.push(shell);
    let first = wait_for_procs(&root, &container, 2);
    let report = scan_oom_scores(fs_, &targets, Mode::Enforce);
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    assert_eq!(report.writes.len(), 2, "{:#?}", report.writes);
    for pid in &first {
        assert_eq!(score(*pid), 750, "pid {pid}");
    }

    // A process that joins later (a `kubectl exec`): the sensors' entry point fixes it.
    let late = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("starting sleep");
    let late_pid = late.id();
    started.0.push(late);
    join(&root, &container, late_pid);
    assert_eq!(score(late_pid as i32), own);
    let path = CgroupPath::parse(&container).unwrap();
    let w = apply_oom_score(
        fs_,
        &targets,
        late_pid as i32,
        CgroupRef::Path(&path),
        Mode::Enforce,
    )
    .unwrap()
    .expect("a write");
    assert_eq!((w.old, w.new), (own, 750));
    assert_eq!(score(late_pid as i32), 750);
    // By cgroup id too, as the eBPF events name cgroups, where the host has a v2 tree.
    if let Some(tree) = root.mounts.id_tree() {
        let id = fs_.inode(tree, &path).unwrap();
        let again = Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("starting sleep");
        let again_pid = again.id() as i32;
        started.0.push(again);
        join(&root, &container, again_pid as u32);
        apply_oom_score(fs_, &targets, again_pid, CgroupRef::Id(id), Mode::Enforce).unwrap();
        assert_eq!(score(again_pid), 750);
    }

    // The shell forks again; that process lowers its own score; the periodic scan restores it.
    let n = procs(&root, &container).len();
    started.0[0]
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"later\n")
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let forked = loop {
        let now = procs(&root, &container);
        if let Some(p) = now
            .iter()
            .find(|p| !first.contains(p) && score(**p) == 0 && now.len() > n)
        {
            break *p;
        }
        assert!(
            Instant::now() < deadline,
            "the forked process never appeared with score 0"
        );
        thread::sleep(Duration::from_millis(10));
    };
    let report = scan_oom_scores(fs_, &targets, Mode::Observe);
    assert!(report.writes.iter().any(|w| w.pid == forked && !w.written));
    assert_eq!(score(forked), 0, "observe mode writes nothing");
    let report = scan_oom_scores(fs_, &targets, Mode::Enforce);
    assert!(report.writes.iter().any(|w| w.pid == forked && w.written));
    for pid in procs(&root, &container) {
        assert_eq!(score(pid), 750, "pid {pid}");
    }
    assert!(
        scan_oom_scores(fs_, &targets, Mode::Enforce)
            .writes
            .is_empty()
    );
    assert_eq!(
        score(std::process::id() as i32),
        own,
        "the test process is not a container's"
    );
}

const MIB: i64 = 1 << 20;

#[test]
fn a_memory_limit_below_usage_is_retried_at_the_usage() {
    require_root();
    let root = NodeRoot::create();
    let s = node_settings("");
    let naming = Naming {
        driver: s.cgroup_driver,
        runtime: ContainerRuntime::Containerd,
        node_root: CgroupPath::parse(&root.name).unwrap(),
        runner: qoslet::cgroup::Runner::Qoslet,
        enforce: Default::default(),
    };
    let ids: ContainerIds = [((UID.to_string(), "app".to_string()), ID.to_string())].into();
    let reconciler = Reconciler::new(root.open(), Mode::Enforce);
    let pass = |limit: &str| {
        let pods = [pod_view("web", UID, &[("app", "100m", "16Mi", "1", limit)])];
        let plan = plan_node(&s, &pods).unwrap();
        reconciler.reconcile(&desired_state(&plan, &naming, &ids))
    };
    let r = pass("256Mi");
    assert!(r.errors.is_empty(), "{:#?}", r.errors);

    let container = format!("kubepods/burstable/pod{UID}/{ID}");
    let (tree, usage_file, limit_file) = if layout() == Layout::Unified {
        (Tree::V2, "memory.current", "memory.max")
    } else {
        (
            Tree::V1(Controller::Memory),
            "memory.usage_in_bytes",
            "memory.limit_in_bytes",
        )
    };
    let mut hog = Hog::spawn(64);
    for t in root.mounts.trees.keys() {
        fs::write(
            root.path(*t, &container).join("cgroup.procs"),
            hog.pid().to_string(),
        )
        .unwrap();
    }
    hog.release();
    // All of it: a hog still growing between the retry's read of the usage and its write makes
    // the write fail, as the kubelet's own retry would (it tries again on its next sync).
    hog.wait_resident(64, Duration::from_secs(60));
    let usage: i64 = root.read(tree, &container, usage_file).parse().unwrap();
    assert!(usage >= 64 * MIB, "{usage}");

    let r = pass("32Mi");
    let ctr = r
        .writes
        .iter()
        .find(|w| w.file == limit_file && w.path.ends_with(ID))
        .expect("a container memory limit write");
    assert_eq!(ctr.new, (32 * MIB).to_string());
    if layout() == Layout::Unified {
        assert_eq!(ctr.result, WriteResult::Written);
        assert!(r.errors.is_empty(), "{:#?}", r.errors);
        assert_eq!(
            hog.wait_signal(Duration::from_secs(20)),
            Some(libc::SIGKILL)
        );
    } else {
        let WriteResult::RetriedAtUsage { usage: at, written } = ctr.result else {
            panic!("expected a retry at the usage, got {:?}", ctr.result);
        };
        assert!(written && at >= 64 * MIB, "{at}");
        let limit: i64 = root.read(tree, &container, limit_file).parse().unwrap();
        assert!(
            limit < 32 * MIB || (limit >= at / 4096 * 4096 && limit <= at),
            "{limit} vs {at}"
        );
        assert!(limit > 32 * MIB);
        // The hog lives on, held at its usage.
        assert!(hog.child.try_wait().unwrap().is_none());
    }
}
