//! The API source: the node's pods and the workload objects they reference, from the API server.
//!
//! kube-runtime watchers feed reflector stores (kube-runtime handles relists, `410 Gone`, bookmarks
//! and restarts, under client-go's backoff: [`WatchBackoff`](super::client::WatchBackoff); lists
//! use `any_semantic`, served from the API server's cache): Pods with
//! `fieldSelector=spec.nodeName=NAME` and the Node itself (`metadata.name=NAME`). Workload-API
//! objects (Workloads and PodGroups, `scheduling.k8s.io/v1beta1`; CompositePodGroups, `v1alpha3`)
//! are watched one by one, only those the node's pods reference and their ancestors
//! (`metadata.name=X` in the namespace), so a node's cost does not grow with the cluster's gangs;
//! they are dynamic objects, decoded by the same workload decoder as manifests. A cluster that does
//! not serve the Workload API (API discovery says so) turns gang-awareness off
//! ([`GangAwareness::Off`]): pods go alone. Each change rebuilds the [`PodSet`] through the
//! manifest source's own door ([`build_set`]): every value from the API is validated exactly
//! as a file's, and the [`Diff`] is computed the same way. A pod is admitted once per
//! resourceVersion: one the last build admitted with the same uid and resourceVersion is kept as
//! it was ([`FromApi::unchanged`]), so a pod event costs the admission of that pod.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    fmt::Debug,
    hash::Hash,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, Resource,
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{
        WatchStreamExt as _,
        reflector::{Store, store::Writer},
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;
use thiserror::Error;
use tokio::{sync::watch, task::JoinHandle, time::Instant};

use self::trim::Trim;
use super::client::Answered;
use crate::{
    source::{
        PodSet,
        admit::{Admitted, AdmittedPod},
        build::build_set,
        manifest::{Loaded, RawObject},
        podset::{Diff, ManifestPod, diff},
    },
    support::lock,
    workload::{self, Typed, ValidationOptions, validate::reads_parent},
};

/// Where problem lines say an object came from.
pub(crate) const ORIGIN: &str = "api";

/// The API source stopped: every watcher task ended.
#[derive(Debug, Error)]
#[error("the API watchers stopped")]
pub struct SourceClosed;

/// What one watch is doing, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiWatchState {
    /// Listing (first list, or a relist after `410 Gone` or a restart).
    Listing,
    /// Listed and watching.
    Synced,
    /// The last request failed; kube-runtime retries with backoff.
    Failing(String),
}

/// One named watch: its state, and what tells a failure that has passed.
#[derive(Debug, Clone)]
struct Watched {
    state: ApiWatchState,
    /// The watch's resource path (`/api/v1/pods`).
    path: String,
    /// When its state was last set: a failing watch has recovered once a read of `path`
    /// succeeded after it.
    since: Instant,
}

/// The state of every watch, by name (`pods`, `node`, `workloads`, ...).
#[derive(Clone, Default)]
pub(crate) struct ApiWatchStates {
    watches: Arc<Mutex<BTreeMap<&'static str, Watched>>>,
    /// A failing watch whose path a read answered since is watching again: kube-runtime yields
    /// nothing for a watch re-established with nothing changed. A synced watch whose path's
    /// last watch was cut or ended at once is failing: kube-runtime sees no error in either.
    answered: Answered,
}

impl ApiWatchStates {
    pub(crate) fn new(answered: Answered) -> Self {
        Self {
            answered,
            ..Self::default()
        }
    }

