//! The API writes waiting for the API server, persisted so they are delivered once each, also
//! when the API server is down for a while and across a restart of qoslet.
//!
//! One file per pending write under `<stateDir>/api-writes/`, named by its idempotency id
//! (`<id>.json`), written to a temporary name, fsynced, renamed and the directory fsynced; the
//! file is removed once the write is delivered. A write pushed again with the same id replaces
//! the pending one (node conditions: the newest value wins). Writes about the same object go out
//! in the order they were pushed (the pod's condition before its eviction); other writes do not
//! wait behind a write the API server refuses for now (a PDB's 429). Each write is retried with
//! its own exponential backoff, jittered so nodes that lost the API server together do not come
//! back in step. A write the API server refuses for good ([`Delivery::Rejected`]) is counted,
//! logged once and dropped. The queue is bounded ([`MAX_PENDING`]; a push beyond it drops the
//! oldest write) and a write older than [`TTL`] is dropped undelivered: after a long outage or
//! a crash, a stale decision is not replayed (and every pod write is bound to its pod's UID).
//!
//! Hand-written rather than a crate: what is needed is a few dozen lines over std::fs, and the
//! persistent queues on crates.io bring their own formats and background threads.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{self, Write as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};

use super::writes::{ApiWrite, Delivery};
use crate::lock;

const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// Pending writes at most. An eviction makes two or three; a node in trouble for hours makes a
/// few condition writes (each type replaces its own).
pub const MAX_PENDING: usize = 1024;
/// How long a write may wait for the API server before it is dropped.
pub const TTL: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Error)]
#[error("{path}: cannot persist a pending API write")]
pub struct QueueError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// A write as stored on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    seq: u64,
    /// Writes with the same key are delivered in `seq` order.
    key: String,
    /// When it was pushed, in seconds since the Unix epoch (wall clock: it must hold across a
    /// restart).
    #[serde(default)]
    queued_at: u64,
    write: ApiWrite,
}

struct Entry {
    stored: Stored,
    attempts: u32,
    due: Instant,
}

/// Writes the queue gave up on, by why and the write's kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropped {
    /// (kind, HTTP status) of writes the API server refused for good.
    pub rejected: BTreeMap<(&'static str, u16), u64>,
    /// Writes older than [`TTL`].
    pub expired: u64,
    /// Writes pushed out by newer ones beyond [`MAX_PENDING`].
    pub overflow: u64,
}

#[derive(Default)]
struct State {
    next_seq: u64,
    pending: BTreeMap<String, Entry>,
    delivered: u64,
    /// Counted since the last [`WriteQueue::take_dropped`].
    dropped: Dropped,
}

