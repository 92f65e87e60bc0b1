//! Lowering a memory limit below what a container uses. cgroup v1 refuses the write (EBUSY) when
//! it cannot reclaim: the reconciler then sets the limit to the usage, as the kubelet's
//! retrySetMemoryReserve does, and reports it. cgroup v2 accepts the write and reclaims, and the
//! OOM killer ends the container's process when nothing can be reclaimed.

use std::{
    fs, thread,
    time::{Duration, Instant},
};

use qoslet::{
    cgroup::{
        CgroupPath, ContainerIds, Mode, Naming, Reconciler, Runtime, Tree, WriteResult,
        desired_state, layout::Controller,
    },
    policy::plan::plan_node,
};
use qoslet_tests::{Hog, Layout, NodeRoot, layout, node_settings, pod_view, require_root};

const UID: &str = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee";
const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const MIB: i64 = 1 << 20;

#[test]
fn a_memory_limit_below_usage_is_retried_at_the_usage() {
    require_root();
    let root = NodeRoot::create();
    let s = node_settings("");
    let naming = Naming {
        driver: s.cgroup_driver,
        runtime: Runtime::Containerd,
        node_root: CgroupPath::parse(&root.name).unwrap(),
        create_containers: true,
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
    let usage = || -> i64 { root.read(tree, &container, usage_file).parse().unwrap() };
    let deadline = Instant::now() + Duration::from_secs(20);
    while usage() < 60 * MIB {
        assert!(Instant::now() < deadline, "the hog did not reach 60 MiB");
        thread::sleep(Duration::from_millis(20));
    }

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
        assert!(written && at >= 60 * MIB, "{at}");
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
