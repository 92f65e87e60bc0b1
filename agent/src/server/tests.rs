use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    sync::Arc,
};

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::{
    config::{KubeletConfig, QosletConfiguration, node_settings},
    policy::{
        cpuset::CpuSet,
        plan::{Plan, plan_node},
        pod::PodSpecView,
        settings::Capacity,
    },
    source::manifest::load_paths,
};

/// The plan `qoslet plan` computes for deploy/examples on a 4-CPU, 32 GiB node.
fn example_plan() -> Plan {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let kc_path = root.join("kubelet-config.yaml");
    let kc = KubeletConfig::load(&kc_path).expect("example kubelet config");
    let qc = QosletConfiguration::load(&root.join("qoslet-config.yaml")).expect("example config");
    let capacity = Capacity {
        cpu_millis: 4000,
        memory_bytes: 32 << 30,
        pids: 4_194_304,
        cpus: "0-3".parse::<CpuSet>().expect("cpuset"),
    };
    let settings = node_settings(&kc_path, &kc, &qc, capacity).expect("settings");
    let loaded = load_paths(&[root.join("pods")], crate::source::file::DEFAULT_MAX_BYTES)
        .expect("example pods");
    let pods: Vec<PodSpecView> = loaded
        .objects
        .iter()
        .filter(|o| o.kind == "Pod")
        .map(|o| PodSpecView::from_pod(&o.decode::<Pod>().expect("pod")).expect("pod view"))
        .collect();
    plan_node(&settings, &pods).expect("plan")
}

struct NoSummary;

impl SummarySource for NoSummary {
    fn summary(&self) -> Summary {
        Summary::default()
    }
}

fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    let code = out[9..12].parse().expect("status code");
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

fn metric_value(text: &str, line_prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_plan_as_metrics_and_readiness_per_subsystem() {
    let plan = example_plan();
    let state = Arc::new(AgentState {
        metrics: Metrics::new(),
        readiness: Readiness::default(),
        status: StatusStore::default(),
        summary: Box::new(NoSummary),
    });
    state.metrics.set_plan(&plan);
    state.readiness.register("sensors");
    let (addr, serve) = bind("127.0.0.1:0".parse().unwrap(), state.clone())
        .await
        .expect("bind");
    let server = tokio::spawn(serve);

    let (code, body) = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        metric_value(&body, "qoslet_node_allocatable{resource=\"memory\"}"),
        Some(plan.node.allocatable.memory_bytes as f64)
    );
    for p in &plan.pods {
        let info = format!(
            "qoslet_pod_info{{namespace=\"{}\",pod=\"{}\",uid=\"{}\",qos_class=\"{:?}\"}}",
            p.namespace, p.name, p.uid, p.qos_class
        );
        assert_eq!(metric_value(&body, &info), Some(1.0), "{info}");
        for c in &p.containers {
            let line = format!(
                "qoslet_container_oom_score_adj{{namespace=\"{}\",pod=\"{}\",container=\"{}\"}}",
                p.namespace, p.name, c.name
            );
            assert_eq!(
                metric_value(&body, &line),
                Some(c.oom_score_adj as f64),
                "{line}"
            );
        }
    }
    assert!(
        body.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );

    let (code, _) = tokio::task::spawn_blocking(move || get(addr, "/readyz"))
        .await
        .unwrap();
    assert_eq!(code, 503, "sensors registered but not ready");
    state.readiness.set("sensors", true, "ebpf");
    let (code, body) = tokio::task::spawn_blocking(move || get(addr, "/readyz"))
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (200, "sensors: ready: ebpf\n"));
    let (code, body) = tokio::task::spawn_blocking(move || get(addr, "/healthz"))
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    server.abort();
}

#[test]
fn kernel_histograms_are_exported_with_log2_microsecond_buckets() {
    let metrics = Metrics::new();
    let h = metrics
        .runqueue_latency
        .get_or_create_owned(&metrics::PodLabels {
            namespace: "demo".into(),
            pod: "db".into(),
        });
    // 3 waits under 2 µs, 1 in [4, 8) µs; 10 µs in all.
    let mut buckets = [0u64; 32];
    buckets[0] = 3;
    buckets[2] = 1;
    h.set(4, 10_000, &buckets);
    assert_eq!(h.quantile_upper_bound(0.5), Some(2e-6));
    assert_eq!(h.quantile_upper_bound(0.99), Some(8e-6));
    let text = metrics.encode().unwrap();
    let labels = "namespace=\"demo\",pod=\"db\"";
    assert_eq!(
        metric_value(
            &text,
            &format!("qoslet_runqueue_latency_seconds_count{{{labels}}}")
        ),
        Some(4.0)
    );
    // Buckets are cumulative in the text format: le=2e-6 holds 3, le=8e-6 holds all 4.
    let bucket = |le: &str| {
        metric_value(
            &text,
            &format!("qoslet_runqueue_latency_seconds_bucket{{le=\"{le}\",{labels}}}"),
        )
    };
    assert_eq!(bucket("0.000002"), Some(3.0), "{text}");
    assert_eq!(bucket("0.000008"), Some(4.0));
}

#[test]
fn a_removed_pods_series_leave_metrics() {
    let m = Metrics::new();
    for (pod, uid) in [("gone", "u1"), ("kept", "u2")] {
        m.memcg_events
            .get_or_create(&metrics::MemcgEventLabels {
                namespace: "ns".into(),
                pod: pod.into(),
                uid: uid.into(),
                container: "c".into(),
                event: "high".into(),
            })
            .inc();
        m.oom_kills
            .get_or_create(&metrics::ContainerLabels {
                namespace: "ns".into(),
                pod: pod.into(),
                container: "c".into(),
            })
            .inc();
        m.runqueue_latency
            .get_or_create(&metrics::PodLabels {
                namespace: "ns".into(),
                pod: pod.into(),
            })
            .set(1, 1000, &[1]);
    }
    m.drop_pod("ns", "gone", "u1", &["c"]);
    let text = m.encode().unwrap();
    assert!(!text.contains("pod=\"gone\""), "{text}");
    for family in [
        "qoslet_memcg_events_total{",
        "qoslet_oom_kills_total{",
        "qoslet_runqueue_latency_seconds_count{",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(family) && l.contains("pod=\"kept\"")),
            "{family} of the kept pod in {text}"
        );
    }
}

#[test]
fn series_names_are_what_metrics_carries() {
    let m = Metrics::new();
    m.set_plan(&example_plan());
    m.set_pod_requests([("ns", "p", 100, 1 << 20)]);
    m.memcg_events
        .get_or_create(&metrics::MemcgEventLabels {
            namespace: "ns".into(),
            pod: "p".into(),
            uid: "u".into(),
            container: String::new(),
            event: "max".into(),
        })
        .inc();
    m.reconcile_duration.observe(0.01);
    let names = m.series_names();
    let text = m.encode().unwrap();
    let mut seen = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
        seen += 1;
    }
    assert!(seen > 20, "{text}");
    assert!(names.iter().any(|n| n == "qoslet_memcg_events_total"));
    assert!(
        names
            .iter()
            .any(|n| n == "qoslet_reconcile_duration_seconds_bucket")
    );
}
