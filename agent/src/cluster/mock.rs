//! Request-level API tests, as kube's own `kube/src/mock_tests.rs`: a [`Client`] over
//! `tower_test::mock::pair`, and a task that records every request it receives and answers it
//! through a test's responder. A request the responder does not answer is held open, as a quiet
//! watch is.

use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::{Client, client::Body};
use serde_json::{Value, json};

/// One request as the API server received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query, percent-decoded.
    pub uri: String,
    pub body: Value,
    pub content_type: String,
}

impl Recorded {
    pub fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or("")
    }

    pub fn query(&self, key: &str) -> Option<String> {
        let q = self.uri.split_once('?')?.1;
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_owned())
    }
}

/// An answer: status and JSON body; `None` holds the request open.
pub type Reply = Option<(u16, Value)>;

pub struct Mock {
    pub log: Arc<Mutex<Vec<Recorded>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Mock {
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().unwrap().clone()
    }

    /// Waits until `pred` holds for the log (5 s at most).
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[Recorded]) -> bool) {
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
pub fn client(respond: impl FnMut(&Recorded) -> Reply + Send + 'static) -> (Client, Mock) {
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

/// The API server's Status body for an error.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

/// A list response.
pub fn list(kind: &str, rv: &str, items: Vec<Value>) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items})
}

/// A watch response body: one JSON event per line.
pub fn events(events: &[(&str, Value)]) -> Value {
    Value::String(
        events
            .iter()
            .map(|(t, o)| json!({"type": t, "object": o}).to_string() + "\n")
            .collect(),
    )
}
