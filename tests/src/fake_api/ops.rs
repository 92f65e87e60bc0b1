//! The API operations behind the HTTP verbs: create, update, patch, delete (with
//! `DeleteOptions`), and the pod eviction subresource, with the real server's rules for each.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    Shared,
    patch::{self, PatchType},
    resources::{ResourceType, Target},
    status::{self, ApiError},
    store::{ObjectKey, Part},
};

/// Pods with this phase, being deleted already, or Pending, are evicted even when a disruption
/// budget would forbid it (`canIgnorePDB` in `pkg/registry/core/pod/storage/eviction.go`).
const PDB_EXEMPT_PHASES: &[&str] = &["Succeeded", "Failed", "Pending"];

/// The kubelet's default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE_SECONDS: i64 = 30;

pub fn key(target: &Target, name: &str) -> ObjectKey {
    ObjectKey {
        resource: target.resource,
        namespace: target.namespace.clone().unwrap_or_default(),
        name: name.to_string(),
    }
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

pub fn get(shared: &Shared, target: &Target, name: &str) -> Result<Value, ApiError> {
    let store = shared.store.lock().expect("store lock");
    store
        .get(&key(target, name))
        .cloned()
        .ok_or_else(|| ApiError::not_found(target.res(), name))
}

/// POST on a collection.
pub fn create(shared: &Shared, target: &Target, body: Option<Value>) -> Result<Value, ApiError> {
    let res = target.res();
    let mut body = body.ok_or_else(|| ApiError::bad_request("the body of the request is empty"))?;
    if let (Some(sent), Some(ns)) = (meta_str(&body, "namespace"), target.namespace.as_deref())
        && sent != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let name = match (meta_str(&body, "name"), meta_str(&body, "generateName")) {
        (Some(name), _) if !name.is_empty() => name.to_string(),
        (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", suffix(shared)),
        _ => {
            return Err(ApiError::invalid(
                res,
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            ));
        }
    };
    body["metadata"]["name"] = json!(name);
    shared
        .store
        .lock()
        .expect("store lock")
        .create(&key(target, &name), body)
}

/// Five characters from the alphabet `generateName` uses, from the write counter.
fn suffix(shared: &Shared) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = shared.store.lock().expect("store lock").resource_version() * 7919 + 104_729;
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// PUT on an object or its status.
pub fn update(
    shared: &Shared,
    target: &Target,
    name: &str,
    body: Option<Value>,
    part: Part,
) -> Result<Value, ApiError> {
    let body = body.ok_or_else(|| ApiError::bad_request("the body of the request is empty"))?;
    if let Some(sent) = meta_str(&body, "name")
        && sent != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({sent}) does not match the name on the URL ({name})"
        )));
    }
    shared
        .store
        .lock()
        .expect("store lock")
        .update(&key(target, name), body, part)
}

/// PATCH on an object or its status. Server-side apply creates a missing object.
pub fn patch(
    shared: &Shared,
    target: &Target,
    name: &str,
    kind: PatchType,
    body: Option<Value>,
    field_manager: Option<&str>,
    part: Part,
) -> Result<Value, ApiError> {
    let res = target.res();
    let body = body.ok_or_else(|| ApiError::bad_request("the body of the request is empty"))?;
    if kind == PatchType::Apply && field_manager.is_none_or(str::is_empty) {
        return Err(ApiError {
            code: 422,
            reason: "Invalid",
            message: "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
                .into(),
            details: Some(json!({ "group": "meta.k8s.io", "kind": "PatchOptions", "causes": [
                { "reason": "FieldValueRequired", "message": "Required value: is required for apply patch", "field": "fieldManager" }
            ]})),
        });
    }
    let key = key(target, name);
    let mut store = shared.store.lock().expect("store lock");
    let Some(current) = store.get(&key).cloned() else {
        if kind == PatchType::Apply && part == Part::Main {
            let mut object = json!({});
            patch::apply(kind, &mut object, &body);
            return store.create(&key, object);
        }
        return Err(ApiError::not_found(res, name));
    };
    let mut patched = current;
    patch::apply(kind, &mut patched, &body);
    store.update(&key, patched, part)
}

/// The `DeleteOptions` fields the fake reads.
#[derive(Debug, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

impl DeleteOptions {
    pub fn from_json(body: Option<&Value>) -> Self {
        let Some(body) = body else {
            return Self::default();
        };
        let text = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
        Self {
            grace_period_seconds: body.get("gracePeriodSeconds").and_then(Value::as_i64),
            uid: text("/preconditions/uid"),
            resource_version: text("/preconditions/resourceVersion"),
        }
    }
}

