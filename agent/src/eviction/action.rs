//! What an eviction does. Standalone: SIGTERM to the pod's processes, the grace period, then
//! the whole cgroup killed (`cgroup.kill` where a v2 cgroup exists, else SIGKILL to every pid
//! of cgroup.procs until it is empty). Only pids read from the pod's own cgroups are signalled.
//! The cluster action (the Eviction API) wraps it.

use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1 as core;
use nix::{
    errno::Errno,
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{
    cgroup::{CgroupBeneath, parse_procs},
    policy::pod::PodKey,
    support::beneath,
};

use super::signals::SignalError;

/// How long SIGKILL is repeated before giving up on a v1 cgroup that does not empty.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);
/// How often [`wait_unpopulated`] reads `cgroup.events` without a notification: a missed one
/// costs at most this.
const UNPOPULATED_RECHECK: Duration = Duration::from_millis(100);
/// How long [`PodCgroups::freeze`] waits for the kernel to report the pod frozen: a task stops at
/// its next return to user space, in microseconds, unless it sleeps uninterruptibly (reclaim
/// under memory pressure, I/O).
pub(crate) const FREEZE_TIMEOUT: Duration = Duration::from_secs(1);
const FREEZE_POLL: Duration = Duration::from_millis(1);

/// The cgroups of one pod: every directory its processes are in (the v1 controllers' and, on
/// hybrid hosts, the unified tree's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodCgroups {
    /// Directories whose `cgroup.procs` are the pod's processes.
    pub procs: Vec<CgroupBeneath>,
    /// A cgroup v2 directory with `cgroup.kill` (kernel 5.14+), when the pod has one.
    pub unified: Option<CgroupBeneath>,
}

impl PodCgroups {
    /// Freezes the pod's processes (cgroup v2 `cgroup.freeze`, in the kernel since 5.2, on pure
    /// v2 and on the unified tree of a hybrid host) and waits until the kernel says they are
    /// (`frozen 1` in `cgroup.events`), at most [`FREEZE_TIMEOUT`]: they stop where they are,
    /// allocate nothing more and run no code, while a fatal signal still kills them. When the
    /// freeze was written; `None` when the pod has no cgroup v2 directory or the write failed
    /// (said in the log), which leaves the processes running until the kill.
    pub(crate) async fn freeze(&self) -> Option<Instant> {
        let dir = self.unified.as_ref()?;
        let at = Instant::now();
        if let Err(e) = dir.write_file("cgroup.freeze", "1") {
            tracing::warn!(cgroup = %dir.display().display(), error = %e, "Could not freeze an evicted pod's cgroup; its processes run until the kill.");
            return None;
        }
        let deadline = tokio::time::Instant::now() + FREEZE_TIMEOUT;
        loop {
            let events = dir.read_file("cgroup.events").unwrap_or_default();
            let done = events
                .lines()
                .any(|l| l == "frozen 1" || l == "populated 0");
            if done {
                return Some(at);
            }
            if tokio::time::Instant::now() > deadline {
                tracing::warn!(cgroup = %dir.display().display(), timeout = ?FREEZE_TIMEOUT, "An evicted pod's processes were not all frozen in time (one in uninterruptible sleep?); going on.");
                return Some(at);
            }
            tokio::time::sleep(FREEZE_POLL).await;
        }
    }

    /// Thaws the pod's cgroup v2 directory once its processes are gone, so that nothing the
    /// runtime places there later (it should place nothing) starts frozen. A cgroup removed
    /// meanwhile is fine.
    pub(crate) fn thaw(&self) {
        let Some(dir) = &self.unified else {
            return;
        };
        if let Err(e) = dir.write_file("cgroup.freeze", "0")
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(cgroup = %dir.display().display(), error = %e, "Could not thaw an evicted pod's emptied cgroup.");
        }
    }
}