/// The persistent queue. Share it with `Arc`; [`WriteQueue::run`] delivers.
pub struct WriteQueue {
    dir: PathBuf,
    state: Mutex<State>,
    wake: Notify,
    /// Bumped after every delivery attempt: [`Self::settled`] waits on it (a write dropped for
    /// age or overflow is seen at its deadline).
    left: watch::Sender<u64>,
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
    pub fn open(dir: &Path) -> Result<Self, QueueError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| QueueError { path, source }
        };
        fs::create_dir_all(dir).map_err(err(dir))?;
        let mut state = State::default();
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
                Ok(stored) if expired(stored.queued_at) => {
                    tracing::info!(file = %path.display(), "Dropping a pending API write older than the queue's TTL.");
                    state.dropped.expired += 1;
                    let _ = fs::remove_file(&path);
                }
                Ok(stored) => {
                    state.next_seq = state.next_seq.max(stored.seq + 1);
                    state.pending.insert(
                        id.to_owned(),
                        Entry {
                            stored,
                            attempts: 0,
                            due: Instant::now(),
                        },
                    );
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
        Ok(Self {
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
            wake: Notify::new(),
            left: watch::Sender::new(0),
        })
    }

    /// Persists a write, then queues it. `id` must be unique per write (letters, digits, `-`,
    /// `_`, `.`); pushing an id again replaces that write. `key` orders writes about one object.
    pub fn push(&self, id: &str, key: &str, write: ApiWrite) -> Result<(), QueueError> {
        let path = self.dir.join(format!("{id}.json"));
        if !is_id(id) {
            return Err(QueueError {
                path,
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a write id"),
            });
        }
        let mut st = lock(&self.state);
        let seq = st.next_seq;
        st.next_seq += 1;
        let stored = Stored {
            seq,
            key: key.into(),
            queued_at: unix_now(),
            write,
        };
        persist(&self.dir, &path, &stored).map_err(|source| QueueError {
            path: path.clone(),
            source,
        })?;
        st.pending.insert(
            id.into(),
            Entry {
                stored,
                attempts: 0,
                due: Instant::now(),
            },
        );
        while st.pending.len() > MAX_PENDING {
            let Some(oldest) = st
                .pending
                .iter()
                .min_by_key(|(_, e)| e.stored.seq)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            st.pending.remove(&oldest);
            st.dropped.overflow += 1;
            self.remove_file(&oldest);
            tracing::warn!(id = %oldest, max = MAX_PENDING, "The API write queue is full; dropped its oldest write.");
        }
        drop(st);
        self.wake.notify_one();
        Ok(())
    }

    /// What was dropped since the last call (the reporter turns it into metrics).
    pub fn take_dropped(&self) -> Dropped {
        std::mem::take(&mut lock(&self.state).dropped)
    }

    fn remove_file(&self, id: &str) {
        let path = self.dir.join(format!("{id}.json"));
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(file = %path.display(), error = %e, "Could not remove a finished API write; it may be sent again (its effect is not repeated).");
        }
    }

    /// The pending writes, oldest first.
    pub fn pending(&self) -> Vec<(String, ApiWrite)> {
        let st = lock(&self.state);
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
    pub async fn settled(&self, id: &str, timeout: Duration) -> bool {
        // Subscribed before the first look, so a write that leaves in between still wakes us.
        let mut left = self.left.subscribe();
        let deadline = Instant::now() + timeout;
        loop {
            if !lock(&self.state).pending.contains_key(id) {
                return true;
            }
            match tokio::time::timeout_at(deadline, left.changed()).await {
                Ok(Ok(())) => {}
                _ => return !lock(&self.state).pending.contains_key(id),
            }
        }
    }

    /// Writes delivered since the queue was opened.
    pub fn delivered(&self) -> u64 {
        lock(&self.state).delivered
    }

    /// The writes due now, at most one per key (the oldest of that key). Expired writes are
    /// dropped first.
    fn due(&self) -> (Vec<(String, u64, ApiWrite)>, Option<Instant>) {
        let mut st = lock(&self.state);
        let stale: Vec<String> = st
            .pending
            .iter()
            .filter(|(_, e)| expired(e.stored.queued_at))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            st.pending.remove(&id);
            st.dropped.expired += 1;
            self.remove_file(&id);
            tracing::warn!(id = %id, ttl = ?TTL, "Dropped an API write the API server did not take in time.");
        }
        let now = Instant::now();
        let mut first_of_key: BTreeMap<&str, (&String, &Entry)> = BTreeMap::new();
        for (id, e) in &st.pending {
            let k = e.stored.key.as_str();
            match first_of_key.get(k) {
                Some((_, f)) if f.stored.seq < e.stored.seq => {}
                _ => {
                    first_of_key.insert(k, (id, e));
                }
            }
        }
        let mut due: Vec<(String, u64, ApiWrite)> = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, e) in first_of_key.into_values() {
            if e.due <= now {
                due.push((id.clone(), e.stored.seq, e.stored.write.clone()));
            } else {
                next = Some(next.map_or(e.due, |n| n.min(e.due)));
            }
        }
        due.sort_by_key(|(_, s, _)| *s);
        (due, next)
    }

    fn finish(&self, id: &str, seq: u64, result: &Delivery) {
        self.record_outcome(id, seq, result);
        self.left.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn record_outcome(&self, id: &str, seq: u64, result: &Delivery) {
        let mut st = lock(&self.state);
        let Some(e) = st.pending.get_mut(id) else {
            return;
        };
        if e.stored.seq != seq {
            // Replaced while in flight: the newer write is still to go.
            return;
        }
        match result {
            Delivery::Done => {
                st.pending.remove(id);
                st.delivered += 1;
                self.remove_file(id);
            }
            Delivery::Rejected { code, message } => {
                let kind = e.stored.write.kind();
                st.pending.remove(id);
                *st.dropped.rejected.entry((kind, *code)).or_default() += 1;
                self.remove_file(id);
                tracing::warn!(id, code, reason = %message, "The API server refused an API write for good; dropped, not retried.");
            }
            Delivery::Retry(why) => {
                e.attempts += 1;
                let backoff = jitter(
                    FIRST_RETRY
                        .saturating_mul(1 << e.attempts.min(10))
                        .min(MAX_RETRY),
                );
                e.due = Instant::now() + backoff;
                if e.attempts == 1 || e.attempts.is_multiple_of(10) {
                    tracing::warn!(id, attempts = e.attempts, reason = %why, "An API write was not delivered; retrying.");
                }
            }
        }
    }

    /// Delivers forever through `send` (one write at a time, oldest due first).
    pub async fn run<F, Fut>(self: Arc<Self>, send: F)
    where
        F: Fn(ApiWrite) -> Fut,
        Fut: Future<Output = Delivery>,
    {
        loop {
            let (due, next) = self.due();
            if due.is_empty() {
                let wait = next.map_or(Duration::from_secs(3600), |n| {
                    n.saturating_duration_since(Instant::now())
                });
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            for (id, seq, write) in due {
                let result = send(write).await;
                self.finish(&id, seq, &result);
            }
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A write from before the TTL. A write without a time (from an older qoslet) counts as old.
fn expired(queued_at: u64) -> bool {
    unix_now().saturating_sub(queued_at) > TTL.as_secs()
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
