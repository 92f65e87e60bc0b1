//! Eviction thresholds and ranking (pkg/kubelet/eviction/helpers.go, api/types.go).

use std::{cmp::Ordering, collections::BTreeMap};

use serde::Serialize;
use thiserror::Error;

use super::{duration::parse_duration, quantity::Quantity};

pub const SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "pid.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
];

/// The kubelet's `evictionHard` default (pkg/kubelet/apis/config/v1beta1/defaults_linux.go).
pub const DEFAULT_HARD: &[(&str, &str)] = &[
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ThresholdError {
    #[error("unrecognized signal {signal:?}")]
    UnknownSignal { signal: String },
    #[error("{signal}: invalid threshold {value:?}: {reason}")]
    Value {
        signal: String,
        value: String,
        reason: String,
    },
    #[error("{signal}: eviction soft threshold requires a grace period")]
    MissingGrace { signal: String },
    #[error("{signal}: invalid duration {value:?}")]
    Duration { signal: String, value: String },
}

/// A threshold value: a quantity, or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ThresholdValue {
    Quantity(#[serde(serialize_with = "ser_quantity")] Quantity),
    /// Kept as upstream's `float32` fraction (0.1 for `10%`), so amounts of capacity come out
    /// byte-identical to the kubelet's `GetThresholdQuantity`.
    Percentage(f32),
}

fn ser_quantity<S: serde::Serializer>(q: &Quantity, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&q.canonical())
}

impl ThresholdValue {
    /// The amount for a resource of `capacity` units (`GetThresholdQuantity`).
    pub fn amount(&self, capacity: i64) -> i64 {
        match self {
            Self::Quantity(q) => q.value(),
            Self::Percentage(p) => (capacity as f64 * f64::from(*p)) as i64,
        }
    }
}

/// One `signal < value` threshold (the only operator the kubelet has).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Threshold {
    pub signal: String,
    pub value: ThresholdValue,
    /// Zero for hard thresholds.
    pub grace_period_secs: u64,
    pub min_reclaim: Option<ThresholdValue>,
}

/// Eviction settings from the KubeletConfiguration, as strings.
#[derive(Debug, Clone, Default)]
pub struct EvictionInput<'a> {
    /// `None` means unset: the upstream defaults apply.
    pub hard: Option<&'a BTreeMap<String, String>>,
    pub soft: Option<&'a BTreeMap<String, String>>,
    pub soft_grace: Option<&'a BTreeMap<String, String>>,
    pub min_reclaim: Option<&'a BTreeMap<String, String>>,
    /// `mergeDefaultEvictionSettings` (PR #127577): a partial `evictionHard` keeps the defaults
    /// for the signals it does not name (otherwise they are dropped).
    pub merge_defaults: bool,
    /// Whether `pods` is enforced: then hard memory.available is copied to
    /// allocatableMemory.available.
    pub pods_enforced: bool,
}

/// `ParseThresholdConfig`: hard thresholds then soft ones.
pub fn parse_thresholds(
    input: &EvictionInput<'_>,
) -> Result<(Vec<Threshold>, Vec<Threshold>), ThresholdError> {
    let defaults: BTreeMap<String, String> = DEFAULT_HARD
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    let empty = BTreeMap::new();
    let min_reclaim = input.min_reclaim.unwrap_or(&empty);
    let hard_map = match input.hard {
        None => defaults,
        Some(h) if input.merge_defaults => {
            let mut merged = defaults;
            merged.extend(h.iter().map(|(k, v)| (k.clone(), v.clone())));
            merged
        }
        Some(h) => h.clone(),
    };
    let mut hard = Vec::new();
    for (signal, value) in &hard_map {
        if let Some(t) = parse_one(signal, value, 0, min_reclaim)? {
            hard.push(t);
        }
    }
    if input.pods_enforced {
        let copies: Vec<Threshold> = hard
            .iter()
            .filter(|t| t.signal == "memory.available")
            .map(|t| Threshold {
                signal: "allocatableMemory.available".into(),
                ..t.clone()
            })
            .collect();
        hard.extend(copies);
    }
    let mut soft = Vec::new();
    for (signal, value) in input.soft.unwrap_or(&empty) {
        let grace = input
            .soft_grace
            .and_then(|g| g.get(signal))
            .ok_or_else(|| ThresholdError::MissingGrace {
                signal: signal.clone(),
            })?;
        let secs = parse_duration(grace).map_err(|_| ThresholdError::Duration {
            signal: signal.clone(),
            value: grace.clone(),
        })?;
        if let Some(t) = parse_one(signal, value, secs, min_reclaim)? {
            soft.push(t);
        }
    }
    Ok((hard, soft))
}

