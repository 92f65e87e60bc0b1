//! The object store: objects by (type, namespace, name), one global resourceVersion bumped by
//! every write (as etcd's revision is), and the history of changes that watches replay, kept
//! until compacted.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use serde_json::{Value, json};
use tokio::sync::watch;

use super::{
    resources::{RESOURCES, ResourceId, ResourceType},
    status::ApiError,
};

/// Where an object lives. `namespace` is empty for cluster-scoped types.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub resource: ResourceId,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn res(&self) -> &'static ResourceType {
        &RESOURCES[self.resource]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One write, as watches see it.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub resource: ResourceId,
    pub kind: ChangeKind,
    /// The object before the write (`None` on create); watches with a selector use it to turn a
    /// change into ADDED or DELETED when the object enters or leaves the selection.
    pub prev: Option<Value>,
    /// The object after the write; for a delete, the last state with the delete's
    /// resourceVersion.
    pub object: Value,
}

/// Which part of an object a write may change: `/status` writes change only `status`, writes
/// to the object itself leave `status` alone on types with a status subresource, and the test
/// controls change both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
    Whole,
}

pub struct Store {
    objects: BTreeMap<ObjectKey, Value>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// A watch may resume from any resourceVersion at or after this one.
    floor: u64,
    /// How many times [`Store::compact`] ran; open watches end with 410 when it changes.
    compactions: u64,
    history_limit: usize,
    /// Pods whose eviction a PodDisruptionBudget blocks: (namespace, name) to the budget's name.
    pub blocked_evictions: HashMap<(String, String), String>,
    uid_salt: u64,
    next_uid: u64,
    notify: watch::Sender<u64>,
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let salt = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self {
            objects: BTreeMap::new(),
            // Start above zero so "0" (any version) never names a real revision.
            rv: 1,
            history: VecDeque::new(),
            floor: 1,
            compactions: 0,
            history_limit,
            blocked_evictions: HashMap::new(),
            uid_salt: salt,
            next_uid: 0,
            notify: watch::channel(1).0,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// A receiver that changes on every write.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of a type, in one namespace or all, ordered by namespace and name.
    pub fn list(&self, resource: ResourceId, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.resource == resource && namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Creates the object: fills kind, apiVersion, name, namespace, uid, creationTimestamp and
    /// resourceVersion. 409 AlreadyExists when it exists.
    pub fn create(&mut self, key: &ObjectKey, mut object: Value) -> Result<Value, ApiError> {
        let res = key.res();
        if self.objects.contains_key(key) {
            return Err(ApiError::already_exists(res, &key.name));
        }
        if !object.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        object["kind"] = json!(res.kind);
        object["apiVersion"] = json!(res.api_version());
        if !object["metadata"].is_object() {
            object["metadata"] = json!({});
        }
        let meta = &mut object["metadata"];
        meta["name"] = json!(key.name);
        if res.namespaced {
            meta["namespace"] = json!(key.namespace);
        }
        self.next_uid += 1;
        let (salt, n) = (self.uid_salt, self.next_uid);
        meta["uid"] = json!(format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            salt & 0xffff_ffff,
            (salt >> 32) & 0xffff,
            (salt >> 48) & 0xfff,
            (n >> 48) & 0xfff,
            n & 0xffff_ffff_ffff
        ));
        meta["creationTimestamp"] = json!(now());
        if let Some(m) = meta.as_object_mut() {
            m.remove("resourceVersion");
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
        }
        Ok(self.record(key, ChangeKind::Added, None, object))
    }

    /// Replaces the object with `object`, keeping what the write may not change (see [`Part`])
    /// and its identity (uid, creationTimestamp). 404 when missing; 409 when `object` carries a
    /// resourceVersion other than the current one. A write that changes nothing is not a write:
    /// it returns the object without bumping its resourceVersion, as the real server does.
    pub fn update(
        &mut self,
        key: &ObjectKey,
        mut object: Value,
        part: Part,
    ) -> Result<Value, ApiError> {
        let res = key.res();
        let Some(old) = self.objects.get(key) else {
            return Err(ApiError::not_found(res, &key.name));
        };
        if !object.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        let sent_rv = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str);
        if sent_rv.is_some_and(|rv| {
            Some(rv)
                != old
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
        }) {
            return Err(ApiError::stale(res, &key.name));
        }
        // metadata.uid is immutable: a write naming another uid (the kubelet's status patch
        // carries the pod's as a precondition) is refused as the API server's validation does.
        if let Some(sent) = object.pointer("/metadata/uid").and_then(Value::as_str)
            && Some(sent) != old.pointer("/metadata/uid").and_then(Value::as_str)
        {
            return Err(ApiError::invalid(
                res,
                &key.name,
                "metadata.uid",
                &format!("Invalid value: \"{sent}\": field is immutable"),
            ));
        }
        match part {
            Part::Status => {
                let status = object.get("status").cloned();
                object = old.clone();
                match status {
                    Some(status) => object["status"] = status,
                    None => remove_field(&mut object, "status"),
                }
            }
            Part::Main if res.status_subresource => match old.get("status") {
                Some(status) => object["status"] = status.clone(),
                None => remove_field(&mut object, "status"),
            },
            Part::Main | Part::Whole => {}
        }
        object["kind"] = json!(res.kind);
        object["apiVersion"] = json!(res.api_version());
        if !object["metadata"].is_object() {
            object["metadata"] = json!({});
        }
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "deletionTimestamp",
        ] {
            match old["metadata"].get(field) {
                Some(v) => object["metadata"][field] = v.clone(),
                None => remove_field(&mut object["metadata"], field),
            }
        }
        if object == *old {
            return Ok(object);
        }
        let prev = old.clone();
        Ok(self.record(key, ChangeKind::Modified, Some(prev), object))
    }

    /// Sets or clears `metadata.deletionTimestamp` (graceful pod deletion), a write of its own.
    pub fn mark_deleted(&mut self, key: &ObjectKey, grace_seconds: i64) -> Option<Value> {
        let old = self.objects.get(key)?;
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            return Some(old.clone());
        }
        let prev = old.clone();
        let mut object = old.clone();
        let when = SystemTime::now() + std::time::Duration::from_secs(grace_seconds.max(0) as u64);
        object["metadata"]["deletionTimestamp"] = json!(format_time(when));
        object["metadata"]["deletionGracePeriodSeconds"] = json!(grace_seconds);
        Some(self.record(key, ChangeKind::Modified, Some(prev), object))
    }

    /// Removes the object; returns its last state with the delete's resourceVersion.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Value> {
        let old = self.objects.get(key)?.clone();
        Some(self.record(key, ChangeKind::Deleted, Some(old.clone()), old))
    }

    /// The changes after `rv`, or 410 Expired when some of them were compacted away.
    pub fn changes_after(&self, rv: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        if rv < self.floor {
            return Err(ApiError::expired(rv, self.floor));
        }
        let start = self.history.partition_point(|c| c.rv <= rv);
        Ok(self.history.range(start..).cloned().collect())
    }

    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// The 410 a watch at `rv` gets once the history it needed is gone.
    pub fn expired(&self, rv: u64) -> ApiError {
        ApiError::expired(rv, self.floor)
    }

    /// Forgets all history: a watch can then only start at the current resourceVersion, and
    /// open watches end with 410 Expired, as they do when the server's watch cache is
    /// re-initialised.
    pub fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
        self.compactions += 1;
        // Wake watches so that those behind the new floor learn they expired.
        self.notify.send_replace(self.rv);
    }

    fn record(
        &mut self,
        key: &ObjectKey,
        kind: ChangeKind,
        prev: Option<Value>,
        mut object: Value,
    ) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        match kind {
            ChangeKind::Deleted => {
                self.objects.remove(key);
            }
            ChangeKind::Added | ChangeKind::Modified => {
                self.objects.insert(key.clone(), object.clone());
            }
        }
        self.history.push_back(Arc::new(Change {
            rv: self.rv,
            resource: key.resource,
            kind,
            prev,
            object: object.clone(),
        }));
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.floor = dropped.rv;
            }
        }
        self.notify.send_replace(self.rv);
        object
    }
}

fn remove_field(object: &mut Value, field: &str) {
    if let Some(map) = object.as_object_mut() {
        map.remove(field);
    }
}

/// RFC 3339 in seconds, as `metav1.Time` marshals.
pub fn now() -> String {
    format_time(SystemTime::now())
}

fn format_time(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs as i64)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}
