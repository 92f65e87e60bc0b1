use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    sync::Arc,
};

use super::*;
use crate::{
    hub::metrics::tests::{example_plan, metric_value},
    hub::{AgentState, Summary, SummarySource},
};

struct NoSummary;

impl SummarySource for NoSummary {
    fn summary(&self) -> Summary {
        Summary::default()
    }
}

/// An agent's state as at start: nothing measured, nothing ready.
fn fresh_state() -> Arc<AgentState> {
    Arc::new(AgentState::new(Box::new(NoSummary), None))
}

/// A GET's status and body; a server silent for 30 s fails it.
pub(crate) fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("a read timeout");
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

/// A pod that holds a thousand silent connections to the agent (every other one slow: a request
/// whose headers never end), reopening each as the server closes it, cannot starve the kubelet's
/// probes, which come from another address (the node's):
/// with the shipped limits, every probe from 127.0.0.2 (`/healthz` and `/readyz` in turn) is
/// answered within the kubelet's default probe timeout of 1 s while 127.0.0.1 attacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_silent_connections_from_one_peer_do_not_starve_the_probes() {
    use std::{
        sync::atomic::{AtomicBool, AtomicUsize, Ordering},
        time::{Duration, Instant},
    };
    let state = fresh_state();
    state.readiness.set("api", true, "watches: pods synced");
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
                    // Every other one slow: a request whose headers never end.
                    if reopened.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
                        let _ = (&s).write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
                    }
                    open.push(s);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    // The attack is on: a thousand connections are open.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let path = if i % 2 == 0 { "/healthz" } else { "/readyz" };
        let started = Instant::now();
        let probe = async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind("127.0.0.2:0".parse().unwrap())?;
            let mut s = socket.connect(addr).await?;
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            tokio::io::AsyncWriteExt::write_all(&mut s, request.as_bytes()).await?;
            let mut out = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out).await?;
            std::io::Result::Ok(out)
        };
        let answer = tokio::time::timeout(Duration::from_secs(1), probe).await;
        let took = started.elapsed();
        slowest = slowest.max(took);
        let answer = answer
            .unwrap_or_else(|_| panic!("a {path} probe was not answered in 1 s"))
            .expect("probe");
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    server.abort();
    let reopened = reopened.load(Ordering::Relaxed);
    println!(
        "20 probes (10 /healthz, 10 /readyz) under a thousand silent or slow connections ({reopened} opened in all), each answered: slowest answer {slowest:?}"
    );
    assert!(
        reopened > 1000,
        "the attack never reopened a connection: {reopened}"
    );
}

/// Authenticates the token "t" as "u" and allows nothing.
struct DenyAll;

impl auth::Reviewer for DenyAll {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<auth::User>, auth::ReviewError>> {
        Box::pin(async move {
            Ok((token == "t").then(|| auth::User {
                username: "u".into(),
                ..Default::default()
            }))
        })
    }

    fn authorize<'a>(
        &'a self,
        _: &'a auth::User,
        _: auth::Access,
    ) -> futures::future::BoxFuture<'a, Result<bool, auth::ReviewError>> {
        Box::pin(async { Ok(false) })
    }
}

/// With the endpoints guarded, the probes' paths stay open, and `/status` answers loopback (where
/// `qoslet status` asks from) as it is and any other address as `/metrics` is answered.
#[tokio::test]
async fn guarded_endpoints_leave_the_probes_and_loopbacks_status_open() {
    let state = Arc::new(AgentState::new(
        Box::new(NoSummary),
        Some(Arc::new(auth::Guard::new(DenyAll))),
    ));
    state.readiness.register("x");
    state.readiness.set("x", true, "ready");
    let app = router(state);
    let ask = |path: &str, peer: [u8; 4], token: Option<&str>| {
        let mut req = http::Request::get(path);
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let mut req = req.body(axum::body::Body::empty()).unwrap();
        req.extensions_mut()
            .insert(Peer(std::net::IpAddr::from(peer)));
        let mut app = app.clone();
        async move {
            tower::Service::call(&mut app, req)
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let outside = [10, 0, 0, 7];
    assert_eq!(ask("/healthz", outside, None).await, 200);
    assert_eq!(ask("/readyz", outside, None).await, 200);
    assert_eq!(ask("/metrics", outside, None).await, 401);
    assert_eq!(ask("/metrics", [127, 0, 0, 1], None).await, 401);
    assert_eq!(ask("/metrics", outside, Some("other")).await, 401);
    assert_eq!(ask("/metrics", outside, Some("t")).await, 403);
    assert_eq!(ask("/stats/summary", outside, Some("t")).await, 403);
    assert_eq!(ask("/status", outside, None).await, 401);
    assert_eq!(ask("/status", outside, Some("t")).await, 403);
    assert_eq!(ask("/status", [127, 0, 0, 1], None).await, 200);
}

/// `[::]` is bound dual-stack: IPv4 clients reach it too (on a node without IPv6 it is
/// `0.0.0.0`, which they reach as well).
#[tokio::test]
async fn every_address_is_bound_for_ipv4_and_ipv6_alike() {
    let listener = serve::listen("[::]:0".parse().unwrap()).expect("listen");
    let local = listener.local_addr().unwrap();
    let port = local.port();
    let accept = tokio::spawn(async move {
        for _ in 0..2 {
            if listener.accept().await.is_err() {
                break;
            }
        }
    });
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("IPv4 reaches [::]");
    if local.is_ipv6() {
        tokio::net::TcpStream::connect(("::1", port))
            .await
            .expect("IPv6 reaches [::]");
    }
    accept.abort();
}
