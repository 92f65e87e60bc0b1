//! oom_score_adj per container (pkg/kubelet/qos/policy.go `GetContainerOOMScoreAdjust`).

use super::{
    pod::{ContainerKind, ContainerView, PodSpecView},
    qos::{QosClass, pod_qos},
};

/// Guaranteed and node-critical pods.
pub(crate) const GUARANTEED_OOM_SCORE_ADJ: i32 = -997;
pub(crate) const BESTEFFORT_OOM_SCORE_ADJ: i32 = 1000;

/// The smallest memory request the `KubeletOOMScoreAdjTieBreak` nudge distinguishes
/// (policy.go `oomScoreAdjTieBreakFloor`, 64Mi).
const TIE_BREAK_FLOOR: i128 = 64 << 20;

/// The score for `container` of `pod` on a node with `memory_capacity` bytes, feature gate
/// `KubeletOOMScoreAdjTieBreak` off. For every container of a pod, use [`PodOomScores`]: this
/// computes the pod's part again on each call.
#[cfg(test)]
pub(crate) fn container_oom_score_adj(
    pod: &PodSpecView,
    container: &ContainerView,
    memory_capacity: i64,
) -> i32 {
    PodOomScores::new(pod, memory_capacity, false).container(container)
}

/// policy.go `containerOOMScoreAdjust`, with `tie_break` the `KubeletOOMScoreAdjTieBreak` gate
/// (alpha): Burstable scores are nudged down by one point per doubling of the request above
/// 64Mi (at most log2(capacity/1000/64Mi) points), and further down when the container's
/// enforced limit is within its request; a sidecar is then capped at the highest regular
/// container's score instead of the smallest request's.
#[cfg(test)]
pub(crate) fn container_oom_score_adj_with(
    pod: &PodSpecView,
    container: &ContainerView,
    memory_capacity: i64,
    tie_break: bool,
) -> i32 {
    PodOomScores::new(pod, memory_capacity, tie_break).container(container)
}

/// The pod-wide part of the score (class, criticality, pod-level share and limit, the sidecar
/// cap), computed once per pod so scoring all of a pod's containers is linear in them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodOomScores {
    fixed: Option<i32>,
    capacity: i128,
    share: i128,
    /// The pod-level memory limit, a container's enforced limit when it has none of its own.
    pod_limit: i128,
    tie_break: bool,
    /// A sidecar's score is at most this (the regular containers' score it must not undercut).
    sidecar_cap: Option<i128>,
}

impl PodOomScores {
    pub(crate) fn new(pod: &PodSpecView, memory_capacity: i64, tie_break: bool) -> Self {
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
        let mut scores = Self {
            fixed,
            capacity: i128::from(memory_capacity.max(1)),
            share: if burstable { pod_level_share(pod) } else { 0 },
            pod_limit: i128::from(pod.pod_resources.map_or(0, |r| r.limits.memory_bytes())),
            tie_break,
            sidecar_cap: None,
        };
        if burstable {
            let regular = pod
                .containers
                .iter()
                .filter(|c| c.kind == ContainerKind::App);
            scores.sidecar_cap = if tie_break {
                regular.map(|c| scores.raw(c)).max()
            } else {
                regular
                    .map(|c| c.resources.requests.memory_bytes())
                    .min()
                    .map(|min| scores.linear(i128::from(min) + scores.share))
            };
        }
        scores
    }

    fn linear(&self, request: i128) -> i128 {
        1000 - (1000 * request) / self.capacity
    }

    /// The score before the sidecar cap and the clamp.
    fn raw(&self, c: &ContainerView) -> i128 {
        let request = i128::from(c.resources.requests.memory_bytes()) + self.share;
        if !self.tie_break {
            return self.linear(request);
        }
        let own = i128::from(c.resources.limits.memory_bytes());
        let limit = if own > 0 { own } else { self.pod_limit };
        tie_break_adjust(self.linear(request), request, limit, self.capacity)
    }

    /// The score of one container of the pod.
    pub(crate) fn container(&self, container: &ContainerView) -> i32 {
        if let Some(fixed) = self.fixed {
            return fixed;
        }
        let mut adj = self.raw(container);
        if container.kind == ContainerKind::Sidecar
            && let Some(cap) = self.sidecar_cap
        {
            // A sidecar is never killed before the app it serves.
            adj = adj.min(cap);
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
