//! `evictionMethod: api` on the real cluster (#37): at a soft threshold qoslet asks the Eviction
//! API, which a PodDisruptionBudget may refuse (429). While it refuses, qoslet's one eviction
//! waits in its write queue, retried with a growing backoff, and the eviction manager decides no
//! other; once the budget allows, exactly one pod goes, not every eviction that could have been
//! decided meanwhile.
//!
//! The cluster's kubelet has no soft threshold and qoslet reads its thresholds from the kubelet's
//! configuration, so the test gives qoslet a copy of the kubelet's file with one (beside it on
//! the node, named by `--kubelet-config /host/...` in the DaemonSet's arguments, read beneath its
//! read-only host root), `evictionMethod: api` in its ConfigMap and the opt-in `pods/eviction`
//! grant of docs/rbac.md; [`Restore`] puts all three back (the arguments without
//! `--kubelet-config`: the kubelet's configuration found from its process), also on failure.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, ReplicaSet},
    core::v1::{ConfigMap, Pod},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use super::{
    Cluster, HOG_PORT, TestNamespace, apiserver_metrics, cluster, hog_template, node_memory_limit,
    node_working_set, trigger_hog, uid, wait_for, with_own_client,
};

/// The soft threshold the copy of the kubelet's file adds, and what the two hogs leave free:
/// under it, and well above the hard thresholds (memory.available 100Mi; allocatable about
/// 356 MiB short of the node cgroup's limit), so only the soft one is crossed.
const SOFT_MIB: u64 = 700;
const LEFT_FREE_MIB: u64 = 580;
/// The copy's name beside the kubelet's `config.yaml`, on the node and in the host's view.
const SOFT_CONFIG: &str = "qoslet-e2e-soft.yaml";
/// The opt-in grant's ClusterRole and ClusterRoleBinding.
const GRANT: &str = "qoslet-e2e-eviction-api";
/// How long the budget refuses before the test deletes it.
const REFUSED_FOR: Duration = Duration::from_secs(40);

/// The DaemonSet's container arguments (deploy/kubernetes/daemonset.yaml), with
/// `--kubelet-config PATH` when `path` is given; without, qoslet finds the kubelet's
/// configuration from its process.
fn qoslet_args(path: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--kube", "--host-root", "/host"]
        .map(String::from)
        .into();
    if let Some(p) = path {
        args.extend(["--kubelet-config".into(), p.into()]);
    }
    args.extend(["--config".into(), "/etc/qoslet/config.yaml".into()]);
    args
}

/// The DaemonSet's container with [`qoslet_args`] (a strategic merge patch replaces the list).
/// The copy named by `path` is on the host node's disk alone, so meanwhile the DaemonSet is kept
/// to `node` (`None` lifts that): on the VM node the file is missing, and its pod, in enforce
/// mode without the kubelet's configuration, would stay not ready and could hold the rollout.
fn kubelet_config_args(path: Option<&str>, node: &str) -> Patch<serde_json::Value> {
    let selector = path.map(|_| node);
    Patch::Strategic(json!({"spec": {"template": {"spec": {
        "containers": [{"name": "qoslet", "args": qoslet_args(path)}],
        "nodeSelector": {"kubernetes.io/hostname": selector},
    }}}}))
}

/// qoslet's pod on `node` once Ready with [`qoslet_args`] of `path` (the DaemonSet rolled out).
async fn qoslet_pod_reading(c: &Client, node: &str, path: Option<&str>) -> Pod {
    let api: Api<Pod> = Api::namespaced(c.clone(), "qoslet-system");
    let want = qoslet_args(path);
    wait_for(&format!("qoslet's pod Ready, reading {path:?}"), || async {
        let list = api
            .list(
                &ListParams::default()
                    .labels("app.kubernetes.io/name=qoslet")
                    .fields(&format!("spec.nodeName={node}")),
            )
            .await
            .ok()?;
        list.items.into_iter().find(|p| {
            let reads = p.spec.as_ref().is_some_and(|s| {
                s.containers
                    .iter()
                    .any(|c| c.name == "qoslet" && c.args.as_ref() == Some(&want))
            });
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            reads && ready && p.metadata.deletion_timestamp.is_none()
        })
    })
    .await
}

