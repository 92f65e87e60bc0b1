//! The pods qoslet evicted lately, one gauge series each: `qoslet_pod_eviction_timestamp_seconds`,
//! the Unix time of the eviction, labelled with the victim's namespace and pod.
//!
//! `qoslet_evictions_total` keeps its two labels (signal, QoS class): a series per pod would be
//! born at 1 and never rise, so `increase()` over it would miss every eviction. These series name
//! the victim instead, and each leaves [`KEPT`] after its eviction (or when [`MOST`] are held), so
//! evicted pods, which have left the node, cannot pile series up.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError, atomic::AtomicU64},
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::metrics::{family::Family, gauge::Gauge};

use super::PodEvictionLabels;

/// How long an evicted pod's series stays: longer than the eviction alert's 10-minute window and
/// a dashboard's usual hour, short enough that a busy node's series do not add up.
pub(crate) const KEPT: Duration = Duration::from_secs(3600);

/// The most series held at once; past it the oldest goes first. A node holds at most a few
/// hundred pods, so this is only reached by evicting every pod of a full node several times in
/// an hour.
pub(crate) const MOST: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct EvictedPods {
    pub(super) family: Family<PodEvictionLabels, Gauge<f64, AtomicU64>>,
    /// When each series was last set, for [`EvictedPods::expire`].
    set_at: Mutex<HashMap<PodEvictionLabels, Instant>>,
}

impl EvictedPods {
    /// The eviction of one pod at `at` (wall clock, the series' value) and `now` (its age).
    pub(crate) fn record(&self, labels: PodEvictionLabels, at: SystemTime, now: Instant) {
        let unix = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut set_at = self.set_at.lock().unwrap_or_else(PoisonError::into_inner);
        if set_at.len() >= MOST
            && !set_at.contains_key(&labels)
            && let Some(oldest) = set_at
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(l, _)| l.clone())
        {
            set_at.remove(&oldest);
            self.family.remove(&oldest);
        }
        self.family.get_or_create(&labels).set(unix);
        set_at.insert(labels, now);
    }

    /// Drops the series set more than [`KEPT`] before `now`.
    pub(crate) fn expire(&self, now: Instant) {
        let mut set_at = self.set_at.lock().unwrap_or_else(PoisonError::into_inner);
        set_at.retain(|labels, t| {
            let keep = now.saturating_duration_since(*t) < KEPT;
            if !keep {
                self.family.remove(labels);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pod: &str) -> PodEvictionLabels {
        PodEvictionLabels {
            namespace: "ns".into(),
            pod: pod.into(),
            signal: "memory.available".into(),
            qos_class: "BestEffort".into(),
        }
    }

    fn value(e: &EvictedPods, pod: &str) -> Option<f64> {
        let l = labels(pod);
        e.set_at
            .lock()
            .unwrap()
            .contains_key(&l)
            .then(|| e.family.get_or_create(&l).get())
    }

    #[test]
    fn a_series_holds_the_eviction_time_and_leaves_after_kept() {
        let e = EvictedPods::default();
        let t0 = Instant::now();
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        e.record(labels("a"), at, t0);
        assert_eq!(value(&e, "a"), Some(1_700_000_000.25));
        e.expire(t0 + KEPT - Duration::from_secs(1));
        assert_eq!(value(&e, "a"), Some(1_700_000_000.25));
        // Evicted again (a StatefulSet's pod keeps its name): the later time, kept from then.
        e.record(
            labels("a"),
            at + Duration::from_secs(60),
            t0 + Duration::from_secs(60),
        );
        e.expire(t0 + KEPT);
        assert_eq!(value(&e, "a"), Some(1_700_000_060.25));
        e.expire(t0 + KEPT + Duration::from_secs(60));
        assert_eq!(value(&e, "a"), None);
    }

    #[test]
    fn past_the_most_the_oldest_series_goes() {
        let e = EvictedPods::default();
        let t0 = Instant::now();
        for i in 0..=MOST {
            e.record(
                labels(&format!("p{i}")),
                SystemTime::now(),
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(e.set_at.lock().unwrap().len(), MOST);
        assert_eq!(value(&e, "p0"), None);
        assert!(value(&e, "p1").is_some());
        assert!(value(&e, &format!("p{MOST}")).is_some());
    }
}
