//! qoslet on a real one-node Kubernetes cluster: `cargo xtask cluster test` brings up etcd,
//! kube-apiserver (Node,RBAC), the controller manager, the scheduler, containerd and the
//! kubelet on this machine, pushes qoslet's image to a distribution registry it starts beside
//! them, installs qoslet with `kubectl apply -k` naming that image by digest, and runs
//! these tests in the cluster's network namespace with `QOSLET_CLUSTER` naming the cluster's
//! `cluster.json` (see xtask/src/cluster.rs). Without it they are ignored.
//!
//! Checked against what the real parts show: qoslet finds every pod's cgroups (its /status
//! reads each pod's working set from them); the kubelet's own cgroup values equal `qoslet
//! plan`'s for the same pods; a BestEffort memory hog is evicted by qoslet, not the kubelet
//! (whose memory.available cannot reach its threshold here), before the kernel (no OOM kill in
//! the node's cgroup) and ends as the kubelet's evictions do (phase Failed, the DisruptionTarget
//! condition, not restarted; reason Evicted unless the kubelet drops it), with qoslet's Events
//! and node conditions on the API server; the API server enforces the RBAC through
//! the DaemonSet's service account, and qoslet's log has no 403. With the API server stopped
//! for a minute (real_cluster/api_outage.rs), qoslet's requests as the server's audit log has
//! them stay within the fault suite's bounds, and qoslet is in sync after.
//!
//! With `cargo xtask cluster up --vm-node` the cluster has a second node, a VM with systemd,
//! pure cgroup v2 and the kubelet's systemd driver (xtask/src/cluster/vm_node.rs): the cgroups,
//! kubelet-equals-plan, hog, real-controller churn (lighter there) and no-403 tests run on it
//! too, reading its files through a pod of their own (real_cluster/nodes.rs). On each node qoslet found the kubelet's configuration
//! itself, from the kubelet's process: kubeadm's one file on the host node, a base file,
//! `--config-dir` drop-ins and flags on the VM node. qoslet's endpoints are read as the tests' reader, a
//! service account allowed what the shipped `qoslet-metrics-reader` allows.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    coordination::v1::Lease,
    core::v1::{Event, Namespace, Node, Pod},
};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, ListParams, LogParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde::Deserialize;
use serde_json::{Value, json};

#[path = "real_cluster/api_eviction.rs"]
mod api_eviction;
#[path = "real_cluster/api_outage.rs"]
mod api_outage;
#[path = "real_cluster/gang_eviction.rs"]
mod gang_eviction;
#[path = "real_cluster/gangs.rs"]
mod gangs;
#[path = "real_cluster/nodes.rs"]
mod nodes;
#[path = "real_cluster/prometheus_operator.rs"]
mod prometheus_operator;

use nodes::{NodeFiles, Target};

const WAIT: Duration = Duration::from_secs(180);

/// xtask's `cluster.json`.
#[derive(Deserialize)]
struct Info {
    /// The cluster's name (its cgroup `/<name>`) and state directory (its daemons' pid files).
    name: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
    node: String,
    kubelet_config: PathBuf,
    /// What qoslet's `/readyz` names as the host node's kubelet configuration.
    kubelet_layout: Vec<String>,
    cgroup_root: String,
    qoslet: PathBuf,
    /// With `cluster up --vm-node`: the VM node, where the tests the issue names for every node
    /// run too.
    #[serde(default)]
    vm_node: Option<nodes::VmNodeInfo>,
    /// The API server's audit log: qoslet's requests (real_cluster/api_outage.rs).
    #[serde(default)]
    audit_log: Option<PathBuf>,
    /// qoslet's image in the cluster's registry, which both install paths name.
    image: RegistryImage,
}

/// xtask's push of qoslet's image to the cluster's registry.
#[derive(Deserialize)]
struct RegistryImage {
    /// `192.0.2.1:5000/qoslet`.
    repository: String,
    /// The manifest's digest as the registry stored it.
    digest: String,
}

struct Cluster {
    info: Info,
    client: Client,
    /// A token that may read qoslet's guarded endpoints ([`READER`]).
    reader: String,
}

async fn cluster() -> Cluster {
    let file = std::env::var("QOSLET_CLUSTER")
        .expect("QOSLET_CLUSTER names the cluster.json of `cargo xtask cluster up`");
    let info: Info = serde_json::from_str(&fs::read_to_string(&file).expect("cluster.json"))
        .expect("cluster.json parses");
    let client = client(&info.kubeconfig)
        .await
        .expect("a client from the admin kubeconfig");
    let reader = reader_token(&client).await;
    Cluster {
        info,
        client,
        reader,
    }
}

/// The tests' reader of qoslet's endpoints (`endpointAuth: tokenReview`): a service account in
/// `default` bound to a ClusterRole of the tests' own, which grants what the shipped
/// `qoslet-metrics-reader` grants and `/status` (asked from outside qoslet's pod).
const READER: &str = "qoslet-e2e-reader";

/// Creates `object` through `api`, or leaves the one that exists.
async fn create_or_keep<K>(api: &Api<K>, object: &K)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("cannot create {object:?}: {e}"),
    }
}

/// A token of service account `name` in `namespace` (created when missing), an hour long.
async fn service_account_token(client: &Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::{authentication::v1::TokenRequest, core::v1::ServiceAccount};
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name},
    }))
    .unwrap();
    create_or_keep(&accounts, &account).await;
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3600},
    }))
    .unwrap();
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("a service account token")
        .status
        .and_then(|s| s.token)
        .expect("the token")
}

/// Binds `account` in `namespace` to the ClusterRole `role` (the binding named `binding`).
async fn bind_cluster_role(
    client: &Client,
    binding: &str,
    role: &str,
    namespace: &str,
    account: &str,
) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let object: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }))
    .unwrap();
    create_or_keep(&Api::all(client.clone()), &object).await;
}

/// [`READER`]'s token, its grants made first (kept between tests: they grant reads only).
async fn reader_token(client: &Client) -> String {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": READER},
        "rules": [
            {"nonResourceURLs": ["/metrics", "/status"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes/stats"], "verbs": ["get"]},
        ],
    }))
    .unwrap();
    create_or_keep(&Api::all(client.clone()), &role).await;
    bind_cluster_role(client, READER, READER, "default", READER).await;
    service_account_token(client, "default", READER).await
}

async fn client(kubeconfig: &Path) -> Result<Client, Box<dyn std::error::Error>> {
    let kubeconfig = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

async fn wait_for<T, F: Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A namespace of the test's own, deleted when dropped (pods and all), waiting until it is gone.
struct TestNamespace {
    name: String,
    client: Client,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    async fn create(c: &Cluster, prefix: &str) -> Self {
        let name = format!("{prefix}-{}", std::process::id());
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))
        .unwrap();
        Api::<Namespace>::all(c.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create the test namespace");
        // The service account controller makes `default`, which pods need.
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(c.client.clone(), &name);
        wait_for("the default service account", || async {
            sa.get_opt("default").await.ok().flatten()
        })
        .await;
        Self {
            name,
            client: c.client.clone(),
            kubeconfig: c.info.kubeconfig.clone(),
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        with_own_client(&self.kubeconfig, |client| async move {
            let api = Api::<Namespace>::all(client);
            let _ = api.delete(&name, &DeleteParams::default()).await;
            // Gone before the next test, whose node then has only its own pods.
            let deadline = Instant::now() + WAIT;
            while Instant::now() < deadline && api.get_opt(&name).await.is_ok_and(|n| n.is_some()) {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
}

/// Runs `cleanup` to its end with a client of its own, for a `Drop`: a drop runs inside the
/// test's runtime, which a client's worker needs, so a thread with a runtime of its own does it.
fn with_own_client<F: Future<Output = ()>>(
    kubeconfig: &Path,
    cleanup: impl FnOnce(Client) -> F + Send + 'static,
) {
    let kubeconfig = kubeconfig.to_owned();
    let _ = std::thread::spawn(move || {
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async move {
                if let Ok(client) = client(&kubeconfig).await {
                    cleanup(client).await;
                }
            });
    })
    .join();
}

/// A pod of the test image (busybox and the hog, see xtask/src/cluster/images.rs).
fn pod(name: &str, script: &str, resources: Value, restart: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": "localhost/qoslet-test:latest",
                "imagePullPolicy": "Never",
                "command": ["/bin/busybox", "sh", "-c", script],
                "resources": resources,
            }],
        },
    }))
    .unwrap()
}

async fn create_running(ns: &TestNamespace, pods: Vec<Pod>) -> Vec<Pod> {
    let api = ns.pods();
    for p in &pods {
        api.create(&PostParams::default(), p)
            .await
            .expect("create pod");
    }
    let mut out = Vec::new();
    for p in pods {
        let name = p.metadata.name.clone().unwrap();
        out.push(
            wait_for(&format!("pod {name} Running"), || async {
                let p = api.get(&name).await.ok()?;
                (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
            })
            .await,
        );
    }
    out
}

/// The API server's own metrics (`/metrics`, Prometheus text), read with the admin's client.
async fn apiserver_metrics(c: &Cluster) -> String {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    c.client
        .request_text(req)
        .await
        .expect("the API server's /metrics")
}

/// qoslet's pod on the host node, once Ready.
async fn qoslet_pod(c: &Cluster) -> Pod {
    qoslet_pod_on(c, &c.info.node, None).await
}

/// qoslet's pod on the host node, once Ready and not being deleted; with `old`, another one than
/// the pod of that uid.
async fn qoslet_pod_other_than(c: &Cluster, old: Option<&str>) -> Pod {
    qoslet_pod_on(c, &c.info.node, old).await
}

/// qoslet's pod on `node` (the DaemonSet has one on every node), once Ready and not being
/// deleted; with `old`, another one than the pod of that uid.
async fn qoslet_pod_on(c: &Cluster, node: &str, old: Option<&str>) -> Pod {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), "qoslet-system");
    wait_for(&format!("qoslet's pod on {node} Ready"), || async {
        let list = api
            .list(
                &ListParams::default()
                    .labels("app.kubernetes.io/name=qoslet")
                    .fields(&format!("spec.nodeName={node}")),
            )
            .await
            .ok()?;
        list.items.into_iter().find(|p| {
            old.is_none_or(|old| uid(p) != old)
                && p.metadata.deletion_timestamp.is_none()
                && p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    })
    .await
}

/// GET `path` from qoslet's metrics port as the tests' reader (the test runs in the cluster's
/// network namespace, where the pod network is); `None` unless it answers 200.
fn qoslet_get(c: &Cluster, pod: &Pod, path: &str) -> Option<String> {
    match qoslet_get_as(pod, path, Some(&c.reader))? {
        (200, body) => Some(body),
        _ => None,
    }
}

/// GET `path` from qoslet's metrics port with `token`: the status code and the body.
fn qoslet_get_as(pod: &Pod, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let ip: std::net::IpAddr = pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
    qoslet_tests::http_get_as(std::net::SocketAddr::new(ip, 9479), path, token)
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap()
}

fn three_qos_pods(t: &Target) -> Vec<Pod> {
    [
        pod(
            "guaranteed",
            "sleep 3600",
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}),
            "Always",
        ),
        pod(
            "burstable",
            "sleep 3600",
            json!({"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "300m", "memory": "128Mi"}}),
            "Always",
        ),
        pod("besteffort", "sleep 3600", json!({}), "Always"),
    ]
    .into_iter()
    .map(|p| t.place(p))
    .collect()
}

#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn cgroups_of_every_pod_are_found() {
    let c = cluster().await;
    for t in c.targets() {
        println!("on node {}:", t.node);
        cgroups_of_every_pod_are_found_on(&c, &t).await;
    }
}

