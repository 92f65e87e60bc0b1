//! Eviction thresholds and ranking (pkg/kubelet/eviction/helpers.go, api/types.go).

use std::{cmp::Ordering, collections::BTreeMap};

use serde::Serialize;
use thiserror::Error;

use super::{duration::parse_duration, pod::PodSpecView, quantity::Quantity};

pub(crate) const SIGNALS: &[&str] = &[
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
pub(crate) const DEFAULT_HARD: &[(&str, &str)] = &[
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

/// The KubeletConfiguration map a value comes from, named in every error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionField {
    Hard,
    Soft,
    SoftGracePeriod,
    MinimumReclaim,
}

impl EvictionField {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Hard => "evictionHard",
            Self::Soft => "evictionSoft",
            Self::SoftGracePeriod => "evictionSoftGracePeriod",
            Self::MinimumReclaim => "evictionMinimumReclaim",
        }
    }
}

/// Errors of `ParseThresholdConfig`, with the upstream texts (pkg/kubelet/eviction/helpers.go).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ThresholdError {
    #[error("unsupported eviction signal {signal}")]
    UnknownSignal {
        field: EvictionField,
        signal: String,
    },
    #[error("{reason}")]
    Value {
        field: EvictionField,
        signal: String,
        value: String,
        reason: String,
    },
    #[error("grace period must be specified for the soft eviction threshold {signal}")]
    MissingGrace { signal: String },
    #[error("invalid eviction grace period specified: {value}, {reason}")]
    Duration {
        signal: String,
        value: String,
        reason: String,
    },
}

impl ThresholdError {
    /// The camelCase path of the field at fault, e.g. `evictionMinimumReclaim.memory.available`.
    pub(crate) fn field(&self) -> String {
        match self {
            Self::UnknownSignal { field, .. } => field.name().into(),
            Self::Value { field, signal, .. } => format!("{}.{signal}", field.name()),
            Self::MissingGrace { .. } => EvictionField::SoftGracePeriod.name().into(),
            Self::Duration { signal, .. } => {
                format!("{}.{signal}", EvictionField::SoftGracePeriod.name())
            }
        }
    }
}

/// A threshold value: a quantity, or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ThresholdValue {
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
    pub(crate) fn amount(&self, capacity: i64) -> i64 {
        match self {
            Self::Quantity(q) => q.value(),
            Self::Percentage(p) => (capacity as f64 * f64::from(*p)) as i64,
        }
    }
}

/// One `signal < value` threshold (the only operator the kubelet has).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Threshold {
    pub(crate) signal: String,
    pub(crate) value: ThresholdValue,
    /// Zero for hard thresholds.
    pub(crate) grace_period_secs: u64,
    pub(crate) min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// Upstream's `isHardEvictionThreshold`: a threshold with no grace period of its own (how
    /// long it must hold before it acts). That is not the pod's grace: at a hard threshold the
    /// kubelet gives the pod 2 s, qoslet none (`eviction_grace_secs`).
    pub(crate) fn is_hard(&self) -> bool {
        self.grace_period_secs == 0
    }
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