    /// Every watch's state now, as `/readyz` says it: a watch kube-runtime holds synced is
    /// failing while its path's watches are cut or end at once ([`Answered::watch_failing`]).
    pub(crate) fn get(&self) -> BTreeMap<&'static str, ApiWatchState> {
        lock(&self.watches)
            .iter()
            .map(|(n, w)| {
                let state = match self.state(w) {
                    ApiWatchState::Synced => match self.answered.watch_failing(&w.path) {
                        Some(how) => ApiWatchState::Failing(how.into()),
                        None => ApiWatchState::Synced,
                    },
                    state => state,
                };
                (*n, state)
            })
            .collect()
    }

    /// A watch's state as kube-runtime's events and errors set it, a failure cleared once a
    /// read of its path succeeded after it.
    fn state(&self, w: &Watched) -> ApiWatchState {
        let recovered =
            matches!(w.state, ApiWatchState::Failing(_)) && self.answered.since(&w.path, w.since);
        if recovered {
            ApiWatchState::Synced
        } else {
            w.state.clone()
        }
    }

    /// Sets a state; true when it changed (a failure with the same error again is no change).
    fn set(&self, name: &'static str, path: &str, state: ApiWatchState) -> bool {
        let now = Watched {
            state,
            path: path.into(),
            since: Instant::now(),
        };
        lock(&self.watches)
            .insert(name, now.clone())
            .is_none_or(|was| was.state != now.state)
    }

    /// The pod watch listed at least once and no error of it since: all readiness needs (the
    /// Node object is only read at start; workload objects are optional). A cut watch, which
    /// `/readyz`'s line names failing, does not hold readiness back: the pods were listed.
    pub(crate) fn synced(&self) -> bool {
        lock(&self.watches)
            .get("pods")
            .is_some_and(|w| self.state(w) == ApiWatchState::Synced)
    }

    /// One line for `/readyz`: `pods synced, node listing, ...`.
    pub(crate) fn summary(&self) -> String {
        self.get()
            .iter()
            .map(|(n, s)| match s {
                ApiWatchState::Listing => format!("{n} listing"),
                ApiWatchState::Synced => format!("{n} synced"),
                ApiWatchState::Failing(e) => format!("{n} failing ({e})"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The workload kinds and where the API serves them.
pub(crate) fn workload_resources() -> [ApiResource; 3] {
    let ar = |version: &str, kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("scheduling.k8s.io", version, kind),
            plural,
        )
    };
    [
        ar("v1beta1", "Workload", "workloads"),
        ar("v1beta1", "PodGroup", "podgroups"),
        ar("v1alpha3", "CompositePodGroup", "compositepodgroups"),
    ]
}

/// The field selector of the node's pods.
pub(crate) fn pods_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// The listed pods bound to `node`, and the others. The watch asks for [`pods_selector`], but a
/// server or proxy that ignored the selector would hand over every node's pods, which this node
/// must never manage: their status written, their cgroups looked for, their memory counted.
pub(crate) fn on_node(pods: Vec<Arc<Pod>>, node: &str) -> (Vec<Arc<Pod>>, Vec<Arc<Pod>>) {
    pods.into_iter()
        .partition(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
}

/// A watcher configuration whose lists the API server may answer from its watch cache
/// (`resourceVersion=0`, `any_semantic`) instead of a quorum read of etcd: what informers do.
/// Unpaged, since a paged list is always read from etcd (kube then leaves `resourceVersion=0`
/// out); each list is one node's pods or one object.
fn from_cache(fields: &str) -> watcher::Config {
    let mut cfg = watcher::Config::default().fields(fields).any_semantic();
    cfg.page_size = None;
    cfg
}

/// The field selector of the Node object.
pub(crate) fn node_selector(node: &str) -> String {
    format!("metadata.name={node}")
}

/// Whether the cluster serves the Workload API, so eviction can be gang-aware.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GangAwareness {
    /// Not known yet (API discovery has not answered).
    Unknown,
    On,
    /// The cluster does not serve Workloads and PodGroups: every pod goes alone.
    Off,
}

/// A watch of one workload object, by (namespace, index in [`workload_resources`], name).
type ObjectKey = (String, usize, String);

struct ObjectWatch {
    store: Store<DynamicObject>,
    task: JoinHandle<()>,
}

/// The watched workload objects, shared with the eviction action.
#[derive(Clone, Default)]
pub(crate) struct WorkloadObjects(Arc<Mutex<BTreeMap<ObjectKey, ObjectWatch>>>);

impl WorkloadObjects {
    /// Every watched object, by kind.
    pub(crate) fn snapshot(&self) -> Vec<(ApiResource, Vec<Arc<DynamicObject>>)> {
        let resources = workload_resources();
        let w = lock(&self.0);
        resources
            .iter()
            .enumerate()
            .map(|(i, ar)| {
                let objs = w
                    .iter()
                    .filter(|(k, _)| k.1 == i)
                    .flat_map(|(_, o)| o.store.state())
                    .collect();
                (ar.clone(), objs)
            })
            .collect()
    }
}

/// The node's pods and workload objects from the API server.
pub(crate) struct ApiSource {
    client: Client,
    node_name: String,
    opts: ValidationOptions,
    state: PodSet,
    pods: Store<Pod>,
    node: Store<Node>,
    workloads: WorkloadObjects,
    gang: Arc<Mutex<GangAwareness>>,
    tx: watch::Sender<u64>,
    changes: watch::Receiver<u64>,
    states: ApiWatchStates,
    tasks: Vec<JoinHandle<()>>,
    /// The UIDs of listed pods bound to another node, each warned about once while listed.
    foreign: BTreeSet<String>,
}

impl Drop for ApiSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for o in lock(&self.workloads.0).values() {
            o.task.abort();
        }
    }
}

