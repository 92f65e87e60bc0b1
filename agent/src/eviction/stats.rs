//! Counters and the decision-latency histogram, plain numbers for the metrics server to export.

use std::{
    collections::BTreeMap,
    collections::VecDeque,
    time::{Duration, Instant},
};

use super::action::EvictedStatus;
use crate::policy::{pod::PodKey, qos::QosClass};

/// Upper bounds of the latency buckets, seconds (Prometheus `le`).
pub(crate) const LATENCY_BUCKETS_SECS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How many decisions are kept for status pages and tests.
const RECENT: usize = 64;

/// A cumulative histogram in the Prometheus layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub(crate) bounds_secs: &'static [f64],
    /// `counts[i]`: observations <= `bounds_secs[i]` (cumulative); `count` holds +Inf.
    pub(crate) counts: Vec<u64>,
    pub count: u64,
    pub(crate) sum_secs: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            bounds_secs: LATENCY_BUCKETS_SECS,
            counts: vec![0; LATENCY_BUCKETS_SECS.len()],
            count: 0,
            sum_secs: 0.0,
        }
    }
}

impl Histogram {
    pub(crate) fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        for (c, b) in self.counts.iter_mut().zip(self.bounds_secs) {
            if s <= *b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum_secs += s;
    }
}

/// One eviction decision, as logged.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub signal: String,
    pub observed: i64,
    pub threshold: i64,
    pub pods: Vec<PodKey>,
    /// Each evicted pod's QoS class as the manager ranked it: by the time the node records the
    /// decision, its plan may have dropped the pod (cluster mode: the Failed status came first).
    pub(crate) qos: BTreeMap<PodKey, QosClass>,
    /// The unit the pods went as, `namespace/Kind/name` (a `disruptionMode: all` group, or a
    /// gang's pod alone); `None` for a pod of no gang.
    pub unit: Option<String>,
    pub(crate) reason: String,
    /// Signal crossing seen -> the pod first stopped (frozen in cluster mode, else the first
    /// signal or the cgroup kill); `None` when nothing was done.
    pub latency: Option<Duration>,
    /// The latency's parts; `None` when nothing was signalled.
    pub(crate) stages: Option<Stages>,
    /// When the pod was first stopped (see `latency`).
    pub first_signal_at: Option<Instant>,
    pub statuses: Vec<(PodKey, EvictedStatus)>,
}

/// The parts of a decision's latency, in order; they add up to [`Decision::latency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stages {
    /// The wake-up seen -> the pass started (the channel and the manager's scheduling).
    pub(crate) wake: Duration,
    /// The pass started -> the action called (signals read, thresholds, ranking).
    pub(crate) decide: Duration,
    /// The action called -> the pod first stopped (the freeze in cluster mode, else the first
    /// signal or the cgroup kill).
    pub(crate) kill: Duration,
}

impl Stages {
    /// Each stage with its metric label.
    pub(crate) fn labelled(&self) -> [(&'static str, Duration); 3] {
        [
            ("wake", self.wake),
            ("decide", self.decide),
            ("kill", self.kill),
        ]
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvictionStats {
    /// Wake-ups received, by source.
    pub(crate) wakes: BTreeMap<&'static str, u64>,
    pub(crate) passes: u64,
    /// Pods evicted, by signal.
    pub evictions: BTreeMap<String, u64>,
    /// Passes where a threshold was met but nothing was evictable.
    pub(crate) nothing_to_evict: u64,
    /// Passes where a soft threshold was met while an earlier eviction still waited to be handed
    /// over (the Eviction API refused it for now).
    pub(crate) awaiting_handover: u64,
    /// Failed reads or actions (each also logged).
    pub(crate) errors: u64,
    /// Waits for released memory that timed out.
    pub(crate) release_timeouts: u64,
    /// Memory reads (the pods', then the node's signals if need be) while waiting for a
    /// release: one per poll once the unit's processes are gone.
    pub(crate) release_reads: u64,
    pub decision_latency: Histogram,
    pub recent: VecDeque<Decision>,
}

impl EvictionStats {
    pub(crate) fn record(&mut self, d: Decision) {
        *self.evictions.entry(d.signal.clone()).or_default() += d.pods.len() as u64;
        if let Some(l) = d.latency {
            self.decision_latency.observe(l);
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_is_cumulative() {
        let mut h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        assert_eq!(h.counts[0], 0);
        assert_eq!(h.counts[2], 1, "<= 5 ms");
        assert_eq!(*h.counts.last().unwrap(), 1, "60 s only in +Inf");
        assert_eq!(h.count, 2);
        assert!((h.sum_secs - 60.003).abs() < 1e-9);
    }
}
