//! The desired node and pod cgroup state: what the reconciler writes and `qoslet plan` prints.
//! The serialized form is a stable interface (`qoslet plan --output json`, docs/usage.md);
//! `None` is a setting not written.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    allocatable::{AllocatableError, NodeAllocatable, ResourceTotals, node_allocatable},
    cgroup_name::render,
    cpu::{MIN_SHARES, milli_cpu_to_quota, milli_cpu_to_shares},
    eviction::{EvictionRank, Threshold},
    memory_qos::memory_high,
    oom::PodOomScores,
    pod::{ContainerKind, PodSpecView},
    qos::{QosClass, pod_qos},
    settings::{MemoryQos, MemoryReservationPolicy, NodeSettings, Reservation},
    version::KubeVersion,
};

pub(crate) type PlanError = AllocatableError;

/// Settings of one cgroup; `None` fields are not written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct CgroupPlan {
    pub(crate) cgroup: Option<String>,
    pub(crate) cpu_shares: Option<u64>,
    pub(crate) cpu_weight: Option<u64>,
    pub(crate) memory_limit_bytes: Option<i64>,
    pub(crate) memory_min_bytes: Option<i64>,
    pub(crate) memory_low_bytes: Option<i64>,
    pub(crate) pids_max: Option<i64>,
    pub(crate) cpuset: Option<String>,
    /// hugetlb limit by page size (`2MB`, `1GB`: the cgroup file names' spelling); empty when
    /// none is written.
    pub(crate) hugetlb_limits: BTreeMap<String, i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct EvictionPlan {
    pub(crate) hard: Vec<Threshold>,
    pub(crate) soft: Vec<Threshold>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct NodePlan {
    /// The Kubernetes version whose kubelet rules this plan follows.
    pub(crate) kubernetes_version: KubeVersion,
    pub(crate) capacity: ResourceTotals,
    pub(crate) allocatable: ResourceTotals,
    pub(crate) kubepods: CgroupPlan,
    pub(crate) burstable: CgroupPlan,
    pub(crate) besteffort: CgroupPlan,
    pub(crate) system_reserved: CgroupPlan,
    pub(crate) kube_reserved: CgroupPlan,
    pub(crate) eviction: EvictionPlan,
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerPlan {
    pub(crate) name: String,
    pub(crate) kind: ContainerKind,
    pub oom_score_adj: i32,
    pub(crate) cpu_shares: u64,
    pub(crate) cpu_weight: u64,
    pub(crate) cpu_quota_us: Option<i64>,
    pub(crate) cpu_period_us: Option<u64>,
    pub(crate) memory_limit_bytes: Option<i64>,
    pub(crate) memory_min_bytes: Option<i64>,
    pub(crate) memory_low_bytes: Option<i64>,
    pub(crate) memory_high_bytes: Option<i64>,
    /// memory.oom.group=1 (cgroup v2): the runtime's OOM kill takes every process of the
    /// container. Set unless `singleProcessOOMKill` is true (kubelet.go defaults it to false on
    /// cgroup v2; kuberuntime_container_linux.go writes the file); `None` is not written.
    pub(crate) memory_oom_group: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodPlan {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) qos_class: QosClass,
    pub(crate) cgroup: Option<String>,
    pub(crate) cpu_shares: Option<u64>,
    pub(crate) cpu_weight: Option<u64>,
    /// -1 (unlimited) when `cpuCFSQuota` is false, as the kubelet writes it.
    pub(crate) cpu_quota_us: Option<i64>,
    pub(crate) cpu_period_us: Option<u64>,
    pub(crate) memory_limit_bytes: Option<i64>,
    pub(crate) memory_min_bytes: Option<i64>,
    pub(crate) memory_low_bytes: Option<i64>,
    /// From 1.37, for pods with pod-level memory resources (`applyPodLevelMemoryHigh`).
    pub(crate) memory_high_bytes: Option<i64>,
    /// hugetlb limit by page size: the pod's hugepage requests (`HugePageLimits`), 0 for every
    /// other page size of the host (cgroup_manager_linux.go "for each page size omitted, limit
    /// to 0").
    pub(crate) hugetlb_limits: BTreeMap<String, i64>,
    /// `podPidsLimit` of the KubeletConfiguration, when it limits (> 0).
    pub(crate) pids_max: Option<i64>,
    pub containers: Vec<ContainerPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub(crate) node: NodePlan,
    pub pods: Vec<PodPlan>,
    /// The memory-pressure eviction order of the pods given their current usage
    /// ([`super::eviction::memory_eviction_order`]); empty when no usage was given.
    pub(crate) eviction_order: Vec<EvictionRank>,
}

/// Computes the whole plan for `pods` on the node.
pub fn plan_node(s: &NodeSettings, pods: &[PodSpecView]) -> Result<Plan, PlanError> {
    let na = node_allocatable(s)?;
    let stripped: Vec<PodSpecView>;
    let pods = if s.pod_level_resources {
        pods
    } else {
        stripped = pods
            .iter()
            .map(|p| PodSpecView {
                pod_resources: None,
                ..p.clone()
            })
            .collect();
        &stripped
    };
    let mut warnings = na.warnings.clone();
    if s.memory_qos
        .is_some_and(|m| m.throttling_factor_ppm.is_none())
    {
        warnings.push("MemoryQoS is on but memoryThrottlingFactor is unset (no default since 1.37): memory.high is not written".into());
    }
    let pod_plans: Vec<PodPlan> = pods.iter().map(|p| plan_pod(s, &na, p)).collect();
    let node = plan_node_cgroups(s, &na, pods, &mut warnings);
    Ok(Plan {
        node: NodePlan { warnings, ..node },
        pods: pod_plans,
        eviction_order: Vec::new(),
    })
}

fn name(s: &NodeSettings, components: &[&str]) -> Option<String> {
    s.cgroups_per_qos
        .then(|| render(s.cgroup_driver, &s.cgroup_root, components))
}

fn plan_node_cgroups(
    s: &NodeSettings,
    na: &NodeAllocatable,
    pods: &[PodSpecView],
    warnings: &mut Vec<String>,
) -> NodePlan {
    let weight = |shares: u64| s.weight_formula.weight(shares);
    let mut sums = [(0i64, 0i64); 3]; // (cpu millis, memory bytes) per class
    for p in pods {
        let r = p.requests();
        let i = pod_qos(p) as usize;
        // Saturating: requests are each within i64 (admission checks), their sum may not be.
        sums[i].0 = sums[i].0.saturating_add(r.cpu_millis());
        sums[i].1 = sums[i].1.saturating_add(r.memory_bytes());
    }
    let [(_, g_mem), (b_cpu, b_mem), _] = sums;

    // kubepods: allocatable minus reservations when `pods` is enforced, capacity otherwise;
    // cpu shares always, as the default shares would starve pods.
    let limits = if s.cgroups_per_qos && na.enforcement.pods {
        na.absolute
    } else {
        na.capacity
    };
    let shares = milli_cpu_to_shares(limits.cpu_millis);
    let mut kubepods = CgroupPlan {
        cgroup: name(s, &["kubepods"]),
        cpu_shares: Some(shares),
        cpu_weight: Some(weight(shares)),
        memory_limit_bytes: Some(limits.memory_bytes),
        pids_max: Some(limits.pids),
        cpuset: Some(
            na.pods_cpuset
                .as_ref()
                .unwrap_or(&s.capacity.cpus)
                .to_string(),
        ),
        ..CgroupPlan::default()
    };
    let b_shares = milli_cpu_to_shares(b_cpu);
    let mut burstable = CgroupPlan {
        cgroup: name(s, &["kubepods", "burstable"]),
        cpu_shares: Some(b_shares),
        cpu_weight: Some(weight(b_shares)),
        ..CgroupPlan::default()
    };
    let mut besteffort = CgroupPlan {
        cgroup: name(s, &["kubepods", "besteffort"]),
        cpu_shares: Some(MIN_SHARES),
        cpu_weight: Some(weight(MIN_SHARES)),
        ..CgroupPlan::default()
    };
    // The QoS tiers' hugetlb is unbounded for every page size of the host
    // (qos_container_manager_linux.go setHugePagesUnbounded: 1 << 62).
    let unbounded: BTreeMap<String, i64> = s
        .hugepage_sizes
        .iter()
        .map(|size| (hugepage_unit(*size), 1 << 62))
        .collect();
    burstable.hugetlb_limits = unbounded.clone();
    besteffort.hugetlb_limits = unbounded;
    // QOSReserved (qos_container_manager_linux.go setMemoryReserve), over capacity - reserved.
    if let Some(pct) = s.qos_reserved_memory_pct {
        let reserve = |mem: i64| i128::from(mem) * i128::from(pct) / 100;
        let burstable_limit = i128::from(na.absolute.memory_bytes) - reserve(g_mem);
        let besteffort_limit = burstable_limit - reserve(b_mem);
        let clamp = |v: i128| v.clamp(0, i64::MAX.into()) as i64;
        if besteffort_limit < 0 {
            warnings.push(format!("QOSReserved leaves besteffort a negative memory limit ({besteffort_limit}); written as 0"));
        }
        burstable.memory_limit_bytes = Some(clamp(burstable_limit));
        besteffort.memory_limit_bytes = Some(clamp(besteffort_limit));
    }
    // Memory QoS (qos_container_manager_linux.go setMemoryQoS): protect what the classes
    // requested. A child's protection is bounded by its ancestors', so the kubepods root covers
    // every tier below it.
    if let Some(mq) = s.memory_qos {
        let positive = |v: i64| (v > 0).then_some(v);
        match tier_protection(s.kubernetes_version, mq) {
            // 1.34, 1.35: memory.min, written only when above 0.
            TierProtection::Legacy => {
                burstable.memory_min_bytes = positive(b_mem);
                kubepods.memory_min_bytes = positive(b_mem.saturating_add(g_mem));
            }
            // 1.36+ `None`: no protection, and an explicit 0 so a stale value left by an earlier
            // plan or another writer is cleared (TestQoSContainerCgroupWithMemoryReservationPolicyNone).
            TierProtection::None => {
                kubepods.memory_min_bytes = Some(0);
                burstable.memory_low_bytes = Some(0);
            }
            // 1.36+ `TieredReservation` (TestQoSContainerCgroup): kubepods memory.min =
            // Guaranteed + Burstable, burstable memory.low = Burstable, 0 when nothing is
            // requested; kubepods memory.low = Burstable under the root
            // (TestQOSCgroupsWithSystemPartition).
            TierProtection::Tiered => {
                kubepods.memory_min_bytes = Some(g_mem.saturating_add(b_mem));
                kubepods.memory_low_bytes = Some(b_mem);
                burstable.memory_low_bytes = Some(b_mem);
            }
        }
    }
    if !s.cgroups_per_qos {
        kubepods = CgroupPlan::default();
        burstable = CgroupPlan::default();
        besteffort = CgroupPlan::default();
    }
    let e = &na.enforcement;
    let system_reserved = reserved_cgroup(
        s,
        &s.system_reserved_cgroup,
        &na.system_reserved,
        e.system_reserved,
        e.system_reserved_compressible,
        na.reserved_cpuset.as_ref().map(ToString::to_string),
    );
    let kube_reserved = reserved_cgroup(
        s,
        &s.kube_reserved_cgroup,
        &na.kube_reserved,
        e.kube_reserved,
        e.kube_reserved_compressible,
        None,
    );
    NodePlan {
        kubernetes_version: s.kubernetes_version,
        capacity: na.capacity,
        allocatable: na.allocatable,
        kubepods,
        burstable,
        besteffort,
        system_reserved,
        kube_reserved,
        eviction: EvictionPlan {
            hard: s.hard_eviction.clone(),
            soft: s.soft_eviction.clone(),
        },
        warnings: Vec::new(),
    }
}

/// `enforceExistingCgroup`: all of memory, pids and cpu, or (`-compressible`) cpu only.
fn reserved_cgroup(
    s: &NodeSettings,
    cgroup: &str,
    r: &Reservation,
    full: bool,
    compressible: bool,
    cpuset: Option<String>,
) -> CgroupPlan {
    let mut plan = CgroupPlan {
        cgroup: (!cgroup.is_empty()).then(|| cgroup.to_string()),
        cpuset,
        ..CgroupPlan::default()
    };
    if (full || compressible)
        && let Some(cpu) = r.cpu
    {
        let shares = milli_cpu_to_shares(cpu.milli_value());
        plan.cpu_shares = Some(shares);
        plan.cpu_weight = Some(s.weight_formula.weight(shares));
    }
    if full {
        plan.memory_limit_bytes = r.memory.map(|q| q.value());
        plan.pids_max = r.pids.map(|q| q.value());
    }
    plan
}

fn plan_pod(s: &NodeSettings, na: &NodeAllocatable, pod: &PodSpecView) -> PodPlan {
    let qos = pod_qos(pod);
    let period = s.cpu_cfs_quota_period_us;
    let reqs = pod.requests();
    let limits = pod.limits();
    // ResourceConfigForPod: every container, init included, must declare a limit for the pod
    // limit to be written; a pod-level limit declares it for the pod.
    let all =
        |f: fn(&super::pod::Amounts) -> bool| pod.containers.iter().all(|c| f(&c.resources.limits));
    let pod_lim = pod.pod_resources.map(|r| r.limits).unwrap_or_default();
    let cpu_declared = all(|l| l.cpu_millis() > 0) || pod_lim.cpu_millis() > 0;
    let mem_declared = all(|l| l.memory_bytes() > 0) || pod_lim.memory_bytes() > 0;
    let shares = milli_cpu_to_shares(reqs.cpu_millis());
    let quota = if s.cpu_cfs_quota {
        milli_cpu_to_quota(limits.cpu_millis(), period)
    } else {
        -1
    };
    let (mut cpu_shares, mut cpu_quota, mut mem_limit) = (Some(MIN_SHARES), None, None);
    match qos {
        QosClass::Guaranteed => {
            cpu_shares = Some(shares);
            cpu_quota = Some(quota);
            mem_limit = Some(limits.memory_bytes());
        }
        QosClass::Burstable => {
            cpu_shares = Some(shares);
            cpu_quota = cpu_declared.then_some(quota);
            mem_limit = mem_declared.then_some(limits.memory_bytes());
        }
        QosClass::BestEffort => {}
    }
    let (mut min, mut low, mut high) = (None, None, None);
    if let Some(mq) = s.memory_qos {
        (min, low) = protection(s.kubernetes_version, mq, qos, reqs.memory_bytes());
        // applyPodLevelMemoryHigh (pod_container_manager_linux.go, 1.37): only for pods whose
        // pod-level resources name memory, with the pod's requests and limits, overhead included
        // (TestApplyPodLevelMemoryHigh).
        let pod_memory = pod
            .pod_resources
            .is_some_and(|r| r.requests.memory.is_some() || r.limits.memory.is_some());
        if s.kubernetes_version.pod_level_memory_high() && pod_memory {
            high = memory_high(
                reqs.memory_bytes(),
                limits.memory_bytes(),
                na.absolute.memory_bytes,
                mq.throttling_factor_ppm,
                false,
            );
        }
    }
    let tier = match qos {
        QosClass::Guaranteed => None,
        QosClass::Burstable => Some("burstable"),
        QosClass::BestEffort => Some("besteffort"),
    };
    let pod_component = format!("pod{}", pod.uid);
    let components: Vec<&str> = ["kubepods"]
        .into_iter()
        .chain(tier)
        .chain([pod_component.as_str()])
        .collect();
    let per_qos = s.cgroups_per_qos;
    let scores = PodOomScores::new(pod, na.capacity.memory_bytes, s.oom_score_adj_tie_break);
    let containers = pod
        .containers
        .iter()
        .map(|c| {
            let r = &c.resources;
            let cshares = milli_cpu_to_shares(r.requests.cpu_millis());
            let cquota = milli_cpu_to_quota(r.limits.cpu_millis(), period);
            let cpu_limited = s.cpu_cfs_quota && cquota > 0;
            let (req, lim) = (r.requests.memory_bytes(), r.limits.memory_bytes());
            let (mut cmin, mut clow, mut chigh) = (None, None, None);
            if let Some(mq) = s.memory_qos {
                (cmin, clow) = protection(s.kubernetes_version, mq, qos, req);
                chigh = memory_high(
                    req,
                    lim,
                    na.absolute.memory_bytes,
                    mq.throttling_factor_ppm,
                    s.kubernetes_version.pod_level_memory_high(),
                );
            }
            ContainerPlan {
                name: c.name.clone(),
                kind: c.kind,
                oom_score_adj: scores.container(c),
                cpu_shares: cshares,
                cpu_weight: s.container_weight_formula.weight(cshares),
                cpu_quota_us: cpu_limited.then_some(cquota),
                cpu_period_us: cpu_limited.then_some(period),
                memory_limit_bytes: (lim > 0).then_some(lim),
                memory_min_bytes: cmin,
                memory_low_bytes: clow,
                memory_high_bytes: chigh,
                memory_oom_group: (!s.single_process_oom_kill).then_some(true),
            }
        })
        .collect();
    let weight = |v: Option<u64>| v.map(|sh| s.weight_formula.weight(sh));
    PodPlan {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        qos_class: qos,
        cgroup: name(s, &components),
        cpu_shares: cpu_shares.filter(|_| per_qos),
        cpu_weight: weight(cpu_shares).filter(|_| per_qos),
        cpu_quota_us: cpu_quota.filter(|_| per_qos),
        cpu_period_us: cpu_quota.map(|_| period).filter(|_| per_qos),
        memory_limit_bytes: mem_limit.filter(|_| per_qos),
        memory_min_bytes: min.filter(|_| per_qos),
        memory_low_bytes: low.filter(|_| per_qos),
        memory_high_bytes: high.filter(|_| per_qos),
        hugetlb_limits: if per_qos {
            pod_hugetlb(s, pod)
        } else {
            BTreeMap::new()
        },
        pids_max: s.pod_pids_limit.filter(|_| per_qos),
        containers,
    }
}

/// The pod's hugepage requests by page size, and 0 for the host's other page sizes.
fn pod_hugetlb(s: &NodeSettings, pod: &PodSpecView) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = s
        .hugepage_sizes
        .iter()
        .map(|size| (hugepage_unit(*size), 0))
        .collect();
    for (size, bytes) in &pod.hugepages {
        out.insert(hugepage_unit(*size), *bytes);
    }
    out
}

/// pkg/apis/core/v1/helper `HugePageUnitSizeFromByteSize`: 2097152 -> `2MB`, as libcontainer
/// names the hugetlb files.
pub(crate) fn hugepage_unit(mut size: i64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut i = 0;
    while size >= 1024 && size % 1024 == 0 && i + 1 < UNITS.len() {
        size /= 1024;
        i += 1;
    }
    format!("{size}{}", UNITS[i])
}

/// Which QoS-tier protection the version and policy ask for.
enum TierProtection {
    Legacy,
    None,
    Tiered,
}

fn tier_protection(v: KubeVersion, mq: MemoryQos) -> TierProtection {
    match (v.has_memory_reservation_policy(), mq.policy) {
        (false, _) => TierProtection::Legacy,
        (true, MemoryReservationPolicy::None) => TierProtection::None,
        (true, MemoryReservationPolicy::TieredReservation) => TierProtection::Tiered,
    }
}

/// (memory.min, memory.low) of a pod or container cgroup requesting `request` bytes
/// (helpers_linux.go `ResourceConfigForPod` and kuberuntime_container_linux.go): up to 1.35
/// memory.min for every request; from 1.36 nothing under `None`, and under
/// `TieredReservation` memory.min for Guaranteed, memory.low for Burstable
/// (TestResourceConfigForPodWithEnforceMemoryQoS). Nothing for a request of 0.
fn protection(
    v: KubeVersion,
    mq: MemoryQos,
    qos: QosClass,
    request: i64,
) -> (Option<i64>, Option<i64>) {
    if request <= 0 {
        return (None, None);
    }
    match (tier_protection(v, mq), qos) {
        (TierProtection::Legacy, _) => (Some(request), None),
        (TierProtection::None, _) | (TierProtection::Tiered, QosClass::BestEffort) => (None, None),
        (TierProtection::Tiered, QosClass::Guaranteed) => (Some(request), None),
        (TierProtection::Tiered, QosClass::Burstable) => (None, Some(request)),
    }
}

#[cfg(test)]
mod tests;
