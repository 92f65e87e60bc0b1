//! The test controls over HTTP, for a fake running as its own process (`qoslet-fake-api`, the
//! cluster bench). Not part of the Kubernetes API and not recorded in the request log:
//!
//! - `POST /_fake/objects`: creates or replaces (status included) each object in the body (one
//!   object, a `List` or an array, JSON or YAML); answers with the stored objects.
//! - `POST /_fake/remove` `{"apiVersion", "kind", "namespace", "name"}`: removes at once.
//! - `POST /_fake/block-eviction` `{"namespace", "name", "budget"}` and
//!   `POST /_fake/unblock-eviction` `{"namespace", "name"}`.
//! - `POST /_fake/compact`.
//! - `POST /_fake/unavailable` (every API request answers 503, watches end) and
//!   `POST /_fake/available`.
//! - `GET /_fake/requests`: the request log as JSON; `DELETE /_fake/requests` clears it.

use std::sync::atomic::Ordering;

use axum::http::Method;
use serde_json::{Value, json};

use super::{FakeApiError, Shared, apply_object, key_for, seed, status::ApiError};

pub const PREFIX: &str = "/_fake/";

/// Answers a control request: the HTTP status and a JSON body.
pub fn handle(shared: &Shared, method: &Method, path: &str, body: Option<Value>) -> (u16, Value) {
    match run(shared, method, path.trim_start_matches(PREFIX), body) {
        Ok(value) => (200, value),
        Err(FakeApiError::Api(err)) => (err.code, err.body()),
        Err(err) => {
            let err = ApiError::bad_request(format!("{err}: {}", source_text(&err)));
            (err.code, err.body())
        }
    }
}

fn source_text(err: &FakeApiError) -> String {
    std::error::Error::source(err)
        .map(ToString::to_string)
        .unwrap_or_default()
}

fn text<'a>(body: &'a Option<Value>, field: &str) -> &'a str {
    body.as_ref()
        .and_then(|b| b.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn run(
    shared: &Shared,
    method: &Method,
    what: &str,
    body: Option<Value>,
) -> Result<Value, FakeApiError> {
    let mut store = shared.store.lock().expect("store lock");
    match (method.as_str(), what) {
        ("POST", "objects") => {
            let mut objects = Vec::new();
            seed::flatten(body.unwrap_or_default(), &mut objects);
            let stored = objects
                .into_iter()
                .map(|o| apply_object(&mut store, o))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Array(stored))
        }
        ("POST", "remove") => {
            let key = key_for(
                text(&body, "apiVersion"),
                text(&body, "kind"),
                text(&body, "namespace"),
                text(&body, "name"),
            )?;
            store
                .remove(&key)
                .ok_or_else(|| FakeApiError::Api(ApiError::not_found(key.res(), &key.name)))
        }
        ("POST", "block-eviction") => {
            let pod = (
                text(&body, "namespace").to_string(),
                text(&body, "name").to_string(),
            );
            store
                .blocked_evictions
                .insert(pod, text(&body, "budget").to_string());
            Ok(json!({}))
        }
        ("POST", "unblock-eviction") => {
            let pod = (
                text(&body, "namespace").to_string(),
                text(&body, "name").to_string(),
            );
            store.blocked_evictions.remove(&pod);
            Ok(json!({}))
        }
        ("POST", "compact") => {
            store.compact();
            Ok(json!({ "resourceVersion": store.resource_version().to_string() }))
        }
        ("POST", "unavailable" | "available") => {
            shared
                .unavailable
                .store(what == "unavailable", Ordering::SeqCst);
            shared.epoch.send_modify(|e| *e += 1);
            Ok(json!({}))
        }
        ("GET", "requests") => {
            let log = shared.log.lock().expect("log lock");
            Ok(serde_json::to_value(&*log).unwrap_or_default())
        }
        ("DELETE", "requests") => {
            shared.log.lock().expect("log lock").clear();
            Ok(json!({}))
        }
        _ => Err(FakeApiError::Api(ApiError::no_route())),
    }
}