/// `ParseThresholdConfig` (pkg/kubelet/eviction/helpers.go): hard thresholds then soft ones.
/// Every grace period and minimum reclaim is checked whether a threshold uses it or not; a soft
/// threshold disabled by `0%` / `100%` needs no grace period; the minimum reclaims apply to hard
/// and soft thresholds, before memory.available is copied to allocatableMemory.available.
pub fn parse_thresholds(
    input: &EvictionInput<'_>,
) -> Result<(Vec<Threshold>, Vec<Threshold>), ThresholdError> {
    let defaults: BTreeMap<String, String> = DEFAULT_HARD
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    let empty = BTreeMap::new();
    let hard_map = match input.hard {
        None => defaults,
        Some(h) if input.merge_defaults => {
            let mut merged = defaults;
            merged.extend(h.iter().map(|(k, v)| (k.clone(), v.clone())));
            merged
        }
        Some(h) => h.clone(),
    };
    let mut hard = statements(&hard_map, EvictionField::Hard)?;
    let mut soft = statements(input.soft.unwrap_or(&empty), EvictionField::Soft)?;
    let grace = grace_periods(input.soft_grace.unwrap_or(&empty))?;
    let reclaims = minimum_reclaims(input.min_reclaim.unwrap_or(&empty))?;
    for t in &mut soft {
        t.grace_period_secs =
            *grace
                .get(t.signal.as_str())
                .ok_or_else(|| ThresholdError::MissingGrace {
                    signal: t.signal.clone(),
                })?;
    }
    for t in hard.iter_mut().chain(soft.iter_mut()) {
        t.min_reclaim = reclaims.get(t.signal.as_str()).copied();
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
    Ok((hard, soft))
}

fn check_signal(signal: &str, field: EvictionField) -> Result<(), ThresholdError> {
    if SIGNALS.contains(&signal) {
        Ok(())
    } else {
        Err(ThresholdError::UnknownSignal {
            field,
            signal: signal.into(),
        })
    }
}

/// `parseThresholdStatements`: thresholds in signal order, grace period 0, disabled ones left
/// out.
fn statements(
    map: &BTreeMap<String, String>,
    field: EvictionField,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut out = Vec::new();
    for (signal, value) in map {
        check_signal(signal, field)?;
        if let Some(value) = threshold_value(signal, value, field)? {
            out.push(Threshold {
                signal: signal.clone(),
                value,
                grace_period_secs: 0,
                min_reclaim: None,
            });
        }
    }
    Ok(out)
}

/// `parsePercentage`: the number before `%` as a float32 fraction.
fn percentage(signal: &str, text: &str, field: EvictionField) -> Result<f32, ThresholdError> {
    text.trim_end_matches('%')
        .parse::<f64>()
        .map(|p| (p as f32) / 100.0)
        .map_err(|e| {
            value_err(
                signal,
                text,
                field,
                format!("invalid percentage {text:?}: {e}"),
            )
        })
}

fn value_err(signal: &str, text: &str, field: EvictionField, reason: String) -> ThresholdError {
    ThresholdError::Value {
        field,
        signal: signal.into(),
        value: text.into(),
        reason,
    }
}

fn quantity(signal: &str, text: &str, field: EvictionField) -> Result<Quantity, ThresholdError> {
    text.parse()
        .map_err(|e: super::quantity::QuantityError| value_err(signal, text, field, e.to_string()))
}

/// `parseThresholdStatement`: the literal `0%` and `100%` disable the threshold; any other
/// percentage must lie in [0%, 100%]; a quantity must be positive.
fn threshold_value(
    signal: &str,
    text: &str,
    field: EvictionField,
) -> Result<Option<ThresholdValue>, ThresholdError> {
    if text.ends_with('%') {
        if text == "0%" || text == "100%" {
            return Ok(None);
        }
        let p = percentage(signal, text, field)?;
        if p < 0.0 {
            let reason = format!("eviction percentage threshold {signal} must be >= 0%: {text}");
            return Err(value_err(signal, text, field, reason));
        }
        if p > 1.0 {
            let reason = format!("eviction percentage threshold {signal} must be <= 100%: {text}");
            return Err(value_err(signal, text, field, reason));
        }
        return Ok(Some(ThresholdValue::Percentage(p)));
    }
    let q = quantity(signal, text, field)?;
    if q.signum() <= 0 {
        let reason = format!(
            "eviction threshold {signal} must be positive: {}",
            q.canonical()
        );
        return Err(value_err(signal, text, field, reason));
    }
    Ok(Some(ThresholdValue::Quantity(q)))
}

/// `parseGracePeriods`: every entry, used or not.
fn grace_periods(map: &BTreeMap<String, String>) -> Result<BTreeMap<&str, u64>, ThresholdError> {
    let mut out = BTreeMap::new();
    for (signal, text) in map {
        check_signal(signal, EvictionField::SoftGracePeriod)?;
        let reason = if text.trim_start().starts_with('-') {
            "must be a positive value".to_string()
        } else {
            match parse_duration(text) {
                Ok(secs) => {
                    out.insert(signal.as_str(), secs);
                    continue;
                }
                Err(e) => e.to_string(),
            }
        };
        return Err(ThresholdError::Duration {
            signal: signal.clone(),
            value: text.clone(),
            reason,
        });
    }
    Ok(out)
}

/// `parseMinimumReclaims`: every entry, used or not. A percentage must be above 0; a quantity
/// must not be negative (0 is valid: reclaim nothing beyond the threshold).
fn minimum_reclaims(
    map: &BTreeMap<String, String>,
) -> Result<BTreeMap<&str, ThresholdValue>, ThresholdError> {
    let field = EvictionField::MinimumReclaim;
    let mut out = BTreeMap::new();
    for (signal, text) in map {
        check_signal(signal, field)?;
        let value = if text.ends_with('%') {
            let p = percentage(signal, text, field)?;
            if p <= 0.0 {
                let reason = format!(
                    "eviction percentage minimum reclaim {signal} must be positive: {text}"
                );
                return Err(value_err(signal, text, field, reason));
            }
            ThresholdValue::Percentage(p)
        } else {
            let q = quantity(signal, text, field)?;
            if q.signum() < 0 {
                let reason = format!("negative eviction minimum reclaim specified for {signal}");
                return Err(value_err(signal, text, field, reason));
            }
            ThresholdValue::Quantity(q)
        };
        out.insert(signal.as_str(), value);
    }
    Ok(out)
}

/// The container runtime manager's floor under every grace period the kubelet gives
/// (pkg/kubelet/kuberuntime/kuberuntime_manager.go `minimumGracePeriodInSeconds`).
pub(crate) const MIN_GRACE_SECS: i64 = 2;

/// The grace period a pod gets when evicted. At a soft threshold it is the kubelet's
/// (pkg/kubelet/eviction/eviction_manager.go `synchronize`): `min(evictionMaxPodGracePeriod,
/// the pod's grace)`, so the kubelet's default maximum of 0 means no grace of the pod's own,
/// raised to the runtime manager's floor of [`MIN_GRACE_SECS`], under which the kubelet never
/// kills a container.
///
/// At a hard threshold qoslet gives none, where the kubelet gives 2 s: its `synchronize` passes
/// `immediateEvictionGracePeriodSeconds` (1 s) as the override, and `killContainer`
/// (pkg/kubelet/kuberuntime/kuberuntime_container.go) raises it to `minimumGracePeriodInSeconds`
/// (2 s, kuberuntime_manager.go): SIGTERM, then SIGKILL 2 s later. qoslet kills at once
/// because the node cannot wait: on a fast ramp a 2 s grace loses the race to the kernel's OOM
/// killer, the kubelet's known failure. In cluster mode the pod is frozen by then, and a
/// frozen process cannot run a SIGTERM handler anyway (`cluster/action.rs`).
pub(crate) fn eviction_grace_secs(hard: bool, pod_grace_secs: i64, max_pod_grace_secs: i64) -> i64 {
    if hard {
        0
    } else {
        pod_grace_secs.min(max_pod_grace_secs).max(MIN_GRACE_SECS)
    }
}

/// What the ranking needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) usage_bytes: i64,
    pub(crate) request_bytes: i64,
    pub(crate) priority: i32,
    /// Static, mirror or priority >= 2e9: never evicted.
    pub(crate) critical: bool,
    /// Seconds since the epoch; kept for gang-aware ordering, not used by the kubelet's rank.
    pub(crate) start_time: i64,
    pub(crate) processes: u64,
}

