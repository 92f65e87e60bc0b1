//! `endpointAuth: tokenReview` against the fake API server: qoslet's server with cluster mode's
//! guard (`qoslet::cluster::review::ApiReviewer` over qoslet's own API client, as
//! `qoslet::cluster::serve_guarded` builds it), the tokens and the grants set in the fake's
//! review table. No root needed.

use std::{net::SocketAddr, path::PathBuf};

use qoslet::cluster::client::RequestBounds;
use qoslet_tests::{
    fake_api::{FakeApi, Options, Outage},
    http_get_as,
};
use serde_json::json;

const NODE: &str = "node-a";

struct Setup {
    fake: FakeApi,
    addr: SocketAddr,
    _server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// The fake with a scraper allowed `/metrics` and `nodes/stats` of this node, a token of a user
/// allowed nothing, and qoslet's server guarded through it.
async fn setup() -> Setup {
    let fake = FakeApi::start(Options::default()).await.expect("fake API");
    fake.add_token(
        "scraper-token",
        "system:serviceaccount:monitoring:prometheus",
        &["system:serviceaccounts"],
    );
    fake.add_token(
        "nobody-token",
        "system:serviceaccount:default:nobody",
        &["system:serviceaccounts"],
    );
    fake.allow(
        "system:serviceaccount:monitoring:prometheus",
        json!({"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}),
    );
    fake.allow(
        "system:serviceaccount:monitoring:prometheus",
        json!({"resourceAttributes": {"group": "", "version": "v1", "resource": "nodes", "subresource": "stats", "name": NODE, "verb": "get"}}),
    );
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "qoslet-endpoint-auth-{}-{}",
        std::process::id(),
        fake.addr().port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    fake.write_kubeconfig(&kubeconfig).unwrap();
    let client = qoslet::cluster::client(Some(&kubeconfig), &RequestBounds::default())
        .await
        .expect("client");
    let (addr, serve) =
        qoslet::cluster::serve_guarded("127.0.0.1:0".parse().unwrap(), client, NODE.into())
            .await
            .expect("bind");
    Setup {
        fake,
        addr,
        _server: tokio::spawn(serve),
    }
}

async fn get(addr: SocketAddr, path: &'static str, token: Option<&'static str>) -> (u16, String) {
    tokio::task::spawn_blocking(move || http_get_as(addr, path, token))
        .await
        .unwrap()
        .expect("an answer")
}

/// Reviews the fake received: (TokenReviews, SubjectAccessReviews).
fn reviews(fake: &FakeApi) -> (usize, usize) {
    let log = fake.requests();
    let count = |p: &str| log.iter().filter(|r| r.path == p).count();
    (
        count("/apis/authentication.k8s.io/v1/tokenreviews"),
        count("/apis/authorization.k8s.io/v1/subjectaccessreviews"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_summary_need_an_authorized_token_and_probes_do_not() {
    let s = setup().await;
    for path in ["/healthz", "/readyz"] {
        let (code, _) = get(s.addr, path, None).await;
        assert!(code == 200 || code == 503, "{path}: {code}");
        assert_ne!(code, 401);
    }
    assert_eq!(reviews(&s.fake), (0, 0), "probes ask nothing");
    for path in ["/metrics", "/stats/summary"] {
        assert_eq!(
            get(s.addr, path, None).await.0,
            401,
            "{path} without a token"
        );
        assert_eq!(
            get(s.addr, path, Some("made-up")).await.0,
            401,
            "{path} with an unknown token"
        );
        assert_eq!(
            get(s.addr, path, Some("nobody-token")).await.0,
            403,
            "{path} for a user allowed nothing"
        );
    }
    let (code, body) = get(s.addr, "/metrics", Some("scraper-token")).await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("qoslet_") && body.ends_with("# EOF\n"),
        "{body}"
    );
    let (code, body) = get(s.addr, "/stats/summary", Some("scraper-token")).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(NODE), "{body}");
    // /status is for `qoslet status` on the node: from loopback, as here, it answers.
    assert_eq!(get(s.addr, "/status", None).await.0, 200);

    // The SubjectAccessReviews asked what kube-rbac-proxy and the kubelet ask.
    let log = s.fake.requests();
    let sar = |attrs: &str| {
        log.iter()
            .filter_map(|r| r.body.as_ref())
            .any(|b| b["kind"] == "SubjectAccessReview" && b["spec"].get(attrs).is_some())
    };
    assert!(sar("nonResourceAttributes") && sar("resourceAttributes"));
    // The shipped RBAC grants qoslet the reviews.
    let denied = qoslet_tests::fake_api::rbac::denied(
        &log,
        include_str!("../../deploy/kubernetes/rbac.yaml"),
    )
    .unwrap();
    assert!(denied.is_empty(), "{denied:?}");
}

/// Scrapes within the caches' time send one TokenReview and one SubjectAccessReview; a flood of
/// bad tokens is answered 401 (each token reviewed once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_scrapes_are_reviewed_once() {
    let s = setup().await;
    for _ in 0..5 {
        assert_eq!(get(s.addr, "/metrics", Some("scraper-token")).await.0, 200);
    }
    assert_eq!(reviews(&s.fake), (1, 1));
    for _ in 0..3 {
        assert_eq!(get(s.addr, "/metrics", Some("nobody-token")).await.0, 403);
        assert_eq!(get(s.addr, "/metrics", Some("made-up")).await.0, 401);
    }
    // One more TokenReview per new token, one more SubjectAccessReview for the new user.
    assert_eq!(reviews(&s.fake), (3, 2));
}

/// The API server down: nothing is served (503), not even to a token never seen; what was
/// reviewed before stays answered from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_fails_closed() {
    let s = setup().await;
    s.fake.go_down(Outage::Unavailable).await;
    let (code, body) = get(s.addr, "/metrics", Some("scraper-token")).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        get(s.addr, "/stats/summary", Some("scraper-token")).await.0,
        503
    );
    assert_eq!(get(s.addr, "/healthz", None).await.0, 200);
    s.fake.come_up().await.unwrap();
    assert_eq!(get(s.addr, "/metrics", Some("scraper-token")).await.0, 200);
    s.fake.go_down(Outage::Refuse).await;
    assert_eq!(
        get(s.addr, "/metrics", Some("scraper-token")).await.0,
        200,
        "reviewed a moment ago: from the cache"
    );
    assert_eq!(get(s.addr, "/metrics", Some("nobody-token")).await.0, 503);
}
