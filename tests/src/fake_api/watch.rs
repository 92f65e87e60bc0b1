//! Watch streams: newline-delimited JSON events `{"type": ..., "object": ...}` as the API server
//! sends them in answer to `?watch=true`.
//!
//! - Start: from `resourceVersion=N`, the changes after N (410 `Expired` as an ERROR event when
//!   the history no longer reaches back to N); with no resourceVersion or "0", synthetic ADDED
//!   events for the current objects first ("get state and start at most recent"), unless
//!   `sendInitialEvents=false`. With `sendInitialEvents=true` the initial events end with a
//!   BOOKMARK annotated `k8s.io/initial-events-end: "true"` (streaming lists).
//! - Selectors filter as the watch cache does: an object that starts matching arrives as ADDED,
//!   one that stops matching as DELETED (its previous state at the change's resourceVersion).
//! - `allowWatchBookmarks=true`: a BOOKMARK carrying the current resourceVersion every
//!   `Options::bookmark_interval`.
//! - `timeoutSeconds`: the stream ends after that long. It also ends after an ERROR event, when
//!   the fake goes down (with a 410 ERROR event when the fault is `WatchesExpire` or
//!   `WatchesGone`), and when the client goes away.
//! - A compaction ([`super::FakeApi::compact`]) ends every open watch with a 410 ERROR event.
//! - The faults of [`Outage`] that touch watches: `WatchesEnd` ends one at once, `WatchesExpire`
//!   answers with a 410 ERROR event (`WatchesCut` and `WatchesGone` are answered by the
//!   handler, before a stream starts).

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::{sync::mpsc, time::Instant};

use super::{
    Outage, Shared,
    resources::{RESOURCES, ResourceId},
    select::Selector,
    status::ApiError,
    store::{Change, ChangeKind},
};

/// A parsed watch request.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub resource: ResourceId,
    pub namespace: Option<String>,
    pub selector: Selector,
    /// `None` for "start from the current state".
    pub from: Option<u64>,
    pub bookmarks: bool,
    /// `sendInitialEvents`: `None` when not given.
    pub send_initial_events: Option<bool>,
    pub timeout: Option<Duration>,
}

/// Starts the stream's producer; the returned receiver yields the encoded lines. The starting
/// point (and the compaction the watch belongs to) is taken now, before the response is sent.
pub fn start(shared: Arc<Shared>, req: WatchRequest) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(64);
    let snapshot = Snapshot::take(&shared, &req);
    tokio::spawn(async move {
        let closed = tx.clone();
        tokio::select! {
            () = run(&shared, &req, snapshot, &tx) => {}
            () = closed.closed() => {}
        }
    });
    rx
}

/// Where a watch starts.
struct Snapshot {
    changed: tokio::sync::watch::Receiver<u64>,
    epoch: tokio::sync::watch::Receiver<u64>,
    compactions: u64,
    /// The resourceVersion to stream changes after and the synthetic ADDED objects to send
    /// first, or the 410 to answer with.
    start: Result<(u64, Vec<Value>), ApiError>,
}

