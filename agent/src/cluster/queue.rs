//! The API writes waiting for the API server, persisted so they are delivered once each, also
//! when the API server is down for a while and across a restart of qoslet.
//!
//! One file per pending write under `<stateDir>/api-writes/`, named by its idempotency id
//! (`<id>.json`), written to a temporary name, fsynced, renamed and the directory fsynced; the
//! file is removed once the write is delivered. The file is written by the queue's own thread,
//! beside the delivery: a push returns at once and the write may go out before its file exists,
//! so no eviction waits on an fsync (a crash in between is covered by the pod's eviction mark,
//! `marks.rs`). A write pushed again with the same id replaces the pending one (node conditions:
//! the newest value wins).
//!
//! Delivery: writes about the same object go out in the order they were pushed (the pod's status
//! before its Event); of the writes due, a pod's status goes first, then Eviction API calls,
//! Events and node writes ([`ApiWrite::priority`]); up to [`MAX_IN_FLIGHT`] go at once, so a
//! write the API server refuses for now (a PDB's 429) or does not answer (a half-open
//! connection, cut at [`REQUEST_TIMEOUT`]) holds back nothing else. Each write is retried with its
//! own exponential backoff, jittered so nodes that lost the API server together do not come back
//! in step, and never sooner than the API server's Retry-After. A write the API server refuses
//! for good ([`Delivery::Rejected`]) is counted, logged once and dropped. The queue is bounded
//! ([`MAX_PENDING`]; a push beyond it drops the oldest write) and a write older than [`TTL`] is
//! dropped undelivered: after a long outage or a crash, a stale decision is not replayed (and
//! every pod write is bound to its pod's UID). A write's age is kept on monotonic clocks: the
//! process's while it runs, the boot's (`CLOCK_BOOTTIME`) across a restart, the wall clock only
//! after a reboot.
//!
//! Hand-written rather than a crate: what is needed is a few dozen lines over std::fs, and the
//! persistent queues on crates.io bring their own formats and background threads.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{self, Write as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::Duration,
};

use futures::{StreamExt as _, stream::FuturesUnordered};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};

use super::writes::{ApiWrite, Delivery};
use crate::{persist::unix_now, policy::pod::PodKey, support::lock};

const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// Pending writes at most. An eviction makes two or three; a node in trouble for hours makes a
/// few condition writes (each type replaces its own).
pub(crate) const MAX_PENDING: usize = 1024;
/// How long a write may wait for the API server before it is dropped.
pub(crate) const TTL: Duration = Duration::from_secs(15 * 60);
/// How long one delivery attempt may take: a request the API server does not answer (a
/// half-open connection, an overloaded server) is abandoned, its connection with it, and retried.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Writes in flight at once, at most one per object.
pub(crate) const MAX_IN_FLIGHT: usize = 4;

#[derive(Debug, Error)]
#[error("{path}: cannot persist a pending API write")]
pub struct QueueError {
    pub(crate) path: PathBuf,
    #[source]
    pub(crate) source: io::Error,
}

/// A write as stored on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    seq: u64,
    /// Writes with the same key are delivered in `seq` order.
    key: String,
    /// When it was pushed, in seconds since the Unix epoch: the age of a write read back after a
    /// reboot.
    #[serde(default)]
    queued_at: u64,
    /// When it was pushed on the boot's monotonic clock: its age after a restart of qoslet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot: Option<BootTime>,
    write: ApiWrite,
}

/// A point on `CLOCK_BOOTTIME` (monotonic, counts suspend), valid for the boot it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct BootTime {
    /// `/proc/sys/kernel/random/boot_id`.
    id: String,
    ms: u64,
}

/// `/proc/sys/kernel/random/boot_id`: read once, when the queue opens.
fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
}

impl BootTime {
    /// Now, in the boot `id`.
    fn now(id: &str) -> Option<Self> {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
        let ms = u64::try_from(t.tv_sec())
            .ok()?
            .checked_mul(1000)?
            .checked_add(u64::try_from(t.tv_nsec()).ok()? / 1_000_000)?;
        Some(Self { id: id.into(), ms })
    }
}

