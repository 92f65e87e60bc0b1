//! What must survive a crash, and the guard against a second instance. One low room, so that the
//! eviction pipeline (`eviction/pipeline.rs`), the node's pass and start-up, and cluster mode's
//! start-up (`cluster/marks.rs`) all keep and read evictions the same way.
//!
//! - [`NodeLock`]: an exclusive `flock` on the node root's cgroup directory, held for the life of
//!   the process, so a second qoslet on the same node root exits at once instead of starting the
//!   pods again in the same cgroups (and removing them when it stops). The kernel drops the lock
//!   when the process dies, SIGKILL included, so a crash never leaves a stale lock behind.
//! - [`StateFile`]: the pods evicted (a restart never starts an evicted pod again, nor evicts it
//!   twice) and the pod and container cgroups qoslet created (a restart after SIGKILL finds the
//!   earlier run's pods and stops them), as JSON under the state directory. Written whole to a
//!   temporary file, synced, then renamed, so a crash leaves the old file or the new one.
//! - [`EvictionMark`]: an eviction, written as an extended attribute on the pod's own cgroup v2
//!   directory just before the mode's action (one syscall: the state file is written beside the
//!   action, off its path). The kernel keeps the mark while the cgroup exists, which a crash of
//!   qoslet does not change, so a restart reads the marks of the earlier run's cgroups back into
//!   the state before it removes them: a crash between the kill and the state file loses no
//!   eviction.
//!
//! An eviction holds until the pod changes (its spec hash) or runs again: a container the API
//! shows running that started after the eviction (the kubelet restarted what was killed, say
//! because the Failed status never reached the API server). Such a pod is a candidate again;
//! its record and mark carry the eviction's time for that ([`ran_again_since`]).

mod state;

pub use state::EvictionMark;
pub(crate) use state::{
    NodeLock, StateError, StateFile, Unsynced, latest_running_start, node_root_marker,
    ran_again_since, started_after, unix_now,
};