/// Asks API discovery whether the Workload API is served, until it answers.
async fn discover_workload_api(
    client: Client,
    gang: Arc<Mutex<GangAwareness>>,
    tx: watch::Sender<u64>,
) {
    let mut backoff = watcher::DefaultBackoff::default();
    let resources = workload_resources();
    loop {
        // Workloads and PodGroups are what gangs need; CompositePodGroups (alpha) are optional.
        let answer = client
            .list_api_group_resources(&resources[0].api_version)
            .await;
        let served = match answer {
            Ok(list) => Some(
                ["workloads", "podgroups"]
                    .iter()
                    .all(|r| list.resources.iter().any(|x| x.name == *r)),
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => Some(false),
            Err(e) => {
                tracing::debug!(error = %e, "API discovery of the Workload API failed; retrying.");
                None
            }
        };
        if let Some(served) = served {
            let state = if served {
                tracing::info!("The cluster serves the Workload API: eviction is gang-aware.");
                GangAwareness::On
            } else {
                tracing::warn!(
                    group_version = %resources[0].api_version,
                    "The cluster does not serve the Workload API (Workloads, PodGroups): gang-awareness is off, every pod is evicted alone."
                );
                GangAwareness::Off
            };
            *lock(&gang) = state;
            tx.send_modify(|n| *n += 1);
            return;
        }
        let wait = backoff.next().unwrap_or(std::time::Duration::from_secs(30));
        tokio::time::sleep(wait).await;
    }
}

impl ApiSource {
    /// Starts the watchers. Needs a tokio runtime; call [`ApiSource::wait_synced`] for the
    /// first complete list.
    /// `answered` is the client's record of successful reads ([`super::client::RequestBounds`]).
    pub(crate) fn start(
        client: Client,
        answered: Answered,
        node_name: &str,
        opts: ValidationOptions,
    ) -> Self {
        let (tx, changes) = watch::channel(0u64);
        let states = ApiWatchStates::new(answered);
        let mut tasks = Vec::new();
        let (pods, t) = spawn_watch(
            Some("pods"),
            Api::<Pod>::all(client.clone()),
            from_cache(&pods_selector(node_name)),
            (),
            tx.clone(),
            states.clone(),
        );
        tasks.push(t);
        // The Node is read at start only (its kubelet version, runtime and uid): its status
        // updates (a heartbeat every 10 s to 5 min) change nothing a pass reads, so they wake
        // nothing; the store still follows them.
        let (node_tx, _) = watch::channel(0u64);
        let (node, t) = spawn_watch(
            Some("node"),
            Api::<Node>::all(client.clone()),
            from_cache(&node_selector(node_name)),
            (),
            node_tx,
            states.clone(),
        );
        tasks.push(t);
        let gang = Arc::new(Mutex::new(GangAwareness::Unknown));
        tasks.push(tokio::spawn(discover_workload_api(
            client.clone(),
            gang.clone(),
            tx.clone(),
        )));
        Self {
            client,
            node_name: node_name.into(),
            opts,
            state: PodSet::default(),
            pods,
            node,
            workloads: WorkloadObjects::default(),
            gang,
            tx,
            changes,
            states,
            tasks,
            foreign: BTreeSet::new(),
        }
    }

    /// Whether eviction can be gang-aware on this cluster.
    pub(crate) fn gang_awareness(&self) -> Arc<Mutex<GangAwareness>> {
        self.gang.clone()
    }

    /// Starts a watch for each workload object `wanted` names that has none, and stops the
    /// watches of objects no longer wanted.
    fn watch_objects(&self, wanted: &BTreeSet<(String, String, String)>) {
        let resources = workload_resources();
        let keys: BTreeSet<ObjectKey> = wanted
            .iter()
            .filter_map(|(ns, kind, name)| {
                let i = resources.iter().position(|r| r.kind == *kind)?;
                Some((ns.clone(), i, name.clone()))
            })
            .collect();
        let mut w = lock(&self.workloads.0);
        w.retain(|k, o| {
            let keep = keys.contains(k);
            if !keep {
                o.task.abort();
            }
            keep
        });
        for k in keys {
            if w.contains_key(&k) {
                continue;
            }
            let ar = &resources[k.1];
            let (store, task) = spawn_watch(
                None,
                Api::<DynamicObject>::namespaced_with(self.client.clone(), &k.0, ar),
                from_cache(&format!("metadata.name={}", k.2)),
                ar.clone(),
                self.tx.clone(),
                self.states.clone(),
            );
            w.insert(k, ObjectWatch { store, task });
        }
    }

    /// Waits for the first complete list of the node's pods and the Node, then builds the first
    /// state. Workload kinds a cluster does not serve never list; they do not hold the start.
    pub(crate) async fn wait_synced(&mut self) -> Result<Diff, SourceClosed> {
        self.pods
            .wait_until_ready()
            .await
            .map_err(|_| SourceClosed)?;
        self.node
            .wait_until_ready()
            .await
            .map_err(|_| SourceClosed)?;
        Ok(self.rebuild())
    }

    pub(crate) fn pods(&self) -> &PodSet {
        &self.state
    }

    /// The Node object, once listed.
    pub(crate) fn node(&self) -> Option<Arc<Node>> {
        self.node.state().into_iter().next()
    }

    pub(crate) fn watch_states(&self) -> ApiWatchStates {
        self.states.clone()
    }

    /// A reader of the node's pods (the eviction action finds a pod's unit from it).
    pub(crate) fn pod_store(&self) -> Store<Pod> {
        self.pods.clone()
    }

    /// Resolves when a watch delivered a change; returns the diff (possibly empty when nothing
    /// qoslet reads changed). Cancel-safe: the change counter is only marked seen once read.
    pub(crate) async fn changed(&mut self) -> Result<Diff, SourceClosed> {
        self.changes.changed().await.map_err(|_| SourceClosed)?;
        Ok(self.rebuild())
    }

    fn rebuild(&mut self) -> Diff {
        self.changes.borrow_and_update();
        let (pods, foreign) = on_node(self.pods.state(), &self.node_name);
        self.foreign
            .retain(|uid| foreign.iter().any(|p| p.metadata.uid.as_ref() == Some(uid)));
        for p in &foreign {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if self.foreign.insert(uid) {
                // Debug-quoted: a pod that is never admitted is never validated either, so its
                // names reach the log escaped.
                tracing::warn!(
                    pod = ?format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or_default(), p.metadata.name.as_deref().unwrap_or_default()),
                    bound_to = ?p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or(""),
                    "The API server listed a pod of another node (the spec.nodeName selector was not applied); ignored."
                );
            }
        }
        let gang = *lock(&self.gang);
        let workloads = if gang == GangAwareness::On {
            self.workloads.snapshot()
        } else {
            Vec::new()
        };
        let FromApi {
            loaded,
            unchanged,
            wanted,
        } = loaded(&pods, &workloads, &self.state);
        if gang == GangAwareness::On {
            self.watch_objects(&wanted);
        }
        tracing::debug!(
            admitted = loaded.typed.len() + loaded.objects.len(),
            unchanged = unchanged.len(),
            "Rebuilding the pod set."
        );
        let next = build_set(
            unchanged,
            loaded,
            &self.state,
            &self.opts,
            BTreeSet::new(),
            // The kubelet runs these pods: no runtime of qoslet's checks them.
            None,
        );
        let diff = diff(&self.state, &next);
        for line in &diff.new_problems {
            tracing::warn!(problem = %line, "API object skipped.");
        }
        self.state = next;
        diff
    }
}