impl Stored {
    /// How old the write is: on the boot's clock when it was pushed in this boot, else on the
    /// wall clock (a write without a time, from an older qoslet, counts as old).
    fn age(&self, boot: Option<&BootTime>) -> Duration {
        match (&self.boot, boot) {
            (Some(then), Some(now)) if then.id == now.id => {
                Duration::from_millis(now.ms.saturating_sub(then.ms))
            }
            _ => Duration::from_secs(unix_now().saturating_sub(self.queued_at)),
        }
    }
}

struct Entry {
    stored: Stored,
    attempts: u32,
    due: Instant,
    /// When it was pushed, on this process's monotonic clock (its age at load for a write read
    /// back).
    pushed: Instant,
    /// Its file is written (else the persister thread has it to do).
    persisted: bool,
    /// A delivery attempt is under way.
    in_flight: bool,
}

impl Entry {
    fn new(stored: Stored, pushed: Instant, persisted: bool) -> Self {
        Self {
            stored,
            attempts: 0,
            due: Instant::now(),
            pushed,
            persisted,
            in_flight: false,
        }
    }

    fn expired(&self) -> bool {
        self.pushed.elapsed() > TTL
    }
}

/// Writes the queue gave up on, by why and the write's kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// (kind, HTTP status) of writes the API server refused for good.
    pub(crate) rejected: BTreeMap<(&'static str, u16), u64>,
    /// Writes older than [`TTL`].
    pub(crate) expired: u64,
    /// Writes pushed out by newer ones beyond [`MAX_PENDING`].
    pub(crate) overflow: u64,
}

#[derive(Default)]
struct State {
    next_seq: u64,
    pending: BTreeMap<String, Entry>,
    delivered: u64,
    /// Counted since the last [`WriteQueue::take_dropped`].
    dropped: Dropped,
}

/// What the persister thread and the queue share.
struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
}

enum ToPersist {
    /// Write the file of this id, if it is still pending and not written.
    Id(String),
    /// Answer once everything sent before is written.
    #[cfg(test)]
    Flush(mpsc::SyncSender<()>),
}

/// The persistent queue. Share it with `Arc`; [`WriteQueue::run`] delivers.
pub(crate) struct WriteQueue {
    shared: Arc<Shared>,
    wake: Notify,
    /// Bumped after every delivery attempt: [`Self::settled`] waits on it (a write dropped for
    /// age or overflow is seen at its deadline).
    left: watch::Sender<u64>,
    persist_tx: Mutex<Option<mpsc::Sender<ToPersist>>>,
    persister: Mutex<Option<JoinHandle<()>>>,
    /// This boot's id, which each write's [`BootTime`] names.
    boot_id: Option<String>,
}

fn is_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !id.starts_with('.')
}

