//! Which thresholds are met, with minimum reclaim and grace periods: a pure state machine, time
//! passed in (pkg/kubelet/eviction/helpers.go `thresholdsMet`, `thresholdsFirstObservedAt`,
//! `thresholdsMetGracePeriod`; eviction_manager.go `synchronize`).

use std::{collections::BTreeMap, time::Instant};

use crate::policy::eviction::Threshold;

/// One observed signal: what is left and out of how much (`signalObservation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observed {
    pub(crate) available: i64,
    pub(crate) capacity: i64,
}

/// Signal name -> observation.
pub(crate) type Observations = BTreeMap<String, Observed>;

/// What a threshold guards: the resource an eviction reclaims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Resource {
    Memory,
    Pids,
}

/// The resource a signal reclaims (`signalToResource`); disk signals are not handled here.
pub(crate) fn resource_of(signal: &str) -> Option<Resource> {
    match signal {
        "memory.available" | "allocatableMemory.available" => Some(Resource::Memory),
        "pid.available" => Some(Resource::Pids),
        _ => None,
    }
}

/// The amount a threshold stands for, plus its minimum reclaim when enforced.
pub(crate) fn threshold_amount(t: &Threshold, capacity: i64, enforce_min_reclaim: bool) -> i64 {
    let mut q = t.value.amount(capacity);
    if enforce_min_reclaim && let Some(m) = &t.min_reclaim {
        q += m.amount(capacity);
    }
    q
}

/// `thresholdsMet`: thresholds whose signal's available is below the amount.
pub(crate) fn thresholds_met(
    thresholds: &[Threshold],
    obs: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            obs.get(&t.signal)
                .is_some_and(|o| threshold_amount(t, o.capacity, enforce_min_reclaim) > o.available)
        })
        .cloned()
        .collect()
}

/// Key of a threshold in the first-observed map: upstream compares signal, operator and value
/// (`compareThresholdValue`); hard and soft on one signal differ by grace period.
fn key(t: &Threshold) -> (String, String, u64) {
    (
        t.signal.clone(),
        format!("{:?}", t.value),
        t.grace_period_secs,
    )
}

/// What the manager remembers between passes.
#[derive(Debug, Clone, Default)]
pub(crate) struct ThresholdState {
    first_observed: BTreeMap<(String, String, u64), Instant>,
    /// Thresholds acted on last pass: minimum reclaim applies to them until resolved.
    met: Vec<Threshold>,
}

/// The outcome of one observation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Evaluation {
    /// Met, before grace periods: what node conditions are derived from.
    pub(crate) met: Vec<Threshold>,
    /// Met and past their grace period: what evictions act on.
    pub(crate) actionable: Vec<Threshold>,
}

impl ThresholdState {
    /// One `synchronize` step on `obs` at `now`.
    pub(crate) fn observe(
        &mut self,
        thresholds: &[Threshold],
        obs: &Observations,
        now: Instant,
    ) -> Evaluation {
        let mut met = thresholds_met(thresholds, obs, false);
        // Thresholds acted on stay met until minimum reclaim is satisfied as well.
        for t in thresholds_met(&self.met, obs, true) {
            if !met.iter().any(|m| key(m) == key(&t)) {
                met.push(t);
            }
        }
        let mut first = BTreeMap::new();
        for t in &met {
            let k = key(t);
            let at = self.first_observed.get(&k).copied().unwrap_or(now);
            first.insert(k, at);
        }
        let actionable: Vec<Threshold> = met
            .iter()
            .filter(|t| {
                let at = first[&key(t)];
                now.saturating_duration_since(at).as_secs_f64() >= t.grace_period_secs as f64
            })
            .cloned()
            .collect();
        self.first_observed = first;
        self.met = actionable.clone();
        Evaluation { met, actionable }
    }

    /// When a met threshold was first seen (the start of its episode).
    #[cfg(test)]
    pub(crate) fn first_observed(&self, t: &Threshold) -> Option<Instant> {
        self.first_observed.get(&key(t)).copied()
    }
}

/// The threshold to reclaim for: memory signals before pids (`byEvictionPriority`), hard before
/// soft among equals.
pub(crate) fn to_reclaim(actionable: &[Threshold]) -> Option<(&Threshold, Resource)> {
    actionable
        .iter()
        .filter_map(|t| resource_of(&t.signal).map(|r| (t, r)))
        .min_by_key(|(t, r)| (*r, t.grace_period_secs))
}

/// How much must be freed for `t` (with its minimum reclaim) to stop being met.
pub(crate) fn shortfall(t: &Threshold, o: &Observed) -> i64 {
    (threshold_amount(t, o.capacity, true) - o.available).max(0)
}

#[cfg(test)]
mod tests;