/// The fewest seconds between two lines about one watch's failures: a server that fails it in
/// ever new words (a resourceVersion in each message) or flaps between failing and answering
/// costs at most a line a minute, and `/readyz` says the latest error.
const FAILURE_LINES_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// What a named watch's log last said, so that each problem is said once per change: its first
/// sync, a failure when the error changes (at most every [`FAILURE_LINES_EVERY`]: a change held
/// back is said at the first failure after, if the watch has not recovered meanwhile), and a
/// recovery only after a failure that was said.
#[derive(Debug, Default)]
struct WatchLog {
    synced: bool,
    /// When a failure was last said.
    failure_said: Option<Instant>,
    /// The error changed since a failure was last said.
    unsaid: bool,
    /// A failure was said and its recovery not yet.
    unrecovered: bool,
}

/// The line [`WatchLog::synced`] lets through.
#[derive(Debug, PartialEq, Eq)]
enum Synced {
    First,
    Recovered,
}

impl WatchLog {
    /// The watch is synced: the line to write, if any.
    fn synced(&mut self) -> Option<Synced> {
        self.unsaid = false;
        if !self.synced {
            self.synced = true;
            self.unrecovered = false;
            return Some(Synced::First);
        }
        std::mem::take(&mut self.unrecovered).then_some(Synced::Recovered)
    }

