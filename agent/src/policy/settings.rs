//! The node settings the plan is computed from, already parsed and validated field by field
//! (crate::config builds them from a KubeletConfiguration and qoslet's own file).

use serde::{Deserialize, Serialize};

use super::{
    cpu::{QUOTA_PERIOD_US, WeightFormula},
    cpuset::CpuSet,
    eviction::Threshold,
    quantity::Quantity,
    version::KubeVersion,
};

/// What the machine (or the operator, with `--capacity`) has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub pids: i64,
    /// The node's CPU ids; `reservedSystemCPUs` is taken out of them for pods.
    pub cpus: CpuSet,
}

/// A `systemReserved` / `kubeReserved` map, restricted to the resources we enforce.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub(crate) cpu: Option<Quantity>,
    pub(crate) memory: Option<Quantity>,
    pub(crate) pids: Option<Quantity>,
}

/// `enforceNodeAllocatable`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Enforcement {
    pub(crate) pods: bool,
    pub(crate) system_reserved: bool,
    pub(crate) kube_reserved: bool,
    pub(crate) system_reserved_compressible: bool,
    pub(crate) kube_reserved_compressible: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

/// What to do when `reservedSystemCPUs` meets `systemReservedCgroup`/`kubeReservedCgroup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReservedCpusConflict {
    /// Refuse the configuration, as the kubelet's validation does.
    #[default]
    Reject,
    /// As OpenShift's machine-config operator: drop the `-compressible` enforcement (the CPU
    /// weight on the reserved cgroups) with a warning; the cpuset does the isolating.
    Openshift,
}

/// `memoryReservationPolicy` (1.36+). Before 1.36 the field does not exist and every memory
/// request is protected with memory.min; [`super::plan`] keys that on the version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub(crate) enum MemoryReservationPolicy {
    /// No QoS-level protection (the 1.36+ default): memory.min / memory.low written as 0.
    #[default]
    None,
    /// Guaranteed requests as memory.min, Burstable as memory.low (1.36+).
    TieredReservation,
}

/// Memory QoS (feature gate `MemoryQoS`, cgroup v2 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryQos {
    /// `memoryThrottlingFactor` in millionths (0.9 -> 900000), the version's default applied.
    /// Unset (1.37 default): memory.high is not written.
    pub(crate) throttling_factor_ppm: Option<u32>,
    pub(crate) policy: MemoryReservationPolicy,
}

/// Everything [`super::plan::plan_node`] needs to know about the node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// Whose kubelet the plan follows (`kubernetesVersion`, default 1.37).
    pub(crate) kubernetes_version: KubeVersion,
    pub(crate) capacity: Capacity,
    pub(crate) system_reserved: Reservation,
    pub(crate) kube_reserved: Reservation,
    pub(crate) hard_eviction: Vec<Threshold>,
    pub(crate) soft_eviction: Vec<Threshold>,
    pub(crate) enforcement: Enforcement,
    /// `systemReservedCgroup` / `kubeReservedCgroup` (empty: unset).
    pub(crate) system_reserved_cgroup: String,
    pub(crate) kube_reserved_cgroup: String,
    pub(crate) reserved_system_cpus: Option<CpuSet>,
    pub(crate) reserved_cpus_conflict: ReservedCpusConflict,
    pub cgroup_driver: CgroupDriver,
    pub(crate) cgroup_root: String,
    pub(crate) cgroups_per_qos: bool,
    pub(crate) cpu_cfs_quota: bool,
    pub(crate) cpu_cfs_quota_period_us: u64,
    /// `qosReserved.memory` in percent, when the `QOSReserved` gate is on.
    pub(crate) qos_reserved_memory_pct: Option<i64>,
    pub(crate) memory_qos: Option<MemoryQos>,
    /// For kubepods, QoS and pod cgroups.
    pub(crate) weight_formula: WeightFormula,
    /// For container cgroups (written by the runtime).
    pub(crate) container_weight_formula: WeightFormula,
    /// Feature gate `PodLevelResources` (beta, on by default): when off, `spec.resources` of
    /// pods is ignored.
    pub(crate) pod_level_resources: bool,
    /// `evictionPressureTransitionPeriod`, seconds (default 5m).
    pub(crate) eviction_pressure_transition_secs: u64,
    /// `evictionMaxPodGracePeriod`, seconds; 0 or less means the pod's own grace period.
    pub(crate) eviction_max_pod_grace_secs: i64,
    /// Feature gate `KubeletOOMScoreAdjTieBreak` (alpha, off by default).
    pub(crate) oom_score_adj_tie_break: bool,
    /// The host's hugepage sizes in bytes (`/sys/kernel/mm/hugepages`), for hugetlb limits.
    pub(crate) hugepage_sizes: Vec<i64>,
    /// `singleProcessOOMKill` (default false on cgroup v2): when false the runtime sets
    /// memory.oom.group=1 on container cgroups, so an OOM kill takes the whole container.
    pub(crate) single_process_oom_kill: bool,
    /// `podPidsLimit`: `pids.max` of every pod cgroup; `None` (the kubelet's -1, or 0) is no
    /// limit, as pkg/kubelet/cm/pod_container_manager_linux.go writes it only when > 0.
    pub(crate) pod_pids_limit: Option<i64>,
}

impl NodeSettings {
    /// Kubelet defaults on a node of `capacity`.
    pub(crate) fn defaults(capacity: Capacity) -> Self {
        Self {
            kubernetes_version: KubeVersion::DEFAULT,
            capacity,
            system_reserved: Reservation::default(),
            kube_reserved: Reservation::default(),
            hard_eviction: Vec::new(),
            soft_eviction: Vec::new(),
            enforcement: Enforcement {
                pods: true,
                ..Enforcement::default()
            },
            system_reserved_cgroup: String::new(),
            kube_reserved_cgroup: String::new(),
            reserved_system_cpus: None,
            reserved_cpus_conflict: ReservedCpusConflict::Reject,
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: "/".into(),
            cgroups_per_qos: true,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period_us: QUOTA_PERIOD_US,
            qos_reserved_memory_pct: None,
            memory_qos: None,
            weight_formula: WeightFormula::KubeletLinear,
            container_weight_formula: WeightFormula::RuncQuadratic,
            pod_level_resources: true,
            eviction_pressure_transition_secs: 300,
            eviction_max_pod_grace_secs: 0,
            oom_score_adj_tie_break: false,
            single_process_oom_kill: false,
            hugepage_sizes: Vec::new(),
            pod_pids_limit: None,
        }
    }
}
