//! The state file, the eviction marks and the node lock (see the room's doc, `mod.rs`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{self, File},
    io::{self, Write as _},
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{
    cgroup::{CgroupBeneath, CgroupPath},
    policy::pod::PodKey,
    source::PodSet,
};

#[derive(Debug, Error)]
pub enum StateError {
    #[error("another qoslet already runs on the node root {root} (it holds the lock on {path})")]
    Locked { root: String, path: PathBuf },
    #[error("cannot lock the node root {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the state file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The lock on the node root; released when dropped or when the process ends.
#[derive(Debug)]
pub(crate) struct NodeLock {
    _lock: Flock<OwnedFd>,
}

impl NodeLock {
    /// Locks the node root's directory in one hierarchy (every instance on this node root picks
    /// the same one), opened beneath the node root's descriptor like every other cgroup file.
    pub(crate) fn acquire(dir: &CgroupBeneath) -> Result<Self, StateError> {
        let path = dir.display();
        let fd = dir.open().map_err(|source| StateError::Lock {
            path: path.clone(),
            source,
        })?;
        match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Self { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(StateError::Locked {
                root: dir.fs.node_root().to_string(),
                path,
            }),
            Err((_, e)) => Err(StateError::Lock {
                path,
                source: e.into(),
            }),
        }
    }
}

/// The file name part for a node root: its components joined by `_`, or `root`.
fn node_root_name(root: &CgroupPath) -> String {
    if root.depth() == 0 {
        "root".to_owned()
    } else {
        root.components().join("_")
    }
}

/// The marker that says qoslet created the node root `root` (standalone), under `dir`.
pub(crate) fn node_root_marker(dir: &Path, root: &CgroupPath) -> PathBuf {
    dir.join(format!("node-{}.created", node_root_name(root)))
}

/// An evicted pod, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct EvictedRecord {
    namespace: String,
    name: String,
    /// A hash of the pod's spec when it was evicted: a changed manifest is a new pod.
    spec: u64,
    message: String,
    /// When it was evicted, in seconds since the Unix epoch; 0 in the records of a qoslet that
    /// did not keep it (such a record holds until the pod changes).
    #[serde(default)]
    at: u64,
}

/// Now in seconds since the Unix epoch: an eviction's time, compared with the kubelet's
/// container start times (wall clock on both sides, and the API's resolution).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// When `pod` ran again after an eviction at `at` (seconds since the Unix epoch): the start of
/// the latest container the API shows running that started after `at`. Never for `at == 0` (no
/// time kept) or a pod without status (standalone manifests: qoslet's runtime does not start
/// an evicted pod again).
pub(crate) fn ran_again_since(pod: &k8s_openapi::api::core::v1::Pod, at: u64) -> Option<u64> {
    started_after(latest_running_start(pod), at)
}

/// `running_since` ([`latest_running_start`]) when it is after an eviction at `at` (0: no time
/// kept, never).
pub(crate) fn started_after(running_since: Option<u64>, at: u64) -> Option<u64> {
    running_since.filter(|started| at > 0 && *started > at)
}

/// The start (seconds since the Unix epoch) of the latest container the API shows running.
pub(crate) fn latest_running_start(pod: &k8s_openapi::api::core::v1::Pod) -> Option<u64> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .filter_map(|t| u64::try_from(t.0.as_second()).ok())
        .max()
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Persisted {
    /// By pod uid.
    #[serde(default)]
    evicted: BTreeMap<String, EvictedRecord>,
    /// Pod and container cgroups qoslet created, relative to the node root.
    #[serde(default)]
    cgroups: BTreeSet<String>,
}

/// The node's state file and what it holds now.
#[derive(Debug)]
pub(crate) struct StateFile {
    path: Option<PathBuf>,
    saved: Persisted,
    now: Persisted,
    /// The last save reached the disk (fsync).
    synced: bool,
    /// How many times the file was written: a sync done outside the lock ([`Unsynced`]) counts
    /// only for the write it followed.
    writes: u64,
}

/// A state file written to the page cache and not yet synced: [`Unsynced::sync`] waits for the
/// disk without the state's lock, so a slow disk (seconds, beside a build) holds up neither the
/// eviction that wrote it nor the readers of the state; [`StateFile::synced`] then says so.
#[derive(Debug)]
pub(crate) struct Unsynced {
    path: PathBuf,
    write: u64,
}

impl Unsynced {
    /// fsync of the file as it is at its path now (the write before it, or a later one).
    pub(crate) fn sync(&self) -> Result<(), StateError> {
        File::open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(|source| StateError::Write {
                path: self.path.clone(),
                source,
            })
    }
}

