//! HTTP requests to API operations: routes the path, reads the query and body, answers with the
//! object, a list, a watch stream or a `Status`, and records the request in the log.

use std::{collections::HashMap, sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, Method, StatusCode, header},
    response::Response,
};
use futures::StreamExt as _;
use serde_json::{Value, json};

use super::{
    Arrived, Outage, Shared, control,
    log::{RequestRecord, url_decode_pairs},
    ops::{self, DeleteOptions},
    patch::PatchType,
    resources::{RESOURCES, Route, Target, route},
    reviews,
    select::Selector,
    status::ApiError,
    store::Part,
    watch::{self, WatchRequest},
};

/// Request bodies above this are refused (the real server's limit is 3 MiB for most objects).
const BODY_LIMIT: usize = 16 << 20;

enum Reply {
    Json(u16, Value),
    Stream(Body),
}

type Query = HashMap<String, String>;

pub async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let arrived = Arrived {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        query: req.uri().query().unwrap_or_default().to_string(),
    };
    if !arrived.path.starts_with(control::PREFIX) {
        let hook = shared.on_arrival.lock().expect("hook lock").clone();
        if let Some(hook) = hook {
            hook(&arrived);
        }
        // FakeApi::hang: as silent, for the requests it matches.
        let mut hang = shared.hang.subscribe();
        while hang
            .borrow_and_update()
            .as_ref()
            .is_some_and(|h| h(&arrived))
        {
            if hang.changed().await.is_err() {
                break;
            }
        }
    }
    // Outage::Silent: no answer until the fake comes up; a client that gives up first drops
    // this future, and the request never happened.
    let mut silent = shared.silent.subscribe();
    while *silent.borrow_and_update() {
        if silent.changed().await.is_err() {
            break;
        }
    }
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or_default().to_string();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .unwrap_or_default();
    let parsed = parse_body(&bytes, content_type.as_deref());
    let query: Query = url_decode_pairs(&raw_query).into_iter().collect();
    if path.starts_with(control::PREFIX) {
        let (code, value) = match parsed {
            Ok(body) => control::handle(&shared, &parts.method, &path, body),
            Err(err) => (err.code, err.body()),
        };
        return json_response(code, &value);
    }

    let unavailable = shared.unavailable.load(std::sync::atomic::Ordering::SeqCst);
    let fault = *shared.fault.lock().expect("fault lock");
    let watch = parts.method == Method::GET && flag(&query, "watch") == Some(true);
    let faulty = fault
        .filter(|_| !unavailable)
        .and_then(|f| fault_answer(f, watch, &query));
    let (code, response) = if let Some(answer) = faulty {
        answer
    } else {
        let reply = if unavailable {
            Err(ApiError::unavailable())
        } else {
            match parsed.clone() {
                Ok(body) => dispatch(
                    &shared,
                    &parts.method,
                    &path,
                    &query,
                    content_type.as_deref(),
                    body,
                ),
                Err(err) => Err(err),
            }
        };
        match reply {
            Ok(Reply::Json(code, value)) => (code, json_response(code, &value)),
            Ok(Reply::Stream(body)) => (200, stream_response(body)),
            Err(err) => (err.code, json_response(err.code, &err.body())),
        }
    };
    let record = RequestRecord {
        method: parts.method.to_string(),
        path,
        query: raw_query,
        content_type,
        body: parsed.ok().flatten(),
        code,
    };
    let hook = shared.on_request.lock().expect("hook lock").clone();
    if let Some(hook) = hook {
        hook(&record);
    }
    shared.log.lock().expect("log lock").push(record);
    response
}

/// What a 200 answers under [`Outage::Garbage`]: no JSON, no list.
const GARBAGE: &[u8] = b"\x00\xff<html>502 Bad Gateway}{\n";

/// The first bytes of a watch event line, where [`Outage::WatchesCut`] cuts the connection.
const CUT_LINE: &[u8] = br#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metad"#;

