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

/// The score for `container` of `pod` on a node with `memory_capacity` bytes.
pub fn container_oom_score_adj(
    pod: &PodSpecView,
    container: &ContainerView,
    memory_capacity: i64,
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
    let score = |request: i64| 1000 - (1000 * (i128::from(request) + share)) / capacity;
    let mut adj = score(container.resources.requests.memory_bytes());
    if container.kind == ContainerKind::Sidecar {
        // A sidecar is never killed before the app it serves: cap it at the score of the regular
        // container with the smallest memory request.
        let min_regular = pod
            .containers
            .iter()
            .filter(|c| c.kind == ContainerKind::App)
            .map(|c| c.resources.requests.memory_bytes())
            .min();
        if let Some(min) = min_regular {
            adj = adj.min(score(min));
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