impl StateFile {
    /// The state of the node root `root` under `dir`; a missing or unreadable file is an empty
    /// state (said once). `None` keeps the state in memory only (observe mode, tests).
    pub(crate) fn load(dir: Option<&Path>, root: &CgroupPath) -> Self {
        let Some(dir) = dir else {
            return Self::in_memory();
        };
        let path = dir.join(format!("node-{}.json", node_root_name(root)));
        let saved = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "The state file is not valid; starting with an empty state.");
                Persisted::default()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Persisted::default(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "Cannot read the state file; starting with an empty state.");
                Persisted::default()
            }
        };
        for r in saved.evicted.values() {
            // A pod that is not started again must say why, or a restarted node looks broken.
            tracing::info!(pod = %format_args!("{}/{}", r.namespace, r.name), state = %path.display(), "Evicted by an earlier run: not started again until its manifest changes.");
        }
        Self {
            path: Some(path),
            now: saved.clone(),
            saved,
            synced: true,
            writes: 0,
        }
    }

    pub(crate) fn in_memory() -> Self {
        Self {
            path: None,
            saved: Persisted::default(),
            now: Persisted::default(),
            synced: true,
            writes: 0,
        }
    }

    /// Whether the pod, with the spec whose hash is `spec` ([`crate::source::spec_hash`]), was
    /// evicted.
    pub(crate) fn is_evicted(&self, key: &PodKey, spec: u64) -> bool {
        self.now
            .evicted
            .get(&key.uid)
            .is_some_and(|r| r.spec == spec)
    }

    /// The evicted pods.
    pub(crate) fn evicted(&self) -> impl Iterator<Item = PodKey> + '_ {
        self.now.evicted.iter().map(|(uid, r)| PodKey {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: uid.clone(),
        })
    }

    /// Records an eviction of the pod whose spec has the hash `spec` ([`crate::source::spec_hash`])
    /// at `at` (seconds since the Unix epoch).
    /// A second record of the same eviction keeps the first one's time.
    pub(crate) fn record_evicted(&mut self, key: &PodKey, spec: u64, message: &str, at: u64) {
        let at = match self.now.evicted.get(&key.uid) {
            Some(r) if r.spec == spec && r.at > 0 => r.at.min(at),
            _ => at,
        };
        self.now.evicted.insert(
            key.uid.clone(),
            EvictedRecord {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                spec,
                message: message.to_owned(),
                at,
            },
        );
    }

    /// Forgets evictions of pods that left the source or changed (those are new pods), and of
    /// pods that ran again since ([`ran_again_since`]): candidates again.
    pub(crate) fn retain_present(&mut self, pods: &PodSet) {
        let present: BTreeMap<&str, &crate::source::ManifestPod> =
            pods.pods.iter().map(|(k, p)| (k.uid.as_str(), p)).collect();
        self.now.evicted.retain(|uid, r| {
            let Some(p) = present.get(uid.as_str()).filter(|p| p.spec_hash == r.spec) else {
                return false;
            };
            if let Some(started) = ran_again_since(&p.pod, r.at) {
                tracing::warn!(pod = %format_args!("{}/{}", r.namespace, r.name), evicted_at = r.at, started_at = started, "A pod evicted earlier runs again (a container started after the eviction); it is a candidate again.");
                return false;
            }
            true
        });
    }

    /// The cgroups the earlier run created.
    pub(crate) fn created_cgroups(&self) -> Vec<CgroupPath> {
        self.now
            .cgroups
            .iter()
            .filter_map(|p| CgroupPath::parse(p).ok())
            .collect()
    }

    pub(crate) fn set_created_cgroups(&mut self, cgroups: &BTreeSet<CgroupPath>) {
        self.now.cgroups = cgroups.iter().map(CgroupPath::relative).collect();
    }

    /// Writes the state when it changed since the last save. `durable` waits for the disk
    /// (fsync); without it the file survives a crash of qoslet, not of the machine, and the write
    /// costs no disk wait (the eviction path records this way, before the kill).
    pub(crate) fn save(&mut self, durable: bool) -> Result<(), StateError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if self.now == self.saved && (self.synced || !durable) {
            return Ok(());
        }
        let err = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(err)?;
        }
        let tmp = path.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(&self.now).map_err(|e| err(e.into()))?;
        let mut f = File::create(&tmp).map_err(err)?;
        f.write_all(&body).map_err(err)?;
        if durable {
            f.sync_all().map_err(err)?;
        }
        fs::rename(&tmp, path).map_err(err)?;
        self.saved = self.now.clone();
        self.synced = durable;
        self.writes += 1;
        Ok(())
    }

    /// Writes the state when it changed (page cache only, see [`Self::save`]); what remains to
    /// sync, unless the disk holds it already or the state lives in memory.
    pub(crate) fn write(&mut self) -> Result<Option<Unsynced>, StateError> {
        self.save(false)?;
        Ok(match &self.path {
            Some(path) if !self.synced => Some(Unsynced {
                path: path.clone(),
                write: self.writes,
            }),
            _ => None,
        })
    }

    /// `done` was synced: the disk holds the state if nothing was written since.
    pub(crate) fn synced(&mut self, done: &Unsynced) {
        if done.write == self.writes {
            self.synced = true;
        }
    }
}