    /// The watch failed, `changed` from what it was (another error, or none): whether to say
    /// so.
    fn failed(&mut self, changed: bool) -> bool {
        self.unsaid |= changed;
        let now = Instant::now();
        if !self.unsaid
            || self
                .failure_said
                .is_some_and(|at| now < at + FAILURE_LINES_EVERY)
        {
            return false;
        }
        self.unsaid = false;
        self.failure_said = Some(now);
        self.unrecovered = true;
        true
    }
}

/// One watch's backoff ([`WatchBackoff`](super::client::WatchBackoff)), kept across the watchers
/// it starts.
#[derive(Clone, Default)]
struct SharedBackoff(Arc<Mutex<super::client::WatchBackoff>>);

impl SharedBackoff {
    fn wait(&self) -> std::time::Duration {
        lock(&self.0)
            .next()
            .unwrap_or(std::time::Duration::from_secs(30))
    }
}

impl Iterator for SharedBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        Some(self.wait())
    }
}

impl kube::runtime::utils::Backoff for SharedBackoff {
    /// Never reset by the stream's items: see [`WatchBackoff`](super::client::WatchBackoff).
    fn reset(&mut self) {}
}

/// Runs a watcher (a new one, which lists first, after a watch request answered 410) into a
/// reflector store, each object trimmed to what qoslet reads
/// ([`trim`]), bumping `tx` on every change the store took. A
/// named watch reports its state to `states` (`/readyz`) and logs as [`WatchLog`] lets it; an
/// unnamed one logs its failures at debug level. A `410 Expired` `ERROR` event is no failure:
/// the API server's watch cache moved past the watch's version (routine, every few minutes on
/// a busy cluster), and kube-runtime relists.
fn spawn_watch<K>(
    name: Option<&'static str>,
    api: Api<K>,
    cfg: watcher::Config,
    dyntype: K::DynamicType,
    tx: watch::Sender<u64>,
    states: ApiWatchStates,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + Trim + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let writer = Writer::new(dyntype);
    let reader = writer.as_reader();
    let path = api.resource_url().to_owned();
    let set = move |state: ApiWatchState| name.is_some_and(|n| states.set(n, &path, state));
    set(ApiWatchState::Listing);
    let task = tokio::spawn(async move {
        let mut writer = writer;
        let backoff = SharedBackoff::default();
        let mut said = WatchLog::default();
        // One watcher until the API server answers a watch request 410 (the version is gone):
        // kube-runtime would ask again from that version for good, under the backoff; a new
        // watcher lists first.
        loop {
            let mut stream = std::pin::pin!(
                watcher::watcher(api.clone(), cfg.clone())
                    .backoff(backoff.clone())
                    .modify(Trim::trim)
            );
            while let Some(ev) = stream.next().await {
                if let Ok(ev) = &ev {
                    writer.apply_watcher_event(ev);
                }
                if let Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) = &ev
                    && s.code == 410
                {
                    tracing::debug!(watch = name, error = %s, "API watch refused as expired; relisting.");
                    break;
                }
                match ev {
                    Ok(Event::Init) => {
                        set(ApiWatchState::Listing);
                    }
                    Ok(Event::InitApply(_)) => {}
                    Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_)) => {
                        if set(ApiWatchState::Synced) && name.is_some() {
                            match said.synced() {
                                Some(Synced::First) => {
                                    tracing::info!(watch = name, "API watch synced.");
                                }
                                Some(Synced::Recovered) => {
                                    tracing::info!(watch = name, "API watch recovered.");
                                }
                                None => {}
                            }
                        }
                        tx.send_modify(|n| *n += 1);
                    }
                    Err(watcher::Error::WatchError(s)) if s.code == 410 => {
                        tracing::debug!(watch = name, error = %s, "API watch expired; relisting.");
                    }
                    Err(e) => match name {
                        Some(_) => {
                            let changed = set(ApiWatchState::Failing(e.to_string()));
                            if said.failed(changed) {
                                tracing::warn!(watch = name, error = %e, "API watch failing; retrying with backoff.");
                            }
                        }
                        None => {
                            tracing::debug!(error = %e, "A workload object's watch is failing; retrying with backoff.");
                        }
                    },
                }
            }
            // The stream's own backoff sleep went with it.
            tokio::time::sleep(backoff.wait()).await;
        }
    });
    (reader, task)
}

