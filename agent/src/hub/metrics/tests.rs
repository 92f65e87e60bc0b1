use std::path::Path;

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
pub(crate) fn example_plan() -> Plan {
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

pub(crate) fn metric_value(text: &str, line_prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn kernel_histograms_are_exported_with_log2_microsecond_buckets() {
    let metrics = Metrics::new();
    let h = metrics.runqueue_latency.get_or_create_owned(&PodLabels {
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
    // The last bucket is +Inf, without which Prometheus' histogram_quantile returns NaN.
    assert_eq!(bucket("+Inf"), Some(4.0), "{text}");
}

#[test]
fn a_removed_pods_series_leave_metrics() {
    let m = Metrics::new();
    for (pod, uid) in [("gone", "u1"), ("kept", "u2")] {
        m.memcg_events
            .get_or_create(&MemcgEventLabels {
                namespace: "ns".into(),
                pod: pod.into(),
                uid: uid.into(),
                container: "c".into(),
                event: "high".into(),
            })
            .inc();
        m.oom_kills
            .get_or_create(&ContainerLabels {
                namespace: "ns".into(),
                pod: pod.into(),
                container: "c".into(),
            })
            .inc();
        m.runqueue_latency
            .get_or_create(&PodLabels {
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
        .get_or_create(&MemcgEventLabels {
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

#[test]
fn node_pressure_and_reconcile_error_series_carry_their_documented_names() {
    let m = Metrics::new();
    // The error counter is there before the first error, so an alert on its increase has a
    // baseline.
    let text = m.encode().unwrap();
    assert!(
        text.lines().any(|l| l == "qoslet_reconcile_errors_total 0"),
        "{text}"
    );
    m.reconcile_errors.inc();
    m.node_signal_available
        .get_or_create(&SignalLabels {
            signal: "memory.available".into(),
        })
        .set(700 << 20);
    m.node_eviction_threshold
        .get_or_create(&ThresholdLabels {
            signal: "memory.available".into(),
            kind: "hard".into(),
        })
        .set(256 << 20);
    // A pid count is no amount of bytes: pid.available has its own family.
    m.node_signal_available
        .get_or_create(&SignalLabels {
            signal: "pid.available".into(),
        })
        .set(4000);
    m.node_eviction_threshold
        .get_or_create(&ThresholdLabels {
            signal: "pid.available".into(),
            kind: "hard".into(),
        })
        .set(100);
    m.node_condition
        .get_or_create(&ConditionLabels {
            condition: "MemoryPressure".into(),
        })
        .set(1);
    let text = m.encode().unwrap();
    for line in [
        "qoslet_reconcile_errors_total 1",
        "qoslet_node_signal_available_bytes{signal=\"memory.available\"} 734003200",
        "qoslet_node_eviction_threshold_bytes{signal=\"memory.available\",kind=\"hard\"} 268435456",
        "qoslet_node_signal_available_pids{signal=\"pid.available\"} 4000",
        "qoslet_node_eviction_threshold_pids{signal=\"pid.available\",kind=\"hard\"} 100",
        "qoslet_node_condition{condition=\"MemoryPressure\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    assert!(!text.contains("_bytes{signal=\"pid.available\""), "{text}");
}

#[test]
fn a_reconcile_pass_counts_its_failed_writes_as_errors() {
    use crate::cgroup::{ReconcileReport, Tree, WriteReport, WriteResult, name::CgroupPath};
    let m = Metrics::new();
    let write = |result| WriteReport {
        cgroup: CgroupPath::root(),
        tree: Tree::V2,
        path: "/sys/fs/cgroup/x".into(),
        file: "cpu.weight",
        old: None,
        new: "100".into(),
        result,
    };
    let report = ReconcileReport {
        created: Vec::new(),
        writes: vec![
            write(WriteResult::Written),
            write(WriteResult::Failed { errno: 13 }),
            write(WriteResult::Vanished),
        ],
        errors: Vec::new(),
        read: 1,
        compared: Vec::new(),
    };
    m.record_reconcile(&report, std::time::Duration::from_millis(3));
    let text = m.encode().unwrap();
    assert!(
        text.lines().any(|l| l == "qoslet_reconcile_errors_total 1"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "qoslet_reconcile_duration_seconds_count 1"),
        "{text}"
    );
}

#[test]
fn the_agents_own_series_and_the_baselines_are_there_from_the_start() {
    let text = Metrics::new().encode().unwrap();
    let version = format!(
        "qoslet_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    for line in [
        version.as_str(),
        // Rates and increases need a sample before the first drop or eviction.
        "qoslet_api_writes_dropped_total{write=\"\",reason=\"expired\"} 0",
        "qoslet_api_writes_dropped_total{write=\"\",reason=\"overflow\"} 0",
        "qoslet_eviction_stage_latency_seconds_count{stage=\"wake\"} 0",
        "qoslet_eviction_stage_latency_seconds_count{stage=\"decide\"} 0",
        "qoslet_eviction_stage_latency_seconds_count{stage=\"kill\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    for series in process::SERIES {
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .unwrap_or_else(|| panic!("{series} in {text}"));
        assert!(
            value.parse::<f64>().is_ok_and(f64::is_finite),
            "{series} {value}"
        );
        let family = series.trim_end_matches("_total");
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} in {text}"
        );
    }
}
