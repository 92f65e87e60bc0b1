//! A **test fake** of the Kubernetes API server: an HTTP server on loopback that speaks enough of
//! the real wire protocol for kube-rs (the `kube` client and kube-runtime's watcher and
//! reflector) to work against it unmodified. It exists because no API server can be installed
//! on the machines that test qoslet's cluster mode; it is not an API server and must never be
//! pointed at by anything but tests, benches and manual runs.
//!
//! Hand-written because no crate offers this: kube's own `tower_test` mocks answer one scripted
//! request at a time, and a real server (kind, envtest) needs binaries these machines cannot
//! fetch.
//!
//! # What it implements
//! - Resources (JSON objects, k8s-openapi's wire format): core/v1 Pods (namespaced and the
//!   cluster-wide `/api/v1/pods`), Nodes, Events; events.k8s.io/v1 Events;
//!   coordination.k8s.io/v1 Leases; scheduling.k8s.io/v1beta1 Workloads and PodGroups;
//!   scheduling.k8s.io/v1alpha3 CompositePodGroups ([`resources`]). Every verb (get, list,
//!   watch, create, update, patch, delete) on each; `status` subresources on Pods, Nodes and the
//!   scheduling kinds; the `pods/eviction` subresource.
//! - TokenReview and SubjectAccessReview (create), answered from a table the test sets
//!   ([`FakeApi::add_token`], [`FakeApi::allow`]; [`reviews`]).
//! - Minimal discovery: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/GROUP/VERSION`.
//! - One global resourceVersion bumped by every write; `uid`, `creationTimestamp` set on create;
//!   identity fields kept on update; a write that changes nothing keeps the resourceVersion;
//!   PUT with a stale `metadata.resourceVersion` is 409 Conflict ([`store`]).
//! - list: the current state; `fieldSelector` (`=`, `==`, `!=` on the fields each type supports,
//!   e.g. `spec.nodeName`, `metadata.name`, `metadata.namespace`, `status.phase`; others are 400
//!   `field label not supported`), `labelSelector` (equality and set-based) ([`select`]).
//! - watch (`watch=true|1`): `resourceVersion`, `allowWatchBookmarks` (periodic BOOKMARKs),
//!   `timeoutSeconds`, `sendInitialEvents` (with the `k8s.io/initial-events-end` bookmark),
//!   selectors with the watch cache's ADDED/DELETED on entering/leaving the selection, and
//!   410 `Expired` as an ERROR event when the requested version is older than the kept history
//!   ([`watch`]).
//! - PATCH: merge, strategic merge (lists merged by their patch merge key for the fields in
//!   [`patch`]; `status.conditions` by `type`), server-side apply treated as a strategic merge.
//! - DELETE with `DeleteOptions` (`gracePeriodSeconds`, `preconditions.uid`,
//!   `preconditions.resourceVersion`; 409 on a mismatch); a pod bound to a node is marked with
//!   `deletionTimestamp` and removed after [`Options::kubelet_delete_after`], as its kubelet
//!   would; everything else goes at once ([`ops`]).
//! - Eviction: 201 Success `Status`, 429 `TooManyRequests` when blocked by a (simulated)
//!   disruption budget, 404 when the pod is missing.
//! - `Status` error bodies worded as the real server words them ([`status`]).
//! - Test controls on [`FakeApi`]: seed, create, replace, modify and delete objects while
//!   running (watches see them), block eviction per pod, compact the history, go down (refuse
//!   connections, answer 503, never answer) and come back on the same port, inject faults
//!   (watches that end, are cut mid-line or expire, garbage bodies, 429/503 with Retry-After:
//!   [`Outage`]), hang the requests a test chooses while serving the rest
//!   ([`FakeApi::hang`]), and a request log (with a hook on each request as it arrives,
//!   [`FakeApi::on_arrival`], and as it is answered). Over HTTP under `/_fake/`, for a fake that runs as its own
//!   process ([`control`]): the object and eviction controls, compaction, 503 and the log.
//!
//! # What it does not implement
//! - Authentication and authorization of its own clients (every request is served; [`rbac`]
//!   checks a log against the shipped RBAC afterwards), admission, validation beyond the name, defaulting (a pod's
//!   `status.phase` and `qosClass` are whatever was written), `generation`, finalizers, owner
//!   references and garbage collection, namespaces as objects, `dryRun`.
//! - Resources other than those above (404), subresources other than `status` and `eviction`.
//! - list pagination: `limit` and `continue` are ignored (one page, no continue token); a list
//!   is always served from the current state whatever `resourceVersion` and
//!   `resourceVersionMatch` ask. A watch from a resourceVersion in the future starts there
//!   instead of waiting or answering 504.
//! - JSON patch (`application/json-patch+json`, 415); strategic merge's `$retainKeys`,
//!   `$setElementOrder` and `$deleteFromPrimitiveList` (dropped); server-side apply's field
//!   ownership, managedFields and conflicts.
//! - Protobuf, table output, HTTP/2, TLS (plain HTTP on 127.0.0.1), watch over WebSocket.
//! - PodDisruptionBudgets as objects: a per-pod switch stands for them.

