//! The desired cgroup state: the policy's [`Plan`] turned into validated cgroup paths under the
//! node root with the settings each one should hold. Pure; a pod whose names fail validation is
//! left out with an error, the others are unaffected.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use super::name::{
    CgroupPath, ContainerRuntime, NameError, check_pod_component, container_component,
    is_dns_label, validate_container_id, validate_uid,
};
use crate::policy::{
    cpuset::CpuSet,
    plan::{CgroupPlan, ContainerPlan, Plan, PodPlan},
    settings::CgroupDriver,
};

/// How cgroups are named on this node, and who made them.
#[derive(Debug, Clone)]
pub struct Naming {
    pub driver: CgroupDriver,
    pub runtime: ContainerRuntime,
    /// The cgroup that holds everything qoslet manages (`/` on a real node).
    pub node_root: CgroupPath,
    /// The executor's [`Runner`]: under qoslet every missing cgroup is created and every file
    /// written; under the kubelet nothing is created and only `enforce`'s files are written.
    pub runner: Runner,
    /// What qoslet writes beside the kubelet (QosletConfiguration `enforce`); read only under
    /// [`Runner::Kubelet`], since qoslet writes everything of its own.
    pub enforce: BTreeSet<Area>,
}

/// Who runs the pods, and so who makes and writes their cgroups: said once, by the executor
/// (`node::PodExecutor::runner`), and everything else derives from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// qoslet's own process runtime (standalone): it creates every cgroup, writes every file,
    /// needs a `command` in every container (it has no images) and signals an evicted pod
    /// itself.
    Qoslet,
    /// The kubelet and its container runtime (cluster mode): they create every cgroup and write
    /// most files; qoslet finds the cgroups, compares (drift) and writes only `enforce`'s areas.
    /// The image's entrypoint is the kubelet's business.
    Kubelet,
}

impl Runner {
    /// Whether the node creates container cgroups (its own runtime) or only finds them.
    pub(crate) fn creates_cgroups(self) -> bool {
        self == Runner::Qoslet
    }

    /// Whether the executor's `mark_evicted` itself signals the pod's processes (so the first
    /// signal of an eviction goes out there): qoslet's runtime stops an evicted pod at once; the
    /// kubelet's pods are signalled by the eviction action's cgroup kill.
    pub(crate) fn signals_on_evict(self) -> bool {
        self == Runner::Qoslet
    }
}

/// What qoslet may write beside the kubelet (QosletConfiguration `enforce`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Area {
    /// memory.min, memory.low, memory.high (cgroup v2).
    MemoryQos,
    /// oom_score_adj of the processes in container cgroups.
    OomScoreAdj,
    /// cpuset.cpus (and v1 cpuset.mems) for reservedSystemCPUs.
    ReservedCpus,
    /// cpu.weight / cpu.shares of the QoS tier cgroups.
    QosTierWeights,
    /// The CPU-pressure controller's levers on the QoS tiers (the BestEffort tier's cpu.idle and
    /// CPU cap).
    CpuPressure,
}

impl Area {
    /// The cgroup files of the area on a cgroup of `role`.
    fn files(self, role: Role) -> &'static [&'static str] {
        match (self, role) {
            (Area::MemoryQos, _) => &["memory.min", "memory.low", "memory.high"],
            (Area::ReservedCpus, _) => &["cpuset.cpus", "cpuset.mems"],
            (Area::QosTierWeights, Role::QosTier) => &["cpu.weight", "cpu.shares"],
            (Area::CpuPressure, Role::QosTier) => &[
                "cpu.idle",
                "cpu.max",
                "cpu.cfs_quota_us",
                "cpu.cfs_period_us",
            ],
            _ => &[],
        }
    }
}

/// Which of a cgroup's files qoslet writes; it compares the others and reports their drift.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Writes {
    #[default]
    All,
    Only(BTreeSet<&'static str>),
}

impl Writes {
    pub(crate) fn allows(&self, file: &str) -> bool {
        match self {
            Writes::All => true,
            Writes::Only(files) => files.contains(file),
        }
    }
}

/// What a cgroup is to qoslet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Kubepods,
    QosTier,
    Pod,
    Container,
    /// systemReservedCgroup / kubeReservedCgroup: must exist, never created.
    Reserved,
}

