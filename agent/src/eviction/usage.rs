//! The pods' `inactive_file` as last read, for ranking without reading every pod's `memory.stat`
//! at decision time.
//!
//! The kubelet ranks on what it already holds: `synchronize` (pkg/kubelet/eviction/
//! eviction_manager.go) takes one summary (`summaryProvider.Get(ctx, updateStats)`, which
//! refreshes only the node's own cgroup stats; the pods' come from cadvisor's cache, which its
//! housekeeping refreshes every 10 s), and `rankMemoryPressure` (helpers.go) sorts the pods on
//! that summary's working sets (`cachedStatsFunc`). Working sets held whole went wrong in the
//! peers bench (2026-12-05): a hog ramping at 126 MiB/s outgrew its held value within the
//! interval, and a BestEffort pod was taken instead. So qoslet holds only the slow part, each
//! pod's `inactive_file` (filled by the node's statistics sampling, `node/housekeeping.rs`, every
//! `statsInterval`, and by every full read of the eviction manager), reads every pod's usage
//! fresh (one integer file, which the kernel answers without flushing the statistics that
//! `memory.stat` flushes and prints), and reads `memory.stat` fresh only for the pods its
//! decision turns on: those without a value held, the head of the ranking and the candidates
//! next to it (`manager.rs`).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{
    inventory::ManagedPod,
    signals::{MemoryReading, SignalError},
};
use crate::{policy::pod::PodKey, support::lock};

/// Where the manager reads a pod's memory and its process count; the cgroup files
/// ([`CgroupFiles`]) but in tests.
pub(crate) trait PodReader: Send + Sync {
    /// The pod's usage and `inactive_file`, read now.
    fn reading(&self, pod: &ManagedPod) -> Result<MemoryReading, SignalError>;
    /// The pod's usage alone, read now.
    fn usage(&self, pod: &ManagedPod) -> Result<i64, SignalError>;
    /// The pod's processes (the largest count of its `cgroup.procs` files; a cgroup that is gone
    /// holds none), read now; `None` when it has such files and none can be read.
    fn processes(&self, pod: &ManagedPod) -> Option<u64>;
}

/// The pod's own cgroup files.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CgroupFiles;

impl PodReader for CgroupFiles {
    fn reading(&self, pod: &ManagedPod) -> Result<MemoryReading, SignalError> {
        pod.memory.reading_without_limit()
    }

    fn usage(&self, pod: &ManagedPod) -> Result<i64, SignalError> {
        pod.memory.usage()
    }

    fn processes(&self, pod: &ManagedPod) -> Option<u64> {
        let counts: Vec<Option<usize>> = pod
            .cgroups
            .procs
            .iter()
            .chain(&pod.cgroups.unified)
            .map(|d| d.read_procs().ok().map(|v| v.len()))
            .collect();
        if !counts.is_empty() && counts.iter().all(Option::is_none) {
            return None;
        }
        Some(counts.into_iter().flatten().max().unwrap_or(0) as u64)
    }
}

/// `inactive_file` by pod, each with the time it was read; shared by the node (which writes
/// what its statistics sampling reads) and the eviction manager. A value older than `max_age`
/// is not used: the pod's `memory.stat` is read fresh instead.
#[derive(Debug, Clone)]
pub(crate) struct UsageCache {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    max_age: Duration,
    pods: HashMap<PodKey, (i64, Instant)>,
}

impl Inner {
    fn put(&mut self, pod: &PodKey, inactive_file: i64, at: Instant) {
        match self.pods.get_mut(pod) {
            // A slower reader's older value does not replace a newer one.
            Some(held) if held.1 > at => {}
            Some(held) => *held = (inactive_file, at),
            None => {
                self.pods.insert(pod.clone(), (inactive_file, at));
            }
        }
    }
}

impl UsageCache {
    pub(crate) fn new(max_age: Duration) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                max_age,
                pods: HashMap::new(),
            })),
        }
    }

    /// `inactive_file` of `pod`, read at `at`.
    pub(crate) fn record(&self, pod: &PodKey, inactive_file: i64, at: Instant) {
        lock(&self.inner).put(pod, inactive_file, at);
    }

    /// Values read at `at` for many pods, under one lock; pods not in `keep` are forgotten.
    pub(crate) fn record_all<'a>(
        &self,
        values: impl IntoIterator<Item = (&'a PodKey, i64)>,
        at: Instant,
        keep: impl Fn(&PodKey) -> bool,
    ) {
        let mut inner = lock(&self.inner);
        inner.pods.retain(|k, _| keep(k));
        for (k, v) in values {
            inner.put(k, v, at);
        }
    }

    /// The value held for each of `pods`, `None` where none is held or it is older than
    /// `max_age` at `now`.
    pub(crate) fn held<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a PodKey>,
        now: Instant,
    ) -> Vec<Option<i64>> {
        let inner = lock(&self.inner);
        pods.into_iter()
            .map(|k| {
                inner
                    .pods
                    .get(k)
                    .filter(|(_, at)| now.saturating_duration_since(*at) <= inner.max_age)
                    .map(|(v, _)| *v)
            })
            .collect()
    }

    /// How many pods have a value (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).pods.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        PodKey {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    #[test]
    fn a_value_ranks_until_it_is_older_than_the_max_age() {
        let cache = UsageCache::new(Duration::from_secs(10));
        let t0 = Instant::now();
        cache.record(&key("a"), 100, t0);
        let (a, b) = (key("a"), key("b"));
        assert_eq!(cache.held([&a, &b], t0), [Some(100), None]);
        assert_eq!(cache.held([&a], t0 + Duration::from_secs(10)), [Some(100)]);
        assert_eq!(cache.held([&a], t0 + Duration::from_secs(11)), [None]);
    }

    #[test]
    fn an_older_read_does_not_replace_a_newer_one_and_gone_pods_are_forgotten() {
        let cache = UsageCache::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(5);
        cache.record(&key("a"), 200, later);
        cache.record(&key("a"), 100, t0);
        assert_eq!(cache.held([&key("a")], later), [Some(200)]);
        cache.record(&key("b"), 1, t0);
        let b = key("b");
        cache.record_all([(&b, 2)], later, |k| k.name == "b");
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.held([&key("a"), &b], later), [None, Some(2)]);
    }
}