/// What one rebuild takes to the door ([`loaded`]).
pub(crate) struct FromApi {
    /// The objects to admit.
    pub(crate) loaded: Loaded,
    /// The node's pods that the last build admitted with the same uid and resourceVersion: the
    /// API server gives an object a new resourceVersion on every change, so these are as they
    /// were, and their admission stands.
    pub(crate) unchanged: Vec<Admitted>,
    /// The (namespace, kind, name) of every workload object the pods reference, with their
    /// ancestors, found or not: the objects to watch.
    pub(crate) wanted: BTreeSet<(String, String, String)>,
}

/// The objects of the stores as the door reads them: the node's pods that still run (Succeeded
/// and Failed pods hold no cgroups), and the workload objects they reference with their
/// ancestors. A pod `before` holds unchanged is not admitted again.
pub(crate) fn loaded(
    pods: &[Arc<Pod>],
    workloads: &[(ApiResource, Vec<Arc<DynamicObject>>)],
    before: &PodSet,
) -> FromApi {
    let mut out = Loaded::default();
    let mut unchanged = Vec::new();
    let mut wanted: BTreeSet<(String, String, String)> = BTreeSet::new();
    let kept: HashMap<(&str, &str), &ManifestPod> = before
        .pods
        .values()
        .filter_map(|k| {
            let m = &k.pod.metadata;
            Some(((m.uid.as_deref()?, m.resource_version.as_deref()?), k))
        })
        .collect();
    for p in pods {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        if let Some(g) = p
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_group.as_ref())
            .and_then(|g| g.pod_group_name.as_ref())
        {
            wanted.insert((ns.clone(), "PodGroup".into(), g.clone()));
        }
        let m = &p.metadata;
        match m
            .uid
            .as_deref()
            .zip(m.resource_version.as_deref())
            .and_then(|key| kept.get(&key))
        {
            Some(k) => unchanged.push(AdmittedPod::kept(k)),
            None => push_pod(&mut out, p),
        }
    }
    // Objects by (namespace, kind, name), then the closure of the references from the pods up.
    let mut all: BTreeMap<(String, String, String), (String, serde_json::Value)> = BTreeMap::new();
    for (ar, objs) in workloads {
        for o in objs {
            let ns = o.metadata.namespace.clone().unwrap_or_default();
            let name = o.metadata.name.clone().unwrap_or_default();
            if let Ok(v) = serde_json::to_value(&**o) {
                all.insert((ns, ar.kind.clone(), name), (ar.api_version.clone(), v));
            }
        }
    }
    // Each with its level in the group chain (a pod's PodGroup is 1), breadth first so that a
    // group reached from several pods is taken at its lowest level. A chain is read no higher
    // than the depth limit ([`reads_parent`]): the door counts the parent the top level names as
    // one more and says the chain is too deep, once; a longer chain or a loop costs no more
    // watches than the limit's levels.
    let mut queue: VecDeque<((String, String, String), usize)> =
        wanted.iter().map(|k| (k.clone(), 1)).collect();
    let mut taken = BTreeSet::new();
    while let Some((key, level)) = queue.pop_front() {
        if !taken.insert(key.clone()) {
            continue;
        }
        wanted.insert(key.clone());
        let Some((api_version, v)) = all.get(&key) else {
            continue;
        };
        let ns = &key.0;
        if let Some(parent) = v
            .pointer("/spec/parentCompositePodGroupName")
            .and_then(|p| p.as_str())
            && reads_parent(level)
        {
            queue.push_back((
                (ns.clone(), "CompositePodGroup".into(), parent.into()),
                level.saturating_add(1),
            ));
        }
        if let Some(w) = v
            .pointer("/spec/workloadRef/workloadName")
            .and_then(|p| p.as_str())
        {
            queue.push_back(((ns.clone(), "Workload".into(), w.into()), level));
        }
        push(&mut out, api_version, &key.1, v.clone());
    }
    FromApi {
        loaded: out,
        unchanged,
        wanted,
    }
}