/// An eviction as marked on the pod's cgroup v2 directory (see the module's comment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictionMark {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    /// [`crate::source::spec_hash`] of the pod when it was evicted.
    pub(crate) spec: u64,
    pub(crate) message: String,
    /// When the eviction was decided, in seconds since the Unix epoch; 0 in the marks of a
    /// qoslet that did not keep it.
    #[serde(default)]
    pub at: u64,
    /// The Event's annotations (`offending_containers`, ...), so that an eviction finished after
    /// a restart posts the kubelet's Event whole; left out when the mark would not fit.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) annotations: BTreeMap<String, String>,
}

/// The extended attribute that holds an [`EvictionMark`] (cgroup v2 takes `user.` attributes
/// since Linux 5.7).
const MARK_ATTR: &std::ffi::CStr = c"user.qoslet.evicted";
/// A mark is a few hundred bytes; a larger attribute is not one of ours.
const MARK_MAX: usize = 4096;

impl EvictionMark {
    pub fn new(key: &PodKey, spec: u64, message: &str, at: u64) -> Self {
        Self {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid: key.uid.clone(),
            spec,
            // Bounded, so the mark always fits (the kubelet's message is about 120 bytes).
            message: message.chars().take(1024).collect(),
            at,
            annotations: BTreeMap::new(),
        }
    }

    /// With the Event's annotations, when the mark still fits in [`MARK_MAX`] with them.
    pub(crate) fn with_annotations(mut self, annotations: &BTreeMap<String, String>) -> Self {
        let size = |m: &Self| serde_json::to_vec(m).map_or(usize::MAX, |b| b.len());
        let without = size(&self);
        self.annotations = annotations.clone();
        if size(&self) > MARK_MAX && without <= MARK_MAX {
            self.annotations.clear();
        }
        self
    }

    pub(crate) fn key(&self) -> PodKey {
        PodKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }

    /// Marks the cgroup v2 directory `dir` (opened beneath the node root for reading).
    pub fn write(&self, dir: BorrowedFd<'_>) -> io::Result<()> {
        let body = serde_json::to_vec(self).map_err(io::Error::other)?;
        // SAFETY: a descriptor we borrow, a NUL-terminated name, and a buffer of the length given.
        let r = unsafe {
            libc::fsetxattr(
                dir.as_raw_fd(),
                MARK_ATTR.as_ptr(),
                body.as_ptr().cast(),
                body.len(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Removes the mark from `dir` (a pod that ran again since: the eviction no longer holds).
    /// A directory without one is fine.
    pub(crate) fn clear(dir: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: a descriptor we borrow and a NUL-terminated name.
        let r = unsafe { libc::fremovexattr(dir.as_raw_fd(), MARK_ATTR.as_ptr()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENODATA) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The mark on `dir` (opened beneath the node root for reading), if it has a valid one.
    pub fn read(dir: BorrowedFd<'_>) -> Option<Self> {
        let mut buf = vec![0u8; MARK_MAX];
        // SAFETY: a descriptor we borrow, a NUL-terminated name, and a buffer of the length given.
        let n = unsafe {
            libc::fgetxattr(
                dir.as_raw_fd(),
                MARK_ATTR.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let n = usize::try_from(n).ok()?;
        let mark: Self = serde_json::from_slice(&buf[..n]).ok()?;
        // Only an evicted record comes of it, keyed by a valid uid; names are bounded as the
        // API bounds them.
        let valid = crate::cgroup::name::validate_uid(&mark.uid).is_ok()
            && mark.namespace.len() <= 253
            && mark.name.len() <= 253;
        valid.then_some(mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::pod_set;

    const UID: &str = "aaaaaaaa-0000-4000-8000-00000000000a";

    fn yaml(command: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: a, namespace: default, uid: {UID}}}\nspec:\n  containers: [{{name: c, command: [{command}]}}]\n"
        )
    }

    fn key() -> PodKey {
        PodKey {
            namespace: "default".into(),
            name: "a".into(),
            uid: UID.into(),
        }
    }

    #[test]
    fn evictions_survive_a_restart_until_the_pod_changes() {
        let dir = std::env::temp_dir().join(format!("qoslet-state-{}", std::process::id()));
        let root = CgroupPath::parse("/node-a").unwrap();
        let first = pod_set(&yaml("sleep"), &PodSet::default());
        let p = &first.pods[&key()];
        let mut s = StateFile::load(Some(&dir), &root);
        s.record_evicted(&key(), p.spec_hash, "low on memory", 0);
        s.set_created_cgroups(&[CgroupPath::parse("/kubepods/poda").unwrap()].into());
        s.save(true).unwrap();

        let mut again = StateFile::load(Some(&dir), &root);
        assert!(again.is_evicted(&key(), p.spec_hash));
        let changed = pod_set(&yaml("'true'"), &first);
        assert_ne!(changed.pods[&key()].spec_hash, p.spec_hash);
        assert!(!again.is_evicted(&key(), changed.pods[&key()].spec_hash));
        assert_eq!(
            again.created_cgroups(),
            vec![CgroupPath::parse("/kubepods/poda").unwrap()]
        );
        // The manifest changed: a new pod, no longer evicted.
        again.retain_present(&changed);
        assert_eq!(again.evicted().count(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A write leaves a sync to do; the sync counts only for the write it followed, and a state
    /// on the disk asks for none.
    #[test]
    fn a_sync_outside_the_lock_counts_for_its_own_write_only() {
        let dir = std::env::temp_dir().join(format!("qoslet-state-sync-{}", std::process::id()));
        let root = CgroupPath::parse("/node-a").unwrap();
        let mut s = StateFile::load(Some(&dir), &root);
        assert!(
            s.write().unwrap().is_none(),
            "nothing changed, nothing to sync"
        );
        s.record_evicted(&key(), 1, "low on memory", 1);
        let first = s.write().unwrap().expect("written, not synced");
        let path = dir.join("node-node-a.json");
        assert!(fs::read_to_string(&path).unwrap().contains("low on memory"));
        // Written again before the first sync ended: that sync does not cover the second write.
        s.record_evicted(&key(), 2, "low on memory again", 2);
        let second = s.write().unwrap().expect("written, not synced");
        first.sync().unwrap();
        s.synced(&first);
        assert!(
            s.write().unwrap().is_some(),
            "the second write is not synced yet"
        );
        second.sync().unwrap();
        s.synced(&second);
        assert!(s.write().unwrap().is_none());
        assert!(StateFile::load(Some(&dir), &root).is_evicted(&key(), 2));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The API shows a container of the evicted pod running, started after the eviction: the
    /// record goes (a candidate again). Started before it, or a record without a time: kept.
    #[test]
    fn an_eviction_holds_until_the_pod_runs_again() {
        let at = 1_800_000_000;
        let running_since = |started: u64| {
            let mut set = pod_set(&yaml("sleep"), &PodSet::default());
            let p = set.pods.get_mut(&key()).unwrap();
            p.pod.status = Some(
                serde_json::from_value(serde_json::json!({
                    "phase": "Running",
                    "containerStatuses": [{
                        "name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
                        "state": {"running": {"startedAt": jiff::Timestamp::from_second(started as i64).unwrap().to_string()}},
                    }],
                }))
                .unwrap(),
            );
            set
        };
        for (recorded, started, kept) in [
            (at, at + 1, false),
            (at, at, true),
            (at, at - 60, true),
            (0, at + 1, true),
        ] {
            let set = running_since(started);
            let mut s = StateFile::in_memory();
            s.record_evicted(
                &key(),
                set.pods[&key()].spec_hash,
                "low on memory",
                recorded,
            );
            s.retain_present(&set);
            assert_eq!(
                s.evicted().count() == 1,
                kept,
                "evicted at {recorded}, started at {started}"
            );
        }
        // A second record of the same eviction keeps the first time.
        let set = running_since(at + 1);
        let mut s = StateFile::in_memory();
        let spec = set.pods[&key()].spec_hash;
        s.record_evicted(&key(), spec, "m", at);
        s.record_evicted(&key(), spec, "m", at + 5);
        s.retain_present(&set);
        assert_eq!(s.evicted().count(), 0);
    }

    #[test]
    fn a_second_lock_on_the_node_root_is_refused_until_the_first_is_dropped() {
        let dir = std::env::temp_dir().join(format!("qoslet-lock-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let root = CgroupBeneath::own(&dir, crate::cgroup::Tree::Unified).unwrap();
        let first = NodeLock::acquire(&root).unwrap();
        // Another open of the same directory, as a second instance's would be.
        let other = CgroupBeneath::own(&dir, crate::cgroup::Tree::Unified).unwrap();
        match NodeLock::acquire(&other) {
            Err(StateError::Locked { path, .. }) => assert_eq!(path, dir),
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(first);
        NodeLock::acquire(&other).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