/// The answer of the fault in force, when it touches this request; the HTTP status and the
/// response.
fn fault_answer(fault: Outage, watch: bool, query: &Query) -> Option<(u16, Response)> {
    match fault {
        Outage::Garbage => Some((200, stream_response(Body::from(GARBAGE)))),
        Outage::Throttled { code, retry_after } => {
            let mut response = json_response(code, &ApiError::throttled(code, retry_after).body());
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
            Some((code, response))
        }
        Outage::WatchesGone if watch => {
            let from = query
                .get("resourceVersion")
                .and_then(|rv| rv.parse().ok())
                .unwrap_or_default();
            let err = ApiError::expired(from, from + 1);
            Some((err.code, json_response(err.code, &err.body())))
        }
        Outage::WatchesCut if watch => {
            // The partial line goes out first (hyper writes what the body yields while it
            // waits), then the body fails and hyper closes the connection mid-chunk.
            let cut = futures::stream::iter([Ok(bytes::Bytes::from_static(CUT_LINE))]).chain(
                futures::stream::once(async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Err(std::io::Error::other("the fake cuts the watch"))
                }),
            );
            Some((200, stream_response(Body::from_stream(cut))))
        }
        _ => None,
    }
}

fn parse_body(bytes: &[u8], content_type: Option<&str>) -> Result<Option<Value>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let yaml = content_type.is_some_and(|c| c.contains("yaml"));
    let parsed = if yaml {
        serde_yaml_ng::from_slice::<Value>(bytes).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice::<Value>(bytes).map_err(|e| e.to_string())
    };
    parsed.map(Some).map_err(|e| {
        ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
    })
}

fn json_response(code: u16, value: &Value) -> Response {
    let mut response = Response::new(Body::from(serde_json::to_vec(value).unwrap_or_default()));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn flag(query: &Query, name: &str) -> Option<bool> {
    query.get(name).map(|v| v == "true" || v == "1")
}

fn dispatch(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    query: &Query,
    content_type: Option<&str>,
    body: Option<Value>,
) -> Result<Reply, ApiError> {
    let only_get = |value: Value| {
        if method == Method::GET {
            Ok(Reply::Json(200, value))
        } else {
            Err(ApiError::method_not_allowed())
        }
    };
    if *method == Method::POST
        && let Some(answer) = reviews::answer(
            &shared.reviews.lock().expect("reviews lock"),
            path,
            body.clone(),
        )
    {
        return answer.map(|review| Reply::Json(201, review));
    }
    let served = |group: &str| shared.options.workload_api || group != WORKLOAD_GROUP;
    let target = match route(path) {
        Route::Version => return only_get(version()),
        Route::CoreVersions => return only_get(core_versions(shared)),
        Route::Groups => return only_get(groups(&served)),
        Route::Resources { group, version } => {
            return resources(&group, &version)
                .filter(|_| served(&group))
                .ok_or_else(ApiError::no_route)
                .and_then(only_get);
        }
        Route::Unknown => return Err(ApiError::no_route()),
        Route::Object(target) if !served(target.res().group) => {
            return Err(ApiError::no_route());
        }
        Route::Object(target) => target,
    };
    let res = target.res();
    let field_manager = query.get("fieldManager").map(String::as_str);
    match (target.name.clone(), target.subresource.as_deref()) {
        (None, None) => match *method {
            Method::GET if flag(query, "watch") == Some(true) => watch(shared, &target, query),
            Method::GET => list(shared, &target, query),
            Method::POST if target.namespace.is_some() || !res.namespaced => {
                ops::create(shared, &target, body).map(|o| Reply::Json(201, o))
            }
            _ => Err(ApiError::method_not_allowed()),
        },
        (Some(name), sub @ (None | Some("status"))) if sub.is_none() || res.status_subresource => {
            let part = if sub.is_none() {
                Part::Main
            } else {
                Part::Status
            };
            match *method {
                Method::GET => ops::get(shared, &target, &name).map(|o| Reply::Json(200, o)),
                Method::PUT => {
                    ops::update(shared, &target, &name, body, part).map(|o| Reply::Json(200, o))
                }
                Method::PATCH => {
                    let kind = patch_type(content_type)?;
                    ops::patch(shared, &target, &name, kind, body, field_manager, part)
                        .map(|o| Reply::Json(200, o))
                }
                Method::DELETE if part == Part::Main => {
                    let mut options = DeleteOptions::from_json(body.as_ref());
                    if let Some(grace) =
                        query.get("gracePeriodSeconds").and_then(|g| g.parse().ok())
                    {
                        options.grace_period_seconds = Some(grace);
                    }
                    let deleted = ops::delete(shared, &target, &name, &options)?;
                    Ok(Reply::Json(200, ops::delete_response(res, deleted)))
                }
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        (Some(name), Some("eviction")) if res.kind == "Pod" => match *method {
            Method::POST => ops::evict(shared, &target, &name, body).map(|s| Reply::Json(201, s)),
            _ => Err(ApiError::method_not_allowed()),
        },
        _ => Err(ApiError::no_route()),
    }
}

fn patch_type(content_type: Option<&str>) -> Result<PatchType, ApiError> {
    let content_type = content_type.unwrap_or_default();
    PatchType::from_content_type(content_type)
        .ok_or_else(|| ApiError::unsupported_media_type(content_type))
}

fn selector(target: &Target, query: &Query) -> Result<Selector, ApiError> {
    Selector::parse(
        target.res(),
        query.get("fieldSelector").map(String::as_str),
        query.get("labelSelector").map(String::as_str),
    )
}

/// A list: always the current state, whatever `resourceVersion` asks; `limit` and `continue`
/// are ignored (everything in one page, no continue token).
fn list(shared: &Shared, target: &Target, query: &Query) -> Result<Reply, ApiError> {
    let res = target.res();
    let selector = selector(target, query)?;
    let store = shared.store.lock().expect("store lock");
    let items: Vec<Value> = store
        .list(target.resource, target.namespace.as_deref())
        .into_iter()
        .filter(|o| selector.matches(o))
        .map(|mut o| {
            // The real server leaves kind and apiVersion out of list items.
            if let Some(map) = o.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            o
        })
        .collect();
    Ok(Reply::Json(
        200,
        json!({
            "kind": res.list_kind(),
            "apiVersion": res.api_version(),
            "metadata": { "resourceVersion": store.resource_version().to_string() },
            "items": items,
        }),
    ))
}

fn watch(shared: &Arc<Shared>, target: &Target, query: &Query) -> Result<Reply, ApiError> {
    let selector = selector(target, query)?;
    let from = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?,
        ),
    };
    let send_initial_events = flag(query, "sendInitialEvents");
    if send_initial_events == Some(true)
        && query.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan")
    {
        return Err(ApiError::bad_request(
            "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
        ));
    }
    let req = WatchRequest {
        resource: target.resource,
        namespace: target.namespace.clone(),
        selector,
        from,
        bookmarks: flag(query, "allowWatchBookmarks") == Some(true),
        send_initial_events,
        timeout: query
            .get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .map(Duration::from_secs),
    };
    let rx = watch::start(Arc::clone(shared), req);
    let lines = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<_, std::convert::Infallible>(line), rx))
    });
    Ok(Reply::Stream(Body::from_stream(lines)))
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "gitVersion": "v1.37.0-qoslet-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn core_versions(shared: &Shared) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string() }],
    })
}

