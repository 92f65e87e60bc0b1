//! The real prometheus-operator scraping qoslet through the shipped ServiceMonitor and loading
//! the shipped PrometheusRule (issue 43): an operator's Prometheus must see the victim of an OOM
//! kill in its own `namespace` and `pod` labels, not renamed `exported_*` and replaced with
//! qoslet's own pod, and the alerts must fire naming it.
//!
//! prometheus-operator v0.85.0 (`cmd/operator`, built from the Go module proxy by xtask) runs as
//! a process of this test with the admin's certificate. It reconciles a `Prometheus` of the
//! test's own (`replicas: 0`, so no pod and no image pull: the cluster has no registry) into
//! the Secret of its generated configuration and the ConfigMap of its rule files, as for any
//! Prometheus. Prometheus 3.5.0 (`cmd/prometheus`, built from the Go module proxy by xtask:
//! Debian's 2.42 has no Kubernetes service discovery and refuses the generated configuration;
//! its version is the CR's, so the operator generates what it reads) then runs that
//! configuration as the operator's StatefulSet would run it: in a
//! mount namespace of its own where `/etc/prometheus/config_out`, `/etc/prometheus/rules/...`
//! and the pod's service account directory (token of the CR's service account, the cluster's
//! CA) are where the operator's pod spec mounts them, with `KUBERNETES_SERVICE_HOST` as the
//! kubelet sets it. So Prometheus discovers qoslet's pods through the API server with that
//! service account's RBAC and scrapes them with its token, as qoslet's `endpointAuth:
//! tokenReview` asks. What the operator's config-reloader sidecar would do is done here:
//! gunzip the Secret and substitute `$(POD_NAME)` and `$(SHARD)`.

use std::{
    fs,
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams},
};
use serde_json::{Value, json};

use super::{
    TestNamespace, bind_cluster_role, cluster, create_or_keep, create_running, pod, qoslet_pod,
    service_account_token, wait_for,
};

/// The `Prometheus` object's name; the operator names what it generates after it.
const NAME: &str = "qoslet-e2e";

/// The scrape pool the operator makes of the shipped ServiceMonitor's one endpoint.
const POOL: &str = "serviceMonitor/qoslet-system/qoslet/0";

/// A child process killed and reaped when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The test's directory, removed when the test passes (kept with the logs when it fails).
struct Work(PathBuf);