impl CgroupBeneath {
    /// The pids of this directory's own `cgroup.procs` (through the held descriptor when there
    /// is one); an absent cgroup has none.
    pub(crate) fn read_procs(&self) -> Result<Vec<i32>, SignalError> {
        let mut out = Vec::new();
        procs_of(self, false, &mut out)?;
        Ok(out)
    }
}

#[derive(Debug, Error)]
pub enum ActionError {
    #[error(transparent)]
    Read(#[from] SignalError),
    #[error("signalling pid {pid}")]
    Signal {
        pid: i32,
        #[source]
        source: Errno,
    },
    #[error("writing {path}")]
    Kill {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the cgroups of {pod} still hold processes {timeout:?} after SIGKILL")]
    NotEmpty { pod: PodKey, timeout: Duration },
}

/// The pod status an eviction leaves: what pkg/kubelet/eviction/eviction_manager.go `evictPod`
/// (line 633) sets in its status function (phase, reason, message, the `DisruptionTarget`
/// condition), and what the kubelet's status then reads for a Failed pod
/// (pkg/kubelet/kubelet_pods.go `generateAPIPodStatus`, line 1910): `Ready` and
/// `ContainersReady` False with reason `PodFailed`, and the pod's generation as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictedStatus {
    /// `Failed`.
    pub phase: &'static str,
    /// `Evicted`.
    pub reason: &'static str,
    pub message: String,
    /// `status.observedGeneration`: pkg/kubelet/status/status_manager.go `SetPodStatus` (line
    /// 500) sets `CalculatePodStatusObservedGeneration` (pkg/api/v1/pod/util.go line 521), the
    /// pod's generation, the `PodObservedGenerationTracking` gate being locked on.
    pub(crate) observed_generation: i64,
    /// `DisruptionTarget`, `Ready`, `ContainersReady`, in the order the kubelet lists them.
    pub conditions: Vec<PodCondition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCondition {
    pub type_: &'static str,
    pub(crate) status: &'static str,
    pub(crate) reason: &'static str,
    /// Empty for `Ready` and `ContainersReady` (the API leaves an empty message out).
    pub(crate) message: String,
    /// [`condition_observed_generation`].
    pub(crate) observed_generation: i64,
    /// The pod's status already had this condition at this status: its `lastTransitionTime`
    /// stays (pkg/kubelet/status/status_manager.go `updateLastTransitionTime`, line 1116;
    /// pkg/api/v1/pod/util.go `UpdatePodCondition`, line 363); else it is the eviction's time.
    pub(crate) unchanged: bool,
}

/// The pod as the source last saw it, as far as the status an eviction leaves depends on it:
/// the kubelet computes that status against the pod's generation and its current status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeenPod {
    /// `metadata.generation`; 0 when unset (a manifest), which the API leaves out.
    #[serde(default)]
    pub(crate) generation: i64,
    /// `status.conditions`: type -> status.
    #[serde(default)]
    pub(crate) conditions: BTreeMap<String, String>,
}

impl SeenPod {
    pub(crate) fn of(pod: &core::Pod) -> Self {
        Self {
            generation: pod.metadata.generation.unwrap_or(0),
            conditions: pod
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect(),
        }
    }
}

/// pkg/api/v1/pod/util.go `CalculatePodConditionObservedGeneration` (line 533): the generation
/// when the `PodObservedGenerationTracking` gate is on, else only for a condition whose current
/// `observedGeneration` is set. The gate is GA and locked on from 1.35
/// (pkg/features/kube_features.go line 1982; v1.37.2 refuses to start with it off), and the
/// status it is given is never nil (`evictPod` passes the status being built), so it is the
/// generation.
pub(crate) fn condition_observed_generation(seen: &SeenPod) -> i64 {
    seen.generation
}

/// The reason (pod status, Event) of a pod the node evicted, as the kubelet's eviction manager
/// writes it (pkg/kubelet/eviction `Reason`). The one spelling: every place that sets or reads
/// it goes through this (`node::PodStatus::set_evicted`, `is_evicted`).
pub(crate) const EVICTED: &str = "Evicted";

/// The reason of `Ready` and `ContainersReady` in a Failed pod (pkg/kubelet/status/generate.go
/// `PodFailed`).
const POD_FAILED: &str = "PodFailed";

impl EvictedStatus {
    /// The status the eviction of `seen` with `message` leaves.
    ///
    /// - `DisruptionTarget` True, `TerminationByKubelet`, the message: eviction_manager.go
    ///   `synchronize` (line 440) builds it, `evictPod` sets its observed generation.
    /// - `Ready` and `ContainersReady` False, `PodFailed`, no message: pkg/kubelet/status/
    ///   generate.go `GenerateContainersReadyCondition` (line 51) returns
    ///   `generateContainersReadyConditionForTerminalPhase` (line 293) for phase Failed, and
    ///   `GeneratePodReadyCondition` (line 127) copies a not-True ContainersReady's status,
    ///   reason and message. (Reason `UnknownContainerStatuses` only without container
    ///   statuses, which `convertToAPIContainerStatuses` gives every container of a pod.)
    pub(crate) fn new(message: String, seen: &SeenPod) -> Self {
        let generation = condition_observed_generation(seen);
        let condition = |type_, status, reason, message| PodCondition {
            type_,
            status,
            reason,
            message,
            observed_generation: generation,
            unchanged: seen.conditions.get(type_).is_some_and(|s| s == status),
        };
        Self {
            phase: "Failed",
            reason: EVICTED,
            conditions: vec![
                condition(
                    "DisruptionTarget",
                    "True",
                    "TerminationByKubelet",
                    message.clone(),
                ),
                condition("Ready", "False", POD_FAILED, String::new()),
                condition("ContainersReady", "False", POD_FAILED, String::new()),
            ],
            observed_generation: seen.generation,
            message,
        }
    }
}

/// What an action did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// When the pod's processes were first stopped: frozen (cluster mode), signalled or killed
    /// by `cgroup.kill`; `None` if nothing was done (no process left and no `cgroup.kill`).
    pub first_signal_at: Option<Instant>,
    pub(crate) signalled: usize,
    pub status: EvictedStatus,
}

