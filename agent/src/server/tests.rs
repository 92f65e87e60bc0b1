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

/// An agent's state as at start: nothing measured, nothing ready.
fn fresh_state() -> Arc<AgentState> {
    Arc::new(AgentState {
        metrics: Metrics::new(),
        readiness: Readiness::default(),
        status: StatusStore::default(),
        summary: Box::new(NoSummary),
        conditions: Default::default(),
    })
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
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
    let state = fresh_state();
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
    // The last bucket is +Inf, without which Prometheus' histogram_quantile returns NaN.
    assert_eq!(bucket("+Inf"), Some(4.0), "{text}");
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

/// A client that opens the cap's worth of connections and sends nothing: the next connection
/// waits (in the listen backlog) instead of taking another descriptor, and is answered once the
/// idle timeout has closed the silent ones. A half-sent request is closed by the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_capped_and_closed() {
    let state = fresh_state();
    let limits = ServeLimits {
        max_connections: 4,
        max_connections_per_peer: 4,
        header_read_timeout: std::time::Duration::from_millis(1500),
        idle_timeout: std::time::Duration::from_millis(1000),
    };
    let (addr, serve) = bind_with("127.0.0.1:0".parse().unwrap(), state, limits)
        .await
        .expect("bind");
    let server = tokio::spawn(serve);
    let result = tokio::task::spawn_blocking(move || {
        use std::time::{Duration, Instant};
        let idle: Vec<TcpStream> = (0..limits.max_connections)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        // Let the server accept all of them before the next one comes.
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let (code, body) = get(addr, "/healthz");
        let waited = started.elapsed();
        // Each silent connection was closed by the server (EOF on our side).
        let closed = idle.into_iter().all(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 1];
            // EOF or a reset: closed by the server. A read timeout means it was left open.
            match s.read(&mut b) {
                Ok(0) => true,
                Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
                Ok(_) => false,
            }
        });
        // A request whose headers never finish is dropped after the header timeout.
        let mut slow = TcpStream::connect(addr).expect("connect");
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let t = Instant::now();
        let mut rest = Vec::new();
        let _ = slow.read_to_end(&mut rest);
        (code, body, waited, closed, t.elapsed(), rest)
    })
    .await
    .unwrap();
    server.abort();
    let (code, body, waited, closed, slow_after, rest) = result;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    assert!(
        waited >= std::time::Duration::from_millis(700),
        "the request past the cap was served after {waited:?}, before any slot was free"
    );
    assert!(closed, "an idle connection was left open");
    assert!(
        slow_after < std::time::Duration::from_secs(9),
        "the half-sent request was held for {slow_after:?}"
    );
    let rest = String::from_utf8_lossy(&rest);
    assert!(!rest.contains("200 OK"), "{rest}");
}

/// A pod that holds a thousand silent connections to the agent, reopening each as the server
/// closes it, cannot starve the kubelet's probes, which come from another address (the node's):
/// with the shipped limits, every probe from 127.0.0.2 is answered within the kubelet's default
/// probe timeout of 1 s while 127.0.0.1 attacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_silent_connections_from_one_peer_do_not_starve_the_probes() {
    use std::{
        sync::atomic::{AtomicBool, AtomicUsize, Ordering},
        time::{Duration, Instant},
    };
    let state = fresh_state();
    let (addr, serve) = bind_with(
        "127.0.0.1:0".parse().unwrap(),
        state,
        ServeLimits::default(),
    )
    .await
    .expect("bind");
    let server = tokio::spawn(serve);
    let stop = Arc::new(AtomicBool::new(false));
    let reopened = Arc::new(AtomicUsize::new(0));
    let attacker = std::thread::spawn({
        let (stop, reopened) = (stop.clone(), reopened.clone());
        move || {
            let mut open: Vec<TcpStream> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                open.retain(|s| {
                    let mut b = [0u8; 1];
                    // Ok(0) or a reset: the server closed it.
                    matches!(s.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                });
                // At most 50 new ones every 10 ms: as fast as the server closes them, within
                // what a shared test machine can spare.
                let mut burst = 0;
                while open.len() < 1000 && burst < 50 && !stop.load(Ordering::Relaxed) {
                    burst += 1;
                    let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(100))
                    else {
                        break;
                    };
                    s.set_nonblocking(true).unwrap();
                    open.push(s);
                    reopened.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    // The attack is on: a thousand connections are open.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = Instant::now();
        let probe = async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind("127.0.0.2:0".parse().unwrap())?;
            let mut s = socket.connect(addr).await?;
            tokio::io::AsyncWriteExt::write_all(
                &mut s,
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            .await?;
            let mut out = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out).await?;
            std::io::Result::Ok(out)
        };
        let answer = tokio::time::timeout(Duration::from_secs(1), probe).await;
        let took = started.elapsed();
        slowest = slowest.max(took);
        let answer = answer
            .unwrap_or_else(|_| panic!("a probe was not answered in 1 s"))
            .expect("probe");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    server.abort();
    let reopened = reopened.load(Ordering::Relaxed);
    println!("20 probes under {reopened} silent connections: slowest answer {slowest:?}");
    assert!(
        reopened > 1000,
        "the attack never reopened a connection: {reopened}"
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
        .get_or_create(&metrics::SignalLabels {
            signal: "memory.available".into(),
        })
        .set(700 << 20);
    m.node_eviction_threshold
        .get_or_create(&metrics::ThresholdLabels {
            signal: "memory.available".into(),
            kind: "hard".into(),
        })
        .set(256 << 20);
    // A pid count is no amount of bytes: pid.available has its own family.
    m.node_signal_available
        .get_or_create(&metrics::SignalLabels {
            signal: "pid.available".into(),
        })
        .set(4000);
    m.node_eviction_threshold
        .get_or_create(&metrics::ThresholdLabels {
            signal: "pid.available".into(),
            kind: "hard".into(),
        })
        .set(100);
    m.node_condition
        .get_or_create(&metrics::ConditionLabels {
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
    use crate::cgroup::{Mode, ReconcileReport, Tree, WriteReport, WriteResult, name::CgroupPath};
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
        mode: Mode::Enforce,
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
