//! Cluster mode end to end, as root on the real kernel: kubelet-shaped cgroup trees under a
//! unique test root (a memory limit makes it the node), real processes in them, the fake API
//! server (`qoslet_tests::fake_api`) serving the matching Node and Pods, and qoslet's cluster
//! node (`qoslet::cluster::run`, what `qoslet run --kube` runs) against it through a kubeconfig.
//! Checked: qoslet finds every pod's cgroups (per-pod metrics), kills a BestEffort hog locally
//! while the API server is down, and once it is back (after a qoslet restart too) writes what
//! the kubelet's eviction manager writes, bound to the pod's UID: `pods/status` phase Failed,
//! reason Evicted, the DisruptionTarget condition; no delete and no Eviction API (a
//! PodDisruptionBudget does not matter), the Warning event and its node condition, each once.
//! With `gangEviction: unit` a `disruptionMode: all` gang is evicted whole, its member on another
//! node through the Eviction API, and `taintOnPressure` taints the node. On a cluster without the
//! Workload API the node is ready and gang-awareness is off; a write decided before a crash is
//! not replayed against a pod re-created under the same name.

mod cluster_common;

use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cluster_common::{
    NODE, SHIPPED_RBAC, WAIT, assert_rbac_allows, assert_rbac_allows_with, setup, setup_node,
    setup_with, start_qoslet, wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use qoslet::{
    cgroup::{Tree, layout::Controller},
    cluster,
};
use qoslet_tests::{
    Hog, NodeRoot,
    fake_api::{Options, Outage, RequestRecord},
    http_get, http_get_as,
    kubelet_tree::{Driver, KPod, Runtime, create, join, make_cgroup},
    require_root,
};
use serde_json::json;

/// docs/rbac.md, whose first YAML block is the ClusterRole to add for `evictionMethod: api` and
/// `gangEviction: unit`.
const RBAC_DOC: &str = include_str!("../../docs/rbac.md");

fn opt_in_rbac() -> String {
    let start = RBAC_DOC
        .find("```yaml\n")
        .expect("a YAML block in docs/rbac.md")
        + 8;
    let len = RBAC_DOC[start..].find("```").unwrap();
    RBAC_DOC[start..start + len].to_owned()
}

fn count(log: &[RequestRecord], method: &str, path: &str, code: u16) -> usize {
    log.iter()
        .filter(|r| r.method == method && r.path == path && r.code == code)
        .count()
}

/// Lets the hog allocate and waits for it to die; the signal that killed it.
async fn release_and_wait(mut hog: Hog) -> Option<i32> {
    hog.release();
    tokio::task::spawn_blocking(move || hog.wait_signal(WAIT))
        .await
        .unwrap()
}

fn sleeper() -> Child {
    Command::new("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .spawn()
        .expect("sleep")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroupfs_containerd_hog_is_killed_while_the_api_is_down_and_reported_once_after_a_restart()
{
    require_root();
    let s = setup(Driver::Cgroupfs, Runtime::Containerd, 384, 128).await;
    let mut hog_pod = KPod::new("hog", "11111111-2222-3333-4444-000000000001", "BestEffort");
    let mut web_pod = KPod::new("web", "11111111-2222-3333-4444-000000000002", "Burstable");
    create(&s.fake, &mut hog_pod, Runtime::Containerd, NODE);
    create(&s.fake, &mut web_pod, Runtime::Containerd, NODE);
    let hog_dirs = make_cgroup(
        &s.root,
        &hog_pod.container_cgroup(Driver::Cgroupfs, Runtime::Containerd),
    );
    let web_dirs = make_cgroup(
        &s.root,
        &web_pod.container_cgroup(Driver::Cgroupfs, Runtime::Containerd),
    );
    let hog = Hog::spawn(320);
    join(&hog_dirs, hog.pid());
    let mut web = sleeper();
    join(&web_dirs, web.id());
    // A PodDisruptionBudget covers the hog: the kubelet's way of evicting does not consult it.
    s.fake.block_eviction("ns", "hog", "hog-pdb");

    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    // Every pod's cgroups found: per-pod metrics for both.
    let metrics = s.metrics;
    wait_for("per-pod metrics of both pods", || {
        let m = http_get(metrics, "/metrics")?;
        (m.contains("qoslet_pod_info{") && m.contains("pod=\"hog\"") && m.contains("pod=\"web\""))
            .then_some(())
    })
    .await;
    // The kubelet's files are compared, never written: kubepods keeps the value the "kubelet"
    // (this test) left, and the difference is counted as drift.
    // A new cgroup's CPU weight is the kernel's default; the plan wants kubepods' weight from
    // the node's 2 CPUs (2048 shares), which differs.
    let (tree, file, kernel_default) =
        if s.root.mounts.trees.contains_key(&Tree::V1(Controller::Cpu)) {
            (Tree::V1(Controller::Cpu), "cpu.shares", "1024")
        } else {
            (Tree::V2, "cpu.weight", "100")
        };
    let kubepods_weight = s.root.read(tree, "kubepods", file);
    let m = http_get(metrics, "/metrics").unwrap_or_default();
    let drift = m
        .lines()
        .find(|l| l.starts_with("qoslet_cgroup_drift_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert_eq!(
        kubepods_weight, kernel_default,
        "qoslet wrote the kubelet's {file}"
    );
    assert!(drift > 0.0, "drift not counted: {m}");
    let ready = http_get(metrics, "/readyz").unwrap_or_default();
    assert!(ready.contains("api: ready: watches: "), "{ready}");
    wait_for("the lease", || {
        s.fake
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/leases") && r.method == "POST" && r.code == 201)
            .then_some(())
    })
    .await;

    // The API server goes away; the hog allocates past the hard threshold.
    s.fake.go_down(Outage::Refuse).await;
    let before = s.fake.requests().len();
    let signal = release_and_wait(hog).await;
    assert_eq!(
        signal,
        Some(libc::SIGKILL),
        "a hard threshold kills at once"
    );
    assert!(
        web.try_wait().unwrap().is_none(),
        "the Burstable pod under its request stays"
    );
    // What matters is that no eviction write got through: a watch or lease request already in
    // flight when the listener went may still be logged.
    let writes: Vec<String> = s.fake.requests()[before..]
        .iter()
        .filter(|r| r.method != "GET" && !r.path.contains("/leases"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        writes.is_empty(),
        "nothing but reads reached the API server while down: {writes:?}"
    );

    // qoslet restarts while the API server is still down; its writes wait on disk.
    tokio::time::sleep(Duration::from_millis(500)).await;
    qoslet.crash();
    let pending = fs::read_dir(s.work.path.join("state/api-writes"))
        .unwrap()
        .count();
    assert!(
        pending >= 2,
        "the pod's status and event are pending ({pending})"
    );
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    // Started while the API server is away: alive (a liveness probe must not restart it), not
    // ready until its pods are listed.
    let ready = wait_for("/healthz while the API server is down", || {
        (http_get(metrics, "/healthz")? == "ok\n").then(|| http_get(metrics, "/readyz"))?
    })
    .await;
    assert!(
        ready.contains("api: not ready: waiting for the first list"),
        "{ready}"
    );
    s.fake.come_up().await.expect("the fake comes back");

    let pod_path = "/api/v1/namespaces/ns/pods/hog";
    let status_path = format!("{pod_path}/status");
    wait_for("the evicted pod's status", || {
        (count(&s.fake.requests(), "PATCH", &status_path, 200) == 1).then_some(())
    })
    .await;
    wait_for("the event", || {
        (count(
            &s.fake.requests(),
            "POST",
            "/api/v1/namespaces/ns/events",
            201,
        ) == 1)
            .then_some(())
    })
    .await;
    // As the kubelet's eviction manager leaves it: the API server's object says so.
    let hog_now: Pod = s.fake.get("ns", "hog").expect("the pod object stays");
    let st = hog_now.status.unwrap();
    assert_eq!(
        (st.phase.as_deref(), st.reason.as_deref()),
        (Some("Failed"), Some("Evicted"))
    );
    assert!(
        st.message
            .as_deref()
            .unwrap_or_default()
            .starts_with("The node was low on resource: memory."),
        "{:?}",
        st.message
    );
    let c = st
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("the DisruptionTarget condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("True", Some("TerminationByKubelet"))
    );
    let log = s.fake.requests();
    let patch = log
        .iter()
        .find(|r| r.method == "PATCH" && r.path == status_path)
        .unwrap();
    assert_eq!(
        patch.body.as_ref().unwrap()["metadata"]["uid"],
        hog_pod.uid,
        "the patch is bound to the pod's UID"
    );
    // Then, after the status, the annotation that makes the kubelet sync the pod (bound to the
    // UID too).
    let status_at = log
        .iter()
        .position(|r| r.method == "PATCH" && r.path == status_path);
    let annotated_at = log
        .iter()
        .position(|r| r.method == "PATCH" && r.path == pod_path && r.code == 200);
    assert!(
        annotated_at > status_at,
        "the annotation follows the status: {log:#?}"
    );
    let annotation = &log[annotated_at.unwrap()];
    assert_eq!(
        annotation.body.as_ref().unwrap()["metadata"]["uid"],
        hog_pod.uid
    );
    assert!(
        hog_now
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("qoslet.dev/evicted-at"),
        "the pod is annotated"
    );
    let event = log
        .iter()
        .find(|r| r.method == "POST" && r.path == "/api/v1/namespaces/ns/events" && r.code == 201)
        .unwrap();
    let e = event.body.as_ref().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["reason"].as_str()),
        (Some("Warning"), Some("Evicted"))
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("The node was low on resource: memory."),
        "{e}"
    );
    wait_for("QosletMemoryPressure on the node", || {
        s.fake
            .requests()
            .iter()
            .any(|r| {
                r.method == "PATCH"
                    && r.path == format!("/api/v1/nodes/{NODE}/status")
                    && r.body.as_ref().is_some_and(|b| {
                        b["status"]["conditions"][0]["type"] == "QosletMemoryPressure"
                    })
            })
            .then_some(())
    })
    .await;
    // Once each: give the queue time to send anything twice, then count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = s.fake.requests();
    assert_eq!(count(&log, "POST", "/api/v1/namespaces/ns/events", 201), 1);
    assert_eq!(
        log.iter()
            .filter(|r| r.method == "PATCH" && r.path == status_path)
            .count(),
        1
    );
    let never: Vec<String> = log
        .iter()
        .filter(|r| {
            (r.method == "DELETE" && r.path.contains("/pods/")) || r.path.ends_with("/eviction")
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(never.is_empty(), "no delete, no Eviction API: {never:?}");
    let left = fs::read_dir(s.work.path.join("state/api-writes"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "delivered writes are removed");
    assert_rbac_allows(&s.fake);
    qoslet.crash();
    let _ = web.kill();
    let _ = web.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_crio_gang_with_disruption_mode_all_is_evicted_whole() {
    require_root();
    let s = setup_with(
        Driver::Systemd,
        Runtime::CriO,
        384,
        128,
        Options::default(),
        "gangEviction: unit\ntaintOnPressure: true\n",
    )
    .await;
    let mut m1 = KPod::new("m1", "22222222-2222-3333-4444-000000000001", "BestEffort");
    let mut m2 = KPod::new("m2", "22222222-2222-3333-4444-000000000002", "BestEffort");
    let mut m3 = KPod::new("m3", "22222222-2222-3333-4444-000000000003", "BestEffort");
    s.fake
        .seed([
            json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                "metadata": {"name": "g", "namespace": "ns"},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}, "disruptionMode": {"all": {}}}}),
        ])
        .unwrap();
    for m in [&mut m1, &mut m2, &mut m3] {
        m.group = Some("g");
    }
    create(&s.fake, &mut m1, Runtime::CriO, NODE);
    create(&s.fake, &mut m2, Runtime::CriO, NODE);
    // The third member runs on another node.
    create(&s.fake, &mut m3, Runtime::CriO, "node-b");
    let d1 = make_cgroup(
        &s.root,
        &m1.container_cgroup(Driver::Systemd, Runtime::CriO),
    );
    let d2 = make_cgroup(
        &s.root,
        &m2.container_cgroup(Driver::Systemd, Runtime::CriO),
    );
    let hog = Hog::spawn(320);
    join(&d1, hog.pid());
    let mut quiet = sleeper();
    join(&d2, quiet.id());
    // What each member's cgroup said when the API server took its Failed status: frozen (or
    // already empty), never running.
    let at_status = Arc::new(Mutex::new(Vec::new()));
    // The v2 tree, or a hybrid host's unified one: where the freeze is.
    let v2 = s.root.mounts.id_tree();
    if let Some(tree) = v2 {
        let seen = at_status.clone();
        let members = [("m1", &m1), ("m2", &m2)].map(|(name, m)| {
            let dir = s
                .root
                .path(tree, &m.container_cgroup(Driver::Systemd, Runtime::CriO));
            (
                format!("/api/v1/namespaces/ns/pods/{name}/status"),
                name,
                dir,
            )
        });
        s.fake.on_request(move |r| {
            for (path, name, dir) in &members {
                if r.method == "PATCH" && r.path == *path {
                    let events = fs::read_to_string(dir.join("cgroup.events")).unwrap_or_default();
                    seen.lock().unwrap().push((*name, events));
                }
            }
        });
    }
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    let metrics = s.metrics;
    wait_for("per-pod metrics of the gang's local members", || {
        let m = http_get(metrics, "/metrics")?;
        (m.contains("pod=\"m1\"") && m.contains("pod=\"m2\"")).then_some(())
    })
    .await;
    let signal = release_and_wait(hog).await;
    assert_eq!(signal, Some(libc::SIGKILL));
    // The quiet member goes with the unit, though it holds no memory.
    let deadline = Instant::now() + WAIT;
    while quiet.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the gang's quiet member was not killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // This node's members as the kubelet evicts; the other node's through the Eviction API.
    for name in ["m1", "m2"] {
        let path = format!("/api/v1/namespaces/ns/pods/{name}/status");
        wait_for(&format!("the evicted status of {name}"), || {
            (count(&s.fake.requests(), "PATCH", &path, 200) >= 1).then_some(())
        })
        .await;
    }
    if v2.is_some() {
        let seen = at_status.lock().unwrap().clone();
        for name in ["m1", "m2"] {
            assert!(seen.iter().any(|(n, _)| *n == name), "{seen:?}");
        }
        for (name, events) in &seen {
            assert!(
                events
                    .lines()
                    .any(|l| l == "frozen 1" || l == "populated 0"),
                "{name} ran when its Failed status was published: {events}"
            );
        }
    }
    let path = "/api/v1/namespaces/ns/pods/m3/eviction";
    wait_for("the eviction of m3", || {
        (count(&s.fake.requests(), "POST", path, 201) >= 1).then_some(())
    })
    .await;
    let log = s.fake.requests();
    let eviction = log.iter().find(|r| r.path == path).unwrap();
    assert_eq!(
        eviction.body.as_ref().unwrap()["deleteOptions"]["preconditions"]["uid"],
        m3.uid,
        "resolved to its UID"
    );
    assert!(
        !log.iter()
            .any(|r| r.method == "PATCH" && r.path == "/api/v1/namespaces/ns/pods/m3/status"),
        "the other node's member is evicted through the API only"
    );
    assert!(
        !log.iter()
            .any(|r| r.path.ends_with("/m1/eviction") || r.path.ends_with("/m2/eviction")),
        "this node's members are not asked of the Eviction API"
    );
    // taintOnPressure: the node is tainted NoSchedule while qoslet's condition holds.
    wait_for("qoslet's taint on the node", || {
        let node: k8s_openapi::api::core::v1::Node = s.fake.get("", NODE)?;
        node.spec?
            .taints?
            .iter()
            .any(|t| t.key == "qoslet.dev/pressure" && t.effect == "NoSchedule")
            .then_some(())
    })
    .await;
    let log = s.fake.requests();
    // The shipped RBAC lacks pods/eviction; docs/rbac.md's opt-in rule grants it.
    assert!(
        !qoslet_tests::fake_api::rbac::denied(&log, SHIPPED_RBAC)
            .unwrap()
            .is_empty(),
        "gangEviction: unit needs more than the shipped RBAC"
    );
    assert_rbac_allows_with(&s.fake, &opt_in_rbac());
    qoslet.crash();
}

/// A cluster without the Workload API, as most are: the node is ready, gang-awareness is off
/// (metric), and a pod naming a PodGroup is still managed and evicted alone. A write decided
/// before a crash is not replayed against a pod re-created under the same name meanwhile: the
/// UID in the status patch makes the API server refuse it (422), and qoslet drops it, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_workload_api_the_node_is_ready_and_a_recreated_pod_is_not_touched() {
    require_root();
    let options = Options {
        workload_api: false,
        ..Options::default()
    };
    let s = setup_with(Driver::Cgroupfs, Runtime::Containerd, 384, 128, options, "").await;
    let mut hog_pod = KPod::new("hog", "33333333-2222-3333-4444-000000000001", "BestEffort");
    let mut quiet_pod = KPod::new(
        "quiet",
        "33333333-2222-3333-4444-000000000002",
        "BestEffort",
    );
    hog_pod.group = Some("g");
    quiet_pod.group = Some("g");
    create(&s.fake, &mut hog_pod, Runtime::Containerd, NODE);
    create(&s.fake, &mut quiet_pod, Runtime::Containerd, NODE);
    let hog_dirs = make_cgroup(
        &s.root,
        &hog_pod.container_cgroup(Driver::Cgroupfs, Runtime::Containerd),
    );
    let quiet_dirs = make_cgroup(
        &s.root,
        &quiet_pod.container_cgroup(Driver::Cgroupfs, Runtime::Containerd),
    );
    let hog = Hog::spawn(320);
    join(&hog_dirs, hog.pid());
    let mut quiet = sleeper();
    join(&quiet_dirs, quiet.id());
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    let metrics = s.metrics;
    // The API's line is ready though the Workload API's kinds are never served.
    wait_for("the api line of /readyz ready", || {
        let body = http_get(metrics, "/readyz")?;
        body.contains("api: ready: ").then_some(())
    })
    .await;
    wait_for("gang-awareness off, both pods managed", || {
        let m = http_get(metrics, "/metrics")?;
        (m.contains("qoslet_gang_awareness 0")
            && m.contains("pod=\"hog\"")
            && m.contains("pod=\"quiet\""))
        .then_some(())
    })
    .await;

    s.fake.go_down(Outage::Refuse).await;
    let signal = release_and_wait(hog).await;
    assert_eq!(signal, Some(libc::SIGKILL));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        quiet.try_wait().unwrap().is_none(),
        "without the Workload API the hog goes alone"
    );
    qoslet.crash();
    // Meanwhile the hog's controller re-created it under the same name.
    let old_uid = hog_pod.uid.clone();
    s.fake.remove::<Pod>("ns", "hog").expect("the old hog");
    let mut again = KPod::new("hog", "33333333-2222-3333-4444-000000000003", "BestEffort");
    create(&s.fake, &mut again, Runtime::Containerd, NODE);
    assert_ne!(again.uid, old_uid);
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    s.fake.come_up().await.expect("the fake comes back");
    let status_path = "/api/v1/namespaces/ns/pods/hog/status";
    wait_for("the stale status patch, refused", || {
        (count(&s.fake.requests(), "PATCH", status_path, 422) == 1).then_some(())
    })
    .await;
    wait_for("the refusal counted", || {
        let m = http_get(metrics, "/metrics")?;
        m.contains(
            "qoslet_api_writes_dropped_total{write=\"podEvicted\",reason=\"rejected-422\"} 1",
        )
        .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count(&s.fake.requests(), "PATCH", status_path, 422),
        1,
        "never retried"
    );
    let now: Pod = s.fake.get("ns", "hog").unwrap();
    assert_eq!(now.metadata.uid.as_deref(), Some(again.uid.as_str()));
    assert_ne!(
        now.status.and_then(|st| st.phase).as_deref(),
        Some("Failed"),
        "the re-created pod is untouched"
    );
    assert!(
        fs::read_dir(s.work.path.join("state/api-writes"))
            .unwrap()
            .next()
            .is_none(),
        "nothing left to replay"
    );
    assert_rbac_allows(&s.fake);
    qoslet.crash();
    let _ = quiet.kill();
    let _ = quiet.wait();
}

/// An eviction cut short between its freeze and its kill (qoslet crashed there) leaves the
/// pod's cgroup marked and frozen: the next start kills and thaws it (`cluster/marks.rs`), and
/// the frozen process dies of SIGKILL without running again.
#[test]
fn a_pod_left_frozen_by_a_crash_is_killed_at_the_next_start() {
    use std::os::{fd::AsFd as _, unix::process::ExitStatusExt as _};

    use qoslet::{
        cgroup::CgroupPath, persist::EvictionMark, policy::pod::PodKey,
        policy::settings::CgroupDriver,
    };

    require_root();
    let root = NodeRoot::create();
    // The v2 tree, or a hybrid host's unified one: where the freeze is.
    let Some(tree) = root.mounts.id_tree() else {
        return;
    };
    let pod = KPod::new(
        "frozen",
        "33333333-2222-3333-4444-000000000001",
        "BestEffort",
    );
    let container = pod.container_cgroup(Driver::Cgroupfs, Runtime::Containerd);
    let dirs = make_cgroup(&root, &container);
    let mut victim = sleeper();
    join(&dirs, victim.id());
    let pod_rel = container.rsplit_once('/').unwrap().0;
    let pod_dir = root.path(tree, pod_rel);
    let key = PodKey {
        namespace: "ns".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
    };
    let dir = fs::File::open(&pod_dir).unwrap();
    EvictionMark::new(&key, 0, "The node was low on resource: memory. ", 0)
        .write(dir.as_fd())
        .expect("the mark");
    fs::write(pod_dir.join("cgroup.freeze"), "1").unwrap();
    let events = || fs::read_to_string(pod_dir.join("cgroup.events")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !events().lines().any(|l| l == "frozen 1") {
        assert!(Instant::now() < deadline, "never frozen: {}", events());
        std::thread::sleep(Duration::from_millis(5));
    }

    let cgroups = root.open();
    let root_dir = cgroups.open_dir_fd(tree, &CgroupPath::root()).unwrap();
    let found = cluster::marks::find(
        root_dir.as_fd(),
        cgroups.node_root(),
        CgroupDriver::Cgroupfs,
    );
    assert_eq!(found.len(), 1, "the mark read back");
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = victim.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the frozen pod was not killed");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert_eq!(
        fs::read_to_string(pod_dir.join("cgroup.freeze"))
            .unwrap()
            .trim(),
        "0",
        "thawed"
    );
}

/// The API server's connection goes half-open during an eviction: requests are taken and never
/// answered. The kill does not wait for the unanswered status write longer than
/// STATUS_BEFORE_KILL; the queue abandons the attempt at its request timeout (10 s) and, once
/// the server answers again, delivers the status, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_half_open_is_delivered_once_the_server_answers() {
    require_root();
    let s = setup(Driver::Cgroupfs, Runtime::Containerd, 384, 128).await;
    let mut hog_pod = KPod::new("hog", "44444444-2222-3333-4444-000000000001", "BestEffort");
    create(&s.fake, &mut hog_pod, Runtime::Containerd, NODE);
    let hog_dirs = make_cgroup(
        &s.root,
        &hog_pod.container_cgroup(Driver::Cgroupfs, Runtime::Containerd),
    );
    let hog = Hog::spawn(320);
    join(&hog_dirs, hog.pid());
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    let metrics = s.metrics;
    wait_for("per-pod metrics of the hog", || {
        let m = http_get(metrics, "/metrics")?;
        m.contains("pod=\"hog\"").then_some(())
    })
    .await;

    s.fake.go_down(Outage::Silent).await;
    let signal = release_and_wait(hog).await;
    assert_eq!(signal, Some(libc::SIGKILL), "killed, the write unanswered");
    // The status was sent before the kill (which waited STATUS_BEFORE_KILL for it). Coming up
    // 12 s after the kill, longer than the queue's request timeout, the first attempt is
    // abandoned, not answered. (Counted from the hog's release instead, a slow VM's growth to the
    // threshold put the comeback on the attempt's timeout: answered by the server as the client
    // gave up on it, and sent again.)
    tokio::time::sleep(Duration::from_secs(12)).await;
    let status_path = "/api/v1/namespaces/ns/pods/hog/status";
    assert_eq!(
        count(&s.fake.requests(), "PATCH", status_path, 200),
        0,
        "nothing answered while silent"
    );
    s.fake.come_up().await.expect("the fake answers again");
    wait_for("the evicted pod's status after the outage", || {
        (count(&s.fake.requests(), "PATCH", status_path, 200) >= 1).then_some(())
    })
    .await;
    let hog_now: Pod = s.fake.get("ns", "hog").expect("the pod object stays");
    assert_eq!(
        hog_now.status.and_then(|st| st.phase).as_deref(),
        Some("Failed")
    );
    // Once: an attempt cut at the timeout was never applied, and the one answered is not sent
    // again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.fake
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path == status_path)
            .count(),
        1
    );
    qoslet.crash();
}