/// One pod to evict, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionRequest {
    pub pod: PodKey,
    pub cgroups: PodCgroups,
    /// SIGTERM first, then this long before the kill; zero kills at once (qoslet's choice at a
    /// hard threshold: `policy::eviction::eviction_grace_secs` says why).
    pub grace: Duration,
    /// The kubelet's message: "The node was low on resource: memory. Threshold quantity: ...".
    pub message: String,
    /// The Event's annotations (helpers.go `evictionMessage`): `offending_containers`,
    /// `offending_containers_usage`, `starved_resource`, and for pod-level requests
    /// `offending_pod`, `offending_pod_usage`. Empty when not known.
    pub annotations: BTreeMap<String, String>,
    /// What the pod's evicted status depends on.
    pub seen: SeenPod,
    pub signal: String,
    /// A hard threshold: killed at once, and (in a cluster) no PodDisruptionBudget can refuse
    /// it. The kubelet gives 2 s there; qoslet does not wait (`eviction_grace_secs`).
    pub hard: bool,
    /// The disruption unit (gang) the pod goes with, when it does not go alone.
    pub unit: Option<String>,
    /// The pod's spec revision (`ManagedPod::revision`).
    pub revision: u64,
}

/// Evicts one pod.
pub trait EvictionAction: Send + Sync {
    fn evict(
        &self,
        req: &EvictionRequest,
    ) -> impl Future<Output = Result<Outcome, ActionError>> + Send;

    /// A pod whose eviction this action still waits to hand over: an Eviction API request that
    /// a PodDisruptionBudget refuses for now, say. The manager starts no other graceful
    /// eviction meanwhile, so refused requests do not pile up, one per pass, to go all at once
    /// when the budget allows. `None` for actions that hand nothing over.
    fn awaiting(&self) -> Option<PodKey> {
        None
    }
}