/// `pods` and every workload object given, unfiltered (a unit's whole hierarchy).
pub(crate) fn loaded_all(
    pods: &[Arc<Pod>],
    workloads: &[(ApiResource, Vec<Arc<DynamicObject>>)],
) -> Loaded {
    let mut out = Loaded::default();
    for p in pods {
        push_pod(&mut out, p);
    }
    for (ar, objs) in workloads {
        for o in objs {
            if let Ok(v) = serde_json::to_value(&**o) {
                push(&mut out, &ar.api_version, &ar.kind, v);
            }
        }
    }
    out
}

/// The API's pods go to admission typed, as they are.
fn push_pod(out: &mut Loaded, p: &Pod) {
    let origin = api_origin();
    out.typed.push((origin, Typed::Pod(Box::new(p.clone()))));
}

/// A workload object of the API goes to admission typed, decoded from the watch's JSON. One that
/// does not decode goes as a document, so that the door says why, as it would of a manifest's.
fn push(out: &mut Loaded, api_version: &str, kind: &str, mut value: serde_json::Value) {
    let origin = api_origin();
    // List items carry no apiVersion and kind: the watch knows them.
    if let Some(m) = value.as_object_mut() {
        m.insert("apiVersion".into(), api_version.into());
        m.insert("kind".into(), kind.into());
    }
    if let Some(typed) = typed(api_version, kind, &value) {
        out.typed.push((origin, typed));
        return;
    }
    let str_at = |p: &str| {
        value
            .pointer(p)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let namespace = str_at("/metadata/namespace");
    let name = str_at("/metadata/name");
    let Ok(value) = serde_yaml_ng::to_value(&value) else {
        return;
    };
    out.objects.push(RawObject {
        file: origin.file,
        index: origin.index,
        api_version: api_version.into(),
        kind: kind.into(),
        namespace,
        name,
        value,
    });
}

/// `value` as the typed object of the hierarchy's `kind`, if it decodes as one.
fn typed(api_version: &str, kind: &str, value: &serde_json::Value) -> Option<Typed> {
    Typed::decode(workload::kind_of(api_version, kind).ok()?, &Json(value)).ok()
}

/// The watch's JSON, decoded as it is.
struct Json<'a>(&'a serde_json::Value);

impl workload::Decoder for Json<'_> {
    type Error = serde_json::Error;

    fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(self.0)
    }
}

/// Where an object of the API comes from: the API, at no position. A document's index would be
/// the object's place in the store's listing, which moves as other objects come and go, and an
/// object's view would then differ from the one kept for it without a change of its own.
fn api_origin() -> workload::Origin {
    workload::Origin {
        file: PathBuf::from(ORIGIN),
        index: 0,
    }
}

mod trim;

#[cfg(test)]
mod tests;