async fn cgroups_of_every_pod_are_found_on(c: &Cluster, t: &Target) {
    let ns = TestNamespace::create(c, &format!("qoslet-e2e-cgroups-{}", t.node)).await;
    let files = t.files(c, &ns).await;
    let pods = create_running(&ns, three_qos_pods(t)).await;
    let q = qoslet_pod_on(c, &t.node, None).await;
    // Each pod, qoslet's own included, with a working set read from its cgroup.
    let mut want: Vec<(String, String)> = pods
        .iter()
        .map(|p| (ns.name.clone(), p.metadata.name.clone().unwrap()))
        .collect();
    want.push(("qoslet-system".into(), q.metadata.name.clone().unwrap()));
    let status: Value = wait_for("every pod in qoslet's /status with its working set", || {
        let q = q.clone();
        let want = want.clone();
        let files = &files;
        async move {
            let s: Value = serde_json::from_str(&files.qoslet_get(c, &q, "/status")?).ok()?;
            let rows = s["pods"].as_array()?;
            want.iter()
                .all(|(ns, name)| {
                    rows.iter().any(|r| {
                        r["namespace"] == ns.as_str()
                            && r["name"] == name.as_str()
                            && r["working_set_bytes"].as_u64().is_some_and(|b| b > 0)
                    })
                })
                .then_some(s)
        }
    })
    .await;
    let metrics = files.qoslet_get(c, &q, "/metrics").expect("metrics");
    for p in &pods {
        assert!(
            metrics.contains(&format!("uid=\"{}\"", uid(p))),
            "no per-pod metrics for {}: {status}",
            p.metadata.name.as_deref().unwrap()
        );
    }
    // The Summary API names the Node object, as the kubelet's does, not the machine's hostname.
    let summary: Value = serde_json::from_str(
        &files
            .qoslet_get(c, &q, "/stats/summary")
            .expect("/stats/summary"),
    )
    .unwrap();
    assert_eq!(summary["node"]["nodeName"], json!(t.node), "{summary}");
    println!(
        "  qoslet's /status has the {} pods with their working sets",
        want.len()
    );
}

/// The kubelet pulled qoslet's image from the cluster's registry (xtask pushed it there and
/// imported no copy): the DaemonSet's container names `repository@digest`, and the running
/// container's `imageID`, the repository digest containerd knows the image by, is that very
/// reference, not `localhost/qoslet@...`, the name an imported archive's image would carry.
#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn qoslet_runs_the_image_pulled_from_the_clusters_registry() {
    let c = cluster().await;
    let want = format!("{}@{}", c.info.image.repository, c.info.image.digest);
    for t in c.targets() {
        let q = qoslet_pod_on(&c, &t.node, None).await;
        let container = &q.spec.as_ref().expect("a pod spec").containers[0];
        assert_eq!(container.image.as_deref(), Some(want.as_str()));
        let status = q
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|s| s.name == container.name))
            .unwrap_or_else(|| panic!("no status of qoslet's container on {}", t.node));
        assert_eq!(
            status.image_id, want,
            "qoslet's container on {} runs another image than the registry's",
            t.node
        );
        println!("on node {}: qoslet runs {}", t.node, status.image_id);
    }
}

/// qoslet's endpoints as the shipped configuration has them (`endpointAuth: tokenReview`): the
/// probes' are open; `/metrics` answers 401 without a token, 403 to a service account bound to
/// nothing, and 200 with qoslet's series to one bound to the shipped ClusterRole
/// `qoslet-metrics-reader`, as Prometheus's is (deploy/kubernetes/rbac.yaml).
#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn endpoints_answer_the_scraper_and_refuse_the_rest() {
    let c = cluster().await;
    let ns = TestNamespace::create(&c, "qoslet-e2e-auth").await;
    let q = qoslet_pod(&c).await;
    let code = |path: &'static str, token: Option<String>| {
        let q = q.clone();
        async move {
            tokio::task::spawn_blocking(move || qoslet_get_as(&q, path, token.as_deref()))
                .await
                .unwrap()
                .map(|(code, _)| code)
        }
    };
    assert_eq!(
        code("/healthz", None).await,
        Some(200),
        "the probes' /healthz"
    );
    assert_eq!(
        code("/metrics", None).await,
        Some(401),
        "/metrics without a token"
    );
    let nobody = service_account_token(&c.client, &ns.name, "nobody").await;
    assert_eq!(
        code("/metrics", Some(nobody)).await,
        Some(403),
        "/metrics for a service account bound to nothing"
    );
    let binding = format!("qoslet-e2e-scraper-{}", std::process::id());
    bind_cluster_role(
        &c.client,
        &binding,
        "qoslet-metrics-reader",
        &ns.name,
        "scraper",
    )
    .await;
    let scraper = service_account_token(&c.client, &ns.name, "scraper").await;
    // A denial is kept 30 s (the kubelet's cacheUnauthorizedTTL); the binding takes a moment.
    let metrics = wait_for("/metrics for the scraper", || {
        let q = q.clone();
        let scraper = scraper.clone();
        async move {
            match tokio::task::spawn_blocking(move || qoslet_get_as(&q, "/metrics", Some(&scraper)))
                .await
                .unwrap()?
            {
                (200, body) => Some(body),
                _ => None,
            }
        }
    })
    .await;
    assert!(metrics.contains("qoslet_"), "{metrics}");
    assert_eq!(code("/stats/summary", Some(scraper)).await, Some(200));
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(c.client.clone())
        .delete(&binding, &DeleteParams::default())
        .await;
}

/// A cgroup file's value; the kernel's "no limit" (`max`, v1's -1 quota or largest page-aligned
/// limit) as `None`; v2's `cpu.max` as its quota.
fn cgroup_value(path: &str, text: &str) -> Option<i64> {
    let text = text
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("{path}: empty"));
    if text == "max" {
        return None;
    }
    let v: i64 = text
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {text}: {e}"));
    (0..(1 << 62)).contains(&v).then_some(v)
}

/// What `qoslet plan --output json` computes for `pods`, with the node's KubeletConfiguration
/// and the capacity the kubelet reports for it (its pids the lower of pid_max and threads-max,
/// as the kubelet's `pkg/kubelet/stats/pidlimit` reads them, which the Node does not report).
async fn plan(c: &Cluster, t: &Target, files: &NodeFiles, pods: &[Pod], work: &Path) -> Value {
    let node = Api::<Node>::all(c.client.clone())
        .get(&t.node)
        .await
        .expect("node");
    let cap = node.status.and_then(|s| s.capacity).expect("node capacity");
    let capacity = format!(
        "cpu={},memory={},pids={}",
        cap["cpu"].0,
        cap["memory"].0,
        files.pid_capacity()
    );
    let file = work.join("pods.yaml");
    let docs: Vec<String> = pods
        .iter()
        .map(|p| serde_yaml_ng::to_string(p).unwrap())
        .collect();
    fs::write(&file, docs.join("---\n")).unwrap();
    let kubelet_config = match &t.kubelet_config {
        Some(f) => f.clone(),
        None => {
            let f = work.join("kubelet-configz.json");
            fs::write(&f, kubelet_configz(c, &t.node).await.to_string()).unwrap();
            f
        }
    };
    let out = Command::new(&c.info.qoslet)
        .arg("plan")
        .arg("--kubelet-config")
        .arg(&kubelet_config)
        .args(["--capacity", &capacity, "--output", "json"])
        .arg(&file)
        .output()
        .expect("qoslet plan");
    assert!(
        out.status.success(),
        "qoslet plan: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("plan JSON")
}

/// The running kubelet's configuration, as it merged it from its files and flags: its
/// `/configz` (through the API server's node proxy) as a KubeletConfiguration.
async fn kubelet_configz(c: &Cluster, node: &str) -> Value {
    let req = http::Request::get(format!("/api/v1/nodes/{node}/proxy/configz"))
        .body(Vec::new())
        .unwrap();
    let text = c
        .client
        .request_text(req)
        .await
        .unwrap_or_else(|e| panic!("{node}'s /configz: {e}"));
    let v: Value = serde_json::from_str(&text).expect("/configz is JSON");
    let mut kc = v["kubeletconfig"].clone();
    let m = kc.as_object_mut().expect("/configz has a kubeletconfig");
    m.insert("apiVersion".into(), "kubelet.config.k8s.io/v1beta1".into());
    m.insert("kind".into(), "KubeletConfiguration".into());
    kc
}

/// The cgroup path of a plan entry, below the hierarchy's root as this machine sees it (the
/// host node's cgroupRoot is the node cgroup; the VM node's, `/`, is the VM's root).
fn plan_cgroup(c: &Cluster, t: &Target, entry: &Value) -> String {
    let cg = entry["cgroup"].as_str().expect("cgroup in the plan");
    if t.is_vm() || cg.starts_with(&c.info.cgroup_root) {
        cg.to_owned()
    } else {
        format!("{}/{}", c.info.cgroup_root, cg.trim_start_matches('/'))
    }
}

/// The pods the kubelet runs on `node` (not terminated or being deleted).
async fn node_pods(c: &Cluster, node: &str) -> Vec<Pod> {
    let all: Api<Pod> = Api::all(c.client.clone());
    let list = all
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("the node's pods");
    list.items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|ph| ph == "Running" || ph == "Pending")
        })
        .collect()
}