fn parse_one(
    signal: &str,
    value: &str,
    grace_period_secs: u64,
    min_reclaim: &BTreeMap<String, String>,
) -> Result<Option<Threshold>, ThresholdError> {
    if !SIGNALS.contains(&signal) {
        return Err(ThresholdError::UnknownSignal {
            signal: signal.into(),
        });
    }
    let Some(value) = parse_value(signal, value)? else {
        return Ok(None);
    };
    let min_reclaim = match min_reclaim.get(signal) {
        Some(v) => parse_value(signal, v)?,
        None => None,
    };
    Ok(Some(Threshold {
        signal: signal.into(),
        value,
        grace_period_secs,
        min_reclaim,
    }))
}

/// A quantity > 0, or a percentage in [0, 100]; `0%` and `100%` disable the threshold.
fn parse_value(signal: &str, text: &str) -> Result<Option<ThresholdValue>, ThresholdError> {
    let err = |reason: String| ThresholdError::Value {
        signal: signal.into(),
        value: text.into(),
        reason,
    };
    if let Some(number) = text.strip_suffix('%') {
        let pct: f32 = number.parse().map_err(|_| err("not a percentage".into()))?;
        if !(0.0..=100.0).contains(&pct) {
            return Err(err("percentage must be >= 0% and <= 100%".into()));
        }
        if pct == 0.0 || pct == 100.0 {
            return Ok(None);
        }
        return Ok(Some(ThresholdValue::Percentage(pct / 100.0)));
    }
    let q: Quantity = text
        .parse()
        .map_err(|e: super::quantity::QuantityError| err(e.to_string()))?;
    if q.signum() <= 0 {
        return Err(err("must be positive".into()));
    }
    Ok(Some(ThresholdValue::Quantity(q)))
}

/// The grace period a pod gets when evicted: 0 for hard thresholds; for soft ones
/// `min(pod grace, evictionMaxPodGracePeriod)`, the pod's own when the maximum is not positive
/// (eviction_manager.go).
pub fn eviction_grace_secs(hard: bool, pod_grace_secs: i64, max_pod_grace_secs: i64) -> i64 {
    match (hard, max_pod_grace_secs > 0) {
        (true, _) => 0,
        (false, true) => pod_grace_secs.min(max_pod_grace_secs),
        (false, false) => pod_grace_secs,
    }
}

/// What the ranking needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub usage_bytes: i64,
    pub request_bytes: i64,
    pub priority: i32,
    /// Static, mirror or priority >= 2e9: never evicted.
    pub critical: bool,
    /// Seconds since the epoch; kept for gang-aware ordering, not used by the kubelet's rank.
    pub start_time: i64,
    pub processes: u64,
}

/// `rankMemoryPressure`: indices of evictable candidates, first to evict first. Usage above
/// request first, then lower priority, then larger `usage - request`. Stable for ties.
pub fn rank_memory(candidates: &[Candidate]) -> Vec<usize> {
    rank(candidates, |a, b| {
        let exceeds = |c: &Candidate| c.usage_bytes > c.request_bytes;
        exceeds(b)
            .cmp(&exceeds(a))
            .then(a.priority.cmp(&b.priority))
            .then((b.usage_bytes - b.request_bytes).cmp(&(a.usage_bytes - a.request_bytes)))
    })
}

/// `rankPIDPressure`: lower priority first (then, as upstream, more processes first).
pub fn rank_pids(candidates: &[Candidate]) -> Vec<usize> {
    rank(candidates, |a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.processes.cmp(&a.processes))
    })
}

fn rank(
    candidates: &[Candidate],
    order: impl Fn(&Candidate, &Candidate) -> Ordering,
) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..candidates.len())
        .filter(|&i| !candidates[i].critical)
        .collect();
    idx.sort_by(|&a, &b| order(&candidates[a], &candidates[b]));
    idx
}

#[cfg(test)]
mod tests;
