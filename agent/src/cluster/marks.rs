//! Evictions a crash cut short, finished at start: the [`EvictionMark`]s on the kubelet's pod
//! cgroups read back, and the status writes of marked pods the API server still shows live
//! queued again.
//!
//! An eviction marks the pod's cgroup v2 directory, freezes it, queues its API writes (their
//! files written by the queue's thread) and kills (`eviction/pipeline.rs`, [`ApiEviction`]).
//! A crash before the writes reached the API server or their files leaves a pod the API server
//! shows Running that qoslet had decided to evict, and a crash between the freeze and the kill
//! leaves it frozen. The mark is on the pod's cgroup, which the kubelet keeps while the pod
//! lives, and the next start finishes the eviction: a pod cgroup still frozen is killed and
//! thawed, and what the eviction would have written is queued: phase Failed, reason
//! Evicted (the kubelet then tears the pod down), or with `evictionMethod: api` the Eviction
//! API's request, which honours PodDisruptionBudgets (whether the decision was at a hard
//! threshold the mark does not say). The writes keep their idempotency ids, so a write that did
//! reach the queue is replaced, not doubled. A marked pod that ran again after the eviction (a
//! container the API shows running started after the mark's time: the kubelet restarted what
//! was killed) is no longer evicted: its mark is removed and nothing is queued, or the restart
//! would evict, with a fresh time, a pod that has run fine since.

use std::{
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    time::Duration,
};

use super::{action::ApiEviction, queue::WriteQueue, writes::now};
use crate::{
    cgroup::{CgroupPath, fs::CgroupFs, name::check_pod_component},
    eviction::{EvictionRequest, SeenPod},
    persist::{EvictionMark, latest_running_start, started_after},
    policy::settings::CgroupDriver,
    source::PodSet,
    support::beneath,
};

/// At start, after the first list of the node's pods: the writes of every marked pod the API
/// server still shows live are queued again.
pub(crate) fn at_start(
    fs: &CgroupFs,
    driver: CgroupDriver,
    pods: &PodSet,
    action: &ApiEviction,
    queue: &WriteQueue,
) {
    let Some(unified) = crate::node::trees::unified_tree(fs.trees()) else {
        return;
    };
    let Ok(root_dir) = fs.open_dir_fd(unified, &CgroupPath::root()) else {
        return;
    };
    let found = find(root_dir.as_fd(), fs.node_root(), driver);
    if found.is_empty() {
        return;
    }
    let marks: Vec<EvictionMark> = found.iter().map(|f| f.mark.clone()).collect();
    let live = |uid: &str| {
        let p = pods.pods.iter().find(|(k, _)| k.uid == uid)?.1;
        let phase = p.pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let grace = p
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        Some(LivePod {
            terminal: matches!(phase, Some("Succeeded" | "Failed")),
            grace: Duration::from_secs(u64::try_from(grace).unwrap_or(0)),
            seen: SeenPod::of(&p.pod),
            running_since: latest_running_start(&p.pod),
        })
    };
    let requeued = requeue(&marks, live, action, queue);
    for uid in &requeued.ran_again {
        let Some(f) = found.iter().find(|f| &f.mark.uid == uid) else {
            continue;
        };
        if let Err(e) = EvictionMark::clear(f.dir.as_fd()) {
            tracing::warn!(cgroup = %f.path, error = %e, "Could not remove the eviction mark of a pod that runs again.");
        }
    }
    tracing::info!(
        marked = found.len(),
        queued = requeued.queued,
        ran_again = requeued.ran_again.len(),
        "Read back the eviction marks of the pods' cgroups."
    );
}

/// A mark found on a pod cgroup.
#[derive(Debug)]
pub struct Found {
    pub(crate) mark: EvictionMark,
    /// The pod cgroup it is on.
    pub(crate) path: CgroupPath,
    /// That cgroup's directory, opened beneath its parent while walking: the mark is removed
    /// through it, with no second lookup by path.
    pub(crate) dir: OwnedFd,
}

/// How deep below the node root a pod cgroup lies: `kubepods[.slice]`, the QoS tier (none for
/// Guaranteed pods), the pod.
const POD_DEPTH_MAX: usize = 3;

/// The marks on the pod cgroups of the kubelet's tree below `root_dir` (the node root's cgroup
/// v2 directory, open; `node_root` its path), each on the cgroup of the pod it names. Only the
/// `kubepods*` directories are walked, three levels at most, each opened beneath its parent.
pub fn find(root_dir: BorrowedFd<'_>, node_root: &CgroupPath, driver: CgroupDriver) -> Vec<Found> {
    let mut found = Vec::new();
    let mut level: Vec<(OwnedFd, CgroupPath)> = subdirs(root_dir, node_root)
        .into_iter()
        .filter(|(_, p)| {
            p.components()
                .last()
                .is_some_and(|c| c.starts_with("kubepods"))
        })
        .collect();
    for depth in 1..=POD_DEPTH_MAX {
        let mut next = Vec::new();
        for (dir, path) in level {
            if depth > 1
                && let Some(mark) = EvictionMark::read(dir.as_fd())
            {
                if check_pod_component(&path, driver, &mark.uid).is_ok() {
                    finish_frozen(&dir, &path);
                    found.push(Found { mark, path, dir });
                } else {
                    tracing::warn!(cgroup = %path, uid = %mark.uid, "An eviction mark names a pod other than its cgroup's; ignored.");
                }
                // A pod's cgroup holds containers, not pods.
                continue;
            }
            if depth < POD_DEPTH_MAX {
                next.extend(subdirs(dir.as_fd(), &path));
            }
        }
        level = next;
    }
    found
}