/// The standalone action: signals and cgroup kills, no API server.
#[derive(Debug, Clone, Copy, Default)]
pub struct CgroupKill;

/// The pod's processes: its cgroups' and their descendants' (under the kubelet every process sits
/// in a container cgroup below the pod's, and `cgroup.procs` lists a cgroup's own members only).
/// The cgroup v2 directory's errors count; the v1 directories are read as far as they can be: a
/// v1 `cgroup.procs` cannot be held open, since a re-read through one open file may return the
/// kernel's cached pid list of up to a second before (`cgroup_pidlist_start`).
fn procs(cgroups: &PodCgroups) -> Result<Vec<i32>, SignalError> {
    let mut all = Vec::new();
    if let Some(u) = &cgroups.unified {
        procs_below(u, &mut all)?;
        for d in cgroups.procs.iter().filter(|d| *d != u) {
            let _ = procs_below(d, &mut all);
        }
    } else {
        for d in &cgroups.procs {
            procs_below(d, &mut all)?;
        }
    }
    all.sort_unstable();
    all.dedup();
    Ok(all)
}

/// The pids of `dir` and its descendants. The directory is opened beneath the node root, its
/// descendants beneath it, one component at a time; its own `cgroup.procs` is read through the
/// held descriptor when there is one (`held.rs`).
fn procs_below(dir: &CgroupBeneath, out: &mut Vec<i32>) -> Result<(), SignalError> {
    procs_of(dir, true, out)
}

/// The pids of `dir`'s own `cgroup.procs`, through the held descriptor when there is one, else
/// from the directory opened beneath the node root; with `descendants`, theirs too, reached from
/// that directory (opened even when the descriptor is held).
fn procs_of(dir: &CgroupBeneath, descendants: bool, out: &mut Vec<i32>) -> Result<(), SignalError> {
    let path = dir.display();
    let procs_file = path.join("cgroup.procs");
    let held = super::held::read_held(&procs_file);
    if let Some(text) = &held
        && !descendants
    {
        out.extend(parse_procs::<i32>(text));
        return Ok(());
    }
    let fd = match dir.open() {
        Ok(fd) => fd,
        // Listing the children failing was never an error (a process out of descriptors).
        Err(_) if held.is_some() => {
            out.extend(parse_procs::<i32>(held.as_deref().unwrap_or_default()));
            return Ok(());
        }
        // A cgroup that is gone holds no process.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(SignalError::Read {
                path: procs_file,
                source,
            });
        }
    };
    match held {
        Some(text) => out.extend(parse_procs::<i32>(&text)),
        None => read_procs_at(&fd, &path, out)?,
    }
    if descendants {
        children_procs(&fd, &path, out)?;
    }
    Ok(())
}

fn read_procs_at(dir: &OwnedFd, path: &Path, out: &mut Vec<i32>) -> Result<(), SignalError> {
    let read = beneath::openat2(
        dir.as_raw_fd(),
        "cgroup.procs",
        libc::O_RDONLY,
        0,
        beneath::RESOLVE_STRICT,
    )
    .and_then(crate::cgroup::fs::read_small);
    match read {
        Ok(text) => out.extend(parse_procs::<i32>(&text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(SignalError::Read {
                path: path.join("cgroup.procs"),
                source,
            });
        }
    }
    Ok(())
}

fn children_procs(dir: &OwnedFd, path: &Path, out: &mut Vec<i32>) -> Result<(), SignalError> {
    let Ok(names) = beneath::subdirs(dir.as_fd()) else {
        return Ok(());
    };
    for name in names {
        let child = path.join(&name);
        // A child removed meanwhile is simply gone.
        let gone = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV));
        let fd = match beneath::open_subdir(dir.as_fd(), &name) {
            Ok(fd) => fd,
            Err(e) if gone(&e) => continue,
            Err(source) => {
                return Err(SignalError::Read {
                    path: child,
                    source,
                });
            }
        };
        match read_procs_at(&fd, &child, out) {
            Ok(()) => {}
            Err(SignalError::Read { source, .. }) if gone(&source) => continue,
            Err(e) => return Err(e),
        }
        children_procs(&fd, &child, out)?;
    }
    Ok(())
}