/// Each kubelet-written value with qoslet plan's: (what, plan, kubelet's file: its value, or
/// why it could not be read).
type Comparison = Vec<(String, Option<i64>, Result<Option<i64>, String>)>;

fn same(plan: &Option<i64>, kubelet: &Result<Option<i64>, String>) -> bool {
    kubelet.as_ref().is_ok_and(|k| k == plan)
}

/// A value the kubelet writes, in either cgroup version.
struct Compared {
    /// The v1 hierarchy.
    hierarchy: &'static str,
    v1: &'static str,
    v2: &'static str,
    /// The plan's key for the v1 file, and for the v2 file.
    key_v1: &'static str,
    key_v2: &'static str,
}

const CPU: Compared = Compared {
    hierarchy: "cpu",
    v1: "cpu.shares",
    v2: "cpu.weight",
    key_v1: "cpu_shares",
    key_v2: "cpu_weight",
};
const QUOTA: Compared = Compared {
    hierarchy: "cpu",
    v1: "cpu.cfs_quota_us",
    v2: "cpu.max",
    key_v1: "cpu_quota_us",
    key_v2: "cpu_quota_us",
};
const MEMORY: Compared = Compared {
    hierarchy: "memory",
    v1: "memory.limit_in_bytes",
    v2: "memory.max",
    key_v1: "memory_limit_bytes",
    key_v2: "memory_limit_bytes",
};
const PIDS: Compared = Compared {
    hierarchy: "pids",
    v1: "pids.max",
    v2: "pids.max",
    key_v1: "pids_max",
    key_v2: "pids_max",
};

fn compare(c: &Cluster, t: &Target, files: &NodeFiles, plan: &Value, pods: &[Pod]) -> Comparison {
    let v2 = t.is_vm();
    // (what, the plan's value, the file on the node)
    let mut wanted: Vec<(String, Option<i64>, String)> = Vec::new();
    let mut want = |what: &str, entry: &Value, f: &Compared| {
        let cg = plan_cgroup(c, t, entry);
        let cg = cg.trim_start_matches('/');
        let (file, key, path) = if v2 {
            (f.v2, f.key_v2, format!("/sys/fs/cgroup/{cg}/{}", f.v2))
        } else {
            let h = f.hierarchy;
            (f.v1, f.key_v1, format!("/sys/fs/cgroup/{h}/{cg}/{}", f.v1))
        };
        wanted.push((format!("{what} {file}"), entry[key].as_i64(), path));
    };
    let n = &plan["node"];
    for tier in ["kubepods", "burstable", "besteffort"] {
        want(tier, &n[tier], &CPU);
        if tier == "kubepods" {
            want(tier, &n[tier], &MEMORY);
            want(tier, &n[tier], &PIDS);
        }
    }
    let plans = plan["pods"].as_array().cloned().unwrap_or_default();
    let mut missing = Vec::new();
    for p in pods {
        let name = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        );
        let Some(e) = plans.iter().find(|e| e["uid"] == uid(p).as_str()) else {
            missing.push((
                format!("{name}: not in the plan"),
                None,
                Err("a pod of the node".to_owned()),
            ));
            continue;
        };
        for compared in [&CPU, &QUOTA, &MEMORY, &PIDS] {
            want(&name, e, compared);
        }
    }
    let paths: Vec<String> = wanted.iter().map(|(_, _, p)| p.clone()).collect();
    let texts = files.read_all(&paths);
    let mut out: Comparison = wanted
        .into_iter()
        .zip(texts)
        .map(|((what, plan, path), text)| {
            let kubelet = text
                .map(|t| cgroup_value(&path, &t))
                .ok_or(format!("{path}: unreadable"));
            (what, plan, kubelet)
        })
        .collect();
    out.append(&mut missing);
    out
}

#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn kubelet_cgroup_values_equal_qoslet_plan() {
    let c = cluster().await;
    for t in c.targets() {
        println!("on node {}:", t.node);
        kubelet_cgroup_values_equal_qoslet_plan_on(&c, &t).await;
    }
}

async fn kubelet_cgroup_values_equal_qoslet_plan_on(c: &Cluster, t: &Target) {
    let ns = TestNamespace::create(c, &format!("qoslet-e2e-plan-{}", t.node)).await;
    let files = t.files(c, &ns).await;
    create_running(&ns, three_qos_pods(t)).await;
    let work = qoslet_tests::TempDir::new();
    // Every pod of the node (qoslet's own too: the QoS tiers sum them all), as the kubelet
    // has them once it has synced its QoS cgroups after the last change (it does so on pod
    // changes and once a minute): the same values, or the last difference at the deadline.
    let deadline = Instant::now() + WAIT;
    let (compared, plan) = loop {
        let pods = node_pods(c, &t.node).await;
        let plan = plan(c, t, &files, &pods, &work.path).await;
        let cmp = compare(c, t, &files, &plan, &pods);
        if cmp.iter().all(|(_, p, k)| same(p, k)) && pods.len() >= 4 {
            break (cmp, plan);
        }
        assert!(
            Instant::now() < deadline,
            "qoslet plan vs the kubelet's cgroups on {}, differing: {:#?}",
            t.node,
            cmp.iter()
                .filter(|(_, p, k)| !same(p, k))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    println!("  kubelet == qoslet plan, {} values:", compared.len());
    for (what, _, v) in &compared {
        println!("    {what}: {v:?}");
    }
    qoslet_found_the_kubelets_configuration(c, t, &files, &plan).await;
}

/// The part of qoslet's `/readyz` that names what it read of the kubelet's configuration: the
/// line `kubelet: ready: kubelet pid N, beneath ROOT: A, B, flags --x --y`, as the list [A, B,
/// flags --x --y]; `None` without a ready line of that shape.
fn discovered_layout(readyz: &str) -> Option<Vec<String>> {
    let line = readyz
        .lines()
        .find_map(|l| l.strip_prefix("kubelet: ready: kubelet pid "))?;
    let (_, read) = line.split_once(": ")?;
    Some(read.split(", ").map(str::to_owned).collect())
}

#[test]
fn discovered_layouts_are_read_from_readyz() {
    let readyz = "api: ready: listed\nkubelet: ready: kubelet pid 42, beneath /host: /etc/k/config.json, /etc/k/config.json.d/ (2 drop-ins), flags --eviction-hard --system-reserved\nsensors: ready: ebpf\n";
    assert_eq!(
        discovered_layout(readyz).unwrap(),
        [
            "/etc/k/config.json",
            "/etc/k/config.json.d/ (2 drop-ins)",
            "flags --eviction-hard --system-reserved"
        ]
    );
    assert_eq!(
        discovered_layout(
            "kubelet: not ready: not found: no kubelet process in /proc (comm and argv[0] named kubelet); observing with the kubelet's defaults\n"
        ),
        None
    );
}

/// qoslet's pod on `t` found the kubelet's configuration itself, from the kubelet's process
/// (no file is named to it): its `/readyz` names the node's layout (`t.kubelet_layout`: on the
/// VM node a base file, `--config-dir` drop-ins and flags that override each other), and what it
/// built from them is the kubelet's own merge: what its Node Allocatable takes off the capacity
/// (`/metrics`: the reservations and the hard eviction threshold of the configuration it found)
/// is what `plan`, made from the kubelet's configuration (its file, or its `/configz`), takes
/// off, and for cpu and memory what the kubelet itself takes off in the Node's status. A layer
/// read wrong (xtask/src/cluster/vm_node.rs, `DROPINS`) changes a reservation or the threshold.
/// The amounts taken off are compared, not Allocatable itself, so that a capacity qoslet reads
/// otherwise than the kubelet would not hide or fake a difference of configuration.
async fn qoslet_found_the_kubelets_configuration(
    c: &Cluster,
    t: &Target,
    files: &NodeFiles,
    plan: &Value,
) {
    let q = qoslet_pod_on(c, &t.node, None).await;
    let readyz = files.qoslet_get(c, &q, "/readyz").unwrap_or_default();
    let line = readyz.lines().find(|l| l.starts_with("kubelet: "));
    assert_eq!(
        discovered_layout(&readyz).as_deref(),
        Some(t.kubelet_layout.as_slice()),
        "qoslet on {}: what it read of the kubelet's configuration ({line:?})",
        t.node
    );
    println!("  qoslet's {}", line.unwrap_or_default());
    let metrics = files
        .qoslet_get(c, &q, "/metrics")
        .unwrap_or_else(|| panic!("qoslet's /metrics on {}", t.node));
    let metric = |name: &str, resource: &str| -> i64 {
        let series = format!("{name}{{resource=\"{resource}\"}} ");
        let v: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series}in qoslet's /metrics on {}", t.node));
        v as i64
    };
    let status = Api::<Node>::all(c.client.clone())
        .get(&t.node)
        .await
        .expect("node")
        .status
        .expect("the Node's status");
    let (capacity, allocatable) = (
        status.capacity.expect("the Node's capacity"),
        status.allocatable.expect("the Node's allocatable"),
    );
    let quantity =
        |m: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
         r: &str|
         -> qoslet::policy::quantity::Quantity { m[r].0.parse().expect("a quantity") };
    for (resource, key) in [
        ("cpu", "cpu_millis"),
        ("memory", "memory_bytes"),
        ("pids", "pids"),
    ] {
        let taken = |cap: i64, alloc: i64| cap.checked_sub(alloc).expect("no overflow");
        let by_qoslet = taken(
            metric("qoslet_node_capacity", resource),
            metric("qoslet_node_allocatable", resource),
        );
        let by_plan = plan["node"]["capacity"][key]
            .as_i64()
            .zip(plan["node"]["allocatable"][key].as_i64())
            .map(|(cap, alloc)| taken(cap, alloc))
            .expect("the plan's capacity and allocatable");
        // The Node reports no pids.
        let by_kubelet = match resource {
            "cpu" => Some(taken(
                quantity(&capacity, "cpu").milli_value(),
                quantity(&allocatable, "cpu").milli_value(),
            )),
            "memory" => Some(taken(
                quantity(&capacity, "memory").value(),
                quantity(&allocatable, "memory").value(),
            )),
            _ => None,
        };
        println!(
            "  {resource} taken off the capacity for Allocatable: by qoslet {by_qoslet}, by the kubelet's configuration {by_plan}, by the kubelet {by_kubelet:?}"
        );
        assert_eq!(
            by_qoslet, by_plan,
            "{resource} taken off the capacity on {}: qoslet's configuration is not the kubelet's",
            t.node
        );
        if let Some(k) = by_kubelet {
            assert_eq!(
                by_plan, k,
                "{resource} taken off the capacity on {}: the plan's is not the kubelet's own",
                t.node
            );
        }
    }
}

/// The kernel's OOM kills in the node's cgroup (v1 `memory.oom_control`, hierarchical).
fn node_oom_kills(c: &Cluster) -> u64 {
    let f = Path::new("/sys/fs/cgroup/memory")
        .join(c.info.cgroup_root.trim_start_matches('/'))
        .join("memory.oom_control");
    let text = fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .expect("oom_kill in memory.oom_control")
}

/// The kernel's OOM kills on `t`'s node: in the host node's cgroup, or in the whole VM.
fn oom_kills(c: &Cluster, t: &Target, files: &NodeFiles) -> u64 {
    if t.is_vm() {
        files.vm_oom_kills()
    } else {
        node_oom_kills(c)
    }
}

#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn eviction_besteffort_hog_by_qoslet_before_the_kernel() {
    let c = cluster().await;
    for t in c.targets() {
        println!("on node {}:", t.node);
        eviction_besteffort_hog_by_qoslet_before_the_kernel_on(&c, &t).await;
    }
}

