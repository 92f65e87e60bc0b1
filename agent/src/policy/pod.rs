//! A pod as the kubelet's resource model sees it, decoded from a k8s-openapi `Pod`, and the
//! effective requests and limits (pkg/api/v1/resource/helpers.go `PodRequests`, `PodLimits`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1 as core, apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{
    qos_class::QosClass,
    quantity::{Quantity, QuantityError},
};

/// `priority` of `system-cluster-critical`; pods at or above it are critical
/// (pkg/apis/scheduling/types.go SystemCriticalPriority).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
const SYSTEM_NODE_CRITICAL_PRIORITY: i32 = SYSTEM_CRITICAL_PRIORITY + 1000;

/// A pod's identity on the node: namespace and name, plus the uid (for manifest pods without
/// one, derived from namespace and name as the kubelet does for static pods). The one key every
/// part of qoslet uses: source, plan, cgroups, executor, eviction, and the API writes queued
/// about a pod (stored with them, so it reads back).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `spec.restartPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

/// A field of a pod could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {source}")]
pub(crate) struct PodError {
    /// JSON path inside the object, e.g. `spec.containers[0].resources.limits.memory`.
    pub(crate) field: String,
    #[source]
    pub(crate) source: QuantityError,
}

/// Where a container runs in the pod's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerKind {
    /// A regular init container: runs to completion before the app containers.
    Init,
    /// An init container with `restartPolicy: Always`: runs beside the app containers.
    Sidecar,
    App,
}

/// cpu and memory amounts; other resources do not enter the QoS model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
}

/// Requests and limits, after API defaulting (a limit without request sets the request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub requests: Amounts,
    pub limits: Amounts,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    pub name: String,
    pub kind: ContainerKind,
    pub resources: Resources,
}

/// The parts of a pod the policy reads. Ephemeral containers are dropped: they cannot declare
/// resources and do not count for QoS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpecView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Init containers (regular and sidecars) in order, then the app containers.
    pub containers: Vec<ContainerView>,
    /// Pod-level `spec.resources`, when it names cpu or memory.
    pub pod_resources: Option<Resources>,
    /// `spec.overhead` (set by admission from the pod's RuntimeClass): what the sandbox costs
    /// beyond the containers. Counted in [`Self::requests`] and [`Self::limits`], not in the QoS
    /// class nor in oom_score_adj.
    pub overhead: Amounts,
    pub priority: Option<i32>,
    pub priority_class_name: Option<String>,
    /// Hugepage requests by page size in bytes (`hugepages-<size>` requests, aggregated as
    /// `PodRequests` aggregates every resource), bytes of hugepages each.
    pub hugepages: BTreeMap<i64, i64>,
    /// Static or mirror pod (annotations `kubernetes.io/config.source` != api,
    /// `kubernetes.io/config.mirror`).
    pub static_or_mirror: bool,
    /// `status.qosClass`, which the kubelet uses when present.
    pub status_qos_class: Option<QosClass>,
}

impl PodSpecView {
    /// Reads a pod; quantities that do not parse are errors naming their field.
    pub(crate) fn from_pod(pod: &core::Pod) -> Result<Self, PodError> {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let name = meta.name.clone().unwrap_or_default();
        let uid = meta
            .uid
            .clone()
            .unwrap_or_else(|| derived_uid(&namespace, &name));
        let spec = pod.spec.clone().unwrap_or_default();
        let mut containers = Vec::new();
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            let kind = if c.restart_policy.as_deref() == Some("Always") {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            let field = format!("spec.initContainers[{i}].resources");
            containers.push(container(c, kind, &field)?);
        }
        for (i, c) in spec.containers.iter().enumerate() {
            let field = format!("spec.containers[{i}].resources");
            containers.push(container(c, ContainerKind::App, &field)?);
        }
        let overhead = amounts(spec.overhead.as_ref(), "spec.overhead")?;
        let hugepages = hugepage_requests(&spec);
        let pod_resources = resources(spec.resources.as_ref(), "spec.resources")?
            .filter(|r| r.requests != Amounts::default() || r.limits != Amounts::default());
        let annotations = meta.annotations.clone().unwrap_or_default();
        let static_or_mirror = annotations.contains_key("kubernetes.io/config.mirror")
            || annotations
                .get("kubernetes.io/config.source")
                .is_some_and(|s| s != "api");
        Ok(Self {
            namespace,
            name,
            uid,
            containers,
            pod_resources,
            overhead,
            hugepages,
            priority: spec.priority,
            priority_class_name: spec.priority_class_name,
            static_or_mirror,
            status_qos_class: pod
                .status
                .as_ref()
                .and_then(|s| s.qos_class.as_deref())
                .and_then(QosClass::from_api),
        })
    }