/// A restart after a resurrection (issue #37): two pods carry eviction marks of an earlier run.
/// The API shows `lost` with its container started before its eviction (the status write was
/// lost in a crash): the start queues its Failed status again. It shows `back` with its
/// container started after its eviction (the status never landed and the kubelet restarted
/// it): that eviction no longer holds, so the start writes nothing for it and removes its mark,
/// and `back` is a candidate again: when it hogs, it is evicted again, with a new mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_ran_again_after_its_eviction_is_not_evicted_again_at_start() {
    use std::os::fd::AsFd as _;

    use qoslet::{persist::EvictionMark, policy::pod::PodKey};

    require_root();
    let s = setup(Driver::Cgroupfs, Runtime::Containerd, 384, 128).await;
    // The v2 tree, or a hybrid host's unified one: where the marks are.
    let Some(tree) = s.root.mounts.id_tree() else {
        return;
    };
    let mut back = KPod::new("back", "55555555-2222-3333-4444-000000000001", "BestEffort");
    let mut lost = KPod::new("lost", "55555555-2222-3333-4444-000000000002", "BestEffort");
    create(&s.fake, &mut back, Runtime::Containerd, NODE);
    create(&s.fake, &mut lost, Runtime::Containerd, NODE);
    // The kubelet_tree pods' containers started at 2026-11-30T10:00:00Z.
    let started: u64 = 1_796_032_800;
    let mut pod_dirs = Vec::new();
    for (p, evicted_at) in [(&back, started - 60), (&lost, started + 60)] {
        let container = p.container_cgroup(Driver::Cgroupfs, Runtime::Containerd);
        make_cgroup(&s.root, &container);
        let dir = s.root.path(tree, container.rsplit_once('/').unwrap().0);
        let key = PodKey {
            namespace: "ns".into(),
            name: p.name.clone(),
            uid: p.uid.clone(),
        };
        EvictionMark::new(
            &key,
            0,
            "The node was low on resource: memory. ",
            evicted_at,
        )
        .write(fs::File::open(&dir).unwrap().as_fd())
        .expect("the mark");
        pod_dirs.push(dir);
    }
    let mark_at =
        |dir: &Path| EvictionMark::read(fs::File::open(dir).unwrap().as_fd()).map(|m| m.at);
    let hog = Hog::spawn(320);
    join(
        &make_cgroup(
            &s.root,
            &back.container_cgroup(Driver::Cgroupfs, Runtime::Containerd),
        ),
        hog.pid(),
    );

    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    let status = |name: &str| format!("/api/v1/namespaces/ns/pods/{name}/status");
    wait_for("the lost eviction's status written again", || {
        (count(&s.fake.requests(), "PATCH", &status("lost"), 200) == 1).then_some(())
    })
    .await;
    wait_for("the mark of the pod that ran again removed", || {
        mark_at(&pod_dirs[0]).is_none().then_some(())
    })
    .await;
    assert_eq!(
        mark_at(&pod_dirs[1]),
        Some(started + 60),
        "the lost one's mark stays"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count(&s.fake.requests(), "PATCH", &status("back"), 200),
        0,
        "the pod that ran again was evicted again at start"
    );
    let now: Pod = s.fake.get("ns", "back").unwrap();
    assert_eq!(
        now.status.and_then(|st| st.phase).as_deref(),
        Some("Running")
    );

    // A candidate again: it hogs and is evicted, a new mark with this eviction's time.
    let signal = release_and_wait(hog).await;
    assert_eq!(signal, Some(libc::SIGKILL));
    wait_for("the second eviction's status", || {
        (count(&s.fake.requests(), "PATCH", &status("back"), 200) == 1).then_some(())
    })
    .await;
    let back_now: Pod = s.fake.get("ns", "back").unwrap();
    assert_eq!(
        back_now.status.and_then(|st| st.phase).as_deref(),
        Some("Failed")
    );
    // A new mark on the pod cgroup, if it is still there (the kill may take it with it).
    if pod_dirs[0].exists() {
        assert!(
            mark_at(&pod_dirs[0]).is_some_and(|at| at > started),
            "the new eviction's mark"
        );
    }
    qoslet.crash();
}