/// The Workload API's group, which [`super::Options::workload_api`] can leave unserved.
const WORKLOAD_GROUP: &str = "scheduling.k8s.io";

fn groups(served: &dyn Fn(&str) -> bool) -> Value {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for res in RESOURCES
        .iter()
        .filter(|r| !r.group.is_empty() && served(r.group))
    {
        match groups.iter_mut().find(|(g, _)| *g == res.group) {
            Some((_, versions)) if !versions.contains(&res.version) => versions.push(res.version),
            Some(_) => {}
            None => groups.push((res.group, vec![res.version])),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({ "groupVersion": format!("{group}/{v}"), "version": v }))
                .collect();
            json!({ "name": group, "versions": versions, "preferredVersion": versions[0] })
        })
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

fn resources(group: &str, version: &str) -> Option<Value> {
    let mut out = Vec::new();
    for res in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let verbs = [
            "create", "delete", "get", "list", "patch", "update", "watch",
        ];
        out.push(json!({
            "name": res.plural, "singularName": res.singular, "namespaced": res.namespaced,
            "kind": res.kind, "verbs": verbs,
        }));
        if res.status_subresource {
            out.push(json!({
                "name": format!("{}/status", res.plural), "singularName": "", "namespaced": res.namespaced,
                "kind": res.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if res.kind == "Pod" {
            out.push(json!({
                "name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy",
                "version": "v1", "kind": "Eviction", "verbs": ["create"],
            }));
        }
    }
    if out.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": out }),
    )
}
