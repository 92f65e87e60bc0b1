//! Prometheus scraping a real agent, as an operator's would: Debian's Prometheus (2.42) scrapes
//! a standalone node (a test cgroup with a 1Gi limit) through a scenario that exercises every
//! panel of deploy/grafana/qoslet.json (an eviction, a kernel OOM kill, memcg events, reconcile
//! passes; the cluster-mode panels show their series at 0), with the alert rules of
//! deploy/kubernetes/prometheusrule.yaml loaded. Every dashboard query, with the dashboard's
//! variables substituted as Grafana would, must return data through Prometheus' HTTP API, and
//! the eviction and OOM alerts must fire (`ALERTS`).
//!
//! Ignored by default: it needs root and Debian's prometheus, which `cargo xtask test`
//! installs before it runs this test with `--ignored`.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

mod common;

use common::{Daemon, WorkDir, free_port, get, start_node, wait_until};

/// Grafana's `$__rate_interval` for a 1 s scrape interval is at least four scrapes; a little
/// more keeps two samples in every window on a busy machine.
const RATE_INTERVAL: &str = "15s";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The `data.result` of a Prometheus API answer; `None` while Prometheus does not listen yet or
/// is not ready (it answers 503 "Service Unavailable" while it starts, for seconds on a loaded
/// machine).
fn try_api(addr: SocketAddr, path: &str) -> Option<Vec<Value>> {
    let (code, _) = get(addr, path)?;
    if code == 503 {
        return None;
    }
    Some(api(addr, path))
}

/// The `data.result` of a Prometheus API answer.
fn api(addr: SocketAddr, path: &str) -> Vec<Value> {
    let (code, body) = get(addr, path).unwrap_or_else(|| panic!("no answer to {path}"));
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(code, 200, "{path}: {body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Whether a range query's result holds a finite value (`histogram_quantile` of an empty
/// window is NaN: that is not data).
fn has_finite_value(result: &[Value]) -> bool {
    result.iter().any(|series| {
        series["values"].as_array().into_iter().flatten().any(|v| {
            v[1].as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        })
    })
}

/// The largest finite value of a range query's result.
fn max_value(result: &[Value]) -> Option<f64> {
    result
        .iter()
        .flat_map(|series| series["values"].as_array().into_iter().flatten())
        .filter_map(|v| v[1].as_str()?.parse::<f64>().ok())
        .filter(|v| v.is_finite())
        .reduce(f64::max)
}

/// Every PromQL expression of the dashboard's panels.
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((p["title"].as_str().unwrap_or("?").to_owned(), e.to_owned()));
            }
        }
    }
    out
}

