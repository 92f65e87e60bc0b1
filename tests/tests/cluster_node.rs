//! Cluster mode end to end, as root on the real kernel: kubelet-shaped cgroup trees under a
//! unique test root (a memory limit makes it the node), real processes in them, the fake API
//! server (`qoslet_tests::fake_api`) serving the matching Node and Pods, and qoslet's cluster
//! node (`qoslet::cluster::run`, what `qoslet run --kube` runs) against it through a kubeconfig.
//! Checked: qoslet finds every pod's cgroups (per-pod metrics), kills a BestEffort hog locally
//! while the API server is down, and once it is back (after a qoslet restart too) delivers the
//! DisruptionTarget condition, the eviction (429 from a PodDisruptionBudget at a hard threshold,
//! then a delete with a UID precondition), the Warning event and its node condition, each once;
//! and evicts a `disruptionMode: all` gang whole, its member on another node through the API.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use qoslet::{
    cgroup::{Tree, layout::Controller},
    cluster::{self, ClusterOptions, KubeletConfigFrom},
    config::CapacityOverride,
    policy::{cpuset::CpuSet, settings::Capacity},
};
use qoslet_tests::{
    Hog, InProcessAgent, NodeRoot, TempDir,
    fake_api::{FakeApi, Options, Outage, RequestRecord},
    free_port, http_get,
    kubelet_tree::{Driver, KPod, Runtime, create, join, make_cgroup},
    require_root,
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const NODE: &str = "node-a";
const MIB: u64 = 1 << 20;

async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn start_qoslet(kubeconfig: &Path, kubelet: &Path, config: &Path) -> InProcessAgent {
    let opts = ClusterOptions {
        kubelet_config: KubeletConfigFrom::File(kubelet.into()),
        config: Some(config.into()),
        node_name: NODE.into(),
        kubeconfig: Some(kubeconfig.into()),
        observe: false,
        shutdown_grace: Duration::from_secs(5),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    InProcessAgent::start(async move {
        let capacity = |_: &CapacityOverride, limit: Option<i64>| {
            Ok(Capacity {
                cpu_millis: 2000,
                memory_bytes: limit.ok_or("the test root has a memory limit")?,
                pids: 4096,
                cpus: CpuSet::first(2),
            })
        };
        if let Err(e) = cluster::run(opts, capacity).await {
            panic!(
                "qoslet --kube stopped: {e}: {:?}",
                std::error::Error::source(&e)
            );
        }
    })
}

/// The shipped RBAC, compiled in (the test also runs in the VM, where the tree is not).
const SHIPPED_RBAC: &str = include_str!("../../deploy/kubernetes/rbac.yaml");

/// Every request qoslet made is one the shipped ClusterRole and Role allow: the fake does not
/// authorize, a real API server answers 403.
fn assert_rbac_allows(fake: &FakeApi) {
    let denied = qoslet_tests::fake_api::rbac::denied(&fake.requests(), SHIPPED_RBAC)
        .expect("deploy/kubernetes/rbac.yaml parses");
    assert!(
        denied.is_empty(),
        "requests deploy/kubernetes/rbac.yaml does not allow: {denied:#?}"
    );
}

fn count(log: &[RequestRecord], method: &str, path: &str, code: u16) -> usize {
    log.iter()
        .filter(|r| r.method == method && r.path == path && r.code == code)
        .count()
}

struct Setup {
    fake: FakeApi,
    root: NodeRoot,
    work: TempDir,
    kubeconfig: PathBuf,
    kubelet: PathBuf,
    config: PathBuf,
    metrics: SocketAddr,
}

async fn setup(driver: Driver, runtime: Runtime, limit_mib: u64, hard_mib: u64) -> Setup {
    let fake = FakeApi::start(Options::default()).await.expect("fake API");
    let root = NodeRoot::create();
    let limit = (limit_mib * MIB).to_string();
    if root.mounts.trees.contains_key(&Tree::V2) {
        fs::write(root.path(Tree::V2, "").join("memory.max"), &limit).unwrap();
    } else {
        let f = root
            .path(Tree::V1(Controller::Memory), "")
            .join("memory.limit_in_bytes");
        fs::write(f, &limit).unwrap();
    }
    let work = TempDir::new();
    let kubeconfig = work.path.join("kubeconfig");
    fake.write_kubeconfig(&kubeconfig).unwrap();
    let kubelet = work.path.join("kubelet.yaml");
    let driver_name = match driver {
        Driver::Cgroupfs => "cgroupfs",
        Driver::Systemd => "systemd",
    };
    fs::write(
        &kubelet,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: {driver_name}\nevictionHard: {{memory.available: {hard_mib}Mi}}\n"
        ),
    )
    .unwrap();
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = work.path.join("qoslet.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nnodeRootCgroup: /{}\nmetricsAddress: \"{metrics}\"\nstateDir: {}\nhousekeepingInterval: 200ms\nleaseNamespace: qoslet-system\n",
            root.name,
            work.path.join("state").display()
        ),
    )
    .unwrap();
    let version = match runtime {
        Runtime::Containerd => "containerd://2.1.0",
        Runtime::CriO => "cri-o://1.33.0",
    };
    fake.seed([json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE},
        "status": {"nodeInfo": {"containerRuntimeVersion": version, "machineID": "", "systemUUID": "",
            "bootID": "", "kernelVersion": "", "osImage": "", "kubeletVersion": "v1.37.0",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}},
    })])
    .unwrap();
    Setup {
        fake,
        root,
        work,
        kubeconfig,
        kubelet,
        config,
        metrics,
    }
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
    // A PodDisruptionBudget forbids evicting the hog: a hard threshold deletes it anyway.
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
        pending >= 3,
        "condition, eviction and event are pending ({pending})"
    );
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    s.fake.come_up().await.expect("the fake comes back");

    let pod_path = "/api/v1/namespaces/ns/pods/hog";
    wait_for("the delete after the PDB's refusal", || {
        (count(&s.fake.requests(), "DELETE", pod_path, 200) == 1).then_some(())
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
    let log = s.fake.requests();
    let condition = log
        .iter()
        .find(|r| r.method == "PATCH" && r.path == format!("{pod_path}/status"))
        .expect("the DisruptionTarget patch");
    let c = &condition.body.as_ref().unwrap()["status"]["conditions"][0];
    assert_eq!(
        (c["type"].as_str(), c["reason"].as_str()),
        (Some("DisruptionTarget"), Some("TerminationByKubelet"))
    );
    let eviction = log
        .iter()
        .find(|r| r.method == "POST" && r.path == format!("{pod_path}/eviction"))
        .expect("the Eviction API first");
    assert_eq!(eviction.code, 429);
    assert_eq!(
        eviction.body.as_ref().unwrap()["deleteOptions"]["gracePeriodSeconds"],
        0
    );
    let delete = log
        .iter()
        .find(|r| r.method == "DELETE" && r.path == pod_path)
        .unwrap();
    assert_eq!(
        delete.body.as_ref().unwrap()["preconditions"]["uid"],
        hog_pod.uid,
        "deleted only if it is still the same pod"
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
    assert_eq!(count(&log, "DELETE", pod_path, 200), 1);
    assert_eq!(count(&log, "POST", "/api/v1/namespaces/ns/events", 201), 1);
    assert_eq!(
        log.iter()
            .filter(|r| r.method == "PATCH" && r.path == format!("{pod_path}/status"))
            .count(),
        1
    );
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
    let s = setup(Driver::Systemd, Runtime::CriO, 384, 128).await;
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
    for name in ["m1", "m2", "m3"] {
        let path = format!("/api/v1/namespaces/ns/pods/{name}/eviction");
        wait_for(&format!("the eviction of {name}"), || {
            (count(&s.fake.requests(), "POST", &path, 201) >= 1).then_some(())
        })
        .await;
    }
    let log = s.fake.requests();
    assert!(
        !log.iter()
            .any(|r| r.method == "PATCH" && r.path == "/api/v1/namespaces/ns/pods/m3/status"),
        "the other node's member is evicted through the API only"
    );
    assert_rbac_allows(&s.fake);
    qoslet.crash();
}
