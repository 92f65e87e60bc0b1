//! Request-level API tests, as kube's own `kube/src/mock_tests.rs`: a [`Client`] over
//! `tower_test::mock::pair`, and a task that records every request it receives and answers it
//! through a test's responder. A request the responder does not answer is held open, as a quiet
//! watch is. [`Routes`] is the responder most tests need: answers by method and path.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use http::{Request, Response, StatusCode};
use kube::{Client, client::Body};
use serde_json::{Value, json};

use super::queue::WriteQueue;

/// One request as the API server received it.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) method: String,
    /// Path and query, percent-decoded.
    pub(crate) uri: String,
    pub(crate) body: Value,
    pub(crate) content_type: String,
}

impl Recorded {
    pub(crate) fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or("")
    }

    pub(crate) fn query(&self, key: &str) -> Option<String> {
        self.query_pairs()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Every `key=value` of the query, in order (kube ends a path without parameters with an
    /// empty query, `?`, which carries none).
    pub(crate) fn query_pairs(&self) -> Vec<(String, String)> {
        let q = self.uri.split_once('?').map_or("", |(_, q)| q);
        q.split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect()
    }

    /// Whether this is a watch (`watch=true`) rather than a list or a get.
    pub(crate) fn is_watch(&self) -> bool {
        self.query("watch").as_deref() == Some("true")
    }

    /// Asserts the whole request: method, path, no query, content type and body.
    #[track_caller]
    pub(crate) fn assert_is(&self, method: &str, path: &str, content_type: &str, body: &Value) {
        assert_eq!(
            (
                self.method.as_str(),
                self.path(),
                self.query_pairs(),
                self.content_type.as_str()
            ),
            (method, path, vec![], content_type),
            "{self:?}"
        );
        assert_eq!(&self.body, body, "{} {}", self.method, self.path());
    }
}

/// An answer: status and JSON body; `None` holds the request open.
pub(crate) type Reply = Option<(u16, Value)>;

pub(crate) struct Mock {
    pub(crate) log: Arc<Mutex<Vec<Recorded>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Mock {
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.log.lock().unwrap().clone()
    }

    /// Waits until `pred` holds for the log (5 s at most).
    pub(crate) async fn wait_for(&self, what: &str, pred: impl Fn(&[Recorded]) -> bool) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if pred(&self.log.lock().unwrap()) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; requests: {:#?}",
                self.requests()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A client whose requests go to `respond`.
pub(crate) fn client(respond: impl FnMut(&Recorded) -> Reply + Send + 'static) -> (Client, Mock) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let log: Arc<Mutex<Vec<Recorded>>> = Arc::default();
    let log2 = log.clone();
    let mut respond = respond;
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let rec = Recorded {
                method: parts.method.to_string(),
                uri: percent_decode(&parts.uri.to_string()),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned(),
            };
            log2.lock().unwrap().push(rec.clone());
            match respond(&rec) {
                Some((code, value)) => {
                    let body = match &value {
                        Value::String(s) => s.clone().into_bytes(),
                        v => serde_json::to_vec(v).unwrap(),
                    };
                    let resp = Response::builder()
                        .status(StatusCode::from_u16(code).unwrap())
                        .body(Body::from(body))
                        .unwrap();
                    send.send_response(resp);
                }
                None => held.push(send),
            }
        }
    });
    (client, Mock { log, _task: task })
}

type Respond = Box<dyn FnMut(&Recorded) -> Reply + Send>;

/// Answers by method and path: the first route that matches answers (a route may hold the
/// request open by answering `None`); a watch no route takes is held open, as a quiet watch is;
/// anything else is a 404 with the API server's Status.
#[derive(Default)]
pub(crate) struct Routes(Vec<(String, String, Respond)>);

impl Routes {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// `method` (`*`: any) on `path` (ending in `*`: every path with that prefix) answers as
    /// `respond` says, watches too (a watch the route answers `None` goes on to the next).
    pub(crate) fn route(
        mut self,
        method: &str,
        path: &str,
        respond: impl FnMut(&Recorded) -> Reply + Send + 'static,
    ) -> Self {
        self.0.push((method.into(), path.into(), Box::new(respond)));
        self
    }

    /// `method path` answers `code` with `body`, every time.
    pub(crate) fn on(self, method: &str, path: &str, code: u16, body: Value) -> Self {
        self.route(method, path, move |_| Some((code, body.clone())))
    }

    /// `GET path` (not a watch) answers a list of `kind` at resourceVersion `rv`.
    pub(crate) fn list(self, path: &str, kind: &str, rv: &str, items: Vec<Value>) -> Self {
        let body = list(kind, rv, items);
        self.route("GET", path, move |r| {
            (!r.is_watch()).then(|| (200, body.clone()))
        })
    }

    fn respond(&mut self, r: &Recorded) -> Reply {
        let matches = |pattern: &str, value: &str| match pattern.strip_suffix('*') {
            Some(prefix) => value.starts_with(prefix),
            None => pattern == value,
        };
        for (method, path, respond) in &mut self.0 {
            if matches(method, &r.method) && matches(path, r.path()) {
                if let Some(reply) = respond(r) {
                    return Some(reply);
                }
                if !r.is_watch() {
                    return None;
                }
            }
        }
        (!r.is_watch()).then(|| (404, status(404, "NotFound", "no route")))
    }

    /// A client answered by these routes.
    pub(crate) fn client(mut self) -> (Client, Mock) {
        client(move |r| self.respond(r))
    }
}

/// The API server's Status body for an error.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

/// A list response.
pub(crate) fn list(kind: &str, rv: &str, items: Vec<Value>) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items})
}

/// A watch response body: one JSON event per line.
pub(crate) fn events(events: &[(&str, Value)]) -> Value {
    Value::String(
        events
            .iter()
            .map(|(t, o)| json!({"type": t, "object": o}).to_string() + "\n")
            .collect(),
    )
}

/// A fresh directory under the system's temporary one, unique to this process and call, removed
/// on drop.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "qoslet-cluster-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A write queue in a fresh directory; the queue's files go with the [`TempDir`].
pub(crate) fn queue(tag: &str) -> (TempDir, Arc<WriteQueue>) {
    let dir = TempDir::new(tag);
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    (dir, q)
}