mod control;
mod handler;
mod kubeconfig;
mod log;
mod ops;
mod patch;
pub mod rbac;
mod resources;
mod reviews;
mod seed;
mod select;
mod server;
mod status;
mod store;
mod watch;

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::Router;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use tokio::task::JoinHandle;

pub use kubeconfig::kubeconfig;
pub use log::RequestRecord;
pub use seed::{SeedError, load as load_seed, parse as parse_seed};
pub use status::ApiError;

use store::{ObjectKey, Part, Store};

/// How the fake behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to listen; port 0 picks an ephemeral port.
    pub addr: SocketAddr,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK (the real server sends
    /// about one a minute; tests want them sooner).
    pub bookmark_interval: Duration,
    /// Changes kept for watches to resume from; older ones are compacted away.
    pub history_limit: usize,
    /// How long after a graceful delete (or eviction) of a pod bound to a node the fake removes
    /// it, standing in for its kubelet; `None` leaves it terminating until a test removes it.
    pub kubelet_delete_after: Option<Duration>,
    /// Serve the Workload API (`scheduling.k8s.io` Workloads, PodGroups, CompositePodGroups);
    /// `false` is a cluster without it, as most are: discovery and every request 404.
    pub workload_api: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            bookmark_interval: Duration::from_secs(1),
            history_limit: 10_000,
            kubelet_delete_after: Some(Duration::from_millis(100)),
            workload_api: true,
        }
    }
}

