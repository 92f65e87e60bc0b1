//! Node conditions MemoryPressure and PIDPressure with evictionPressureTransitionPeriod, and
//! the admission rule they drive: pure, time passed in (pkg/kubelet/eviction/helpers.go
//! `nodeConditions`, `nodeConditionsLastObservedAt`, `nodeConditionsObservedSince`;
//! eviction_manager.go `Admit`).

use std::{collections::BTreeMap, time::Duration, time::Instant};

use super::thresholds::{Resource, resource_of};
use crate::policy::{eviction::Threshold, qos::QosClass};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum NodeCondition {
    MemoryPressure,
    PidPressure,
}

impl NodeCondition {
    /// The API spelling (`NodeConditionType`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::MemoryPressure => "MemoryPressure",
            Self::PidPressure => "PIDPressure",
        }
    }
}

/// Conditions with the time each was last observed.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConditionState {
    last_observed: BTreeMap<NodeCondition, Instant>,
}

impl ConditionState {
    /// Records the conditions the met thresholds (before grace) imply at `now` and returns the
    /// ones in force: each stays for `transition` after it was last observed, so a node does
    /// not flap in and out of pressure.
    pub(crate) fn update(
        &mut self,
        met: &[Threshold],
        transition: Duration,
        now: Instant,
    ) -> Vec<NodeCondition> {
        for t in met {
            let c = match resource_of(&t.signal) {
                Some(Resource::Memory) => NodeCondition::MemoryPressure,
                Some(Resource::Pids) => NodeCondition::PidPressure,
                None => continue,
            };
            self.last_observed.insert(c, now);
        }
        self.last_observed
            .retain(|_, at| now.saturating_duration_since(*at) < transition);
        self.last_observed.keys().copied().collect()
    }
}

/// Whether a pod may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admission {
    Admit,
    /// Reason `Evicted` and this message, as the kubelet rejects.
    Reject {
        message: String,
    },
}

/// The kubelet's `Admit`: critical pods always; under MemoryPressure alone, everything but
/// BestEffort pods that do not tolerate the memory-pressure taint; under any other condition,
/// nothing else.
pub(crate) fn admit(
    conditions: &[NodeCondition],
    qos: QosClass,
    critical: bool,
    tolerates_memory_pressure: bool,
) -> Admission {
    if conditions.is_empty() || critical {
        return Admission::Admit;
    }
    if conditions == [NodeCondition::MemoryPressure]
        && (qos != QosClass::BestEffort || tolerates_memory_pressure)
    {
        return Admission::Admit;
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    Admission::Reject {
        message: format!("The node had condition: [{}]. ", names.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::eviction::ThresholdValue;

    fn th(signal: &str) -> Threshold {
        Threshold {
            signal: signal.into(),
            value: ThresholdValue::Percentage(0.1),
            grace_period_secs: 0,
            min_reclaim: None,
        }
    }

    #[test]
    fn a_condition_holds_for_the_transition_period_after_it_was_last_seen() {
        let t0 = Instant::now();
        let p = Duration::from_secs(300);
        let mut s = ConditionState::default();
        assert!(s.update(&[], p, t0).is_empty());
        assert_eq!(
            s.update(&[th("memory.available")], p, t0),
            [NodeCondition::MemoryPressure]
        );
        assert_eq!(
            s.update(&[], p, t0 + Duration::from_secs(299)),
            [NodeCondition::MemoryPressure]
        );
        assert!(s.update(&[], p, t0 + Duration::from_secs(300)).is_empty());
    }

    #[test]
    fn each_signal_maps_to_its_condition() {
        let t0 = Instant::now();
        let mut s = ConditionState::default();
        let c = s.update(
            &[
                th("pid.available"),
                th("allocatableMemory.available"),
                th("nodefs.available"),
            ],
            Duration::from_secs(1),
            t0,
        );
        assert_eq!(
            c,
            [NodeCondition::MemoryPressure, NodeCondition::PidPressure]
        );
    }

    #[test]
    fn memory_pressure_refuses_only_best_effort_pods() {
        let mp = [NodeCondition::MemoryPressure];
        assert_eq!(
            admit(&[], QosClass::BestEffort, false, false),
            Admission::Admit
        );
        assert_eq!(
            admit(&mp, QosClass::Burstable, false, false),
            Admission::Admit
        );
        assert_eq!(
            admit(&mp, QosClass::Guaranteed, false, false),
            Admission::Admit
        );
        assert_eq!(
            admit(&mp, QosClass::BestEffort, true, false),
            Admission::Admit
        );
        assert_eq!(
            admit(&mp, QosClass::BestEffort, false, true),
            Admission::Admit
        );
        assert_eq!(
            admit(&mp, QosClass::BestEffort, false, false),
            Admission::Reject {
                message: "The node had condition: [MemoryPressure]. ".into()
            }
        );
    }

    #[test]
    fn pid_pressure_refuses_every_non_critical_pod() {
        let both = [NodeCondition::MemoryPressure, NodeCondition::PidPressure];
        assert!(matches!(
            admit(&both, QosClass::Guaranteed, false, false),
            Admission::Reject { .. }
        ));
        assert!(matches!(
            admit(
                &[NodeCondition::PidPressure],
                QosClass::Burstable,
                false,
                true
            ),
            Admission::Reject { .. }
        ));
        assert_eq!(
            admit(&both, QosClass::BestEffort, true, false),
            Admission::Admit
        );
    }
}