/// Cluster mode's default `endpointAuth: tokenReview`, through `cluster::run`: the probes' paths
/// are open from the start, `/metrics` answers 401 without a token and 200 to one the API server
/// authenticates and authorizes, and the reviews are within the shipped RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_are_guarded_by_default() {
    require_root();
    let s = setup_with(
        Driver::Cgroupfs,
        Runtime::Containerd,
        384,
        128,
        Options::default(),
        "endpointAuth: tokenReview\n",
    )
    .await;
    s.fake.add_token("scrape", "prometheus", &[]);
    s.fake.allow(
        "prometheus",
        serde_json::json!({"nonResourceAttributes": {"path": "/metrics"}}),
    );
    let _qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    let metrics = s.metrics;
    wait_for("/healthz", || {
        (http_get_as(metrics, "/healthz", None)?.0 == 200).then_some(())
    })
    .await;
    assert_eq!(
        http_get_as(metrics, "/metrics", None).map(|(code, _)| code),
        Some(401)
    );
    let body = wait_for("/metrics with the token", || {
        match http_get_as(metrics, "/metrics", Some("scrape"))? {
            (200, body) if body.contains("qoslet_node_allocatable{") => Some(body),
            _ => None,
        }
    })
    .await;
    assert!(body.ends_with("# EOF\n"));
    assert_eq!(
        http_get_as(metrics, "/stats/summary", Some("scrape")).map(|(code, _)| code),
        Some(403),
        "prometheus is allowed /metrics only"
    );
    assert_rbac_allows(&s.fake);
}

