//! What the eviction manager may evict: the node's pods with where their memory is read and
//! what their eviction reads, and the workload hierarchies for disruption units. The node's pass
//! keeps it current (`node/`); the manager and the usage readers (`usage.rs`) read it.

use std::collections::BTreeMap;

use super::{
    action::{PodCgroups, SeenPod},
    signals::MemoryCgroup,
};
use crate::{
    policy::{pod::PodKey, qos::QosClass, quantity::Quantity},
    workload::Forest,
};

/// A pod the manager may evict.
#[derive(Debug, Clone)]
pub struct ManagedPod {
    pub key: PodKey,
    pub qos: QosClass,
    pub request_bytes: i64,
    pub priority: i32,
    /// Static, mirror or priority >= 2e9.
    pub critical: bool,
    pub start_time: i64,
    /// `terminationGracePeriodSeconds`.
    pub grace_secs: i64,
    /// Identifies the pod's spec (a hash): an eviction is recorded against this revision, so a
    /// changed pod is a new pod.
    pub revision: u64,
    /// Where the pod's memory usage is read.
    pub memory: MemoryCgroup,
    pub cgroups: PodCgroups,
    /// The pod's containers with a memory cgroup (init, sidecar and app), in the order of the
    /// pod's stats (the Summary API's): the eviction message names those using more memory than
    /// they request. Their working sets are read only for the pods evicted.
    pub containers: Vec<ManagedContainer>,
    /// Pod-level `spec.resources.requests.memory` as the pod object sets it, while the
    /// `PodLevelResources` gate is on: the eviction message then gives the pod's usage.
    pub pod_memory_request: Option<Quantity>,
    /// What the status an eviction leaves depends on.
    pub seen: SeenPod,
}

/// A container of a [`ManagedPod`], as the eviction message reads it.
#[derive(Debug, Clone)]
pub struct ManagedContainer {
    pub(crate) name: String,
    /// `resources.requests.memory` after API defaulting (a limit alone sets it); `None` when
    /// unset, Go's zero Quantity.
    pub(crate) memory_request: Option<Quantity>,
    /// Where its working set is read.
    pub(crate) memory: MemoryCgroup,
}

/// The pods and workload hierarchies, as the source last saw them.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub pods: Vec<ManagedPod>,
    /// Namespace -> hierarchy, for disruption units and gangs.
    pub forests: BTreeMap<String, Forest>,
}