impl Drop for Work {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// The last lines of a log of the test's directory, for a failure's message.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The `data` of an answer of Prometheus's HTTP API; `None` while it does not answer 200.
/// HTTP/1.0: to an HTTP/1.1 request Go answers a body over 2 KiB chunked, which this plain
/// reader would not decode.
fn api(prom: SocketAddr, path: &str) -> Option<Value> {
    use std::io::Read as _;
    let mut s = std::net::TcpStream::connect_timeout(&prom, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    serde_json::from_str::<Value>(body)
        .ok()?
        .get("data")
        .cloned()
}

/// The series of an instant query.
fn query(prom: SocketAddr, q: &str) -> Vec<Value> {
    api(prom, &format!("/api/v1/query?query={}", encode(q)))
        .and_then(|d| d["result"].as_array().cloned())
        .unwrap_or_default()
}

/// The BestEffort evictions Prometheus holds, summed over the signals (0 before the first).
fn best_effort_evictions(prom: SocketAddr) -> f64 {
    query(
        prom,
        "sum(qoslet_evictions_total{job=\"qoslet\",qos_class=\"BestEffort\"})",
    )
    .first()
    .and_then(|s| s["value"][1].as_str()?.parse().ok())
    .unwrap_or(0.0)
}

/// An unused port of the cluster's network namespace's loopback (where the test runs).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// What the operator's config-reloader does before Prometheus reads the Secret: gunzip it and
/// expand the pod's environment in it.
fn reloaded(gz: &[u8], pod_name: &str) -> String {
    let mut gunzip = Command::new("/usr/bin/gzip")
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip");
    gunzip.stdin.take().unwrap().write_all(gz).unwrap();
    let out = gunzip.wait_with_output().unwrap();
    assert!(out.status.success(), "gzip -dc of prometheus.yaml.gz");
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text
        .replace("$(POD_NAME)", pod_name)
        .replace("$(SHARD)", "0");
    assert!(!text.contains("$("), "an unexpanded variable:\n{text}");
    text
}

#[tokio::test]
#[ignore = "needs a real cluster and prometheus-operator: cargo xtask cluster test"]
async fn prometheus_operator_scrapes_qoslet_and_the_alerts_name_the_victim() {
    let test_started = SystemTime::now();
    let c = cluster().await;
    let operator = PathBuf::from(
        std::env::var_os("QOSLET_PROMETHEUS_OPERATOR")
            .expect("QOSLET_PROMETHEUS_OPERATOR names the operator xtask built"),
    );
    let prometheus = PathBuf::from(
        std::env::var_os("QOSLET_PROMETHEUS")
            .expect("QOSLET_PROMETHEUS names the Prometheus xtask built"),
    );
    // The Prometheus object's version, so that the operator generates what this one reads.
    let out = Command::new(&prometheus).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(2)
        .map(|v| format!("v{}", v.trim_end_matches(|c: char| !c.is_ascii_digit())))
        .expect("prometheus --version: prometheus, version X.Y.Z ...");
    assert!(
        Path::new("/etc/prometheus").is_dir(),
        "Debian's prometheus package makes /etc/prometheus, the directory the operator's pod spec mounts over"
    );
    let qoslet = qoslet_pod(&c).await;
    let qoslet_name = qoslet.metadata.name.clone().unwrap();
    let ns = TestNamespace::create(&c, "qoslet-e2e-prom").await;
    let work = Work(std::env::temp_dir().join(format!("qoslet-e2e-prom-{}", std::process::id())));
    let _ = fs::remove_dir_all(&work.0);
    fs::create_dir_all(&work.0).unwrap();
    let w = |rel: &str| work.0.join(rel);

    // Prometheus's service account: service discovery in qoslet's namespace (what kube-prometheus
    // grants its Prometheus), and qoslet's metrics through the shipped qoslet-metrics-reader.
    let sd_role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "qoslet-e2e-prometheus-sd"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "endpoints", "pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        ],
    }))
    .unwrap();
    create_or_keep(&Api::all(c.client.clone()), &sd_role).await;
    let sd_binding = format!("{}-sd", ns.name);
    let reader_binding = format!("{}-metrics", ns.name);
    bind_cluster_role(
        &c.client,
        &sd_binding,
        "qoslet-e2e-prometheus-sd",
        &ns.name,
        "prometheus",
    )
    .await;
    bind_cluster_role(
        &c.client,
        &reader_binding,
        "qoslet-metrics-reader",
        &ns.name,
        "prometheus",
    )
    .await;
    let token = service_account_token(&c.client, &ns.name, "prometheus").await;

    // The operator, as a process with the admin's client certificate (its flags take files, not
    // a kubeconfig). It watches every namespace, as a default install does.
    let kubeconfig = kube::config::Kubeconfig::read_from(&c.info.kubeconfig).unwrap();
    let cluster_cfg = kubeconfig.clusters[0].cluster.clone().unwrap();
    let user = kubeconfig.auth_infos[0].auth_info.clone().unwrap();
    let _operator = Daemon(
        Command::new(&operator)
            .arg(format!("--apiserver={}", cluster_cfg.server.unwrap()))
            .arg(format!(
                "--ca-file={}",
                cluster_cfg.certificate_authority.unwrap()
            ))
            .arg(format!("--cert-file={}", user.client_certificate.unwrap()))
            .arg(format!("--key-file={}", user.client_key.unwrap()))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(w("operator.log")).unwrap())
            .spawn()
            .expect("starting prometheus-operator"),
    );

    // Selecting every ServiceMonitor and PrometheusRule, as kube-prometheus-stack does with
    // its `...SelectorNilUsesHelmValues: false`.
    let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", "Prometheus");
    let prometheuses: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, "prometheuses"),
    );
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": 0,
            "version": version,
            "serviceAccountName": "prometheus",
            "serviceMonitorSelector": {},
            "serviceMonitorNamespaceSelector": {},
            "ruleSelector": {},
            "ruleNamespaceSelector": {},
            "evaluationInterval": "5s",
        },
    }))
    .unwrap();
    prometheuses
        .create(&PostParams::default(), &object)
        .await
        .expect("create the Prometheus");

    // The operator's output: the configuration, once it has the ServiceMonitor's job, and the
    // rule files, once they have the PrometheusRule's.
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), &ns.name);
    let pod_name = format!("prometheus-{NAME}-0");
    let t = Instant::now();
    let config = wait_for("the operator's generated configuration", || async {
        let s = secrets
            .get_opt(&format!("prometheus-{NAME}"))
            .await
            .ok()??;
        let gz = s.data?.get("prometheus.yaml.gz")?.0.clone();
        let text = reloaded(&gz, &pod_name);
        text.contains(POOL).then_some(text)
    })
    .await;
    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns.name);
    let rule_maps = wait_for("the operator's rule files", || async {
        let list = maps
            .list(&ListParams::default().labels(&format!("prometheus-name={NAME}")))
            .await
            .ok()?;
        let found: Vec<ConfigMap> = list
            .items
            .into_iter()
            .filter(|m| {
                m.data
                    .as_ref()
                    .is_some_and(|d| d.values().any(|v| v.contains("QosletKernelOOMKill")))
            })
            .collect();
        (!found.is_empty()).then_some(found)
    })
    .await;
    println!(
        "the operator generated the configuration and {} rule file ConfigMap(s) in {:.0?}",
        rule_maps.len(),
        t.elapsed()
    );
    let generated: Value = serde_yaml_ng::from_str(&config).unwrap();
    let job = generated["scrape_configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_name"] == POOL)
        .unwrap_or_else(|| panic!("no job {POOL}:\n{config}"))
        .clone();
    // The ServiceMonitor's honorLabels, as the operator hands it to Prometheus.
    assert_eq!(job["honor_labels"], true, "{job:#?}");

    // /etc/prometheus as the StatefulSet mounts it: config_out/ (the reloader's output) and
    // rules/<ConfigMap>/; the service account's directory as the kubelet mounts it.
    fs::create_dir_all(w("etc/config_out")).unwrap();
    fs::write(w("etc/config_out/prometheus.env.yaml"), &config).unwrap();
    for m in &rule_maps {
        let dir = w(&format!("etc/rules/{}", m.metadata.name.as_ref().unwrap()));
        fs::create_dir_all(&dir).unwrap();
        for (file, text) in m.data.as_ref().unwrap() {
            fs::write(dir.join(file), text).unwrap();
        }
    }
    for f in generated["rule_files"].as_array().unwrap() {
        assert!(
            f.as_str().unwrap().starts_with("/etc/prometheus/rules/"),
            "a rule file outside the mounted rules: {f}"
        );
    }
    let root_ca = wait_for("the cluster's CA in kube-root-ca.crt", || async {
        maps.get_opt("kube-root-ca.crt")
            .await
            .ok()??
            .data?
            .remove("ca.crt")
    })
    .await;
    fs::create_dir_all(w("serviceaccount")).unwrap();
    fs::write(w("serviceaccount/token"), &token).unwrap();
    fs::write(w("serviceaccount/ca.crt"), root_ca).unwrap();
    fs::write(w("serviceaccount/namespace"), &ns.name).unwrap();
    let kubernetes = Api::<Service>::namespaced(c.client.clone(), "default")
        .get("kubernetes")
        .await
        .unwrap();
    let api_ip = kubernetes.spec.unwrap().cluster_ip.unwrap();
    let port = free_port();
    let prom: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // A private mount namespace (unshare's default propagation), so nothing lands in the host's
    // /run or /etc.
    let script = r#"set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