/// A Burstable pod that allocates past its 48Mi limit once `GO` exists: the kernel OOM-kills it.
const OOMER: &str = "apiVersion: v1
kind: Pod
metadata: {name: oomer, namespace: demo}
spec:
  restartPolicy: Never
  containers:
  - name: oomer
    command: [\"sh\", \"-c\", \"while [ ! -e GO ]; do sleep 0.2; done; exec tail /dev/zero\"]
    resources:
      limits: {memory: 48Mi}
";

/// The example's BestEffort hog, allocating without bound once `GO` exists: evicted.
const HOG: &str = "apiVersion: v1
kind: Pod
metadata: {name: hog, namespace: demo}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: hog
    command: [\"sh\", \"-c\", \"while [ ! -e GO ]; do sleep 0.2; done; sleep 1; exec tail /dev/zero\"]
";

#[test]
#[ignore = "needs root and Debian's prometheus: `cargo xtask test` installs it and runs this"]
fn prometheus_gets_every_panel_and_fires_the_eviction_and_oom_alerts() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root (real cgroups)");
    let prometheus = std::env::var_os("QOSLET_PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"));
    assert!(
        prometheus.exists(),
        "{} missing: `apt-get install prometheus`",
        prometheus.display()
    );
    let work_dir =
        WorkDir(std::env::temp_dir().join(format!("qoslet-prometheus-{}", std::process::id())));
    let work = work_dir.0.clone();
    let _ = fs::remove_dir_all(&work);
    let pods = work.join("pods");
    fs::create_dir_all(&pods).unwrap();
    let examples = repo().join("deploy/examples/standalone");
    for f in ["guaranteed.yaml", "burstable.yaml", "besteffort-idle.yaml"] {
        fs::copy(examples.join("pods").join(f), pods.join(f)).unwrap();
    }
    // The trigger file, named by an absolute path in the pods' commands.
    let go = work.join("GO");
    let arm = |pod: &str| pod.replace("-e GO", &format!("-e {}", go.display()));
    fs::write(pods.join("hog.yaml"), arm(HOG)).unwrap();
    fs::write(pods.join("oomer.yaml"), arm(OOMER)).unwrap();

    let node_root = format!("qoslet-test-{}-prometheus", std::process::id());
    let port = free_port();

    // The PrometheusRule's spec is a plain rule file.
    let rule: Value = serde_yaml_ng::from_str(
        &fs::read_to_string(repo().join("deploy/kubernetes/prometheusrule.yaml")).unwrap(),
    )
    .unwrap();
    fs::write(
        work.join("rules.yaml"),
        serde_json::to_string(&rule["spec"]).unwrap(),
    )
    .unwrap();
    let instance = format!("127.0.0.1:{port}");
    // The job is `qoslet`, as the ServiceMonitor names it (the Service's name).
    fs::write(
        work.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yaml]\nscrape_configs:\n  - job_name: qoslet\n    static_configs:\n      - targets: ['{instance}']\n"
        ),
    )
    .unwrap();

    let started = now();
    let _qoslet = start_node(&work, &node_root, port);
    let prom_port = free_port();
    let prom: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let _prometheus = Daemon {
        child: Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                work.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                work.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .current_dir(&work)
            .stdout(Stdio::null())
            .stderr(fs::File::create(work.join("prometheus.log")).unwrap())
            .spawn()
            .expect("starting prometheus"),
    };
    let log = |name: &str| fs::read_to_string(work.join(name)).unwrap_or_default();

    // The target is up, as the "Agent up" panel shows it.
    wait_until(
        "Prometheus scraping qoslet",
        Duration::from_secs(60),
        || {
            let r = try_api(
                prom,
                &format!("/api/v1/query?query={}", encode("up{job=\"qoslet\"} == 1")),
            )?;
            (!r.is_empty()).then_some(())
        },
    );

    // A few scrapes before anything happens, so every rate has a "before".
    thread::sleep(Duration::from_secs(5));
    // The scenario: the oomer dies by the kernel's hand in its 48Mi limit, the hog is evicted.
    fs::write(&go, "").unwrap();
    for (alert, what) in [
        ("QosletKernelOOMKill", "the oomer's kernel OOM kill"),
        ("QosletPodsEvicted", "the hog's eviction"),
    ] {
        let q = encode(&format!(
            "ALERTS{{alertname=\"{alert}\",alertstate=\"firing\"}}"
        ));
        let firing = wait_until(
            &format!("{alert} firing for {what}"),
            Duration::from_secs(120),
            || {
                let r = api(prom, &format!("/api/v1/query?query={q}"));
                (!r.is_empty()).then_some(r)
            },
        );
        let labels = &firing[0]["metric"];
        match alert {
            "QosletKernelOOMKill" => assert_eq!(labels["pod"], "oomer", "{firing:?}"),
            _ => {
                // The example kubelet configuration reserves 128Mi, so the pods' cgroup crosses
                // allocatableMemory.available (its 896Mi limit less 256Mi) before the node
                // crosses memory.available (1Gi less 256Mi); the hog, `tail /dev/zero`, covers the
                // 128 MiB between them in a fraction of a second, so a pass that runs later (a
                // loaded machine) finds both met and names memory.available, as the kubelet's
                // priority order does. Either is the kubelet's answer; which one is timing.
                assert!(
                    ["memory.available", "allocatableMemory.available"]
                        .contains(&labels["signal"].as_str().unwrap_or_default()),
                    "{firing:?}"
                );
                assert_eq!(labels["qos_class"], "BestEffort", "{firing:?}");
                // The victim by name, from its qoslet_pod_eviction_timestamp_seconds series.
                assert_eq!(labels["namespace"], "demo", "{firing:?}");
                assert_eq!(labels["pod"], "hog", "{firing:?}");
            }
        }
    }
    // Rate windows after the events hold samples from before and after them.
    thread::sleep(Duration::from_secs(5));
    let end = now();

    let dashboard: Value = serde_json::from_str(
        &fs::read_to_string(repo().join("deploy/grafana/qoslet.json")).unwrap(),
    )
    .unwrap();
    let node_var = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "node")
        .unwrap();
    // The node variable lists the instances Grafana would offer; this one is among them.
    let definition = node_var["definition"].as_str().unwrap();
    let (metric, label) = definition
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(')'))
        .and_then(|s| s.split_once(", "))
        .unwrap();
    let values = get(
        prom,
        &format!("/api/v1/label/{label}/values?match[]={}", encode(metric)),
    )
    .unwrap()
    .1;
    assert!(values.contains(&instance), "{definition}: {values}");

    // The operator sees each event in its panel, the first of a new series included.
    let mut peaks = std::collections::BTreeMap::new();
    let mut empty = Vec::new();
    let mut checked = 0;
    // Grafana's `$__range`: the dashboard's time range, here the test's.
    let range = format!("{}s", (end - started).ceil());
    for (title, expr) in panel_queries(&dashboard) {
        // Grafana escapes a variable's value for regex matchers.
        let q = expr
            .replace("$__rate_interval", RATE_INTERVAL)
            .replace("$__range", &range)
            .replace("$node", &instance.replace('.', "\\\\."));
        let result = api(
            prom,
            &format!(
                "/api/v1/query_range?query={}&start={started:.3}&end={end:.3}&step=1",
                encode(&q)
            ),
        );
        if title == "Evicted pods" {
            let names: Vec<_> = result.iter().map(|r| &r["metric"]["pod"]).collect();
            assert!(names.iter().any(|p| *p == "hog"), "{title}: {names:?}");
        }
        let data = has_finite_value(&result);
        peaks.insert(title.clone(), max_value(&result));
        if !data {
            let raw: String = serde_json::to_string(&result)
                .unwrap()
                .chars()
                .take(600)
                .collect();
            empty.push(format!("{title}: {q}\n  {raw}"));
        }
        checked += 1;
    }
    assert!(checked >= 30, "{checked} queries");
    for panel in ["OOM kills by pod", "Evictions", "Eviction count"] {
        assert!(
            peaks.get(panel).copied().flatten() >= Some(1.0),
            "{panel}: the event does not show ({:?})",
            peaks.get(panel)
        );
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}\nqoslet log:\n{}",
        empty.join("\n"),
        log("qoslet.log")
    );
}