    /// The pod's priority: `spec.priority`, else the value of the two built-in classes.
    pub(crate) fn effective_priority(&self) -> i32 {
        self.priority
            .unwrap_or(match self.priority_class_name.as_deref() {
                Some("system-node-critical") => SYSTEM_NODE_CRITICAL_PRIORITY,
                Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
                _ => 0,
            })
    }

    /// pkg/kubelet/types/pod_update.go `IsCriticalPod`: static, mirror, or priority >= 2e9.
    pub(crate) fn is_critical(&self) -> bool {
        self.static_or_mirror || self.effective_priority() >= SYSTEM_CRITICAL_PRIORITY
    }

    /// `IsNodeCriticalPod`: critical and of class `system-node-critical`.
    pub(crate) fn is_node_critical(&self) -> bool {
        self.is_critical() && self.priority_class_name.as_deref() == Some("system-node-critical")
    }

    /// `AggregateContainerRequests` (requests) without pod-level resources: the sum of app
    /// containers and sidecars, against the peak of each init container plus the sidecars
    /// started before it.
    pub(crate) fn container_requests(&self) -> Totals {
        aggregate(&self.containers, |r| r.requests)
    }

    /// `AggregateContainerLimits`, the same aggregation over limits.
    pub(crate) fn container_limits(&self) -> Totals {
        aggregate(&self.containers, |r| r.limits)
    }

    /// `PodRequests` (component-helpers/resource/helpers.go): pod-level requests where set,
    /// else the container aggregate, plus `spec.overhead` for every resource it names
    /// (`addResourceList`; the kubelet never passes `ExcludeOverhead`).
    pub(crate) fn requests(&self) -> Totals {
        let mut t = self.requests_without_overhead();
        t.cpu = add(t.cpu, self.overhead.cpu);
        t.memory = add(t.memory, self.overhead.memory);
        t
    }

    /// `PodRequests` with `ExcludeOverhead`.
    pub(crate) fn requests_without_overhead(&self) -> Totals {
        let mut t = self.container_requests();
        if let Some(p) = &self.pod_resources {
            t.cpu = p.requests.cpu.or(t.cpu);
            t.memory = p.requests.memory.or(t.memory);
        }
        t
    }

    /// `PodLimits`: pod-level limits where set, else the container aggregate; `spec.overhead`
    /// is added only to a resource that has a limit ("Add overhead to non-zero limits").
    pub(crate) fn limits(&self) -> Totals {
        let mut t = self.container_limits();
        if let Some(p) = &self.pod_resources {
            t.cpu = p.limits.cpu.or(t.cpu);
            t.memory = p.limits.memory.or(t.memory);
        }
        if t.cpu.is_some() {
            t.cpu = add(t.cpu, self.overhead.cpu);
        }
        if t.memory.is_some() {
            t.memory = add(t.memory, self.overhead.memory);
        }
        t
    }
}

/// Summed cpu and memory of a pod; `None` when nothing declared the resource.
pub(crate) type Totals = Amounts;

impl Amounts {
    pub(crate) fn cpu_millis(&self) -> i64 {
        self.cpu.map_or(0, |q| q.milli_value())
    }

    pub(crate) fn memory_bytes(&self) -> i64 {
        self.memory.map_or(0, |q| q.value())
    }
}

fn add(a: Option<Quantity>, b: Option<Quantity>) -> Option<Quantity> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.checked_add(&b).unwrap_or(a.max(b))),
        (a, b) => a.or(b),
    }
}

fn max(a: Option<Quantity>, b: Option<Quantity>) -> Option<Quantity> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn aggregate(containers: &[ContainerView], pick: impl Fn(&Resources) -> Amounts) -> Totals {
    let mut sum = Amounts::default();
    let mut sidecars = Amounts::default();
    let mut init_peak = Amounts::default();
    for c in containers {
        let r = pick(&c.resources);
        match c.kind {
            ContainerKind::App => {
                sum.cpu = add(sum.cpu, r.cpu);
                sum.memory = add(sum.memory, r.memory);
            }
            ContainerKind::Sidecar => {
                sum.cpu = add(sum.cpu, r.cpu);
                sum.memory = add(sum.memory, r.memory);
                sidecars.cpu = add(sidecars.cpu, r.cpu);
                sidecars.memory = add(sidecars.memory, r.memory);
                init_peak.cpu = max(init_peak.cpu, sidecars.cpu);
                init_peak.memory = max(init_peak.memory, sidecars.memory);
            }
            ContainerKind::Init => {
                init_peak.cpu = max(init_peak.cpu, add(r.cpu, sidecars.cpu));
                init_peak.memory = max(init_peak.memory, add(r.memory, sidecars.memory));
            }
        }
    }
    Amounts {
        cpu: max(sum.cpu, init_peak.cpu),
        memory: max(sum.memory, init_peak.memory),
    }
}