cp "$WORK"/serviceaccount/* /run/secrets/kubernetes.io/serviceaccount/
mount --bind "$WORK/etc" /etc/prometheus
exec "$PROMETHEUS" --config.file=/etc/prometheus/config_out/prometheus.env.yaml \
  --storage.tsdb.path="$WORK/tsdb" --web.listen-address="$LISTEN""#;
    let _prometheus = Daemon(
        Command::new("/usr/bin/unshare")
            .args(["--mount", "--", "/bin/sh", "-c", script])
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("WORK", &work.0)
            .env("PROMETHEUS", &prometheus)
            .env("LISTEN", prom.to_string())
            .env("KUBERNETES_SERVICE_HOST", &api_ip)
            .env("KUBERNETES_SERVICE_PORT", "443")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(w("prometheus.log")).unwrap())
            .spawn()
            .expect("starting prometheus"),
    );
    let logs = || {
        format!(
            "prometheus log:\n{}\noperator log:\n{}",
            tail(&w("prometheus.log")),
            tail(&w("operator.log"))
        )
    };

    // The shipped ServiceMonitor's target: qoslet's pod on the host node (with `--vm-node`,
    // the VM node's is another), up, with the job and
    // instance the alerts and the dashboard select, and the target's own pod and namespace.
    let t = Instant::now();
    let target = wait_until(&logs, "Prometheus scraping qoslet's pod, up", || {
        let d = api(prom, "/api/v1/targets?state=active")?;
        d["activeTargets"]
            .as_array()?
            .iter()
            .find(|t| {
                t["scrapePool"] == POOL
                    && t["labels"]["instance"] == c.info.node.as_str()
                    && t["health"] == "up"
            })
            .cloned()
    })
    .await;
    println!("target up in {:.0?}: {}", t.elapsed(), target["labels"]);
    let labels = &target["labels"];
    assert_eq!(labels["job"], "qoslet", "{target:#}");
    assert_eq!(labels["instance"], c.info.node.as_str(), "{target:#}");
    assert_eq!(labels["namespace"], "qoslet-system", "{target:#}");
    assert_eq!(labels["pod"], qoslet_name.as_str(), "{target:#}");
    // The tests before this one evicted BestEffort pods too: the hog's eviction is a rise from
    // what the first scrapes hold.
    let evictions_before = best_effort_evictions(prom);

    // The kernel OOM-kills a container in its 48Mi limit; then a BestEffort hog paced past the
    // node's 2 GiB is evicted (the eviction test's hog). The oomer's pod keeps a container
    // running, so it stays Running on the node and qoslet keeps its series (it drops a pod's
    // series when the pod leaves the node).
    let mut oomer = pod(
        "oomer",
        "sleep 1; exec /bin/busybox tail /dev/zero",
        json!({"requests": {"memory": "48Mi"}, "limits": {"memory": "48Mi"}}),
        "Never",
    );
    let spec = oomer.spec.as_mut().unwrap();
    let mut sidecar = spec.containers[0].clone();
    sidecar.name = "sidecar".into();
    sidecar.command = Some(["/bin/busybox", "sleep", "3600"].map(String::from).to_vec());
    spec.containers.push(sidecar);
    ns.pods()
        .create(&PostParams::default(), &oomer)
        .await
        .expect("create the oomer");
    let api_pods = ns.pods();
    wait_for("the oomer's container OOMKilled", || async {
        let p = api_pods.get("oomer").await.ok()?;
        let statuses = p.status?.container_statuses?;
        let main = statuses.iter().find(|s| s.name == "main")?;
        let reason = main.state.as_ref()?.terminated.as_ref()?.reason.clone();
        (reason.as_deref() == Some("OOMKilled")).then_some(())
    })
    .await;
    create_running(
        &ns,
        vec![pod(
            "hog",
            "echo go | /bin/qoslet-test-hog 4000 50",
            json!({}),
            "Always",
        )],
    )
    .await;
    wait_for("the hog evicted", || async {
        let p = api_pods.get("hog").await.ok()?;
        (p.status?.phase.as_deref() == Some("Failed")).then_some(())
    })
    .await;

    // The OOM series names the victim in its own labels: the test's namespace and the oomer,
    // not renamed exported_*, and with the target's job and instance.
    let oom = one_series_of(&logs, prom, "qoslet_oom_kills_total", &ns.name, "oomer").await;
    let m = &oom[0]["metric"];
    assert_eq!(m["container"], "main", "{m:#}");
    assert_eq!(m["job"], "qoslet", "{m:#}");
    assert_eq!(m["instance"], c.info.node.as_str(), "{m:#}");
    assert_eq!(oom[0]["value"][1], "1", "{oom:#?}");
    wait_until(&logs, "the hog's eviction in Prometheus", || {
        (best_effort_evictions(prom) > evictions_before).then_some(())
    })
    .await;
    let evictions = query(prom, "qoslet_evictions_total{qos_class=\"BestEffort\"}");
    println!(
        "BestEffort evictions from {evictions_before} to {}; eviction series: {}",
        best_effort_evictions(prom),
        evictions[0]["metric"]
    );
    let m = &evictions[0]["metric"];
    assert_eq!(m["job"], "qoslet", "{m:#}");
    assert_eq!(m["instance"], c.info.node.as_str(), "{m:#}");
    assert!(
        ["memory.available", "allocatableMemory.available"]
            .contains(&m["signal"].as_str().unwrap_or_default()),
        "{m:#}"
    );
    // The eviction series of the victim: its namespace and pod in its own labels, and the time
    // of its eviction as the value.
    let evicted = one_series_of(
        &logs,
        prom,
        "qoslet_pod_eviction_timestamp_seconds",
        &ns.name,
        "hog",
    )
    .await;
    let m = &evicted[0]["metric"];
    assert_eq!(m["job"], "qoslet", "{m:#}");
    assert_eq!(m["instance"], c.info.node.as_str(), "{m:#}");
    assert_eq!(m["qos_class"], "BestEffort", "{m:#}");
    let evicted_at: f64 = evicted[0]["value"][1].as_str().unwrap().parse().unwrap();
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    assert!(
        (unix(test_started)..=unix(SystemTime::now())).contains(&evicted_at),
        "evicted at {evicted_at}, the test ran from {}",
        unix(test_started)
    );
    // No series of qoslet's has a label Prometheus renamed: without honorLabels, every series
    // with its own namespace, pod or container (the OOM kills, the pods' info, requests and
    // cgroup values) would have them as exported_* and the target's in their place.
    let series = api(
        prom,
        &format!("/api/v1/series?match[]={}", encode("{job=\"qoslet\"}")),
    )
    .expect("the series API");
    let series = series.as_array().unwrap();
    assert!(series.len() > 20, "{} series of job qoslet", series.len());
    let renamed: Vec<&Value> = series
        .iter()
        .filter(|s| {
            s.as_object()
                .unwrap()
                .keys()
                .any(|k| k.starts_with("exported_"))
        })
        .collect();
    assert!(renamed.is_empty(), "renamed labels: {renamed:#?}");
    // The pods' own series name the test's pods, not qoslet's.
    let oomer_info = query(
        prom,
        &format!("qoslet_pod_info{{namespace=\"{}\"}}", ns.name),
    );
    println!(
        "{} series of job qoslet, none renamed; qoslet_pod_info of the test's namespace: {}",
        series.len(),
        oomer_info
            .iter()
            .map(|s| s["metric"]["pod"].to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    // The shipped alerts, as the operator's rule files carry them, fire naming the victim.
    let t = Instant::now();
    let alerts = wait_until(
        &logs,
        "QosletKernelOOMKill and QosletPodsEvicted firing",
        || {
            let d = api(prom, "/api/v1/alerts")?;
            let firing: Vec<Value> = d["alerts"]
                .as_array()?
                .iter()
                .filter(|a| a["state"] == "firing")
                .cloned()
                .collect();
            let oom = firing.iter().any(|a| {
                a["labels"]["alertname"] == "QosletKernelOOMKill"
                    && a["labels"]["namespace"] == ns.name.as_str()
            });
            let evicted = firing.iter().any(|a| {
                a["labels"]["alertname"] == "QosletPodsEvicted"
                    && a["labels"]["namespace"] == ns.name.as_str()
            });
            (oom && evicted).then_some(firing)
        },
    )
    .await;
    println!("firing {:.0?} after the events were scraped:", t.elapsed());
    for a in &alerts {
        println!("  {}", a["labels"]);
    }
    let oom_alert = alerts
        .iter()
        .find(|a| {
            a["labels"]["alertname"] == "QosletKernelOOMKill"
                && a["labels"]["namespace"] == ns.name.as_str()
        })
        .unwrap();
    let l = &oom_alert["labels"];
    assert_eq!(l["namespace"], ns.name.as_str(), "{oom_alert:#}");
    assert_eq!(l["pod"], "oomer", "{oom_alert:#}");
    assert_eq!(l["container"], "main", "{oom_alert:#}");
    assert_eq!(l["instance"], c.info.node.as_str(), "{oom_alert:#}");
    assert!(
        oom_alert["annotations"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains(&format!("{}/oomer", ns.name))),
        "{oom_alert:#}"
    );
    let evicted_alert = alerts
        .iter()
        .find(|a| {
            a["labels"]["alertname"] == "QosletPodsEvicted"
                && a["labels"]["namespace"] == ns.name.as_str()
        })
        .unwrap();
    let l = &evicted_alert["labels"];
    assert_eq!(l["pod"], "hog", "{evicted_alert:#}");
    assert_eq!(l["qos_class"], "BestEffort", "{evicted_alert:#}");
    assert_eq!(l["instance"], c.info.node.as_str(), "{evicted_alert:#}");
    assert!(
        evicted_alert["annotations"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains(&format!("{}/hog", ns.name))),
        "{evicted_alert:#}"
    );

    // The cluster-wide grants go with the test; the namespace (the Prometheus, the service
    // account, the operator's Secret, ConfigMaps and StatefulSet) when `ns` drops.
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(c.client.clone());
    for b in [&sd_binding, &reader_binding] {
        let _ = bindings.delete(b, &DeleteParams::default()).await;
    }
}

/// The series of `metric` that names `namespace`/`pod` in its own labels, once Prometheus holds
/// it; there must be exactly one.
async fn one_series_of(
    logs: &dyn Fn() -> String,
    prom: SocketAddr,
    metric: &str,
    namespace: &str,
    pod: &str,
) -> Vec<Value> {
    let selector = format!("{metric}{{namespace=\"{namespace}\",pod=\"{pod}\"}}");
    let r = wait_until(logs, &format!("{selector} in Prometheus"), || {
        let r = query(prom, &selector);
        (!r.is_empty()).then_some(r)
    })
    .await;
    println!("{metric} of {pod}: {}", r[0]["metric"]);
    assert_eq!(r.len(), 1, "{r:#?}");
    r
}

/// Polls `f` (a quick blocking check of Prometheus's API, every second) until it returns a
/// value, for up to 3 minutes; on a timeout the message has Prometheus's and the operator's logs.
async fn wait_until<T>(
    logs: &dyn Fn() -> String,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