async fn eviction_besteffort_hog_by_qoslet_before_the_kernel_on(c: &Cluster, t: &Target) {
    let _q = qoslet_pod_on(c, &t.node, None).await;
    let ns = TestNamespace::create(c, &format!("qoslet-e2e-evict-{}", t.node)).await;
    let files = t.files(c, &ns).await;
    let oom_before = oom_kills(c, t, &files);
    let pods = create_running(
        &ns,
        [
            pod(
                "bystander",
                "sleep 3600",
                json!({"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "50m", "memory": "32Mi"}}),
                "Always",
            ),
            // Paced past the node's 2 GiB, so that a threshold 100 MiB below it is crossed
            // about two seconds before the limit would be.
            pod(
                "hog",
                "echo go | /bin/qoslet-test-hog 4000 50",
                json!({}),
                "Always",
            ),
        ]
        .into_iter()
        .map(|p| t.place(p))
        .collect(),
    )
    .await;
    let hog_index = pods.len() - 1;
    let hog_uid = uid(&pods[hog_index]);
    let api = ns.pods();
    // Evicted: the pod Failed, or (an eviction through the Eviction API) gone.
    let after = wait_for("the hog's eviction", || async {
        match api.get_opt("hog").await.ok()? {
            None => Some(None),
            Some(p) => (p.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(Some(p)),
        }
    })
    .await;
    // Before the kernel: no OOM kill in the node's cgroup, the hog not OOMKilled.
    assert_eq!(
        oom_kills(c, t, &files),
        oom_before,
        "the kernel OOM-killed on {}",
        t.node
    );
    // Not the kubelet's. On the host node its memory.available is the machine's MemTotal less
    // the node cgroup's working set (the node cgroup is its root, xtask/src/cluster.rs), out of
    // its threshold's reach, so an eviction of its own (an event with its name) means something
    // else made it evict, and the pod's end would not be qoslet's to judge. On the VM node its
    // signals are the VM's own, as qoslet's are: an eviction of its own means it came first.
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns.name);
    let evs = events.list(&ListParams::default()).await.unwrap();
    let evictions: Vec<&Event> = evs
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Evicted"))
        .collect();
    assert!(
        evictions.iter().all(|e| {
            e.source.as_ref().and_then(|s| s.component.as_deref()) != Some("kubelet")
                && e.reporting_component.as_deref() != Some("kubelet")
        }),
        "the kubelet evicted: {evictions:#?}"
    );
    assert!(!evictions.is_empty(), "no Evicted event: {:#?}", evs.items);
    // The threshold the hog met, as qoslet tells it: its Node Event (`events`) and its own
    // condition types on `nodes/status`, never the kubelet's.
    let node = t.node.as_str();
    let node_event = wait_for("qoslet's Node Event of memory pressure", || async {
        let evs = Api::<Event>::namespaced(c.client.clone(), "default")
            .list(&ListParams::default())
            .await
            .ok()?;
        evs.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("MemoryPressureThresholdMet")
                && e.involved_object.kind.as_deref() == Some("Node")
                && e.involved_object.name.as_deref() == Some(node)
        })
    })
    .await;
    assert_eq!(
        node_event.source.and_then(|s| s.component).as_deref(),
        Some("qoslet")
    );
    let conditions: Vec<String> = Api::<Node>::all(c.client.clone())
        .get(node)
        .await
        .unwrap()
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    for t in ["QosletMemoryPressure", "QosletPIDPressure"] {
        assert!(conditions.iter().any(|c| c == t), "no {t}: {conditions:?}");
    }
    println!(
        "node event: {}; node conditions: {conditions:?}",
        node_event.message.unwrap_or_default()
    );
    let bystander = api.get("bystander").await.unwrap();
    assert_eq!(
        bystander.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "the Guaranteed bystander"
    );
    // As the kubelet's evictions end: the pod object stays (a controller deletes it later),
    // Failed with reason Evicted and a DisruptionTarget condition.
    let evicted = after.unwrap_or_else(|| {
        panic!(
            "the hog's pod was deleted: an eviction must leave it Failed/Evicted, as the kubelet's do"
        )
    });
    let s = evicted.status.clone().unwrap();
    assert_eq!(uid(&evicted), hog_uid, "the same pod object");
    // The top-level reason and message are the kubelet's to keep: its status manager keeps an
    // API reason only if its terminating sync sees it (docs/architecture.md, cluster mode); 3
    // runs in 16 saw it dropped. The DisruptionTarget condition, which the kubelet does not own,
    // always stays with qoslet's reason and message.
    assert!(s.reason.as_deref().is_none_or(|r| r == "Evicted"), "{s:#?}");
    assert!(
        s.conditions.as_ref().is_some_and(|cs| cs.iter().any(|c| {
            c.type_ == "DisruptionTarget"
                && c.status == "True"
                && c.reason.as_deref() == Some("TerminationByKubelet")
                && c.message.as_deref().is_some_and(|m| {
                    m.starts_with("The node was low on resource: memory. Threshold quantity: ")
                })
        })),
        "no DisruptionTarget condition of qoslet's: {s:#?}"
    );
    println!(
        "the evicted pod: phase Failed, reason {:?} (the kubelet's to keep), DisruptionTarget with qoslet's message",
        s.reason
    );
    // Not restarted (restartPolicy Always would restart a container the kubelet saw die).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let p = api.get("hog").await.expect("the evicted pod stays");
    let s = p.status.unwrap();
    assert_eq!(s.phase.as_deref(), Some("Failed"), "{s:#?}");
    for cs in s.container_statuses.unwrap_or_default() {
        assert_eq!(cs.restart_count, 0, "{cs:#?}");
        assert!(
            cs.state.as_ref().is_none_or(|st| st.running.is_none()),
            "running again: {cs:#?}"
        );
        let reason = cs
            .state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .and_then(|t| t.reason.clone());
        assert_ne!(reason.as_deref(), Some("OOMKilled"), "{cs:#?}");
    }
}

/// A log line that reports a 403 (the number alone: not inside a larger number, a hex run or a
/// UID such as `a14d-403ca92bbe01`) or "forbidden".
fn denial(line: &str) -> bool {
    let b = line.as_bytes();
    let word_at = |i: Option<usize>| {
        i.and_then(|i| b.get(i))
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
    };
    let status = line
        .match_indices("403")
        .any(|(i, _)| !word_at(i.checked_sub(1)) && !word_at(Some(i + 3)));
    status || line.to_ascii_lowercase().contains("forbidden")
}

#[test]
fn denials_are_told_from_numbers() {
    assert!(denial("API write failed: 403 Forbidden"));
    assert!(denial("status=403"));
    assert!(denial("pods is forbidden: User cannot list"));
    assert!(!denial("observed=103440384 threshold=104857600"));
    assert!(!denial("uid=4031"));
    // A pod's UID in a cgroup path (a cluster test saw this one).
    assert!(!denial(
        "path=/sys/fs/cgroup/cpu/kubepods/pod8af068d6-5d76-4460-a14d-403ca92bbe01 file=\"cpu.shares\""
    ));
    assert!(denial("code: 403, reason: Forbidden"));
    assert!(denial("(403)"));
}

#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn rbac_is_enforced_and_qoslet_is_never_denied() {
    let c = cluster().await;
    let q = qoslet_pod(&c).await;
    let sa = "system:serviceaccount:qoslet-system:qoslet";
    let review = |verb: &str, resource: &str, group: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(sa.into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:serviceaccounts:qoslet-system".into(),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                resource: Some(resource.into()),
                group: Some(group.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(c.client.clone());
    let allowed = |r: SubjectAccessReview| r.status.is_some_and(|s| s.allowed);
    for (verb, resource, group, want) in [
        ("list", "pods", "", true),
        ("watch", "nodes", "", true),
        ("get", "secrets", "", false),
        ("delete", "nodes", "", false),
        ("create", "deployments", "apps", false),
    ] {
        let r = reviews
            .create(&PostParams::default(), &review(verb, resource, group))
            .await
            .expect("SubjectAccessReview");
        assert_eq!(
            allowed(r),
            want,
            "{sa} {verb} {group}/{resource} allowed by the API server"
        );
    }
    // qoslet's own requests went through: it holds its lease and is ready.
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "qoslet-system");
    let list = leases.list(&ListParams::default()).await.unwrap();
    assert!(
        !list.items.is_empty(),
        "no lease of qoslet's in qoslet-system"
    );
    let ready = qoslet_get(&c, &q, "/readyz").unwrap_or_default();
    println!("qoslet's /readyz on {}: {}", c.info.node, ready.trim());
    // Every node's qoslet: the VM node's too, with its own node-bound token.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "qoslet-system");
    for t in c.targets() {
        let q = qoslet_pod_on(&c, &t.node, None).await;
        let log = pods
            .logs(q.metadata.name.as_deref().unwrap(), &LogParams::default())
            .await
            .expect("qoslet's log");
        let denied: Vec<&str> = log.lines().filter(|l| denial(l)).collect();
        assert!(
            denied.is_empty(),
            "qoslet on {} was denied by the API server:\n{}",
            t.node,
            denied.join("\n")
        );
        println!(
            "qoslet's log on {}: {} lines, none denied",
            t.node,
            log.lines().count()
        );
    }
}