/// `rankMemoryPressure`: indices of evictable candidates, first to evict first. Usage above
/// request first, then lower priority, then larger `usage - request`. Stable for ties.
pub(crate) fn rank_memory(candidates: &[Candidate]) -> Vec<usize> {
    rank(candidates, |a, b| {
        let exceeds = |c: &Candidate| c.usage_bytes > c.request_bytes;
        exceeds(b)
            .cmp(&exceeds(a))
            .then(a.priority.cmp(&b.priority))
            .then((b.usage_bytes - b.request_bytes).cmp(&(a.usage_bytes - a.request_bytes)))
    })
}

/// `rankPIDPressure`: lower priority first (then, as upstream, more processes first).
pub(crate) fn rank_pids(candidates: &[Candidate]) -> Vec<usize> {
    rank(candidates, |a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.processes.cmp(&a.processes))
    })
}

/// One pod's place in the memory-pressure eviction order and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct EvictionRank {
    /// 1 is evicted first; `None` for pods the kubelet never evicts (critical).
    pub(crate) rank: Option<usize>,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) priority: i32,
    pub(crate) memory_request_bytes: i64,
    /// Working set; `None` when the node reported no stats for the pod.
    pub(crate) memory_usage_bytes: Option<i64>,
    pub(crate) reason: String,
}