impl WriteQueue {
    /// Opens (creating) `dir` and loads the writes a previous run left pending.
    pub(crate) fn open(dir: &Path) -> Result<Self, QueueError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| QueueError { path, source }
        };
        fs::create_dir_all(dir).map_err(err(dir))?;
        let mut state = State::default();
        let boot_id = boot_id();
        let boot = boot_id.as_deref().and_then(BootTime::now);
        for entry in fs::read_dir(dir).map_err(err(dir))? {
            let path = entry.map_err(err(dir))?.path();
            let Some(id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .filter(|id| is_id(id))
            else {
                // A temporary file of a write interrupted before its rename: never queued.
                if path
                    .file_name()
                    .is_some_and(|n| n.as_encoded_bytes().starts_with(b".tmp-"))
                {
                    let _ = fs::remove_file(&path);
                }
                continue;
            };
            let text = fs::read_to_string(&path).map_err(err(&path))?;
            match serde_json::from_str::<Stored>(&text) {
                Ok(stored) if stored.age(boot.as_ref()) > TTL => {
                    tracing::info!(file = %path.display(), "Dropping a pending API write older than the queue's TTL.");
                    state.dropped.expired += 1;
                    let _ = fs::remove_file(&path);
                }
                Ok(stored) => {
                    let now = Instant::now();
                    let pushed = now.checked_sub(stored.age(boot.as_ref())).unwrap_or(now);
                    state.next_seq = state.next_seq.max(stored.seq + 1);
                    state
                        .pending
                        .insert(id.to_owned(), Entry::new(stored, pushed, true));
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "Dropping an unreadable pending API write.");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        if !state.pending.is_empty() {
            tracing::info!(pending = state.pending.len(), dir = %dir.display(), "API writes left pending by a previous run will be delivered.");
        }
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
        });
        let (persist_tx, persist_rx) = mpsc::channel();
        let s = shared.clone();
        let persister = std::thread::Builder::new()
            .name("qoslet-api-writes".into())
            .spawn(move || s.persist_loop(&persist_rx))
            .map_err(err(dir))?;
        Ok(Self {
            shared,
            wake: Notify::new(),
            left: watch::Sender::new(0),
            persist_tx: Mutex::new(Some(persist_tx)),
            persister: Mutex::new(Some(persister)),
            boot_id,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.shared.state)
    }

    /// Queues a write and returns; its file is written by the queue's thread. `id` must be
    /// unique per write (letters, digits, `-`, `_`, `.`); pushing an id again replaces that
    /// write. `key` orders writes about one object.
    pub(crate) fn push(&self, id: &str, key: &str, write: ApiWrite) -> Result<(), QueueError> {
        if !is_id(id) {
            return Err(QueueError {
                path: self.shared.dir.join(format!("{id}.json")),
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a write id"),
            });
        }
        let mut st = self.state();
        let seq = st.next_seq;
        st.next_seq += 1;
        let stored = Stored {
            seq,
            key: key.into(),
            queued_at: unix_now(),
            boot: self.boot_id.as_deref().and_then(BootTime::now),
            write,
        };
        let mut entry = Entry::new(stored, Instant::now(), false);
        // A replaced write still in flight finishes as its own (`record_outcome` checks `seq`).
        entry.in_flight = st.pending.get(id).is_some_and(|e| e.in_flight);
        st.pending.insert(id.into(), entry);
        while st.pending.len() > MAX_PENDING {
            let Some(oldest) = st
                .pending
                .iter()
                .min_by_key(|(_, e)| e.stored.seq)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            if let Some(e) = st.pending.remove(&oldest) {
                self.shared.forget(&oldest, &e);
            }
            st.dropped.overflow += 1;
            tracing::warn!(id = %oldest, max = MAX_PENDING, "The API write queue is full; dropped its oldest write.");
        }
        drop(st);
        self.send_persister(ToPersist::Id(id.into()));
        self.wake.notify_one();
        Ok(())
    }

    fn send_persister(&self, msg: ToPersist) {
        if let Some(tx) = lock(&self.persist_tx).as_ref()
            && tx.send(msg).is_err()
        {
            tracing::error!(
                "The API write queue's thread is gone; pending writes are no longer saved to disk."
            );
        }
    }

    /// Blocks until every write pushed so far is on disk (or gone).
    #[cfg(test)]
    pub(crate) fn flush(&self) {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send_persister(ToPersist::Flush(tx));
        let _ = rx.recv();
    }

    /// What was dropped since the last call (the reporter turns it into metrics).
    pub(crate) fn take_dropped(&self) -> Dropped {
        std::mem::take(&mut self.state().dropped)
    }

    /// The pod of the oldest Eviction API request still pending (refused for now, or not sent
    /// yet), if any.
    pub(crate) fn pending_eviction(&self) -> Option<PodKey> {
        let st = self.state();
        st.pending
            .values()
            .filter_map(|e| match &e.stored.write {
                ApiWrite::Evict { pod, .. } => Some((e.stored.seq, pod)),
                _ => None,
            })
            .min_by_key(|(seq, _)| *seq)
            .map(|(_, pod)| pod.clone())
    }

    /// Whether a write about `key` (a pod's UID) is still pending: read back from disk at start,
    /// or pushed since.
    pub(crate) fn has_pending(&self, key: &str) -> bool {
        self.state().pending.values().any(|e| e.stored.key == key)
    }

    /// The pending writes, oldest first.
    pub(crate) fn pending(&self) -> Vec<(String, ApiWrite)> {
        let st = self.state();
        let mut v: Vec<(u64, String, ApiWrite)> = st
            .pending
            .iter()
            .map(|(id, e)| (e.stored.seq, id.clone(), e.stored.write.clone()))
            .collect();
        v.sort_by_key(|(s, _, _)| *s);
        v.into_iter().map(|(_, id, w)| (id, w)).collect()
    }

    /// Waits until the write `id` has left the queue (delivered, refused for good or dropped), at
    /// most `timeout`; whether it left in time.
    pub(crate) async fn settled(&self, id: &str, timeout: Duration) -> bool {
        // Subscribed before the first look, so a write that leaves in between still wakes us.
        let mut left = self.left.subscribe();
        let deadline = Instant::now() + timeout;
        loop {
            if !self.state().pending.contains_key(id) {
                return true;
            }
            match tokio::time::timeout_at(deadline, left.changed()).await {
                Ok(Ok(())) => {}
                _ => return !self.state().pending.contains_key(id),
            }
        }
    }

    /// Writes delivered since the queue was opened.
    #[cfg(test)]
    pub(crate) fn delivered(&self) -> u64 {
        self.state().delivered
    }

    /// At most `room` writes due now, marked in flight: the oldest of each key with nothing in
    /// flight, most urgent kind first, then oldest. Expired writes are dropped first. Also when
    /// the next write not yet due is.
    fn due(&self, room: usize) -> (Vec<(String, u64, ApiWrite)>, Option<Instant>) {
        let mut st = self.state();
        let stale: Vec<String> = st
            .pending
            .iter()
            .filter(|(_, e)| !e.in_flight && e.expired())
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if let Some(e) = st.pending.remove(&id) {
                self.shared.forget(&id, &e);
            }
            st.dropped.expired += 1;
            tracing::warn!(id = %id, ttl = ?TTL, "Dropped an API write the API server did not take in time.");
        }
        let now = Instant::now();
        let mut first_of_key: BTreeMap<&str, (&String, &Entry)> = BTreeMap::new();
        for (id, e) in &st.pending {
            let k = e.stored.key.as_str();
            match first_of_key.get(k) {
                Some((_, f)) if f.in_flight || f.stored.seq < e.stored.seq => {}
                _ => {
                    first_of_key.insert(k, (id, e));
                }
            }
        }
        let mut due: Vec<(u8, u64, String)> = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, e) in first_of_key.into_values() {
            if e.in_flight {
                continue;
            }
            if e.due <= now {
                due.push((e.stored.write.priority(), e.stored.seq, id.clone()));
            } else {
                next = Some(next.map_or(e.due, |n| n.min(e.due)));
            }
        }
        due.sort();
        due.truncate(room);
        let out = due
            .into_iter()
            .filter_map(|(_, seq, id)| {
                let e = st.pending.get_mut(&id)?;
                e.in_flight = true;
                Some((id, seq, e.stored.write.clone()))
            })
            .collect();
        (out, next)
    }

    fn finish(&self, id: &str, seq: u64, result: &Delivery) {
        self.record_outcome(id, seq, result);
        self.left.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn record_outcome(&self, id: &str, seq: u64, result: &Delivery) {
        let mut st = self.state();
        let Some(e) = st.pending.get_mut(id) else {
            return;
        };
        e.in_flight = false;
        if e.stored.seq != seq {
            // Replaced while in flight: the newer write is still to go.
            return;
        }
        match result {
            Delivery::Done => {
                if let Some(e) = st.pending.remove(id) {
                    self.shared.forget(id, &e);
                }
                st.delivered += 1;
            }
            Delivery::Rejected { code, message } => {
                let kind = e.stored.write.kind();
                if let Some(e) = st.pending.remove(id) {
                    self.shared.forget(id, &e);
                }
                *st.dropped.rejected.entry((kind, *code)).or_default() += 1;
                tracing::warn!(id, code, reason = %message, "The API server refused an API write for good; dropped, not retried.");
            }
            Delivery::Retry { why, after } => {
                e.attempts += 1;
                let backoff = jitter(
                    FIRST_RETRY
                        .saturating_mul(1 << e.attempts.min(10))
                        .min(MAX_RETRY),
                )
                .max(after.unwrap_or_default().min(TTL));
                e.due = Instant::now() + backoff;
                if e.attempts == 1 || e.attempts.is_multiple_of(10) {
                    tracing::warn!(id, attempts = e.attempts, retry_in = ?backoff, reason = %why, "An API write was not delivered; retrying.");
                }
            }
        }
    }

    /// Delivers forever through `send`: up to [`MAX_IN_FLIGHT`] writes at once, each attempt
    /// cut at [`REQUEST_TIMEOUT`].
    pub(crate) async fn run<F, Fut>(self: Arc<Self>, send: F)
    where
        F: Fn(ApiWrite) -> Fut,
        Fut: Future<Output = Delivery>,
    {
        let mut in_flight = FuturesUnordered::new();
        loop {
            let (due, next) = self.due(MAX_IN_FLIGHT.saturating_sub(in_flight.len()));
            for (id, seq, write) in due {
                let attempt = send(write);
                in_flight.push(async move {
                    let result = tokio::time::timeout(REQUEST_TIMEOUT, attempt)
                        .await
                        .unwrap_or_else(|_| Delivery::Retry {
                            why: format!("no answer in {REQUEST_TIMEOUT:?}"),
                            after: None,
                        });
                    (id, seq, result)
                });
            }
            let wait = next.map_or(Duration::from_secs(3600), |n| {
                n.saturating_duration_since(Instant::now())
            });
            tokio::select! {
                Some((id, seq, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    self.finish(&id, seq, &result);
                }
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

impl Drop for WriteQueue {
    /// Lets the thread write what was pushed, then ends it.
    fn drop(&mut self) {
        lock(&self.persist_tx).take();
        if let Some(t) = lock(&self.persister).take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Removes the file of a write that left the queue, when it was written; a write not yet
    /// written is left to the persister, which finds it gone.
    fn forget(&self, id: &str, e: &Entry) {
        if e.persisted {
            self.remove_file(id);
        }
    }

    fn remove_file(&self, id: &str) {
        let path = self.path(id);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(file = %path.display(), error = %e, "Could not remove a finished API write; it may be sent again (its effect is not repeated).");
        }
    }

    /// The persister thread: writes each pushed write's file, off the eviction's path.
    fn persist_loop(&self, rx: &mpsc::Receiver<ToPersist>) {
        for msg in rx {
            match msg {
                #[cfg(test)]
                ToPersist::Flush(done) => {
                    let _ = done.send(());
                }
                ToPersist::Id(id) => self.persist_one(&id),
            }
        }
    }

    fn persist_one(&self, id: &str) {
        let pending = lock(&self.state)
            .pending
            .get(id)
            .map(|e| (!e.persisted).then(|| e.stored.clone()));
        let stored = match pending {
            Some(Some(stored)) => stored,
            Some(None) => return,
            // Gone before its turn: a file an older write of this id left goes too.
            None => {
                self.remove_file(id);
                return;
            }
        };
        let path = self.path(id);
        if let Err(e) = persist(&self.dir, &path, &stored) {
            tracing::error!(file = %path.display(), error = %e, "Could not save a pending API write; it is delivered, but lost if qoslet restarts first.");
            return;
        }
        let mut st = lock(&self.state);
        match st.pending.get_mut(id) {
            Some(e) if e.stored.seq == stored.seq => e.persisted = true,
            // Replaced meanwhile: the newer write's own turn rewrites the file.
            Some(_) => {}
            // Delivered or dropped while its file was written.
            None => self.remove_file(id),
        }
    }
}

/// `d` scaled by a random factor in [0.5, 1.0): retries of many writes (and nodes) spread out.
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher as _, RandomState};
    // RandomState is seeded per instance from the OS: enough randomness for a backoff.
    let r = RandomState::new().hash_one(Instant::now()) % 1000;
    d.mul_f64(0.5 + r as f64 / 2000.0)
}

/// Write-then-rename: the file is either the old write, the new one, or absent.
fn persist(dir: &Path, path: &Path, stored: &Stored) -> io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".tmp-{name}"));
    let mut f = File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(stored).map_err(io::Error::other)?)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;