/// A client with `token` in place of the admin kubeconfig's credentials.
async fn client_with_token(kubeconfig: &Path, token: &str) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("the admin kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("its cluster");
    config.auth_info = serde_json::from_value(json!({ "token": token })).expect("a token");
    Client::try_from(config).expect("a client with the token")
}

/// The shipped ValidatingAdmissionPolicy (deploy/kubernetes/node-binding.yaml) binds qoslet's
/// writes to its node. With the credentials the DaemonSet's pod has (a token of its service
/// account bound to that pod, which names its node), qoslet may write its own node's status and
/// the status and the `qoslet.dev/evicted-at` annotation of a pod on its node, neither any other
/// annotation or label of that pod, nor the status of a second Node, nor the status or
/// annotation of a pod bound to it: the API server answers 422 with the policy's message, which qoslet's queue drops,
/// counted, and never retries (agent/src/cluster/writes.rs). No second kubelet is needed: the
/// second Node object and its pod are enough for the API server.
#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn writes_are_bound_to_qoslets_own_node() {
    use k8s_openapi::api::{authentication::v1::TokenRequest, core::v1::ServiceAccount};
    use kube::api::{Patch, PatchParams};

    let c = cluster().await;
    let q = qoslet_pod(&c).await;
    let own_node = q.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let ns = TestNamespace::create(&c, "binding").await;
    let here = create_running(&ns, vec![pod("here", "sleep 3600", json!({}), "Never")]).await;
    let other = format!("qoslet-other-{}", std::process::id());
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": other},
    }))
    .unwrap();
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("a second Node object");
    let mut elsewhere = pod("elsewhere", "sleep 3600", json!({}), "Never");
    elsewhere.spec.as_mut().unwrap().node_name = Some(other.clone());
    ns.pods()
        .create(&PostParams::default(), &elsewhere)
        .await
        .expect("a pod bound to the second node");

    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {
            "audiences": [],
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1", "kind": "Pod",
                "name": q.metadata.name, "uid": q.metadata.uid,
            },
        },
    }))
    .unwrap();
    let token = Api::<ServiceAccount>::namespaced(c.client.clone(), "qoslet-system")
        .create_token_request("qoslet", &PostParams::default(), &request)
        .await
        .expect("a token of qoslet's service account bound to its pod")
        .status
        .and_then(|s| s.token)
        .expect("the token");
    let as_qoslet = client_with_token(&c.info.kubeconfig, &token).await;
    let condition = Patch::Strategic(json!({"status": {"conditions": [{
        "type": "QosletBindingTest", "status": "False", "reason": "Test", "message": "node binding",
    }]}}));
    let params = PatchParams::default();
    let qoslet_nodes: Api<Node> = Api::all(as_qoslet.clone());
    let qoslet_pods: Api<Pod> = Api::namespaced(as_qoslet.clone(), &ns.name);
    let here_name = here[0].metadata.name.as_deref().unwrap();
    let annotate = |key: &str| {
        Patch::Merge(json!({"metadata": {"annotations": {key: "2026-12-03T10:00:00Z"}}}))
    };
    let evicted_at = annotate("qoslet.dev/evicted-at");

    let allowed = [
        (
            "its own node's status",
            qoslet_nodes
                .patch_status(&own_node, &params, &condition)
                .await
                .map(drop),
        ),
        (
            "the status of a pod on its node",
            qoslet_pods
                .patch_status(here_name, &params, &condition)
                .await
                .map(drop),
        ),
        (
            "the annotation qoslet.dev/evicted-at of a pod on its node",
            qoslet_pods
                .patch(here_name, &params, &evicted_at)
                .await
                .map(drop),
        ),
    ];
    let other_change = [
        (
            "another annotation of a pod on its node",
            qoslet_pods
                .patch(here_name, &params, &annotate("example.com/other"))
                .await
                .map(drop),
        ),
        (
            "a label of a pod on its node",
            qoslet_pods
                .patch(
                    here_name,
                    &params,
                    &Patch::Merge(json!({"metadata": {"labels": {"qoslet-test": "x"}}})),
                )
                .await
                .map(drop),
        ),
    ];
    let denied = [
        (
            "the second node's status",
            qoslet_nodes
                .patch_status(&other, &params, &condition)
                .await
                .map(drop),
        ),
        (
            "the status of the pod on the second node",
            qoslet_pods
                .patch_status("elsewhere", &params, &condition)
                .await
                .map(drop),
        ),
        (
            "the annotation qoslet.dev/evicted-at of the pod on the second node",
            qoslet_pods
                .patch("elsewhere", &params, &evicted_at)
                .await
                .map(drop),
        ),
    ];
    // Gone before the asserts can fail: a pod bound to a node without a kubelet is deleted at
    // once only with no grace, and then its node.
    let _ = ns
        .pods()
        .delete("elsewhere", &DeleteParams::default().grace_period(0))
        .await;
    let _ = nodes.delete(&other, &DeleteParams::default()).await;
    for (what, r) in allowed {
        assert!(r.is_ok(), "qoslet may write {what}: {r:?}");
    }
    for (what, r) in denied {
        match r {
            Err(kube::Error::Api(s))
                if s.code == 422 && s.message.contains("may write only its own node") => {}
            other => panic!("qoslet wrote {what}, or was refused otherwise: {other:?}"),
        }
    }
    for (what, r) in other_change {
        match r {
            Err(kube::Error::Api(s))
                if s.code == 422
                    && s.message
                        .contains("may change only the annotation qoslet.dev/evicted-at") => {}
            other => panic!("qoslet changed {what}, or was refused otherwise: {other:?}"),
        }
    }
}

/// The workloads whose pods `evictions_under_real_controllers` evicts, by the label value its
/// pods carry.
const CHURN: [&str; 3] = ["statefulset", "job", "replicaset"];
/// Evictions of each workload's pod on the host node (the figure: 60 in all).
const EVICTIONS_EACH: usize = 20;
/// The hogs' trigger port (`QOSLET_HOG_LISTEN`, tests/src/bin/qoslet-test-hog.rs).
const HOG_PORT: u16 = 7000;

/// The pod template of a workload's hog, labelled `qoslet-churn: kind`: it waits for a
/// connection on [`HOG_PORT`], then grows at `rate` MiB/s to `cap_mib` (or the cap the
/// connection names, or until it is evicted); its process carries the pod's name and uid.
fn hog_template(kind: &str, restart: &str, cap_mib: u64, rate: u64) -> Value {
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    json!({
        "metadata": {"labels": {"qoslet-churn": kind}},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "containers": [{
                "name": "main",
                "image": "localhost/qoslet-test:latest",
                "imagePullPolicy": "Never",
                "command": ["/bin/qoslet-test-hog", cap_mib.to_string(), rate.to_string(), "$(POD_NAME)", "$(POD_UID)"],
                "env": [
                    {"name": "QOSLET_HOG_LISTEN", "value": HOG_PORT.to_string()},
                    {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                    {"name": "POD_UID", "valueFrom": field("metadata.uid")},
                ],
            }],
        },
    })
}

/// Starts the hog of a [`hog_template`] pod at `addr` (its pod IP and [`HOG_PORT`]): a
/// connection is its trigger. Ready says the container started, not that the hog listens yet,
/// so refused connections are tried again for 10 s.
async fn trigger_hog(addr: std::net::SocketAddr) {
    let t = Instant::now();
    let mut connect = tokio::net::TcpStream::connect(addr).await;
    while connect.is_err() && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        connect = tokio::net::TcpStream::connect(addr).await;
    }
    assert!(connect.is_ok(), "the hog at {addr}: {connect:?}");
}

/// The node cgroup's working set in bytes (usage less inactive file pages, as the kubelet counts
/// it), from the v1 memory hierarchy or the v2 tree.
fn node_working_set(c: &Cluster) -> u64 {
    let root = c.info.cgroup_root.trim_start_matches('/');
    let v1 = Path::new("/sys/fs/cgroup/memory").join(root);
    let (usage, stat, inactive) = if v1.join("memory.usage_in_bytes").exists() {
        (
            v1.join("memory.usage_in_bytes"),
            v1.join("memory.stat"),
            "total_inactive_file",
        )
    } else {
        let v2 = Path::new("/sys/fs/cgroup").join(root);
        (
            v2.join("memory.current"),
            v2.join("memory.stat"),
            "inactive_file",
        )
    };
    let usage: u64 = fs::read_to_string(&usage)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}", usage.display()));
    let inactive: u64 = fs::read_to_string(&stat)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(inactive)?.trim().parse().ok())
        .unwrap_or(0);
    usage.saturating_sub(inactive)
}

/// The node cgroup's memory limit in bytes (what qoslet and the kubelet take as the node's
/// memory).
fn node_memory_limit(c: &Cluster) -> u64 {
    let root = c.info.cgroup_root.trim_start_matches('/');
    let v1 = Path::new("/sys/fs/cgroup/memory")
        .join(root)
        .join("memory.limit_in_bytes");
    let file = if v1.exists() {
        v1
    } else {
        Path::new("/sys/fs/cgroup").join(root).join("memory.max")
    };
    fs::read_to_string(&file)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("no memory limit in {}", file.display()))
}

/// What the watch saw of one churn pod.
#[derive(Debug, Default, Clone)]
struct Seen {
    kind: String,
    name: String,
    ip: Option<String>,
    running: bool,
    failed: bool,
    disruption_target: bool,
    reason_evicted: bool,
    /// An update after the one that showed Failed in which a container ran again: a restart
    /// counted, or a container running that started later than any the Failed update showed.
    /// (A container still shown running after Failed is not one: the patch sets the phase, and
    /// the kubelet updates the containers' states later.)
    restarted_after_failed: bool,
    /// Updates that showed the phase back to Pending or Running after Failed (the kubelet's
    /// status manager writing its cached phase back; qoslet sends the status again).
    phase_written_back: u32,
    /// The phase of the last update.
    phase: Option<String>,
    max_restarts: i32,
    /// The latest container start the first Failed update showed.
    started_at_failure: Option<String>,
    deleted: bool,
}