/// SIGKILL to every process of the cgroup open at `dir` (`path`, for errors) and of its
/// descendants, each read beneath it: the kill of a kernel without `cgroup.kill` (before 5.14).
/// A fatal signal reaches a frozen process too. How many were signalled.
pub(crate) fn sigkill_below(dir: &OwnedFd, path: &Path) -> Result<usize, ActionError> {
    let mut pids = Vec::new();
    read_procs_at(dir, path, &mut pids)?;
    children_procs(dir, path, &mut pids)?;
    signal_all(&pids, Signal::SIGKILL)
}

/// Signals each pid; one that exited meanwhile is not an error.
fn signal_all(pids: &[i32], sig: Signal) -> Result<usize, ActionError> {
    let mut n = 0;
    for &pid in pids {
        match kill(Pid::from_raw(pid), sig) {
            Ok(()) => n += 1,
            Err(Errno::ESRCH) => {}
            Err(source) => return Err(ActionError::Signal { pid, source }),
        }
    }
    Ok(n)
}

/// Says once per process that the kernel has no `cgroup.kill` (it came with Linux 5.14), so an
/// eviction's kill is the SIGKILL loop below: it re-reads the pids until the cgroups are empty, so
/// a process forked between a read and its signal is caught by the next round.
fn say_no_cgroup_kill(unified: &Path) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::info!(
            cgroup = %unified.display(),
            "No cgroup.kill in the pod's cgroup v2 directory (Linux before 5.14); evictions send SIGKILL to each of its pids until it is empty."
        );
    });
}

/// Frees the memory of killed processes from this process's side (`process_mrelease(2)`, Linux
/// 5.15+, the call Android's lmkd makes after its kills), on a blocking thread: a process killed
/// under memory pressure frees its memory only once it is scheduled and runs its exit, which a
/// busy CPU delays; the call unmaps its anonymous memory at once, as the kernel's OOM reaper does
/// for its own victims. Best effort: a process already gone, or a kernel without the call, leaves
/// the freeing to the process's exit.
fn reap(pids: Vec<i32>) {
    if pids.is_empty() {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn_blocking(move || {
        for pid in pids {
            // SAFETY: pidfd_open(2) with no flags; the result is checked before it is used.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            if fd < 0 {
                continue;
            }
            let fd = fd as i32;
            // SAFETY: process_mrelease(2) on the pidfd just opened; it only frees the memory of a
            // process that is dying (EINVAL otherwise), so a reused pid is left alone.
            let r = unsafe { libc::syscall(libc::SYS_process_mrelease, fd, 0) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOSYS) {
                    say_no_mrelease();
                }
            }
            // SAFETY: closing the pidfd this loop opened and nothing else holds.
            unsafe { libc::close(fd) };
        }
    });
}

fn say_no_mrelease() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::info!("No process_mrelease (Linux before 5.15): an evicted process's memory comes back when it exits.");
    });
}

/// Writes `cgroup.kill` of `dir`: through the held descriptor, else opened beneath the
/// directory. When it went out; `None` when the kernel has no `cgroup.kill` (or the cgroup is
/// gone), which leaves the SIGKILL loop.
fn kill_cgroup(dir: &CgroupBeneath) -> Result<Option<Instant>, ActionError> {
    let display = dir.display();
    let path = display.join("cgroup.kill");
    let at = Instant::now();
    if super::held::write_held(&path, "1") {
        return Ok(Some(at));
    }
    let file = match dir.open_file("cgroup.kill", crate::cgroup::Access::Write) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            say_no_cgroup_kill(&display);
            return Ok(None);
        }
        Err(source) => return Err(ActionError::Kill { path, source }),
    };
    let at = Instant::now();
    match io::Write::write(&mut &file, b"1") {
        Ok(1) => Ok(Some(at)),
        Ok(_) => Err(ActionError::Kill {
            path,
            source: io::ErrorKind::WriteZero.into(),
        }),
        Err(source) => Err(ActionError::Kill { path, source }),
    }
}