/// Puts back what the test changed: the grant, the ConfigMap's text and the DaemonSet's volume,
/// then waits for qoslet's pod to read the kubelet's own file again, and removes the copy.
struct Restore {
    kubeconfig: PathBuf,
    node: String,
    config_text: String,
    soft_copy: PathBuf,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let text = self.config_text.clone();
        let soft_copy = self.soft_copy.clone();
        let node = self.node.clone();
        with_own_client(&self.kubeconfig, |client| async move {
            let params = PatchParams::default();
            let _ = Api::<ClusterRoleBinding>::all(client.clone())
                .delete(GRANT, &DeleteParams::default())
                .await;
            let _ = Api::<ClusterRole>::all(client.clone())
                .delete(GRANT, &DeleteParams::default())
                .await;
            let _ = Api::<ConfigMap>::namespaced(client.clone(), "qoslet-system")
                .patch(
                    "qoslet-config",
                    &params,
                    &Patch::Merge(json!({"data": {"config.yaml": text}})),
                )
                .await;
            let _ = Api::<DaemonSet>::namespaced(client.clone(), "qoslet-system")
                .patch("qoslet", &params, &kubelet_config_args(None, &node))
                .await;
            qoslet_pod_reading(&client, &node, None).await;
            let _ = std::fs::remove_file(soft_copy);
        });
    }
}