/// The memory request the eviction ranking compares usage with: pkg/api/v1/resource
/// `GetResourceRequestQuantity`, which adds `spec.overhead` only to a non-zero request.
pub(crate) fn eviction_request_bytes(pod: &PodSpecView) -> i64 {
    let request = pod.requests_without_overhead().memory_bytes();
    if request > 0 {
        request.saturating_add(pod.overhead.memory_bytes())
    } else {
        request
    }
}

fn mib(bytes: i64) -> String {
    format!("{:.1}Mi", bytes as f64 / f64::from(1 << 20))
}

/// The order `rankMemoryPressure` (pkg/kubelet/eviction/helpers.go) puts `pods` in given their
/// working sets: pods without stats first, then usage above request, lower priority, larger
/// usage - request. Critical pods come last, unranked.
pub(crate) fn memory_eviction_order(
    pods: &[PodSpecView],
    usage: impl Fn(&PodSpecView) -> Option<i64>,
) -> Vec<EvictionRank> {
    let entry = |p: &PodSpecView, rank: Option<usize>, reason: String| EvictionRank {
        rank,
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        priority: p.effective_priority(),
        memory_request_bytes: eviction_request_bytes(p),
        memory_usage_bytes: usage(p),
        reason,
    };
    let (critical, evictable): (Vec<&PodSpecView>, Vec<&PodSpecView>) =
        pods.iter().partition(|p| p.is_critical());
    let (without, with): (Vec<&PodSpecView>, Vec<&PodSpecView>) =
        evictable.into_iter().partition(|p| usage(p).is_none());
    let candidates: Vec<Candidate> = with
        .iter()
        .map(|p| Candidate {
            usage_bytes: usage(p).unwrap_or(0),
            request_bytes: eviction_request_bytes(p),
            priority: p.effective_priority(),
            critical: false,
            start_time: 0,
            processes: 0,
        })
        .collect();
    let mut out: Vec<EvictionRank> = without
        .iter()
        .map(|p| {
            let reason = "no stats for the pod: ranked before every pod with stats".to_string();
            entry(p, None, reason)
        })
        .collect();
    for i in rank_memory(&candidates) {
        let c = &candidates[i];
        let over = c.usage_bytes - c.request_bytes;
        let reason = if over > 0 {
            format!(
                "usage {} exceeds request {} by {}; priority {}",
                mib(c.usage_bytes),
                mib(c.request_bytes),
                mib(over),
                c.priority
            )
        } else {
            format!(
                "usage {} within request {}; priority {}; {} below request",
                mib(c.usage_bytes),
                mib(c.request_bytes),
                c.priority,
                mib(-over)
            )
        };
        out.push(entry(with[i], None, reason));
    }
    for (n, e) in out.iter_mut().enumerate() {
        e.rank = Some(n + 1);
    }
    out.extend(critical.into_iter().map(|p| {
        entry(
            p,
            None,
            "critical (static, mirror or priority >= 2000000000): never evicted".into(),
        )
    }));
    out
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