fn record(seen: &mut Seen, p: &Pod) {
    let s = p.status.clone().unwrap_or_default();
    seen.kind = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("qoslet-churn").cloned())
        .unwrap_or_default();
    seen.name = p.metadata.name.clone().unwrap_or_default();
    seen.ip = s.pod_ip.clone().or(seen.ip.take());
    let statuses = s.container_statuses.clone().unwrap_or_default();
    let restarts = statuses.iter().map(|c| c.restart_count).max().unwrap_or(0);
    // RFC 3339 in UTC with the API's second resolution: ordered as strings.
    let latest_start = statuses
        .iter()
        .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .map(|t| t.0.to_string())
        .max();
    let phase = s.phase.as_deref();
    if seen.failed && (restarts > seen.max_restarts || latest_start > seen.started_at_failure) {
        seen.restarted_after_failed = true;
    }
    if seen.failed && seen.phase.as_deref() == Some("Failed") && phase != Some("Failed") {
        seen.phase_written_back += 1;
    }
    seen.phase = phase.map(str::to_owned);
    seen.max_restarts = seen.max_restarts.max(restarts);
    seen.running = phase == Some("Running")
        && p.metadata.deletion_timestamp.is_none()
        && statuses.iter().any(|c| c.ready);
    if phase == Some("Failed") {
        if !seen.failed {
            seen.started_at_failure = latest_start;
        }
        seen.failed = true;
        seen.reason_evicted |= s.reason.as_deref() == Some("Evicted");
        seen.disruption_target |= s.conditions.unwrap_or_default().iter().any(|c| {
            c.type_ == "DisruptionTarget"
                && c.status == "True"
                && c.reason.as_deref() == Some("TerminationByKubelet")
        });
    }
}

/// The hog processes on this machine by the pod name they carry: each pod uid, with whether its
/// process is frozen (`frozen 1` in its cgroup v2 `cgroup.events`: a frozen process runs no code
/// but is not dead either).
fn hog_processes() -> BTreeMap<String, BTreeMap<String, bool>> {
    let mut out: BTreeMap<_, BTreeMap<_, _>> = BTreeMap::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let dir = entry.path();
        if fs::read_to_string(dir.join("comm")).ok().as_deref() != Some("qoslet-test-hog\n") {
            continue;
        }
        let Ok(cmdline) = fs::read(dir.join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if let [_, _, _, name, uid, ..] = args.as_slice() {
            out.entry(name.clone())
                .or_default()
                .insert(uid.clone(), frozen(&dir));
        }
    }
    out
}

/// Whether the process at `/proc/<pid>` is frozen: its cgroup v2 directory (the unified tree on
/// a hybrid host) says `frozen 1`.
fn frozen(proc_dir: &Path) -> bool {
    let Some(rel) = fs::read_to_string(proc_dir.join("cgroup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        })
    else {
        return false;
    };
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .any(|mount| {
            fs::read_to_string(
                Path::new(mount)
                    .join(rel.trim_start_matches('/'))
                    .join("cgroup.events"),
            )
            .is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
        })
}

/// Issue #37's real controllers: a StatefulSet's, a Job's (a `podFailurePolicy` that ignores
/// `DisruptionTarget`, `backoffLimit: 0`) and a ReplicaSet's pod, each evicted by qoslet once a
/// round while the controller manager reacts: [`EVICTIONS_EACH`] rounds on the host node,
/// [`VM_ROUNDS`] on the VM node (below). A new Job each round: the Job controller delays a
/// replacement by 10 s doubling per failed pod, ignored ones included (`newBackoffRecord`,
/// pkg/controller/job/backoff_utils.go, v1.37.2), so one Job's twentieth replacement would come
/// hours later; each Job must still count no failure and replace its pod. One pod at a time grows
/// (its hog is triggered through the pod network) past the eviction threshold; a Guaranteed
/// ballast sized from the node's working set keeps each growth short. Throughout, the node's
/// processes are read every 50 ms: never two processes of the StatefulSet's pod at once (a frozen
/// one counts: it is not dead). A watch records every pod update: each evicted pod Failed with
/// qoslet's `DisruptionTarget`, and never a container running or restarted after that; reason
/// Evicted is counted (the kubelet's to keep). Each Job ends with no failure counted, the
/// ReplicaSet has its replica back, the kubelet evicted nothing and the kernel killed nothing.
///
/// The VM node is emulated (TCG): there the host's churn left the replaced Jobs' idle pods to
/// shrink the room round by round until the VM's kernel OOM-killed a hog before qoslet could act
/// (docs/test-cluster.md). So it gets a lighter churn: fewer rounds, each earlier round's Jobs
/// (checked first) and evicted pods deleted before the next round, a ballast sized from the VM's
/// own memory and threshold, and slower hogs each capped at the room left when it is triggered
/// plus [`VM_OVERSHOOT_MIB`], short of the limits.
#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn evictions_under_real_controllers() {
    let c = cluster().await;
    for t in c.targets() {
        println!("on node {}:", t.node);
        let rounds = if t.is_vm() { VM_ROUNDS } else { EVICTIONS_EACH };
        evictions_under_real_controllers_on(&c, &t, rounds).await;
    }
}

/// Rounds of `evictions_under_real_controllers` on the VM node: each workload's pod evicted twice.
const VM_ROUNDS: usize = 2;
/// The VM node's hogs grow at this many MiB/s (the host node's at 100).
const VM_HOG_RATE: u64 = 25;
/// What the ballast leaves on the VM node before the closer of its memory thresholds, in MiB.
const VM_ROOM_MIB: i64 = 250;
/// How far past the threshold a VM hog's cap is, in MiB: half the way to the limit beyond it
/// (the kubelet's `memory.available` there is 150Mi, kubepods' `memory.max` the pods' limit).
const VM_OVERSHOOT_MIB: i64 = 75;

async fn evictions_under_real_controllers_on(c: &Cluster, t: &Target, rounds: usize) {
    use std::sync::{Arc, Mutex};

    use futures::StreamExt as _;
    use k8s_openapi::api::{
        apps::v1::{ReplicaSet, StatefulSet},
        batch::v1::Job,
    };
    use kube::runtime::watcher;

    let _q = qoslet_pod_on(c, &t.node, None).await;
    let ns = TestNamespace::create(c, &format!("qoslet-e2e-churn-{}", t.node)).await;
    let files = t.files_and_processes(c, &ns).await;
    let oom_before = oom_kills(c, t, &files);
    let started = Instant::now();

    // Every update of the namespace's pods, by uid.
    let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        let stream = watcher(ns.pods(), watcher::Config::default());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let (p, deleted) = match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                    Ok(watcher::Event::Delete(p)) => (p, true),
                    _ => continue,
                };
                let mut seen = seen.lock().unwrap();
                let s = seen.entry(uid(&p)).or_default();
                record(s, &p);
                s.deleted |= deleted;
            }
        })
    };
    let copies = CopiesSampler::start(&files);

    // On the VM node the cap is the trigger's (the room left then, [`trigger_growth`]).
    let (cap_mib, rate) = if t.is_vm() {
        (
            u64::try_from(VM_ROOM_MIB + VM_OVERSHOOT_MIB).unwrap(),
            VM_HOG_RATE,
        )
    } else {
        (4000, 100)
    };
    let template =
        |kind: &str, restart: &str| t.place_template(hog_template(kind, restart, cap_mib, rate));
    let post = PostParams::default();
    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "churn"},
        "spec": {
            "replicas": 1, "serviceName": "churn",
            "selector": {"matchLabels": {"qoslet-churn": "statefulset"}},
            "template": template("statefulset", "Always"),
        },
    }))
    .unwrap();
    let job = |round: usize| -> Job {
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": format!("churn-{round}")},
            "spec": {
                "backoffLimit": 0,
                "podFailurePolicy": {"rules": [{
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget"}],
                }]},
                "template": template("job", "Never"),
            },
        }))
        .unwrap()
    };
    let rs: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "churn"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"qoslet-churn": "replicaset"}},
            "template": template("replicaset", "Always"),
        },
    }))
    .unwrap();
    let sts_api: Api<StatefulSet> = Api::namespaced(c.client.clone(), &ns.name);
    let job_api: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    let rs_api: Api<ReplicaSet> = Api::namespaced(c.client.clone(), &ns.name);
    sts_api.create(&post, &sts).await.expect("the StatefulSet");
    job_api.create(&post, &job(0)).await.expect("the Job");
    rs_api.create(&post, &rs).await.expect("the ReplicaSet");

    // The running pod of `kind` with its IP.
    let running = |kind: &'static str| {
        let seen = seen.clone();
        async move {
            wait_for(&format!("the {kind}'s pod Running"), || async {
                let seen = seen.lock().unwrap();
                // Said at once: waiting on would only time out.
                if let Some(s) = seen.values().find(|s| s.restarted_after_failed) {
                    panic!("an evicted pod's container ran again: {s:#?}");
                }
                seen.iter()
                    .find(|(_, s)| s.kind == kind && s.running && !s.failed && !s.deleted)
                    .and_then(|(u, s)| Some((u.clone(), s.ip.clone()?)))
            })
            .await
        }
    };
    for kind in CHURN {
        running(kind).await;
    }
    // `Some(threshold)` on the VM node, whose growths are sized at their trigger.
    let vm_threshold = if t.is_vm() {
        Some(vm_ballast(c, t, &ns, &files).await)
    } else {
        host_ballast(c, &ns).await;
        None
    };

    // Round after round, each workload's pod in turn: triggered, then evicted.
    let mut evicted: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut took = Vec::new();
    // The Jobs from `churn-{first_unchecked}` on are still to be checked.
    let mut first_unchecked = 0;
    let allowed = Duration::from_secs(if t.is_vm() { 300 } else { 60 }) * rounds as u32;
    let deadline = Instant::now() + allowed;
    for round in 0..rounds {
        if t.is_vm() && round > 0 {
            // What the rounds before left goes before the next growth, so that the room stays
            // what the ballast left: their Jobs (checked first) with their replaced pods, and the
            // evicted pods (a round gave a restart of their containers the time to show).
            for r in first_unchecked..round {
                job_replaced_without_failure(&job_api, &format!("churn-{r}")).await;
                delete_job(&job_api, &format!("churn-{r}")).await;
            }
            first_unchecked = round;
            ns.pods()
                .delete_collection(
                    &DeleteParams::default(),
                    &ListParams::default().fields("status.phase=Failed"),
                )
                .await
                .expect("delete the evicted pods");
        }
        for kind in CHURN {
            assert!(
                Instant::now() < deadline,
                "{allowed:?} and only {:?} evictions",
                evicted
                    .iter()
                    .map(|(k, v)| (*k, v.len()))
                    .collect::<Vec<_>>()
            );
            let (victim, ip) = running(kind).await;
            let start = Instant::now();
            trigger_growth(&files, &ip, vm_threshold).await;
            wait_for(
                &format!("round {round}: the {kind}'s pod evicted"),
                || async {
                    let seen = seen.lock().unwrap();
                    let s = seen.get(&victim)?;
                    (s.failed || s.deleted).then_some(())
                },
            )
            .await;
            took.push(start.elapsed());
            // One eviction at a time: the next hog grows once this one's processes are gone
            // (frozen, they hold their memory until the kill).
            wait_for(&format!("round {round}: the {kind}'s hog gone"), || async {
                (!hog_pods(&files).contains(&victim)).then_some(())
            })
            .await;
            evicted.entry(kind).or_default().push(victim);
            if kind == "job" && round + 1 < rounds {
                job_api
                    .create(&post, &job(round + 1))
                    .await
                    .expect("the next round's Job");
            }
        }
        println!("churn: round {round} done at {:.0?}", started.elapsed());
    }
    // The ReplicaSet and the StatefulSet have their pod back.
    for kind in ["statefulset", "replicaset"] {
        running(kind).await;
    }
    // Every Job replaced its evicted pod (after its 10 s back-off) and counted no failure.
    for round in first_unchecked..rounds {
        job_replaced_without_failure(&job_api, &format!("churn-{round}")).await;
    }
    // Late updates (a restart the kubelet might still try) get their chance to show.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let seen = seen.lock().unwrap().clone();
    let statefulset_pods: BTreeSet<String> = seen
        .iter()
        .filter(|(_, s)| s.kind == "statefulset")
        .map(|(u, _)| u.clone())
        .collect();
    let (samples, overlaps) = copies.stop(&files, &statefulset_pods);
    watch.abort();

    let mut report = Vec::new();
    for kind in CHURN {
        let uids = &evicted[kind];
        let of = |f: fn(&Seen) -> bool| uids.iter().filter(|u| seen.get(*u).is_some_and(f)).count();
        let failed = of(|s| s.failed);
        let target = of(|s| s.disruption_target);
        let reason = of(|s| s.reason_evicted);
        let restarted: Vec<&Seen> = uids
            .iter()
            .filter_map(|u| seen.get(u))
            .filter(|s| s.restarted_after_failed || s.max_restarts > 0)
            .collect();
        assert_eq!(failed, uids.len(), "{kind}: evicted pods never seen Failed");
        assert_eq!(
            target,
            uids.len(),
            "{kind}: evictions without qoslet's DisruptionTarget"
        );
        assert!(
            restarted.is_empty(),
            "{kind}: containers restarted after the eviction: {restarted:#?}"
        );
        // The phase the kubelet wrote back is sent again: every pod still there ends Failed.
        let not_failed: Vec<&Seen> = uids
            .iter()
            .filter_map(|u| seen.get(u))
            .filter(|s| !s.deleted && s.phase.as_deref() != Some("Failed"))
            .collect();
        assert!(
            not_failed.is_empty(),
            "{kind}: evicted pods not Failed at the end: {not_failed:#?}"
        );
        let written_back: u32 = uids
            .iter()
            .filter_map(|u| seen.get(u))
            .map(|s| s.phase_written_back)
            .sum();
        report.push(format!(
            "{kind}: {} evicted, Failed with DisruptionTarget {target}, reason Evicted kept {reason}, restarted 0, phase written back by the kubelet and sent again {written_back} times",
            uids.len()
        ));
    }
    // Alive, frozen or not: a frozen copy runs no code, but it still holds what it held.
    assert!(
        overlaps.is_empty(),
        "two copies of the StatefulSet's pod alive at once in {} of {samples} samples (uid: frozen, on the host node): {:?}",
        overlaps.len(),
        overlaps.iter().take(5).collect::<Vec<_>>()
    );
    let rs = rs_api.get("churn").await.unwrap();
    assert_eq!(
        rs.status.and_then(|s| s.ready_replicas),
        Some(1),
        "the ReplicaSet's replica"
    );
    // qoslet's evictions: the kubelet's would end the same (its DisruptionTarget reads as
    // qoslet's), and on the VM node its threshold is qoslet's (on the host node it cannot reach
    // its own).
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns.name);
    let by_kubelet: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Evicted")
                && (e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("kubelet")
                    || e.reporting_component.as_deref() == Some("kubelet"))
        })
        .collect();
    assert!(
        by_kubelet.is_empty(),
        "the kubelet evicted: {by_kubelet:#?}"
    );
    assert_eq!(
        oom_kills(c, t, &files),
        oom_before,
        "the kernel OOM-killed on {}",
        t.node
    );
    took.sort();
    println!(
        "churn: {} evictions in {:.0?}; trigger to Failed p50 {:.1?}, max {:.1?}; StatefulSet copies: at most 1 in {samples} samples of the processes",
        took.len(),
        started.elapsed(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
    for line in report {
        println!("churn: {line}");
    }
}

/// Copies of the StatefulSet's pod alive at once: this machine's /proc read every 50 ms by a
/// thread on the host node (its hogs carry their pod's name and uid), the reader pod's loop on the
/// VM node ([`nodes::HogSampler`]).
enum CopiesSampler {
    Host {
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
        thread: std::thread::JoinHandle<(u64, Vec<BTreeMap<String, bool>>)>,
    },
    Vm(nodes::HogSampler),
}

impl CopiesSampler {
    fn start(files: &NodeFiles) -> Self {
        use std::sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        };
        match files {
            NodeFiles::Host => {
                let stop = Arc::new(AtomicBool::new(false));
                let thread = {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        let (mut samples, mut overlaps) = (0u64, Vec::new());
                        while !stop.load(Ordering::Relaxed) {
                            let procs = hog_processes();
                            if let Some(copies) = procs.get("churn-0")
                                && copies.len() > 1
                            {
                                overlaps.push(copies.clone());
                            }
                            samples += 1;
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        (samples, overlaps)
                    })
                };
                CopiesSampler::Host { stop, thread }
            }
            NodeFiles::Vm { .. } => CopiesSampler::Vm(files.vm_hog_sampler()),
        }
    }

    /// The samples taken, and those that saw two copies of the StatefulSet's pod (`statefulset`:
    /// its pods' uids) alive at once: the copies' uids, on the host node with whether each was
    /// frozen.
    fn stop(self, files: &NodeFiles, statefulset: &BTreeSet<String>) -> (u64, Vec<String>) {
        match self {
            CopiesSampler::Host { stop, thread } => {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let (samples, overlaps) = thread.join().unwrap();
                (
                    samples,
                    overlaps
                        .iter()
                        .map(|copies| format!("{copies:?}"))
                        .collect(),
                )
            }
            CopiesSampler::Vm(sampler) => {
                let (samples, changes) = sampler.stop(files);
                let overlaps = changes
                    .iter()
                    .map(|pods| pods.intersection(statefulset).collect::<Vec<_>>())
                    .filter(|copies| copies.len() > 1)
                    .map(|copies| format!("{copies:?}"))
                    .collect();
                (samples, overlaps)
            }
        }
    }
}