/// The API server's count of Eviction API calls answered `code`, from its own metrics
/// (`apiserver_request_total`).
async fn evictions_answered(c: &Cluster, code: u16) -> u64 {
    let text = apiserver_metrics(c).await;
    let code = format!("code=\"{code}\"");
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains(&code)
                && l.contains("resource=\"pods\"")
                && l.contains("subresource=\"eviction\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The ReplicaSet's pods (its two hogs and their replacements).
async fn hog_pods(ns: &TestNamespace) -> Vec<Pod> {
    ns.pods()
        .list(&ListParams::default().labels("qoslet-churn=api"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn running_undeleted(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn api_eviction_waits_for_the_disruption_budget_and_evicts_one() {
    let c = cluster().await;
    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), "qoslet-system");
    let config_text = maps
        .get("qoslet-config")
        .await
        .expect("qoslet's ConfigMap")
        .data
        .and_then(|d| d.get("config.yaml").cloned())
        .expect("its config.yaml");
    let soft_copy = c.info.kubelet_config.with_file_name(SOFT_CONFIG);
    let _restore = Restore {
        kubeconfig: c.info.kubeconfig.clone(),
        node: c.info.node.clone(),
        config_text: config_text.clone(),
        soft_copy: soft_copy.clone(),
    };

    // The copy of the kubelet's file, with a soft threshold it does not have.
    let kubelet_text = std::fs::read_to_string(&c.info.kubelet_config).expect("kubelet's file");
    assert!(!kubelet_text.contains("evictionSoft"), "{kubelet_text}");
    let soft = format!(
        "{kubelet_text}evictionSoft: {{memory.available: \"{SOFT_MIB}Mi\"}}\n\
         evictionSoftGracePeriod: {{memory.available: 2s}}\nevictionMaxPodGracePeriod: 5\n"
    );
    std::fs::write(&soft_copy, soft).expect("the copy");
    let post = PostParams::default();
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": GRANT},
        "rules": [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}],
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": GRANT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": GRANT},
        "subjects": [{"kind": "ServiceAccount", "name": "qoslet", "namespace": "qoslet-system"}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(c.client.clone())
        .create(&post, &role)
        .await
        .expect("the opt-in ClusterRole");
    Api::<ClusterRoleBinding>::all(c.client.clone())
        .create(&post, &binding)
        .await
        .expect("its binding");
    let api_mode = config_text.replace("mode: observe", "mode: enforce") + "evictionMethod: api\n";
    maps.patch(
        "qoslet-config",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"config.yaml": api_mode}})),
    )
    .await
    .expect("the ConfigMap patched");
    // The node's /var/lib/kubelet, beneath the DaemonSet's read-only host root.
    let soft_path = format!("/host/var/lib/kubelet/{SOFT_CONFIG}");
    Api::<DaemonSet>::namespaced(c.client.clone(), "qoslet-system")
        .patch(
            "qoslet",
            &PatchParams::default(),
            &kubelet_config_args(Some(&soft_path), &c.info.node),
        )
        .await
        .expect("the DaemonSet patched");
    let qoslet = qoslet_pod_reading(&c.client, &c.info.node, Some(&soft_path)).await;

    // Two hogs of a ReplicaSet under a budget that wants both.
    let ns = TestNamespace::create(&c, "qoslet-e2e-api").await;
    let mib = 1 << 20;
    let room = node_memory_limit(&c).saturating_sub(node_working_set(&c)) / mib;
    assert!(room > LEFT_FREE_MIB + 200, "{room} MiB free on the node");
    let cap = (room - LEFT_FREE_MIB) / 2;
    let rs: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "api"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"qoslet-churn": "api"}},
            "template": hog_template("api", "Always", cap, 100),
        },
    }))
    .unwrap();
    Api::<ReplicaSet>::namespaced(c.client.clone(), &ns.name)
        .create(&post, &rs)
        .await
        .expect("the ReplicaSet");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "both"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"qoslet-churn": "api"}}},
    }))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.client.clone(), &ns.name);
    pdbs.create(&post, &pdb).await.expect("the budget");
    let hogs = wait_for("both hogs Ready", || async {
        let pods: Vec<_> = hog_pods(&ns)
            .await
            .into_iter()
            .filter(|p| {
                running_undeleted(p)
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
            })
            .collect();
        (pods.len() == 2).then_some(pods)
    })
    .await;
    wait_for("the budget allowing no disruption", || async {
        let s = pdbs.get("both").await.ok()?.status?;
        (s.observed_generation.is_some()
            && s.current_healthy == Some(2)
            && s.disruptions_allowed == Some(0))
        .then_some(())
    })
    .await;
    let hog_uids: Vec<String> = hogs.iter().map(uid).collect();

    // Both grow to `cap`: the node's memory.available falls under the soft threshold.
    let refused_before = evictions_answered(&c, 429).await;
    let created_before = evictions_answered(&c, 201).await;
    for p in &hogs {
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
        let addr: std::net::SocketAddr = format!("{ip}:{HOG_PORT}").parse().unwrap();
        trigger_hog(addr).await;
    }
    wait_for("the budget's first refusal", || async {
        (evictions_answered(&c, 429).await > refused_before).then_some(())
    })
    .await;
    let first_refusal = Instant::now();
    while first_refusal.elapsed() < REFUSED_FOR {
        let pods = hog_pods(&ns).await;
        for u in &hog_uids {
            let p = pods.iter().find(|p| &uid(p) == u);
            assert!(
                p.is_some_and(running_undeleted),
                "a hog went while the budget refused: {p:#?}"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let refused = evictions_answered(&c, 429).await - refused_before;
    println!(
        "eviction api: {refused} refusals in {:.0?} (the first, then the queue's backoff)",
        first_refusal.elapsed()
    );
    // One eviction retried with a growing backoff (200 ms, doubling, at most 30 s): about 8 in
    // 40 s. Evictions decided again and again, or of both pods, would be many more.
    assert!((2..=12).contains(&refused), "{refused} refusals");
    assert_eq!(evictions_answered(&c, 201).await, created_before);

    // The budget goes: the waiting eviction is taken, and only it.
    pdbs.delete("both", &DeleteParams::default())
        .await
        .expect("the budget deleted");
    let evicted = || async {
        let pods = hog_pods(&ns).await;
        hog_uids
            .iter()
            .filter(|u| !pods.iter().any(|p| &uid(p) == *u && running_undeleted(p)))
            .cloned()
            .collect::<Vec<_>>()
    };
    wait_for("one hog evicted", || async {
        (!evicted().await.is_empty()).then_some(())
    })
    .await;
    // The other is kept: 30 s more, long past the evicted pod's 1 s grace.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut gone = evicted().await;
    while Instant::now() < deadline && gone.len() < 2 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        gone = evicted().await;
    }
    let log = Api::<Pod>::namespaced(c.client.clone(), "qoslet-system")
        .logs(
            &qoslet.metadata.name.clone().unwrap(),
            &LogParams::default(),
        )
        .await
        .unwrap_or_default();
    for line in log.lines().filter(|l| l.contains("vict")) {
        println!("qoslet: {line}");
    }
    assert_eq!(gone.len(), 1, "evicted: {gone:?}");
    let created = evictions_answered(&c, 201).await - created_before;
    assert_eq!(created, 1, "Eviction API calls taken");
}
