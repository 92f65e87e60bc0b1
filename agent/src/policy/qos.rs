//! The pod QoS class (pkg/apis/core/helper/qos/qos.go `ComputePodQOS`).

pub use super::qos_class::QosClass;
use super::{
    pod::{Amounts, PodSpecView},
    quantity::Quantity,
};

/// The class the kubelet uses: `status.qosClass` when present, else computed.
pub(crate) fn pod_qos(pod: &PodSpecView) -> QosClass {
    pod.status_qos_class.unwrap_or_else(|| compute_pod_qos(pod))
}

/// Computes the class from the spec. Only cpu and memory count, and only amounts > 0.
/// With pod-level resources only those decide; otherwise every init, sidecar and app container.
pub(crate) fn compute_pod_qos(pod: &PodSpecView) -> QosClass {
    let mut requests = Amounts::default();
    let mut limits = Amounts::default();
    let mut guaranteed = true;
    let lists: Vec<(Amounts, Amounts)> = match &pod.pod_resources {
        Some(r) => vec![(r.requests, r.limits)],
        None => pod
            .containers
            .iter()
            .map(|c| (c.resources.requests, c.resources.limits))
            .collect(),
    };
    for (req, lim) in lists {
        accumulate(&mut requests, &req);
        // Every container (or the pod level) needs positive cpu and memory limits.
        if accumulate(&mut limits, &lim) != (true, true) {
            guaranteed = false;
        }
    }
    if requests == Amounts::default() && limits == Amounts::default() {
        return QosClass::BestEffort;
    }
    let same = |r: Option<_>, l: Option<_>| r.is_none() || r == l;
    let count = |a: &Amounts| usize::from(a.cpu.is_some()) + usize::from(a.memory.is_some());
    if guaranteed
        && same(requests.cpu, limits.cpu)
        && same(requests.memory, limits.memory)
        && count(&requests) == count(&limits)
    {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// Adds the positive cpu and memory of `add` to `sum`; returns which of them were positive.
fn accumulate(sum: &mut Amounts, add: &Amounts) -> (bool, bool) {
    let one = |slot: &mut Option<Quantity>, q: Option<Quantity>| match q {
        Some(q) if q.signum() > 0 => {
            *slot = Some(match *slot {
                Some(s) => s.checked_add(&q).unwrap_or(q),
                None => q,
            });
            true
        }
        _ => false,
    };
    (one(&mut sum.cpu, add.cpu), one(&mut sum.memory, add.memory))
}
