//! qoslet: an eBPF-backed node enforcement agent for Kubernetes.
//!
//! Data flows one way: [`source`] (pods and workload objects) -> [`policy`] (desired state, pure)
//! -> cgroup reconciler (writes); [`sensors`] (kernel events) -> eviction manager -> actions.

pub mod cgroup;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod eviction;
pub(crate) mod exit;
#[doc(hidden)]
pub mod fuzzing;
pub mod hub;
#[cfg(test)]
mod layering;
pub mod node;
pub mod persist;
pub mod policy;
pub mod runtime;
pub mod sensors;
pub(crate) mod server;
pub mod source;
pub mod standalone;
pub(crate) mod support;
#[cfg(test)]
mod test_log;
pub mod workload;