/// How the fake is unavailable while down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// The listener and every connection are closed: connects are refused.
    Refuse,
    /// Connections are accepted and every request answers 503 ServiceUnavailable; open watches
    /// end.
    Unavailable,
    /// Connections and requests are accepted and never answered, as over a half-open
    /// connection or from a hung server: a request waits, unrecorded and not applied, until the
    /// client gives up on it (then it never happened) or the fake comes up (then it is served).
    Silent,
    /// Every other request is served, but a watch ends at once, without an event or an error
    /// (as behind a proxy with a short idle timeout): a client that watches again at once asks
    /// without end.
    WatchesEnd,
    /// Every other request is served, but a watch's connection is closed in the middle of its
    /// first event line (as by a proxy or load balancer that drops the connection).
    WatchesCut,
    /// Every other request is served, but a watch answers 200 with one `ERROR` event, 410
    /// `Expired`, and ends: what the API server sends when the watch cache no longer holds the
    /// version asked for. A client relists and watches again.
    WatchesExpire,
    /// Every other request is served, but a watch answers HTTP 410 `Expired` (a `Status` body,
    /// no stream).
    WatchesGone,
    /// Every API request answers 200 with a body that is not JSON.
    Garbage,
    /// Every API request answers `code` (429 or 503) with a `Retry-After: retry_after` header
    /// and `details.retryAfterSeconds`, as the API server's priority and fairness does when it
    /// sheds load; open watches end.
    Throttled { code: u16, retry_after: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum FakeApiError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the fake API server does not serve {kind} in {api_version}")]
    UnknownKind { api_version: String, kind: String },
    #[error("the object is not valid JSON for the fake")]
    Encode(#[source] serde_json::Error),
    #[error("the fake API server refused the write")]
    Api(#[source] ApiError),
}

/// State shared by the handlers and the controls.
/// See [`FakeApi::on_request`].
pub type RequestHook = Arc<dyn Fn(&RequestRecord) + Send + Sync>;

/// See [`FakeApi::on_arrival`].
pub type ArrivalHook = Arc<dyn Fn(&Arrived) + Send + Sync>;

/// Which requests [`FakeApi::hang`] holds.
type HangPredicate = Arc<dyn Fn(&Arrived) -> bool + Send + Sync>;

/// A request as it arrives, before any fault or answer: one that is never answered (a silent
/// outage, [`FakeApi::hang`]) is seen here only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrived {
    pub method: String,
    pub path: String,
    /// The raw query string ("" when none).
    pub query: String,
}

impl Arrived {
    pub fn is_watch(&self) -> bool {
        log::url_decode_pairs(&self.query)
            .iter()
            .any(|(k, v)| k == "watch" && matches!(v.as_str(), "true" | "1"))
    }
}

struct Shared {
    store: Mutex<Store>,
    reviews: Mutex<reviews::Reviews>,
    log: Mutex<Vec<RequestRecord>>,
    /// Called with each request as it is answered, before the client has the answer.
    on_request: Mutex<Option<RequestHook>>,
    /// Called with each API request as it arrives.
    on_arrival: Mutex<Option<ArrivalHook>>,
    /// While set, the requests it matches wait ([`FakeApi::hang`]).
    hang: tokio::sync::watch::Sender<Option<HangPredicate>>,
    unavailable: AtomicBool,
    /// The fault the handlers apply to each request now: any [`Outage`] but `Refuse`,
    /// `Unavailable` and `Silent`, which have their own switches.
    fault: Mutex<Option<Outage>>,
    /// While true, requests wait ([`Outage::Silent`]).
    silent: tokio::sync::watch::Sender<bool>,
    /// Bumped to end every open watch.
    epoch: tokio::sync::watch::Sender<u64>,
    options: Options,
    addr: SocketAddr,
}

/// A running fake API server and its test controls. Dropping it stops the server.
pub struct FakeApi {
    shared: Arc<Shared>,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl FakeApi {
    /// Starts listening. Must run inside a tokio runtime.
    pub async fn start(options: Options) -> Result<Self, FakeApiError> {
        let listener = server::bind(options.addr).map_err(|source| FakeApiError::Bind {
            addr: options.addr,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| FakeApiError::Bind {
            addr: options.addr,
            source,
        })?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(options.history_limit.max(1))),
            reviews: Mutex::default(),
            log: Mutex::new(Vec::new()),
            on_request: Mutex::new(None),
            on_arrival: Mutex::new(None),
            hang: tokio::sync::watch::Sender::new(None),
            unavailable: AtomicBool::new(false),
            fault: Mutex::new(None),
            silent: tokio::sync::watch::Sender::new(false),
            epoch: tokio::sync::watch::channel(0).0,
            options: Options {
                bookmark_interval: options.bookmark_interval.max(Duration::from_millis(1)),
                ..options
            },
            addr,
        });
        let task = server::serve(listener, router(&shared));
        Ok(Self {
            shared,
            server: Mutex::new(Some(task)),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// Writes a kubeconfig for this server, with `default` as its namespace.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, kubeconfig(&self.url(), "default"))
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().resource_version()
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared.store.lock().expect("store lock")
    }

    /// Creates each object (`apiVersion` and `kind` pick the type; namespaced objects without a
    /// namespace go to `default`).
    pub fn seed(&self, objects: impl IntoIterator<Item = Value>) -> Result<(), FakeApiError> {
        objects
            .into_iter()
            .try_for_each(|o| self.create_json(o).map(drop))
    }

    /// Creates a typed object; returns it as stored (uid, resourceVersion, ...).
    pub fn create<K: k8s_openapi::Resource + Serialize + DeserializeOwned>(
        &self,
        object: &K,
    ) -> Result<K, FakeApiError> {
        let value = serde_json::to_value(object).map_err(FakeApiError::Encode)?;
        serde_json::from_value(self.create_json(value)?).map_err(FakeApiError::Encode)
    }

    /// Creates an object given as JSON, status included.
    pub fn create_json(&self, object: Value) -> Result<Value, FakeApiError> {
        let key = key_of(&object)?;
        if key.name.is_empty() {
            return Err(FakeApiError::Api(ApiError::invalid(
                key.res(),
                "",
                "metadata.name",
                "Required value: name is required",
            )));
        }
        self.store().create(&key, object).map_err(FakeApiError::Api)
    }

    /// Replaces an object (status included), or creates it when missing.
    pub fn apply_json(&self, object: Value) -> Result<Value, FakeApiError> {
        apply_object(&mut self.store(), object)
    }

    /// Changes a stored object in place (status included) as one write.
    pub fn modify<K: k8s_openapi::Resource>(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Result<Value, FakeApiError> {
        let key = key_for(K::API_VERSION, K::KIND, namespace, name)?;
        let mut store = self.store();
        let mut object = store
            .get(&key)
            .cloned()
            .ok_or_else(|| FakeApiError::Api(ApiError::not_found(key.res(), name)))?;
        change(&mut object);
        store
            .update(&key, object, Part::Whole)
            .map_err(FakeApiError::Api)
    }

    /// A stored object (`namespace` is ignored for cluster-scoped types).
    pub fn get<K: k8s_openapi::Resource + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        let key = key_for(K::API_VERSION, K::KIND, namespace, name).ok()?;
        self.store()
            .get(&key)
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok())
    }

    /// Removes an object at once (no grace period); returns its last state.
    pub fn remove<K: k8s_openapi::Resource>(&self, namespace: &str, name: &str) -> Option<Value> {
        let key = key_for(K::API_VERSION, K::KIND, namespace, name).ok()?;
        self.store().remove(&key)
    }

    /// Makes the eviction of a pod answer 429, as a PodDisruptionBudget named `budget` with no
    /// disruptions allowed would.
    pub fn block_eviction(&self, namespace: &str, name: &str, budget: &str) {
        self.store().blocked_evictions.insert(
            (namespace.to_string(), name.to_string()),
            budget.to_string(),
        );
    }

    pub fn unblock_eviction(&self, namespace: &str, name: &str) {
        self.store()
            .blocked_evictions
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Makes a TokenReview of `token` authenticate it as `username` in `groups`.
    pub fn add_token(&self, token: &str, username: &str, groups: &[&str]) {
        self.shared
            .reviews
            .lock()
            .expect("reviews lock")
            .tokens
            .insert(
                token.to_owned(),
                serde_json::json!({"username": username, "uid": format!("uid-{username}"), "groups": groups}),
            );
    }

    /// Makes a SubjectAccessReview for `username` allowed when its spec has every field of
    /// `attributes` (e.g. `{"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}`).
    pub fn allow(&self, username: &str, attributes: Value) {
        self.shared
            .reviews
            .lock()
            .expect("reviews lock")
            .allowed
            .push((username.to_owned(), attributes));
    }

    /// Forgets the change history: a watch from any earlier resourceVersion, including open
    /// watches that have not caught up, gets 410 Expired.
    pub fn compact(&self) {
        self.store().compact();
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log.lock().expect("log lock").clone()
    }

    /// Calls `hook` with every request as the fake answers it, before the client reads the
    /// answer: what the node looked like while the API server took a write.
    pub fn on_request(&self, hook: impl Fn(&RequestRecord) + Send + Sync + 'static) {
        *self.shared.on_request.lock().expect("hook lock") = Some(Arc::new(hook));
    }

    /// Calls `hook` with every API request (not the `/_fake/` controls) as it arrives, before
    /// any fault: the requests a silent server or [`FakeApi::hang`] never answers are seen here
    /// only.
    pub fn on_arrival(&self, hook: impl Fn(&Arrived) + Send + Sync + 'static) {
        *self.shared.on_arrival.lock().expect("hook lock") = Some(Arc::new(hook));
    }

    /// The API requests `hang` matches from now on (and those waiting already) wait, unanswered
    /// and unrecorded, as behind a stuck connection or a hung handler, while every other request
    /// is served: until [`FakeApi::release`] (then they are served) or until the client gives
    /// up on them (then they never happened).
    pub fn hang(&self, hang: impl Fn(&Arrived) -> bool + Send + Sync + 'static) {
        self.shared.hang.send_replace(Some(Arc::new(hang)));
    }

    /// Ends [`FakeApi::hang`]: the requests it holds are served.
    pub fn release(&self) {
        self.shared.hang.send_replace(None);
    }

    pub fn clear_requests(&self) {
        self.shared.log.lock().expect("log lock").clear();
    }

    /// Makes the server unavailable (see [`Outage`]); open watches end either way.
    pub async fn go_down(&self, outage: Outage) {
        match outage {
            Outage::Refuse => {
                let task = self.server.lock().expect("server lock").take();
                if let Some(task) = task {
                    task.abort();
                    // Aborted is the expected outcome; waiting makes sure the port is closed.
                    let _ = task.await;
                }
            }
            Outage::Unavailable => self.shared.unavailable.store(true, Ordering::SeqCst),
            Outage::Silent => {
                self.shared.silent.send_replace(true);
            }
            fault => *self.shared.fault.lock().expect("fault lock") = Some(fault),
        }
        self.shared.epoch.send_modify(|e| *e += 1);
    }

    /// Serves again, on the same address.
    pub async fn come_up(&self) -> Result<(), FakeApiError> {
        self.shared.unavailable.store(false, Ordering::SeqCst);
        *self.shared.fault.lock().expect("fault lock") = None;
        self.shared.silent.send_replace(false);
        if self.server.lock().expect("server lock").is_some() {
            return Ok(());
        }
        let addr = self.shared.addr;
        let listener = server::bind(addr).map_err(|source| FakeApiError::Bind { addr, source })?;
        let task = server::serve(listener, router(&self.shared));
        *self.server.lock().expect("server lock") = Some(task);
        Ok(())
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Some(task) = self.server.lock().ok().and_then(|mut s| s.take()) {
            task.abort();
        }
        self.shared.epoch.send_modify(|e| *e += 1);
    }
}

fn router(shared: &Arc<Shared>) -> Router {
    Router::new()
        .fallback(handler::handle)
        .with_state(Arc::clone(shared))
}

/// Creates or replaces (status included) an object given as JSON.
fn apply_object(store: &mut Store, mut object: Value) -> Result<Value, FakeApiError> {
    let key = key_of(&object)?;
    if store.get(&key).is_none() {
        return store.create(&key, object).map_err(FakeApiError::Api);
    }
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    store
        .update(&key, object, Part::Whole)
        .map_err(FakeApiError::Api)
}

fn key_for(
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<ObjectKey, FakeApiError> {
    let resource =
        resources::by_kind(api_version, kind).ok_or_else(|| FakeApiError::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })?;
    let namespaced = resources::RESOURCES[resource].namespaced;
    Ok(ObjectKey {
        resource,
        namespace: if namespaced {
            namespace.to_string()
        } else {
            String::new()
        },
        name: name.to_string(),
    })
}

/// The key of an object given as JSON; namespaced objects without a namespace go to `default`.
fn key_of(object: &Value) -> Result<ObjectKey, FakeApiError> {
    let text = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let namespace = match text("/metadata/namespace") {
        "" => "default",
        ns => ns,
    };
    key_for(
        text("/apiVersion"),
        text("/kind"),
        namespace,
        text("/metadata/name"),
    )
}