/// The uids of the pods whose hog has a process on `files`' node, frozen ones too.
fn hog_pods(files: &NodeFiles) -> BTreeSet<String> {
    match files {
        NodeFiles::Host => hog_processes()
            .into_values()
            .flat_map(BTreeMap::into_keys)
            .collect(),
        NodeFiles::Vm { .. } => files.vm_hog_pods(),
    }
}

/// Starts the hog of the churn pod at `ip`: through the cluster's pod network on the host node;
/// on the VM node (`vm_threshold`, its memory threshold in bytes) from the reader pod, capped at
/// the room left before the threshold at that moment plus [`VM_OVERSHOOT_MIB`].
async fn trigger_growth(files: &NodeFiles, ip: &str, vm_threshold: Option<i64>) {
    match (files, vm_threshold) {
        (NodeFiles::Host, _) => {
            trigger_hog(format!("{ip}:{HOG_PORT}").parse().expect("a pod IP")).await;
        }
        (NodeFiles::Vm { .. }, Some(threshold)) => {
            let room_mib = vm_room(files, threshold) >> 20;
            assert!(
                room_mib > 0,
                "the VM is {} MiB past its threshold before the growth",
                -room_mib
            );
            files.vm_trigger(ip, HOG_PORT, room_mib + VM_OVERSHOOT_MIB);
        }
        (NodeFiles::Vm { .. }, None) => unreachable!("the VM node's growths are sized"),
    }
}

/// On the VM node: what is left before the closer of the node's and the pods' memory thresholds
/// (`threshold` bytes less than their available memory), in bytes.
fn vm_room(files: &NodeFiles, threshold: i64) -> i64 {
    let (node, pods) = files.vm_memory_available();
    node.min(pods) - threshold
}

/// On the host node: a Guaranteed ballast that leaves about 300 MiB to the threshold
/// (memory.available 100Mi, the kubelet configuration's evictionHard, of the node cgroup's limit).
async fn host_ballast(c: &Cluster, ns: &TestNamespace) {
    let mib = 1u64 << 20;
    let limit = node_memory_limit(c);
    let free = (limit - 100 * mib).saturating_sub(node_working_set(c));
    let ballast_mib = (free / mib).saturating_sub(300);
    println!(
        "churn: node working set {} MiB, ballast {ballast_mib} MiB",
        node_working_set(c) / mib
    );
    let ballast = pod(
        "ballast",
        &format!("echo go | /bin/qoslet-test-hog {ballast_mib}"),
        json!({"requests": {"cpu": "10m", "memory": format!("{}Mi", ballast_mib + 64)},
               "limits": {"cpu": "10m", "memory": format!("{}Mi", ballast_mib + 64)}}),
        "Always",
    );
    create_running(ns, vec![ballast]).await;
    let want = limit - 100 * mib - 400 * mib;
    wait_for("the ballast's memory", || async {
        (node_working_set(c) >= want).then_some(())
    })
    .await;
}

/// On the VM node: a Guaranteed ballast that leaves [`VM_ROOM_MIB`] before the closer of the
/// memory thresholds, from the VM's own numbers (the kubelet's `memory.available` of its
/// `/configz`, which qoslet found too); the threshold in bytes. A whole cpu to touch its memory:
/// with the host node's 10m an emulated CPU touched 1 MB/s.
async fn vm_ballast(c: &Cluster, t: &Target, ns: &TestNamespace, files: &NodeFiles) -> i64 {
    let kc = kubelet_configz(c, &t.node).await;
    let threshold = kc["evictionHard"]["memory.available"]
        .as_str()
        .and_then(|q| q.parse::<qoslet::policy::quantity::Quantity>().ok())
        .unwrap_or_else(|| panic!("the kubelet's memory.available: {kc}"))
        .value();
    let mib = 1i64 << 20;
    let room = vm_room(files, threshold);
    let ballast_mib = room / mib - VM_ROOM_MIB;
    println!(
        "churn: {} MiB before the threshold ({} MiB), ballast {ballast_mib} MiB",
        room / mib,
        threshold / mib
    );
    assert!(ballast_mib > 0, "no room for a ballast on {}", t.node);
    let r = json!({"cpu": "1", "memory": format!("{}Mi", ballast_mib + 64)});
    let ballast = t.place(pod(
        "ballast",
        &format!("echo go | /bin/qoslet-test-hog {ballast_mib}"),
        json!({"requests": r, "limits": r}),
        "Always",
    ));
    create_running(ns, vec![ballast]).await;
    wait_for("the ballast's memory", || async {
        (vm_room(files, threshold) <= (VM_ROOM_MIB + 100) * mib).then_some(())
    })
    .await;
    threshold
}

