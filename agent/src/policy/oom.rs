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

/// The score for `container` of `pod` on a node with `memory_capacity` bytes. For every
/// container of a pod, use [`PodOomScores`]: this computes the pod's part again on each call.
pub fn container_oom_score_adj(
    pod: &PodSpecView,
    container: &ContainerView,
    memory_capacity: i64,
) -> i32 {
    PodOomScores::new(pod, memory_capacity).container(container)
}

/// The pod-wide part of the score (class, criticality, pod-level share, the smallest app
/// request), computed once per pod so scoring all of a pod's containers is linear in them.
#[derive(Debug, Clone, Copy)]
pub struct PodOomScores {
    fixed: Option<i32>,
    capacity: i128,
    share: i128,
    /// The smallest memory request of an app container, for capping sidecars.
    min_regular: Option<i64>,
}

impl PodOomScores {
    pub fn new(pod: &PodSpecView, memory_capacity: i64) -> Self {
        let fixed = if pod.is_node_critical() {
            Some(GUARANTEED_OOM_SCORE_ADJ)
        } else {
            match pod_qos(pod) {
                QosClass::Guaranteed => Some(GUARANTEED_OOM_SCORE_ADJ),
                QosClass::BestEffort => Some(BESTEFFORT_OOM_SCORE_ADJ),
                QosClass::Burstable => None,
            }
        };
        let burstable = fixed.is_none();
        Self {
            fixed,
            capacity: i128::from(memory_capacity.max(1)),
            share: if burstable { pod_level_share(pod) } else { 0 },
            min_regular: pod
                .containers
                .iter()
                .filter(|c| burstable && c.kind == ContainerKind::App)
                .map(|c| c.resources.requests.memory_bytes())
                .min(),
        }
    }

    /// The score of one container of the pod.
    pub fn container(&self, container: &ContainerView) -> i32 {
        if let Some(fixed) = self.fixed {
            return fixed;
        }
        let score =
            |request: i64| 1000 - (1000 * (i128::from(request) + self.share)) / self.capacity;
        let mut adj = score(container.resources.requests.memory_bytes());
        if container.kind == ContainerKind::Sidecar {
            // A sidecar is never killed before the app it serves: cap it at the score of the
            // regular container with the smallest memory request.
            if let Some(min) = self.min_regular {
                adj = adj.min(score(min));
            }
        }
        // A Guaranteed pod using all memory scores about 3: keep Burstable above it, and below
        // BestEffort. The clamp also keeps a pod-level share larger than capacity in range.
        if adj < i128::from(1000 + GUARANTEED_OOM_SCORE_ADJ) {
            return 1000 + GUARANTEED_OOM_SCORE_ADJ;
        }
        if adj >= i128::from(BESTEFFORT_OOM_SCORE_ADJ) {
            return BESTEFFORT_OOM_SCORE_ADJ - 1;
        }
        adj as i32
    }
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