/// Settings of one cgroup; `None` is not managed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `cpu.idle` (5.15+, v2 and the v1 cpu controller): the cgroup's tasks run as SCHED_IDLE
    /// against its siblings. Set only by the CPU-pressure controller, on the BestEffort tier.
    pub(crate) cpu_idle: Option<bool>,
    pub(crate) cpu_shares: Option<u64>,
    pub(crate) cpu_weight: Option<u64>,
    /// `None` unlimited when `cpu_period_us` is set.
    pub(crate) cpu_quota_us: Option<i64>,
    pub(crate) cpu_period_us: Option<u64>,
    pub(crate) memory_limit: Option<i64>,
    pub(crate) memory_min: Option<i64>,
    pub(crate) memory_low: Option<i64>,
    pub(crate) memory_high: Option<i64>,
    /// memory.oom.group (v2 only): an OOM kill takes every process of the cgroup.
    pub(crate) memory_oom_group: Option<bool>,
    pub(crate) pids_max: Option<i64>,
    pub(crate) cpus: Option<CpuSet>,
    /// Written only in a v1 cpuset hierarchy, where a child's cpuset is not confined by its
    /// parent's and starts empty; on v2 the parent's cpuset already confines it.
    pub(crate) cpus_v1_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DesiredCgroup {
    pub(crate) path: CgroupPath,
    pub(crate) role: Role,
    /// The pod this cgroup belongs to (pods and containers).
    pub(crate) pod_uid: Option<String>,
    /// Containers: the container's name (the cgroup is named by the runtime's container id).
    pub(crate) container: Option<String>,
    pub(crate) settings: Settings,
    /// Containers: the score every process in the cgroup gets.
    pub(crate) oom_score_adj: Option<i32>,
    /// Create the directory when it is missing (never for reserved cgroups).
    pub(crate) create: bool,
    pub(crate) writes: Writes,
    /// v2: qoslet enables in `cgroup.subtree_control` the controllers the children need (and
    /// reports the file's drift). Not under the kubelet's systemd driver, where systemd owns the
    /// file: it enables a slice's controllers as the units beneath it need them and writes them
    /// again as pods come and go, so a difference there is systemd's doing, not drift.
    pub(crate) enables_controllers: bool,
}

/// A pod left out of the desired state.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("pod {namespace}/{name} (uid {uid:?}) is not reconciled")]
pub struct PodRefused {
    pub(crate) namespace: String,
    pub name: String,
    pub(crate) uid: String,
    #[source]
    pub(crate) source: NameError,
}

/// Node-level cgroups that cannot be placed (a reserved cgroup outside the node root).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{what} cgroup {name:?} is not reconciled")]
pub struct NodeCgroupRefused {
    pub(crate) what: &'static str,
    pub(crate) name: String,
    #[source]
    pub(crate) source: NameError,
}

/// Everything qoslet wants, parents before children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub(crate) cgroups: Vec<DesiredCgroup>,
    pub(crate) refused_pods: Vec<PodRefused>,
    pub(crate) refused_node: Vec<NodeCgroupRefused>,
}

/// Container ids by (pod UID, container name); containers without an id are not started.
pub type ContainerIds = BTreeMap<(String, String), String>;

/// Builds the desired state from the plan and the running containers' ids.
pub fn desired_state(plan: &Plan, naming: &Naming, ids: &ContainerIds) -> DesiredState {
    let mut out = DesiredState::default();
    let n = &plan.node;
    let kubepods_cpus = n.kubepods.cpuset.as_deref().and_then(|c| c.parse().ok());
    let node = [
        ("kubepods", Role::Kubepods, &n.kubepods),
        ("burstable", Role::QosTier, &n.burstable),
        ("besteffort", Role::QosTier, &n.besteffort),
        ("system-reserved", Role::Reserved, &n.system_reserved),
        ("kube-reserved", Role::Reserved, &n.kube_reserved),
    ];
    for (what, role, cp) in node {
        let Some(name) = &cp.cgroup else { continue };
        let mut settings = cgroup_settings(cp);
        if role == Role::QosTier {
            inherit_cpus(&mut settings, &kubepods_cpus);
        }
        if role == Role::Reserved && settings == Settings::default() {
            continue;
        }
        match CgroupPath::under_root(name, &naming.node_root) {
            Ok(path) => out.cgroups.push(DesiredCgroup {
                path,
                role,
                pod_uid: None,
                container: None,
                settings,
                oom_score_adj: None,
                create: role != Role::Reserved,
                writes: Writes::All,
                enables_controllers: false,
            }),
            Err(source) => out.refused_node.push(NodeCgroupRefused {
                what,
                name: name.clone(),
                source,
            }),
        }
    }
    for pod in &plan.pods {
        match pod_cgroups(pod, naming, ids, &kubepods_cpus) {
            Ok(mut cgroups) => out.cgroups.append(&mut cgroups),
            Err(source) => out.refused_pods.push(PodRefused {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                source,
            }),
        }
    }
    let systemd_owned = naming.runner == Runner::Kubelet && naming.driver == CgroupDriver::Systemd;
    for c in &mut out.cgroups {
        c.enables_controllers = has_children(c.role) && !systemd_owned;
        if naming.runner == Runner::Kubelet {
            kubelet_owned(c, &naming.enforce);
        }
    }
    // Depth-first pre-order: parents before children and each subtree contiguous, so the
    // reconciler opens every cgroup relative to its parent's directory, held open meanwhile.
    out.cgroups
        .sort_by(|a, b| a.path.components().cmp(b.path.components()));
    out
}