/// Job `name` once it replaced its evicted pod: it must count no failure.
async fn job_replaced_without_failure(api: &Api<k8s_openapi::api::batch::v1::Job>, name: &str) {
    let js = wait_for(&format!("Job {name} replaced its pod"), || async {
        let js = api.get(name).await.ok()?.status?;
        (js.active.unwrap_or(0) + js.ready.unwrap_or(0) > 0).then_some(js)
    })
    .await;
    assert_eq!(
        js.failed.unwrap_or(0),
        0,
        "Job {name} counted failures: {js:#?}"
    );
    assert!(
        js.conditions
            .iter()
            .flatten()
            .all(|c| c.type_ != "Failed" || c.status != "True"),
        "Job {name} failed: {js:#?}"
    );
}

/// Job `name` deleted with its pods, once they are gone (foreground deletion).
async fn delete_job(api: &Api<k8s_openapi::api::batch::v1::Job>, name: &str) {
    api.delete(name, &DeleteParams::foreground())
        .await
        .expect("delete the Job");
    wait_for(&format!("Job {name} gone"), || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// qoslet's ConfigMap (`deploy/kubernetes/configmap.yaml`) changed by `edit`, and its pod
/// restarted to read it: waits for a Ready pod other than the one that was running.
async fn reconfigure_qoslet(c: &Cluster, edit: impl FnOnce(&str) -> String) -> Pod {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams};

    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), "qoslet-system");
    let map = maps.get("qoslet-config").await.expect("qoslet's ConfigMap");
    let text = map
        .data
        .as_ref()
        .and_then(|d| d.get("config.yaml"))
        .expect("its config.yaml");
    let patch = Patch::Merge(json!({"data": {"config.yaml": edit(text)}}));
    maps.patch("qoslet-config", &PatchParams::default(), &patch)
        .await
        .expect("the ConfigMap patched");
    let old = uid(&qoslet_pod(c).await);
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "qoslet-system");
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app.kubernetes.io/name=qoslet"),
    )
    .await
    .expect("qoslet's pod deleted");
    qoslet_pod_other_than(c, Some(&old)).await
}

/// A message with every number (a quantity, a byte count) as `N`: the two evictions' messages
/// differ in the amounts, which depend on when each side looked, and nowhere else.
fn shape(message: &str) -> String {
    message
        .split(' ')
        .map(|w| {
            if w.starts_with(|ch: char| ch.is_ascii_digit()) {
                let tail: String = w
                    .chars()
                    .rev()
                    .take_while(|ch| !ch.is_ascii_alphanumeric())
                    .collect();
                format!("N{}", tail.chars().rev().collect::<String>())
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn shapes_keep_the_words_and_the_punctuation() {
    assert_eq!(
        shape(
            "Threshold quantity: 104857600, available: 51200Ki. Container main was using 1.5Gi, request is 0, has"
        ),
        "Threshold quantity: N, available: N. Container main was using N, request is N, has"
    );
}

/// What an eviction leaves that qoslet writes, amounts as [`shape`] leaves them: the pod's
/// phase, reason and message; each condition's status and reason, its message's shape and
/// whether it has an observed generation; the Event's type, reason, message's shape and
/// annotations (values shaped).
fn eviction_record(p: &Pod, e: &Event) -> Value {
    let s = p.status.clone().unwrap_or_default();
    let conditions: serde_json::Map<String, Value> = s
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| ["DisruptionTarget", "Ready", "ContainersReady"].contains(&c.type_.as_str()))
        .map(|c| {
            (
                c.type_.clone(),
                json!({
                    "status": c.status,
                    "reason": c.reason,
                    "message": c.message.as_deref().map(shape),
                    "observedGeneration": c.observed_generation.is_some(),
                }),
            )
        })
        .collect();
    let annotations: serde_json::Map<String, Value> = e
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, json!(shape(&v))))
        .collect();
    json!({
        "phase": s.phase,
        "reason": s.reason,
        "message": s.message.as_deref().map(shape),
        "observedGeneration": s.observed_generation.is_some(),
        "conditions": conditions,
        "event": {
            "type": e.type_,
            "reason": e.reason,
            "message": e.message.as_deref().map(shape),
            "annotations": annotations,
        },
    })
}

/// A BestEffort hog named `name` that grows to 150 MiB short of the node cgroup's limit and
/// holds there (past where both sides' `allocatableMemory.available`, the pods' cgroup limit less
/// its working set, crosses: about 356 MiB short; clear of the kernel's OOM killer), evicted by
/// whichever side acts: its pod once Failed and settled (the kubelet's
/// own status writes done), and its `Evicted` Event.
async fn evicted_hog(c: &Cluster, ns: &TestNamespace, name: &str) -> (Pod, Event) {
    // The kubelet refuses a BestEffort pod while its node reports MemoryPressure, which it keeps
    // for 5 minutes (evictionPressureTransitionPeriod) after its own eviction: a test run again
    // on the same cluster waits that out.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let deadline = Instant::now() + Duration::from_secs(400);
    loop {
        let pressure = nodes
            .get(&c.info.node)
            .await
            .ok()
            .and_then(|n| n.status?.conditions)
            .unwrap_or_default()
            .into_iter()
            .any(|c| c.type_ == "MemoryPressure" && c.status == "True");
        if !pressure {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node kept MemoryPressure for 400 s"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let mib = 1u64 << 20;
    let room = node_memory_limit(c).saturating_sub(node_working_set(c));
    let cap = (room / mib).saturating_sub(150);
    let hog = pod(
        name,
        &format!("echo go | /bin/qoslet-test-hog {cap} 50"),
        json!({}),
        "Never",
    );
    let uid = uid(&create_running(ns, vec![hog]).await[0]);
    let api = ns.pods();
    wait_for(&format!("{name} Failed"), || async {
        let p = api.get(name).await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(())
    })
    .await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns.name);
    let event = wait_for(&format!("{name}'s Evicted Event"), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("Evicted")
                && e.involved_object.uid.as_deref() == Some(uid.as_str())
        })
    })
    .await;
    // The kubelet's status manager writes its terminal status within its next sync.
    tokio::time::sleep(Duration::from_secs(5)).await;
    (api.get(name).await.expect("the evicted pod stays"), event)
}

/// Issue #37: an eviction by qoslet reads as one by the kubelet itself. `cargo xtask cluster test`
/// runs this alone, after the others, with the kubelet restarted at the threshold where its own
/// `memory.available` (the machine's MemTotal less the node cgroup's working set) crosses when
/// qoslet's (the node cgroup's limit less the same working set) crosses 100Mi; qoslet is given
/// the kubelet's capacity, so both read the same. A BestEffort hog is evicted by qoslet
/// (enforce), then another by the kubelet (qoslet in observe mode, which evicts nothing): the
/// pod's phase, reason, message, conditions and observed generations, and the Event's type,
/// reason, message and annotations must be the same but for the amounts. The one difference is
/// who reports it (the Event's source: `kubelet` or `qoslet`), which also says who acted.
#[tokio::test]
#[ignore = "needs a real cluster with the kubelet's threshold moved: cargo xtask cluster test runs it alone"]
async fn an_eviction_by_qoslet_reads_as_the_kubelets_own() {
    let c = cluster().await;
    let node = Api::<Node>::all(c.client.clone())
        .get(&c.info.node)
        .await
        .unwrap();
    let capacity = node
        .status
        .and_then(|s| s.capacity)
        .and_then(|c| c.get("memory").cloned())
        .expect("the node's memory capacity")
        .0;
    // The kustomize ConfigMap has no `capacity`, the Helm chart's `capacity: {}`; a block of
    // its own is this test's, from an earlier run.
    let block = format!("capacity:\n  memory: \"{capacity}\"\n");
    let with_capacity = |text: &str| {
        if text.contains("\ncapacity: {}\n") {
            text.replace("\ncapacity: {}\n", &format!("\n{block}"))
        } else if text.contains("\ncapacity:") {
            text.to_owned()
        } else {
            format!("{text}{block}")
        }
    };
    reconfigure_qoslet(&c, |t| {
        with_capacity(&t.replace("mode: observe", "mode: enforce"))
    })
    .await;
    let ns = TestNamespace::create(&c, "qoslet-e2e-same").await;
    let (qp, qe) = evicted_hog(&c, &ns, "by-qoslet").await;
    reconfigure_qoslet(&c, |t| t.replace("mode: enforce", "mode: observe")).await;
    let (kp, ke) = evicted_hog(&c, &ns, "by-kubelet").await;
    let source = |e: &Event| {
        e.source
            .as_ref()
            .and_then(|s| s.component.clone())
            .unwrap_or_default()
    };
    let (by_qoslet, by_kubelet) = (eviction_record(&qp, &qe), eviction_record(&kp, &ke));
    println!(
        "evicted by qoslet: {by_qoslet:#}\nevicted by the kubelet: {by_kubelet:#}\nmessages: qoslet {:?}; kubelet {:?}",
        qp.status.as_ref().and_then(|s| s.message.clone()),
        kp.status.as_ref().and_then(|s| s.message.clone()),
    );
    assert_eq!(
        (source(&qe).as_str(), source(&ke).as_str()),
        ("qoslet", "kubelet"),
        "who evicted which"
    );
    // Nothing compared is missing from the kubelet's own: its conditions and annotations are there.
    let kubelet_conditions = by_kubelet["conditions"].as_object().unwrap();
    assert_eq!(kubelet_conditions.len(), 3, "{by_kubelet:#}");
    assert!(
        !by_kubelet["event"]["annotations"]
            .as_object()
            .unwrap()
            .is_empty(),
        "{by_kubelet:#}"
    );
    assert_eq!(by_qoslet, by_kubelet);
}
