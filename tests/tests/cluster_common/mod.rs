//! Shared by the cluster-mode tests (`cluster_node`, `api_faults`): a node root with
//! kubelet-shaped configuration, the fake API server serving its Node, and qoslet's cluster node
//! started in this process against it.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of these helpers"
)]

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use qoslet::{
    cgroup::{Tree, layout::Controller},
    cluster::{self, ClusterOptions, KubeletConfigFrom},
    config::CapacityOverride,
    policy::{cpuset::CpuSet, settings::Capacity},
};
use qoslet_tests::{
    InProcessAgent, NodeRoot, TempDir,
    fake_api::{FakeApi, Options},
    free_port,
    kubelet_tree::{Driver, Runtime},
};
use serde_json::json;

pub const WAIT: Duration = Duration::from_secs(60);
pub const NODE: &str = "node-a";
pub const MIB: u64 = 1 << 20;

pub async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn start_qoslet(kubeconfig: &Path, kubelet: &Path, config: &Path) -> InProcessAgent {
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
pub const SHIPPED_RBAC: &str = include_str!("../../../deploy/kubernetes/rbac.yaml");

/// Every request qoslet made is one the shipped ClusterRole and Role allow: the fake does not
/// authorize, a real API server answers 403.
pub fn assert_rbac_allows(fake: &FakeApi) {
    assert_rbac_allows_with(fake, "");
}

/// [`assert_rbac_allows`] with `extra` RBAC documents added to the shipped ones.
pub fn assert_rbac_allows_with(fake: &FakeApi, extra: &str) {
    let rbac = if extra.is_empty() {
        SHIPPED_RBAC.to_owned()
    } else {
        format!("{SHIPPED_RBAC}\n---\n{extra}")
    };
    let denied = qoslet_tests::fake_api::rbac::denied(&fake.requests(), &rbac)
        .expect("deploy/kubernetes/rbac.yaml parses");
    assert!(
        denied.is_empty(),
        "requests deploy/kubernetes/rbac.yaml does not allow: {denied:#?}"
    );
}

pub struct Setup {
    pub fake: FakeApi,
    pub root: NodeRoot,
    pub work: TempDir,
    pub kubeconfig: PathBuf,
    pub kubelet: PathBuf,
    pub config: PathBuf,
    pub metrics: SocketAddr,
}

pub async fn setup(driver: Driver, runtime: Runtime, limit_mib: u64, hard_mib: u64) -> Setup {
    setup_with(driver, runtime, limit_mib, hard_mib, Options::default(), "").await
}

/// [`setup`] with the fake's options and extra QosletConfiguration lines.
pub async fn setup_with(
    driver: Driver,
    runtime: Runtime,
    limit_mib: u64,
    hard_mib: u64,
    options: Options,
    extra_config: &str,
) -> Setup {
    setup_node(
        driver,
        runtime,
        limit_mib,
        hard_mib,
        options,
        extra_config,
        "v1.37.0",
    )
    .await
}

/// [`setup_with`] whose Node reports `kubelet_version` in `status.nodeInfo.kubeletVersion`.
pub async fn setup_node(
    driver: Driver,
    runtime: Runtime,
    limit_mib: u64,
    hard_mib: u64,
    options: Options,
    extra_config: &str,
    kubelet_version: &str,
) -> Setup {
    let fake = FakeApi::start(options).await.expect("fake API");
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
    // The tests read /metrics without a token: the endpoints are open unless a test's own lines
    // say otherwise (cluster_node's guarded-endpoints test; endpoint_auth.rs).
    let auth = if extra_config.contains("endpointAuth:") {
        ""
    } else {
        "endpointAuth: none\n"
    };
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nnodeRootCgroup: /{}\nmetricsAddress: \"{metrics}\"\nstateDir: {}\nhousekeepingInterval: 200ms\nleaseNamespace: qoslet-system\n{auth}{extra_config}",
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
            "bootID": "", "kernelVersion": "", "osImage": "", "kubeletVersion": kubelet_version,
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