/// Whether a cgroup of `role` has children qoslet manages.
pub(crate) fn has_children(role: Role) -> bool {
    matches!(role, Role::Kubepods | Role::QosTier | Role::Pod)
}

/// Under the kubelet: nothing is created, and only the enforced areas' files are written.
fn kubelet_owned(c: &mut DesiredCgroup, areas: &BTreeSet<Area>) {
    c.create = false;
    c.writes = Writes::Only(
        areas
            .iter()
            .flat_map(|a| a.files(c.role).iter().copied())
            .collect(),
    );
    if !areas.contains(&Area::OomScoreAdj) {
        c.oom_score_adj = None;
    }
}

fn inherit_cpus(s: &mut Settings, kubepods_cpus: &Option<CpuSet>) {
    if s.cpus.is_none() {
        s.cpus = kubepods_cpus.clone();
        s.cpus_v1_only = true;
    }
}

fn cgroup_settings(cp: &CgroupPlan) -> Settings {
    Settings {
        cpu_shares: cp.cpu_shares,
        cpu_weight: cp.cpu_weight,
        memory_limit: cp.memory_limit_bytes,
        memory_min: cp.memory_min_bytes,
        memory_low: cp.memory_low_bytes,
        pids_max: cp.pids_max,
        cpus: cp.cpuset.as_deref().and_then(|c| c.parse().ok()),
        ..Settings::default()
    }
}

fn quota(q: Option<i64>) -> Option<i64> {
    q.filter(|q| *q > 0)
}

fn pod_cgroups(
    pod: &PodPlan,
    naming: &Naming,
    ids: &ContainerIds,
    kubepods_cpus: &Option<CpuSet>,
) -> Result<Vec<DesiredCgroup>, NameError> {
    validate_uid(&pod.uid)?;
    // Without cgroupsPerQOS the kubelet makes no pod cgroups and qoslet has nothing to write.
    let Some(name) = &pod.cgroup else {
        return Ok(Vec::new());
    };
    let path = CgroupPath::under_root(name, &naming.node_root)?;
    check_pod_component(&path, naming.driver, &pod.uid)?;
    let mut settings = Settings {
        cpu_shares: pod.cpu_shares,
        cpu_weight: pod.cpu_weight,
        cpu_quota_us: quota(pod.cpu_quota_us),
        cpu_period_us: pod.cpu_period_us,
        memory_limit: pod.memory_limit_bytes,
        memory_min: pod.memory_min_bytes,
        memory_low: pod.memory_low_bytes,
        memory_high: pod.memory_high_bytes,
        pids_max: pod.pids_max,
        ..Settings::default()
    };
    inherit_cpus(&mut settings, kubepods_cpus);
    let mut out = vec![DesiredCgroup {
        path: path.clone(),
        role: Role::Pod,
        pod_uid: Some(pod.uid.clone()),
        container: None,
        settings,
        oom_score_adj: None,
        create: true,
        writes: Writes::All,
        enables_controllers: false,
    }];
    for c in &pod.containers {
        if !is_dns_label(&c.name) {
            return Err(NameError::ContainerName {
                name: c.name.clone(),
            });
        }
        let Some(id) = ids.get(&(pod.uid.clone(), c.name.clone())) else {
            continue;
        };
        validate_container_id(id, naming.runtime)?;
        let cpath = path.join(&container_component(naming.driver, naming.runtime, id))?;
        let mut cg = container_cgroup(cpath, &pod.uid, c, kubepods_cpus);
        cg.create = naming.runner.creates_cgroups();
        out.push(cg);
    }
    Ok(out)
}

fn container_cgroup(
    path: CgroupPath,
    uid: &str,
    c: &ContainerPlan,
    kubepods_cpus: &Option<CpuSet>,
) -> DesiredCgroup {
    let mut settings = Settings {
        cpu_shares: Some(c.cpu_shares),
        cpu_weight: Some(c.cpu_weight),
        cpu_quota_us: quota(c.cpu_quota_us),
        cpu_period_us: c.cpu_period_us,
        memory_limit: c.memory_limit_bytes,
        memory_min: c.memory_min_bytes,
        memory_low: c.memory_low_bytes,
        memory_high: c.memory_high_bytes,
        memory_oom_group: c.memory_oom_group,
        ..Settings::default()
    };
    inherit_cpus(&mut settings, kubepods_cpus);
    DesiredCgroup {
        path,
        role: Role::Container,
        pod_uid: Some(uid.into()),
        container: Some(c.name.clone()),
        settings,
        oom_score_adj: Some(c.oom_score_adj),
        create: true,
        writes: Writes::All,
        enables_controllers: false,
    }
}

#[cfg(test)]
mod tests;
