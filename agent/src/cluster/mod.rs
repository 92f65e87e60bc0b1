//! Cluster mode (`qoslet run --kube`): qoslet as the node agent of a Kubernetes cluster, beside
//! the kubelet.
//!
//! [`source`] watches the node's pods and their workload objects through the API server;
//! the kubelet executor finds the cgroups the kubelet and the container runtime made; the
//! eviction action kills locally first and then tells the API server, through a persistent
//! queue that survives the API server's absence and qoslet's restarts.

pub mod action;
pub mod executor;
pub mod queue;
pub mod source;
pub mod writes;

#[cfg(test)]
mod mock;

pub use executor::KubeletExecutor;
pub use source::{ApiSource, WatchState, WatchStates};
