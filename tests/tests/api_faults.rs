//! Cluster mode under API server faults, as root: qoslet's cluster node against the fake API
//! server (`qoslet_tests::fake_api`) while it fails in each way of [`Outage`]: 503 from the
//! start, watches that end at once, watch streams cut mid-line, watches that expire (410 as an
//! `ERROR` event and as an HTTP status), garbage bodies, and 429/503 with a `Retry-After`. For
//! each, what the node asked (requests per resource path and second, bounded by
//! `agent/src/cluster/client.rs`) and what it logged (lines a minute) are printed and checked,
//! and the node is in sync again once the fault is over.
//!
//! The log lines are counted by a subscriber of this binary's own, at qoslet's default level
//! (`info`, every target); the tests run one at a time so that each counts only its own node.

mod cluster_common;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use cluster_common::{Setup, assert_rbac_allows, setup, start_qoslet, wait_for};
use qoslet_tests::{
    fake_api::{FakeApi, Outage},
    http_get,
    kubelet_tree::{Driver, KPod, Runtime, create},
    require_root,
};
use tracing_subscriber::{Layer, layer::SubscriberExt as _};

/// The most log lines a minute any fault may cost (issue #39).
const LINES_A_MINUTE: f64 = 100.0;

/// The tests share this binary's log: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One log line qoslet wrote (an event at `info` or above, outside the tests' own crates).
struct Line {
    at: Instant,
    text: String,
}

fn lines() -> &'static Mutex<Vec<Line>> {
    static LINES: OnceLock<Mutex<Vec<Line>>> = OnceLock::new();
    LINES.get_or_init(Default::default)
}

/// Counts each event qoslet's own subscriber would print (`qoslet run`'s default filter,
/// `qoslet::cli::DEFAULT_LOG_FILTER`); the fake's and the tests' events are not qoslet's.
struct CountLines;

impl<S: tracing::Subscriber> Layer<S> for CountLines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if meta.target().starts_with("qoslet_tests") || meta.target().starts_with("api_faults") {
            return;
        }
        let mut text = format!("{} {}:", meta.level(), meta.target());
        event.record(
            &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                let _ = write!(text, " {}={value:?}", field.name());
            },
        );
        lines().lock().unwrap().push(Line {
            at: Instant::now(),
            text,
        });
    }
}