/// helpers_linux.go `HugePageLimits` over the pod's requests: for each `hugepages-<size>`
/// request, its bytes under the page size (names that do not parse are skipped, as upstream);
/// across containers as `PodRequests` aggregates (app and sidecars summed, against each init
/// container's peak with the sidecars started before it).
fn hugepage_requests(spec: &core::PodSpec) -> BTreeMap<i64, i64> {
    let of = |c: &core::Container| -> BTreeMap<i64, i64> {
        let mut out = BTreeMap::new();
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        for (name, q) in requests.into_iter().flatten() {
            let Some(size) = name.strip_prefix("hugepages-") else {
                continue;
            };
            let (Ok(size), Ok(q)) = (size.parse::<Quantity>(), q.0.parse::<Quantity>()) else {
                continue;
            };
            *out.entry(size.value()).or_insert(0) += q.value();
        }
        out
    };
    let merge = |a: &mut BTreeMap<i64, i64>, b: &BTreeMap<i64, i64>, f: fn(i64, i64) -> i64| {
        for (k, v) in b {
            let e = a.entry(*k).or_insert(0);
            *e = f(*e, *v);
        }
    };
    let (mut sum, mut sidecars, mut peak) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for c in spec.init_containers.iter().flatten() {
        let r = of(c);
        if c.restart_policy.as_deref() == Some("Always") {
            merge(&mut sum, &r, i64::saturating_add);
            merge(&mut sidecars, &r, i64::saturating_add);
            merge(&mut peak, &sidecars, i64::max);
        } else {
            let mut with = sidecars.clone();
            merge(&mut with, &r, i64::saturating_add);
            merge(&mut peak, &with, i64::max);
        }
    }
    for c in &spec.containers {
        merge(&mut sum, &of(c), i64::saturating_add);
    }
    merge(&mut sum, &peak, i64::max);
    sum.retain(|_, v| *v > 0);
    sum
}

fn container(
    c: &core::Container,
    kind: ContainerKind,
    field: &str,
) -> Result<ContainerView, PodError> {
    Ok(ContainerView {
        name: c.name.clone(),
        kind,
        resources: resources(c.resources.as_ref(), field)?.unwrap_or_default(),
    })
}

fn resources(
    r: Option<&core::ResourceRequirements>,
    field: &str,
) -> Result<Option<Resources>, PodError> {
    let Some(r) = r else { return Ok(None) };
    let limits = amounts(r.limits.as_ref(), &format!("{field}.limits"))?;
    let mut requests = amounts(r.requests.as_ref(), &format!("{field}.requests"))?;
    // API defaulting (pkg/apis/core/v1/defaults.go): a limit without a request sets the request.
    requests.cpu = requests.cpu.or(limits.cpu);
    requests.memory = requests.memory.or(limits.memory);
    Ok(Some(Resources { requests, limits }))
}

fn amounts(list: Option<&BTreeMap<String, K8sQuantity>>, field: &str) -> Result<Amounts, PodError> {
    let parse = |key: &str| -> Result<Option<Quantity>, PodError> {
        list.and_then(|l| l.get(key))
            .map(|q| {
                q.0.parse().map_err(|source| PodError {
                    field: format!("{field}.{key}"),
                    source,
                })
            })
            .transpose()
    };
    Ok(Amounts {
        cpu: parse("cpu")?,
        memory: parse("memory")?,
    })
}

/// A stable UID for pods without `metadata.uid` (manifests on disk): an RFC 9562 version 8
/// UUID whose bits are the FNV-1a 128-bit hash of `qoslet:<namespace>/<name>`. The same
/// manifest always gets the same cgroup, across runs and machines.
pub(crate) fn derived_uid(namespace: &str, name: &str) -> String {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;
    let mut h = OFFSET;
    for b in format!("qoslet:{namespace}/{name}").bytes() {
        h ^= u128::from(b);
        h = h.wrapping_mul(PRIME);
    }
    // Version 8 in bits 76-79, variant 0b10 in bits 62-63.
    h = (h & !(0xf << 76)) | (0x8 << 76);
    h = (h & !(0x3 << 62)) | (0x2 << 62);
    let hex = format!("{h:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests;
