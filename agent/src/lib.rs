//! qoslet: an eBPF-backed node enforcement agent for Kubernetes.
//!
//! Data flows one way: [`source`] (pods and workload objects) -> [`policy`] (desired state, pure)
//! -> cgroup reconciler (writes); [`sensors`] (kernel events) -> eviction manager -> actions.

pub mod cgroup;
pub mod cli;
pub mod config;
pub mod eviction;
pub mod policy;
pub mod runtime;
pub mod sensors;
pub mod server;
pub mod source;
pub mod standalone;
pub mod workload;