impl Snapshot {
    fn take(shared: &Shared, req: &WatchRequest) -> Self {
        let epoch = shared.epoch.subscribe();
        let store = shared.store.lock().expect("store lock");
        let start = match req.from {
            Some(rv) => store.changes_after(rv).map(|_| (rv, Vec::new())),
            None if req.send_initial_events == Some(false) => {
                Ok((store.resource_version(), Vec::new()))
            }
            None => {
                let objects = store.list(req.resource, req.namespace.as_deref());
                let initial = objects
                    .into_iter()
                    .filter(|o| req.selector.matches(o))
                    .collect();
                Ok((store.resource_version(), initial))
            }
        };
        Self {
            changed: store.subscribe(),
            epoch,
            compactions: store.compactions(),
            start,
        }
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut out =
        serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

fn bookmark(req: &WatchRequest, rv: u64, initial_end: bool) -> Bytes {
    let res = &RESOURCES[req.resource];
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if initial_end {
        meta["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    line(
        "BOOKMARK",
        &json!({ "kind": res.kind, "apiVersion": res.api_version(), "metadata": meta }),
    )
}

fn in_scope(req: &WatchRequest, object: &Value) -> bool {
    let ns_matches = req.namespace.as_deref().is_none_or(|ns| {
        object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            == Some(ns)
    });
    ns_matches && req.selector.matches(object)
}

/// The event this watch sees for a change, if any.
fn event(req: &WatchRequest, change: &Change) -> Option<Bytes> {
    if change.resource != req.resource {
        return None;
    }
    let now = in_scope(req, &change.object);
    let before = change.prev.as_ref().is_some_and(|p| in_scope(req, p));
    match (change.kind, before, now) {
        (ChangeKind::Added, _, true) => Some(line("ADDED", &change.object)),
        (ChangeKind::Modified, true, true) => Some(line("MODIFIED", &change.object)),
        (ChangeKind::Modified, false, true) => Some(line("ADDED", &change.object)),
        (ChangeKind::Modified, true, false) => {
            let mut gone = change.prev.clone().unwrap_or_default();
            gone["metadata"]["resourceVersion"] = json!(change.rv.to_string());
            Some(line("DELETED", &gone))
        }
        (ChangeKind::Deleted, _, true) => Some(line("DELETED", &change.object)),
        _ => None,
    }
}

async fn run(shared: &Shared, req: &WatchRequest, snapshot: Snapshot, tx: &mpsc::Sender<Bytes>) {
    let fault = *shared.fault.lock().expect("fault lock");
    match fault {
        Some(Outage::WatchesEnd) => return,
        Some(Outage::WatchesExpire) => {
            let from = req.from.unwrap_or_default();
            let err = ApiError::expired(from, from + 1);
            let _ = tx.send(line("ERROR", &err.body())).await;
            return;
        }
        _ => {}
    }
    let Snapshot {
        mut changed,
        mut epoch,
        compactions,
        start,
    } = snapshot;
    let mut cursor = match start {
        Ok((rv, initial)) => {
            for object in &initial {
                if tx.send(line("ADDED", object)).await.is_err() {
                    return;
                }
            }
            if req.send_initial_events == Some(true)
                && tx.send(bookmark(req, rv, true)).await.is_err()
            {
                return;
            }
            rv
        }
        Err(err) => {
            let _ = tx.send(line("ERROR", &err.body())).await;
            return;
        }
    };
    let deadline = req.timeout.map(|t| Instant::now() + t);
    let mut ticks = tokio::time::interval(shared.options.bookmark_interval);
    ticks.reset();
    let mut bookmark_due = false;
    loop {
        let batch = {
            let store = shared.store.lock().expect("store lock");
            if store.compactions() == compactions {
                store
                    .changes_after(cursor)
                    .map(|changes| (changes, store.resource_version()))
            } else {
                Err(store.expired(cursor))
            }
        };
        let (changes, current) = match batch {
            Ok(batch) => batch,
            Err(err) => {
                let _ = tx.send(line("ERROR", &err.body())).await;
                return;
            }
        };
        for change in &changes {
            if let Some(event) = event(req, change)
                && tx.send(event).await.is_err()
            {
                return;
            }
        }
        cursor = current;
        if bookmark_due {
            bookmark_due = false;
            if tx.send(bookmark(req, cursor, false)).await.is_err() {
                return;
            }
        }
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            res = changed.changed() => if res.is_err() { return },
            _ = ticks.tick(), if req.bookmarks => bookmark_due = true,
            () = timeout => return,
            _ = epoch.changed() => {
                // The expiry faults reach an open watch as the server's `410` ERROR event (its
                // watch cache can no longer serve the watcher), not as a silent end.
                let fault = *shared.fault.lock().expect("fault lock");
                if matches!(fault, Some(Outage::WatchesExpire | Outage::WatchesGone)) {
                    let err = ApiError::expired(cursor, cursor + 1);
                    let _ = tx.send(line("ERROR", &err.body())).await;
                }
                return;
            }
        }
    }
}