/// Kills and thaws a marked pod cgroup that a crash left frozen (between the eviction's freeze
/// and its kill): the decision was taken, and frozen processes would otherwise sit out the
/// kubelet's whole grace period. A cgroup not frozen is left alone.
fn finish_frozen(dir: &OwnedFd, path: &CgroupPath) {
    use std::io::Write as _;
    let open = |file: &str, flags| {
        beneath::openat2(dir.as_raw_fd(), file, flags, 0, beneath::RESOLVE_STRICT)
    };
    let frozen = open("cgroup.freeze", libc::O_RDONLY)
        .and_then(crate::cgroup::fs::read_small)
        .is_ok_and(|v| v.trim() == "1");
    if !frozen {
        return;
    }
    let write = |file: &str, value: &[u8]| {
        open(file, libc::O_WRONLY).and_then(|fd| std::fs::File::from(fd).write_all(value))
    };
    // The kill reaches frozen processes; thawed after it, they die without running. Before
    // Linux 5.14 there is no cgroup.kill: SIGKILL to each of its processes.
    let killed = match write("cgroup.kill", b"1") {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::eviction::action::sigkill_below(dir, std::path::Path::new(&path.to_string()))
                .map(drop)
                .map_err(std::io::Error::other)
        }
        other => other,
    };
    let thawed = write("cgroup.freeze", b"0");
    match killed.and(thawed) {
        Ok(()) => {
            tracing::warn!(cgroup = %path, "An eviction cut short by a restart left its pod frozen; killed it.");
        }
        Err(e) => {
            tracing::warn!(cgroup = %path, error = %e, "An eviction cut short by a restart left its pod frozen and it could not be killed.");
        }
    }
}

/// The child directories of `dir` (cgroup `path`) whose names are valid cgroup components,
/// opened beneath it.
fn subdirs(dir: BorrowedFd<'_>, path: &CgroupPath) -> Vec<(OwnedFd, CgroupPath)> {
    let Ok(names) = beneath::subdirs(dir) else {
        return Vec::new();
    };
    names
        .into_iter()
        .filter_map(|name| {
            let child = path.join(&name).ok()?;
            let fd = beneath::open_subdir(dir, &name).ok()?;
            Some((fd, child))
        })
        .collect()
}

/// A pod as the API server shows it at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LivePod {
    /// Phase Succeeded or Failed: nothing left to write.
    pub(crate) terminal: bool,
    /// `terminationGracePeriodSeconds`, for an Eviction API request.
    pub(crate) grace: Duration,
    /// Its generation and conditions now, for the Failed status.
    pub(crate) seen: SeenPod,
    /// The start of its latest running container (seconds since the Unix epoch).
    pub(crate) running_since: Option<u64>,
}

/// What [`requeue`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Requeued {
    /// Evictions whose writes were queued again.
    pub(crate) queued: usize,
    /// The uids of marked pods that ran again after their eviction: nothing queued.
    pub(crate) ran_again: Vec<String>,
}

/// Queues the writes of each marked eviction whose pod (same UID) `live` finds not terminal and
/// not run again since the mark, unless writes about that pod are still in the queue.
pub(crate) fn requeue(
    marks: &[EvictionMark],
    live: impl Fn(&str) -> Option<LivePod>,
    action: &ApiEviction,
    queue: &WriteQueue,
) -> Requeued {
    let mut out = Requeued::default();
    for mark in marks {
        let Some(pod) = live(&mark.uid).filter(|p| !p.terminal) else {
            continue;
        };
        if queue.has_pending(&mark.uid) {
            // The queue read its writes back from disk: they were not lost, and sending them
            // again beside the stored ones would PATCH the status twice.
            continue;
        }
        if let Some(started) = started_after(pod.running_since, mark.at) {
            tracing::warn!(pod = %mark.key(), evicted_at = mark.at, started_at = started, "A pod whose eviction a restart cut short runs again since (a container started after it); not evicted again.");
            out.ran_again.push(mark.uid.clone());
            continue;
        }
        let req = EvictionRequest {
            pod: mark.key(),
            cgroups: Default::default(),
            grace: pod.grace,
            message: mark.message.clone(),
            annotations: mark.annotations.clone(),
            seen: pod.seen,
            signal: String::new(),
            hard: false,
            unit: None,
            revision: mark.spec,
        };
        let mut ok = true;
        for (id, w) in action.writes(&req, &now()) {
            if let Err(e) = queue.push(&id, &mark.uid, w) {
                tracing::error!(pod = %req.pod, error = %e, "Could not queue the API write of an eviction cut short by a restart.");
                ok = false;
            }
        }
        if ok {
            tracing::warn!(pod = %req.pod, "An eviction's API writes were lost in a restart; queued again.");
            out.queued += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests;