fn check_preconditions(
    res: &ResourceType,
    name: &str,
    object: &Value,
    options: &DeleteOptions,
) -> Result<(), ApiError> {
    let uid = meta_str(object, "uid").unwrap_or_default();
    if let Some(want) = options.uid.as_deref()
        && want != uid
    {
        return Err(ApiError::conflict(
            res,
            name,
            &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
        ));
    }
    let rv = meta_str(object, "resourceVersion").unwrap_or_default();
    if let Some(want) = options.resource_version.as_deref()
        && want != rv
    {
        return Err(ApiError::conflict(
            res,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
            ),
        ));
    }
    Ok(())
}

/// What a DELETE did.
pub enum Deleted {
    /// Removed: its last state.
    Gone(Value),
    /// A pod on a node, marked with `deletionTimestamp` for its kubelet to finish.
    Terminating(Value),
}

/// DELETE on an object. A pod bound to a node with a grace period above zero is marked with
/// `deletionTimestamp`/`deletionGracePeriodSeconds` (the kubelet finishes the deletion; the fake
/// does after `Options::kubelet_delete_after`); other objects, and a grace period of 0, remove
/// the object at once.
pub fn delete(
    shared: &Arc<Shared>,
    target: &Target,
    name: &str,
    options: &DeleteOptions,
) -> Result<Deleted, ApiError> {
    let res = target.res();
    let key = key(target, name);
    let mut store = shared.store.lock().expect("store lock");
    let object = store
        .get(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(res, name))?;
    check_preconditions(res, name, &object, options)?;
    let is_pod = res.kind == "Pod" && res.group.is_empty();
    let bound = object
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let terminal = matches!(
        object.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    let grace = options
        .grace_period_seconds
        .or_else(|| {
            object
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    if is_pod && bound && !terminal && grace > 0 {
        let marked = store
            .mark_deleted(&key, grace)
            .ok_or_else(|| ApiError::not_found(res, name))?;
        drop(store);
        if let Some(after) = shared.options.kubelet_delete_after {
            let uid = meta_str(&marked, "uid").unwrap_or_default().to_string();
            let shared = Arc::clone(shared);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let mut store = shared.store.lock().expect("store lock");
                if store.get(&key).and_then(|o| meta_str(o, "uid")) == Some(uid.as_str()) {
                    store.remove(&key);
                }
            });
        }
        return Ok(Deleted::Terminating(marked));
    }
    store
        .remove(&key)
        .map(Deleted::Gone)
        .ok_or_else(|| ApiError::not_found(res, name))
}

/// The body a DELETE answers with: pods return the object, other types a `Status` naming it.
pub fn delete_response(res: &ResourceType, deleted: Deleted) -> Value {
    let object = match deleted {
        Deleted::Gone(o) | Deleted::Terminating(o) => o,
    };
    if res.kind == "Pod" {
        return object;
    }
    let mut body = status::success(200);
    body["details"] = json!({
        "name": meta_str(&object, "name"),
        "group": res.group,
        "kind": res.plural,
        "uid": meta_str(&object, "uid"),
    });
    body
}

/// POST `pods/NAME/eviction` (policy/v1 Eviction): 201 with a Success `Status` after deleting
/// the pod with the eviction's `deleteOptions`, 429 when a disruption budget blocks it, 404 when
/// the pod does not exist.
pub fn evict(
    shared: &Arc<Shared>,
    target: &Target,
    name: &str,
    body: Option<Value>,
) -> Result<Value, ApiError> {
    let res = target.res();
    if res.kind != "Pod" {
        return Err(ApiError::no_route());
    }
    if let Some(sent) = body.as_ref().and_then(|b| meta_str(b, "name"))
        && sent != name
    {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let pod = get(shared, target, name)?;
    let namespace = target.namespace.clone().unwrap_or_default();
    let budget = {
        let store = shared.store.lock().expect("store lock");
        store
            .blocked_evictions
            .get(&(namespace, name.to_string()))
            .cloned()
    };
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let exempt =
        PDB_EXEMPT_PHASES.contains(&phase) || pod.pointer("/metadata/deletionTimestamp").is_some();
    if let Some(budget) = budget
        && !exempt
    {
        return Err(ApiError::disruption_budget(&budget));
    }
    let options = DeleteOptions::from_json(body.as_ref().and_then(|b| b.get("deleteOptions")));
    delete(shared, target, name, &options)?;
    Ok(status::success(201))
}
