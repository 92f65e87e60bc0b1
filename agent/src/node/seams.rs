//! The seams between the node and its mode (docs/architecture.md, "Seams"): where pods come
//! from ([`PodSource`]), who runs them and where their cgroups are ([`PodExecutor`]), and what an
//! eviction does (`crate::eviction::EvictionAction`, the mode's step of the eviction pipeline,
//! where the executor takes part as `crate::eviction::HoldEvicted`). The node only ever sees
//! these traits, so the standalone node and the cluster node share every part between them.

use std::{collections::BTreeMap, future::Future, time::Duration};

use super::pod_status::PodStatus;
use crate::{
    cgroup::{CgroupBeneath, ContainerIds, Runner},
    eviction::{HoldEvicted, NodeCondition},
    policy::{pod::PodKey, qos::QosClass},
    source::{Diff, ManifestPod, PodSet},
};

/// Where pods and Workload / PodGroup / CompositePodGroup objects come from: a manifest
/// directory (standalone) or the Kubernetes API (cluster).
pub(crate) trait PodSource: Send {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The valid pods and workload objects now. Everything in it passed validation at the door.
    fn pods(&self) -> &PodSet;

    /// Resolves when the set changed, with what changed. Cancel-safe: a future dropped before it
    /// resolves loses no change (the next call reports it).
    fn changed(&mut self) -> impl Future<Output = Result<Diff, Self::Error>> + Send;
}

/// A pod as the node hands it to the executor after a pass: planned, and placed in cgroups.
#[derive(Debug, Clone)]
pub(crate) struct PlannedPod<'a> {
    pub(crate) key: PodKey,
    /// The pod, with its views computed at admission.
    pub(crate) pod: &'a ManifestPod,
    pub(crate) qos_class: QosClass,
    /// Static, mirror or priority >= system-cluster-critical: admitted under pressure.
    pub(crate) critical: bool,
    /// Why workload gating holds it (its PodGroup or an ancestor not created yet, a group short
    /// of its minimum, ...); `None`: it may start now.
    pub(crate) held: Option<String>,
    /// Each container's cgroup directories, one per hierarchy, by container name, named
    /// beneath the node root (the path comes from the pod's UID and the container's id). A
    /// container missing here has no cgroup and must not be started.
    pub(crate) container_cgroups: BTreeMap<String, Vec<CgroupBeneath>>,
}

/// Who runs the containers and where their cgroups are: qoslet's process runtime (standalone),
/// or the kubelet and its container runtime, whose cgroups qoslet only finds (cluster).
/// Admission and workload gating are the executor's.
pub(crate) trait PodExecutor: Send + Sync + 'static {
    /// Who runs the pods. The one place this is said: the cgroup naming (created or found,
    /// written or compared), the check at the source's door, crash recovery, the BestEffort
    /// tier's owner and an eviction's first signal all derive from it.
    fn runner(&self) -> Runner;

    /// Whether this executor can run the pod at all (the standalone runtime needs a command in
    /// every container, for one); a pod it refuses is reported once and not planned.
    fn accepts(&self, pod: &ManifestPod) -> Result<(), String>;

    /// The ids container cgroups are named by, per (pod uid, container name).
    fn container_ids(&self, pods: &PodSet) -> ContainerIds;

    /// Brings the executor in line with the planned pods: new pods start once admitted and
    /// released by gating, removed pods stop, changed pods restart. Returns problem lines for
    /// pods it cannot run (reported once by the node).
    fn apply(&self, pods: Vec<PlannedPod<'_>>, conditions: &[NodeCondition]) -> Vec<String>;

    /// What each pod is doing now.
    fn status(&self) -> Vec<PodStatus>;

    /// Resolves once some pod's status changed since the last call returned; changes coalesce.
    fn changed(&self) -> impl Future<Output = ()> + Send;

    /// The pod is being evicted: it ends Failed with reason `Evicted` and is not started again.
    fn mark_evicted(&self, key: &PodKey, message: &str, grace: Duration);

    /// At shutdown: stops what the executor started, each pod within the shorter of its own
    /// grace period and `grace`, and waits for them.
    fn stop_all(&self, grace: Duration) -> impl Future<Output = ()> + Send;
}

/// The executor's part in the eviction pipeline (`eviction/pipeline.rs`).
impl<E: PodExecutor> HoldEvicted for E {
    fn hold(&self, pod: &PodKey, message: &str, grace: Duration) {
        self.mark_evicted(pod, message, grace);
    }

    fn signals_on_hold(&self) -> bool {
        self.runner().signals_on_evict()
    }
}
