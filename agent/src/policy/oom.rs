//! oom_score_adj per container (pkg/kubelet/qos/policy.go `GetContainerOOMScoreAdjust`).

use super::{
    pod::{ContainerKind, ContainerView, PodSpecView},
    qos::{QosClass, pod_qos},
};

/// The kubelet and the container runtime.
pub const KUBELET_OOM_SCORE_ADJ: i32 = -999;
/// Guaranteed and node-critical pods.
pub const GUARANTEED_OOM_SCORE_ADJ: i32 = -997;
pub const BESTEFFORT_OOM_SCORE_ADJ: i32 = 1000;

/// The smallest memory request the `KubeletOOMScoreAdjTieBreak` nudge distinguishes
/// (policy.go `oomScoreAdjTieBreakFloor`, 64Mi).
const TIE_BREAK_FLOOR: i128 = 64 << 20;

/// The score for `container` of `pod` on a node with `memory_capacity` bytes, feature gate
/// `KubeletOOMScoreAdjTieBreak` off.
pub fn container_oom_score_adj(
    pod: &PodSpecView,
    container: &ContainerView,
    memory_capacity: i64,
) -> i32 {
    container_oom_score_adj_with(pod, container, memory_capacity, false)
}

/// policy.go `containerOOMScoreAdjust`, with `tie_break` the `KubeletOOMScoreAdjTieBreak` gate
/// (alpha): Burstable scores are nudged down by one point per doubling of the request above
/// 64Mi (at most log2(capacity/1000/64Mi) points), and further down when the container's
/// enforced limit is within its request; a sidecar is then capped at the highest regular
/// container's score instead of the smallest request's.
pub fn container_oom_score_adj_with(
    pod: &PodSpecView,
    container: &ContainerView,
    memory_capacity: i64,
    tie_break: bool,
) -> i32 {
    if pod.is_node_critical() {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match pod_qos(pod) {
        QosClass::Guaranteed => return GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => return BESTEFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {}
    }
    let capacity = i128::from(memory_capacity.max(1));
    let share = pod_level_share(pod);
    let linear = |request: i128| 1000 - (1000 * request) / capacity;
    let tie_broken = |c: &ContainerView| {
        let request = i128::from(c.resources.requests.memory_bytes()) + share;
        tie_break_adjust(linear(request), request, enforced_limit(pod, c), capacity)
    };
    let request = i128::from(container.resources.requests.memory_bytes()) + share;
    let mut adj = if tie_break {
        tie_broken(container)
    } else {
        linear(request)
    };
    if container.kind == ContainerKind::Sidecar {
        // A sidecar is never killed before the app it serves.
        let regular = pod
            .containers
            .iter()
            .filter(|c| c.kind == ContainerKind::App);
        let cap = if tie_break {
            regular.map(tie_broken).max()
        } else {
            regular
                .map(|c| c.resources.requests.memory_bytes())
                .min()
                .map(|min| linear(i128::from(min) + share))
        };
        if let Some(cap) = cap {
            adj = adj.min(cap);
        }
    }
    // A Guaranteed pod using all memory scores about 3: keep Burstable above it, and below
    // BestEffort.
    if adj < i128::from(1000 + GUARANTEED_OOM_SCORE_ADJ) {
        return 1000 + GUARANTEED_OOM_SCORE_ADJ;
    }
    if adj == i128::from(BESTEFFORT_OOM_SCORE_ADJ) {
        return BESTEFFORT_OOM_SCORE_ADJ - 1;
    }
    adj as i32
}

/// policy.go `tieBreakOOMScoreAdjust`.
fn tie_break_adjust(linear: i128, request: i128, limit: i128, capacity: i128) -> i128 {
    let max_nudge = log2_floor(capacity / 1000 / TIE_BREAK_FLOOR);
    let mut adj = linear - log2_floor(request / TIE_BREAK_FLOOR).min(max_nudge);
    if limit > 0 && limit <= request {
        adj -= max_nudge + 1;
    }
    adj
}

/// floor(log2(x)), 0 for x < 1 (policy.go `log2Floor`).
fn log2_floor(x: i128) -> i128 {
    if x < 1 {
        0
    } else {
        i128::from(127 - x.leading_zeros())
    }
}

/// The memory limit the container's cgroup gets: its own, else the pod-level limit
/// (policy.go `enforcedMemoryLimit`; TestGetContainerOOMScoreAdjustTieBreak's pod-level rows
/// show the pod-level limit counting), 0 when unlimited. DRA claims are not modelled.
fn enforced_limit(pod: &PodSpecView, c: &ContainerView) -> i128 {
    let own = c.resources.limits.memory_bytes();
    let limit = if own > 0 {
        own
    } else {
        pod.pod_resources.map_or(0, |r| r.limits.memory_bytes())
    };
    i128::from(limit)
}

/// With pod-level requests, the memory they add beyond the containers' own, split evenly over
/// every container and init container (`getRemainingPodMemoryRequestPerContainer`).
fn pod_level_share(pod: &PodSpecView) -> i128 {
    let Some(pod_mem) = pod.pod_resources.and_then(|r| r.requests.memory) else {
        return 0;
    };
    let containers = pod.containers.len().max(1) as i128;
    let aggregate = i128::from(pod.container_requests().memory_bytes());
    (i128::from(pod_mem.value()) - aggregate) / containers
}