/// Issue #41: unless `kubernetesVersion` is set, qoslet follows the kubelet rules of its Node's
/// `status.nodeInfo.kubeletVersion`. With the same `enforce: [memoryQoS]`, a Node reporting
/// v1.35.2 gets 1.35's Memory QoS (the MemoryQoS gate alpha, off by default: the Burstable
/// container's memory.high is left `max`) and one reporting v1.37.0 gets 1.37's (beta, on:
/// memory.high throttles the container between its request and allocatable), with the same
/// KubeletConfiguration (`memoryThrottlingFactor: 0.9`). Memory QoS is cgroup
/// v2's (memory.high): skipped where the host has no v2 memory controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reporting_1_35_gets_1_35s_memory_qos() {
    require_root();
    let v2_memory = fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|k| k == "memory"));
    if !v2_memory {
        println!("skipped: no cgroup v2 memory controller on this host (Memory QoS is v2's)");
        return;
    }
    for (kubelet_version, throttled) in [("v1.35.2", false), ("v1.37.0", true)] {
        let s = setup_node(
            Driver::Cgroupfs,
            Runtime::Containerd,
            384,
            64,
            Options::default(),
            "enforce: [memoryQoS]\n",
            kubelet_version,
        )
        .await;
        // From 1.37 memory.high has no default throttling factor: the kubelet writes it only
        // with memoryThrottlingFactor set (policy/version.rs), as here.
        let kubelet_text = fs::read_to_string(&s.kubelet).unwrap();
        fs::write(
            &s.kubelet,
            format!("{kubelet_text}memoryThrottlingFactor: 0.9\n"),
        )
        .unwrap();
        let mut web = KPod::new("web", "44444444-2222-3333-4444-000000000001", "Burstable");
        create(&s.fake, &mut web, Runtime::Containerd, NODE);
        let cgroup = web.container_cgroup(Driver::Cgroupfs, Runtime::Containerd);
        let dirs = make_cgroup(&s.root, &cgroup);
        let mut proc = sleeper();
        join(&dirs, proc.id());
        let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
        let metrics = s.metrics;
        wait_for("the pod managed", || {
            http_get(metrics, "/metrics")?
                .contains("pod=\"web\"")
                .then_some(())
        })
        .await;
        // A pass over web's container after its plan: passes run when the plan changes, so a
        // second pod makes one; any pass counted after web was planned covers its container,
        // and any memory.high of the plan is written in it.
        let before = wait_for("a pass", || qoslet_tests::reconcile_passes(metrics)).await;
        let mut other = KPod::new(
            "other",
            "44444444-2222-3333-4444-000000000002",
            "BestEffort",
        );
        create(&s.fake, &mut other, Runtime::Containerd, NODE);
        wait_for("a pass after the second pod", || {
            let m = http_get(metrics, "/metrics")?;
            (qoslet_tests::reconcile_passes(metrics)? > before && m.contains("pod=\"other\""))
                .then_some(())
        })
        .await;
        let high = || s.root.read(Tree::V2, &cgroup, "memory.high");
        if throttled {
            let v: i64 = high()
                .parse()
                .unwrap_or_else(|e| panic!("{kubelet_version}: memory.high {:?}: {e}", high()));
            // Above the 16Mi request, below the node's 384Mi.
            assert!((16 << 20..384 << 20).contains(&v), "{kubelet_version}: {v}");
        } else {
            assert_eq!(high(), "max", "{kubelet_version}: memory.high");
        }
        println!(
            "kubeletVersion {kubelet_version}: the container's memory.high {}",
            high()
        );
        qoslet.crash();
        let _ = proc.kill();
        let _ = proc.wait();
    }
}
