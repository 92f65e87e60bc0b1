//! qoslet: an eBPF-backed node enforcement agent for Kubernetes.
//!
//! Data flows one way: [`source`] (pods and workload objects) -> [`policy`] (desired state, pure)
//! -> cgroup reconciler (writes); [`sensors`] (kernel events) -> eviction manager -> actions.

pub mod cgroup;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod eviction;
pub mod node;
pub mod policy;
pub mod runtime;
pub mod sensors;
pub mod server;
pub mod source;
pub mod standalone;
pub mod workload;

/// Locks a mutex even if a holder panicked: qoslet's mutexes guard plain data (maps, lists,
/// counters) that stays usable, and a node agent must keep running.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