/// Waits until the cgroup `dir` and its descendants hold no process (`populated 0` in its
/// `cgroup.events`, whose changes the kernel announces as a modification: inotify), until
/// `deadline`, writing `cgroup.kill` again at each re-read without a notification. After
/// `cgroup.kill` the kernel has signalled every process already; walking them every 10 ms while
/// they exit only took CPU from their exit, which frees the memory (docs/benchmarks.md).
/// `false` when the deadline passed or the wait could not be set up (an older kernel, the cgroup
/// gone, a test's plain directory): the caller's walk decides.
async fn wait_unpopulated(dir: &CgroupBeneath, deadline: tokio::time::Instant) -> bool {
    // The watch before the first read: a change between the two still wakes the wait.
    let Ok(changes) = super::watch::inotify_events(dir, "cgroup.events") else {
        return false;
    };
    loop {
        let Ok(events) = dir.read_file("cgroup.events") else {
            return false;
        };
        if events.lines().any(|l| l == "populated 0") {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        let next = deadline.min(now + UNPOPULATED_RECHECK);
        match tokio::time::timeout_at(next, super::watch::next_event(&changes)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return false,
            // Still populated a while after the kill: a process moved in since (an exec into
            // the container) is killed as the SIGKILL loop would have killed it.
            Err(_) => {
                let _ = kill_cgroup(dir);
            }
        }
    }
}

impl EvictionAction for CgroupKill {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        let (pod, cgroups, grace) = (&req.pod, &req.cgroups, req.grace);
        let mut first_signal_at = None;
        let mut signalled = 0;
        // A zero grace period kills at once, as a runtime does for StopContainer(timeout 0). The
        // kubelet never asks for that: `killContainer` raises every grace to 2 s.
        if !grace.is_zero() {
            let pids = procs(cgroups)?;
            if !pids.is_empty() {
                first_signal_at = Some(Instant::now());
                signalled += signal_all(&pids, Signal::SIGTERM)?;
            }
            let deadline = tokio::time::Instant::now() + grace;
            while tokio::time::Instant::now() < deadline && !procs(cgroups)?.is_empty() {
                tokio::time::sleep(POLL).await;
            }
        }
        let deadline = tokio::time::Instant::now() + KILL_TIMEOUT;
        if let Some(u) = &cgroups.unified
            // The kill first, with nothing read before it: the kernel kills every process of the
            // cgroup and its descendants, a fork racing it included.
            && let Some(at) = kill_cgroup(u)?
        {
            first_signal_at.get_or_insert(at);
            let pids = procs(cgroups)?;
            signalled += pids.len();
            reap(pids);
            // The kernel says when they are gone; the walk below then finds none (or, on a
            // hybrid host, what a v1 directory still lists).
            wait_unpopulated(u, deadline).await;
        }
        loop {
            let pids = procs(cgroups)?;
            if pids.is_empty() {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ActionError::NotEmpty {
                    pod: pod.clone(),
                    timeout: KILL_TIMEOUT,
                });
            }
            first_signal_at.get_or_insert_with(Instant::now);
            signalled += signal_all(&pids, Signal::SIGKILL)?;
            tokio::time::sleep(POLL).await;
        }
        Ok(Outcome {
            first_signal_at,
            signalled,
            status: EvictedStatus::new(req.message.clone(), &req.seen),
        })
    }
}

#[cfg(test)]
mod tests;