/// Installs the counting subscriber (before `start_qoslet` would install its own), beside the
/// usual test output filtered by `RUST_LOG`.
fn count_log_lines() {
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(tracing_subscriber::EnvFilter::from_default_env()),
        )
        .with(CountLines.with_filter(tracing_subscriber::EnvFilter::new(
            qoslet::cli::DEFAULT_LOG_FILTER,
        )));
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The log lines within `[from, to)`: how many a minute, and each distinct line (its fields
/// but the message's variable parts as written) with its count, most frequent first.
fn log_rate(from: Instant, to: Instant) -> (f64, Vec<(usize, String)>) {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    let mut n = 0;
    for l in lines().lock().unwrap().iter() {
        if l.at >= from && l.at < to {
            n += 1;
            *by.entry(l.text.clone()).or_default() += 1;
        }
    }
    let mut distinct: Vec<(usize, String)> = by.into_iter().map(|(t, n)| (n, t)).collect();
    distinct.sort_by_key(|d| std::cmp::Reverse(d.0));
    let a_minute = n as f64 * 60.0 / (to - from).as_secs_f64();
    (a_minute, distinct)
}

/// One request as the fake answered it.
struct Arrival {
    method: String,
    path: String,
    watch: bool,
    code: u16,
    at: Instant,
}

type Arrivals = Arc<Mutex<Vec<Arrival>>>;

fn record_arrivals(fake: &FakeApi) -> Arrivals {
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    fake.on_request(move |r| {
        seen.lock().unwrap().push(Arrival {
            method: r.method.clone(),
            path: r.path.clone(),
            watch: r.is_watch(),
            code: r.code,
            at: Instant::now(),
        });
    });
    arrivals
}

/// The most of `times` (sorted) within any one second.
fn most_in_a_second(times: &[Instant]) -> usize {
    times
        .iter()
        .enumerate()
        .map(|(i, t)| {
            times[i..]
                .iter()
                .take_while(|u| **u < *t + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Per request kind (method, path, `?watch` for a watch) within `[from, to)`: how many, and the
/// most in any one second.
fn rates(arrivals: &Arrivals, from: Instant, to: Instant) -> Vec<(String, usize, usize)> {
    let mut by: BTreeMap<String, Vec<Instant>> = BTreeMap::new();
    for a in arrivals.lock().unwrap().iter() {
        if a.at >= from && a.at < to {
            let watch = if a.watch { "?watch" } else { "" };
            by.entry(format!("{} {}{watch}", a.method, a.path))
                .or_default()
                .push(a.at);
        }
    }
    by.into_iter()
        .map(|(what, times)| (what, times.len(), most_in_a_second(&times)))
        .collect()
}

/// What a node asked of one resource path within a window.
#[derive(Debug)]
struct PathRate {
    path: String,
    requests: usize,
    a_second: f64,
    most_in_a_second: usize,
}

/// Per resource path (lists, watches and writes of it together) within `[from, to)`.
fn path_rates(arrivals: &Arrivals, from: Instant, to: Instant) -> Vec<PathRate> {
    let mut by: BTreeMap<String, Vec<Instant>> = BTreeMap::new();
    for a in arrivals.lock().unwrap().iter() {
        if a.at >= from && a.at < to {
            by.entry(a.path.clone()).or_default().push(a.at);
        }
    }
    let secs = (to - from).as_secs_f64();
    by.into_iter()
        .map(|(path, times)| PathRate {
            requests: times.len(),
            a_second: times.len() as f64 / secs,
            most_in_a_second: most_in_a_second(&times),
            path,
        })
        .collect()
}

/// At most two requests a second for any resource path: over the window, as many as a request
/// every 500 ms allows (`READ_SPACING`), and in any one second at most 3 as the server sees
/// them (a window of one second catches a third request at its edge, and arrivals are not sent
/// times).
fn assert_two_a_second(fault: &str, rates: &[PathRate], from: Instant, to: Instant) {
    let secs = (to - from).as_secs_f64();
    for r in rates {
        assert!(
            r.a_second <= 2.0 + 1.0 / secs && r.most_in_a_second <= 3,
            "{fault}: {} asked {} times in {secs:.1} s ({:.2} a second), {} in one second",
            r.path,
            r.requests,
            r.a_second,
            r.most_in_a_second
        );
    }
}

/// Prints and checks the log lines of `[from, to)`: at most [`LINES_A_MINUTE`].
fn assert_few_lines(fault: &str, from: Instant, to: Instant) -> f64 {
    let (a_minute, distinct) = log_rate(from, to);
    let shown: Vec<_> = distinct.iter().take(12).collect();
    println!("{fault}: {a_minute:.1} log lines a minute; most written: {shown:#?}");
    assert!(
        a_minute <= LINES_A_MINUTE,
        "{fault}: {a_minute:.1} log lines a minute: {distinct:#?}"
    );
    a_minute
}

/// Waits until `/readyz` says `what`.
async fn readyz_says(metrics: SocketAddr, what: &str, ok: &dyn Fn(&str) -> bool) {
    // The backoff may have grown to 30 s plus jitter.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let body = http_get(metrics, "/readyz").unwrap_or_default();
        if ok(&body) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never said {what}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn all_synced(body: &str) -> bool {
    body.contains("api: ready: ")
        && body.contains("pods synced")
        && body.contains("node synced")
        && !body.contains("failing")
        && !body.contains("listing")
}

/// A pod created now is seen by the node (its metrics): the watches work.
async fn a_new_pod_is_seen(s: &Setup, name: &str, uid: &str) {
    let mut pod = KPod::new(name, uid, "BestEffort");
    create(&s.fake, &mut pod, Runtime::Containerd, cluster_common::NODE);
    let metrics = s.metrics;
    let pod = format!("pod=\"{name}\"");
    wait_for("the pod created after the fault, managed", || {
        let m = http_get(metrics, "/metrics")?;
        m.contains(&pod).then_some(())
    })
    .await;
}

/// What one node asks of an API server that fails it (cluster/client.rs): a node started during
/// a 503 outage lists under client-go's growing backoff, not every second for good; watches that
/// a server ends at once are asked again at most twice a second per resource, not in a loop;
/// after both, the node is in sync again. The rates and log lines are printed for the README's
/// figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_api_server_is_asked_under_backoff_and_at_most_twice_a_second_per_resource() {
    require_root();
    let _serial = SERIAL.lock().await;
    count_log_lines();
    let s = setup(Driver::Cgroupfs, Runtime::Containerd, 384, 128).await;
    let arrivals = record_arrivals(&s.fake);
    let metrics = s.metrics;

    // Started while every request answers 503.
    s.fake.go_down(Outage::Unavailable).await;
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    let started = Instant::now();
    let outage = Duration::from_secs(20);
    tokio::time::sleep(outage).await;
    let now = Instant::now();
    let during = rates(&arrivals, started, now);
    println!("20 s of 503 from the start (request, count, most in one second): {during:#?}");
    let pod_lists = during
        .iter()
        .find(|(what, ..)| what == "GET /api/v1/pods")
        .map_or(0, |(_, n, _)| *n);
    // client-go's backoff from 0.8 s, doubling: at most 6 tries in 20 s (kube-runtime's own
    // backoff, reset before every list, tries 13 to 25 times).
    assert!(
        (1..=6).contains(&pod_lists),
        "pod lists in 20 s of 503: {pod_lists}: {during:#?}"
    );
    let per_path = path_rates(&arrivals, started, now);
    assert_two_a_second("503 from the start", &per_path, started, now);
    assert_few_lines("503 from the start", started, now);
    // Not ready, and why.
    let ready = http_get(metrics, "/readyz").unwrap_or_default();
    assert!(
        ready.contains("api: not ready: waiting for the first list")
            && ready.contains("pods failing (")
            && ready.contains("503"),
        "{ready}"
    );

    s.fake.come_up().await.expect("the fake comes back");
    readyz_says(metrics, "ready after the outage", &|b| {
        b.contains("api: ready: ")
    })
    .await;

    // A later outage shows in the line, and clears when the watches are back, though no object
    // changed (a re-established watch yields nothing).
    s.fake.go_down(Outage::Unavailable).await;
    readyz_says(metrics, "the outage", &|b| {
        b.contains("api: ready: ") && b.contains("pods failing (")
    })
    .await;
    s.fake.come_up().await.expect("the fake comes back");
    readyz_says(metrics, "the outage over", &all_synced).await;

    // Every watch now ends at once, without an error.
    s.fake.go_down(Outage::WatchesEnd).await;
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let to = Instant::now();
    let during = rates(&arrivals, from, to);
    println!("10 s of watches that end at once (request, count, most in one second): {during:#?}");
    assert!(
        during
            .iter()
            .any(|(what, ..)| what == "GET /api/v1/pods?watch"),
        "the pods are watched again: {during:#?}"
    );
    let per_path = path_rates(&arrivals, from, to);
    println!("by resource path: {per_path:#?}");
    assert_two_a_second("watches that end at once", &per_path, from, to);
    assert_few_lines("watches that end at once", from, to);

    // Back to normal: a new pod on the node is seen.
    s.fake.come_up().await.expect("watches last again");
    a_new_pod_is_seen(&s, "late", "33333333-2222-3333-4444-000000000009").await;
    assert_rbac_allows(&s.fake);
    qoslet.crash();
}

/// How long each watch fault lasts: long enough for client-go's backoff to have doubled four
/// times (0.8 + 1.6 + 3.2 + 6.4 s).
const FAULT: Duration = Duration::from_secs(15);

/// `fault` for [`FAULT`] on a node in sync: the requests in that window printed, at most two
/// a second for each resource path and at most [`LINES_A_MINUTE`] log lines checked. The
/// window, and the requests by kind in it.
async fn fault_window(
    s: &Setup,
    arrivals: &Arrivals,
    fault: Outage,
    name: &str,
) -> (Instant, Instant, Vec<(String, usize, usize)>) {
    s.fake.go_down(fault).await;
    let from = Instant::now();
    tokio::time::sleep(FAULT).await;
    let to = Instant::now();
    s.fake.come_up().await.expect("the fault ends");
    let during = rates(arrivals, from, to);
    let per_path = path_rates(arrivals, from, to);
    println!("{name}, {FAULT:?} (request, count, most in one second): {during:#?}");
    println!("{name}, by resource path: {per_path:#?}");
    assert_two_a_second(name, &per_path, from, to);
    assert_few_lines(name, from, to);
    (from, to, during)
}

/// A node in sync meets `fault` for [`FAULT`]: it asks each resource path at most twice a
/// second, logs at most [`LINES_A_MINUTE`], and is in sync again once the fault is over.
async fn under(fault: Outage, name: &str) {
    require_root();
    let _serial = SERIAL.lock().await;
    count_log_lines();
    let s = setup(Driver::Cgroupfs, Runtime::Containerd, 384, 128).await;
    let arrivals = record_arrivals(&s.fake);
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    readyz_says(s.metrics, "ready", &all_synced).await;

    let (from, to, during) = fault_window(&s, &arrivals, fault, name).await;
    let faulty = arrivals
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.at >= from && a.at < to && a.path == "/api/v1/pods")
        .count();
    assert!(faulty > 1, "{name}: the pods are asked again: {during:#?}");

    readyz_says(s.metrics, "in sync after the fault", &all_synced).await;
    a_new_pod_is_seen(&s, "late", "33333333-2222-3333-4444-000000000019").await;
    assert_rbac_allows(&s.fake);
    qoslet.crash();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_cut_mid_line_are_asked_at_most_twice_a_second_per_resource_and_logged_little() {
    under(Outage::WatchesCut, "watches cut mid-line").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_that_expire_are_relisted_at_most_twice_a_second_per_resource_and_logged_little() {
    under(
        Outage::WatchesExpire,
        "watches that expire (410 ERROR event)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_answered_410_are_asked_at_most_twice_a_second_per_resource_and_logged_little() {
    under(Outage::WatchesGone, "watches answered HTTP 410").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_answers_are_asked_again_at_most_twice_a_second_per_resource_and_logged_little() {
    under(Outage::Garbage, "garbage bodies").await;
}

/// `code` with `Retry-After` ([`FAULT`] long): the next read of each resource path waits at
/// least that long (`RequestBounds`), though the watch backoff alone would ask sooner (0.8, 1.6,
/// 3.2 s). One node a code: the backoff a first fault grew would hide a second one's wait.
async fn throttled(code: u16) {
    require_root();
    let _serial = SERIAL.lock().await;
    count_log_lines();
    let s = setup(Driver::Cgroupfs, Runtime::Containerd, 384, 128).await;
    let arrivals = record_arrivals(&s.fake);
    let qoslet = start_qoslet(&s.kubeconfig, &s.kubelet, &s.config);
    readyz_says(s.metrics, "ready", &all_synced).await;

    let retry_after = 6;
    let name = format!("{code} with Retry-After: {retry_after}");
    let (from, to, during) = fault_window(
        &s,
        &arrivals,
        Outage::Throttled { code, retry_after },
        &name,
    )
    .await;
    // Each read answered with the header, and the next read of its path.
    let mut last: BTreeMap<String, Instant> = BTreeMap::new();
    let mut gaps = Vec::new();
    for a in arrivals.lock().unwrap().iter() {
        if a.at < from || a.at >= to || a.method != "GET" {
            continue;
        }
        if let Some(at) = last.remove(&a.path) {
            gaps.push((a.path.clone(), a.at - at));
        }
        if a.code == code {
            last.insert(a.path.clone(), a.at);
        }
    }
    println!("{name}: the waits after it: {gaps:#?}");
    assert!(
        gaps.iter().any(|(p, _)| p == "/api/v1/pods"),
        "{name}: the pods are asked again within {FAULT:?}: {during:#?}"
    );
    for (path, gap) in &gaps {
        assert!(
            *gap >= Duration::from_secs(retry_after.into()),
            "{name}: {path} asked again after {gap:?}"
        );
    }
    readyz_says(s.metrics, "in sync after the fault", &all_synced).await;
    a_new_pod_is_seen(&s, "late", "33333333-2222-3333-4444-000000000029").await;
    assert_rbac_allows(&s.fake);
    qoslet.crash();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_holds_back_the_next_read_of_that_resource() {
    throttled(429).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_with_retry_after_holds_back_the_next_read_of_that_resource() {
    throttled(503).await;
}
