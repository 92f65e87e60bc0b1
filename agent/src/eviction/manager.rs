//! The event-driven eviction manager: one pass per wake-up (or per housekeeping interval at the
//! latest), the node's signals read fresh, at most one unit evicted per pass, then a wait until
//! its memory is released and an immediate re-check with minimum reclaim (eviction_manager.go
//! `synchronize`, `waitForPodsCleanup`).
//!
//! The pods are ranked as the kubelet ranks them, on their usage read now less the
//! `inactive_file` already held (`usage.rs`: the node's statistics sampling and this manager's
//! own reads); a pass reads `memory.stat` only for the pods without a value held, and the head
//! of the ranking and the candidates next to it until the head holds against them
//! ([`FRESH_READS`] at most), so that the victim is chosen, and its message written, on its
//! working set of now. A next candidate whose usage read now (the most its working set can be)
//! would not change the choice is not read whole.
//!
//! The decide stage, from the pass's start to the action's call, holds only what the action
//! needs; what reports the decision (the "Evicting" line, the observations and conditions sent
//! to the node) follows the call.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    task::Poll,
    time::{Duration, Instant},
};

use thiserror::Error;
use tokio::sync::{Notify, mpsc, watch};

use super::{
    action::{ActionError, EvictionAction, EvictionRequest},
    conditions::{ConditionState, NodeCondition},
    held,
    inventory::{Inventory, ManagedPod},
    node::NodeSignals,
    select::{Choice, Order, Sample, choose},
    signals::SignalError,
    stats::{Decision, EvictionStats, Stages},
    thresholds::{
        Observations, Resource, ThresholdState, resource_of, shortfall, threshold_amount,
        to_reclaim,
    },
    usage::{CgroupFiles, PodReader, UsageCache},
    watch::Wake,
};
use crate::{
    cgroup::{Access, CgroupBeneath},
    config::QosletConfiguration,
    policy::{
        eviction::{Candidate, Threshold, ThresholdValue, eviction_grace_secs, rank_memory},
        pod::PodKey,
        quantity::{Format, Quantity},
        settings::NodeSettings,
    },
    workload::{Forest, UnitRoot},
};

/// The Event annotation naming the `disruptionMode: all` group an evicted pod went with
/// (`PodGroup/NAME` or `CompositePodGroup/NAME`, in the pod's namespace): qoslet's own key
/// beside the kubelet's, so that the message stays the kubelet's word for word.
pub(crate) const UNIT_ANNOTATION: &str = "qoslet.dev/unit";

const RELEASE_POLL: Duration = Duration::from_millis(10);

/// How many pods with an `inactive_file` held a memory decision reads whole (`memory.stat`):
/// the chosen unit's, then the next candidate's while the head is not confirmed (and its usage
/// could change the choice). Pods without a value held are read whole besides, and the chosen
/// unit's pods always are (its `frees` and its message).
pub(crate) const FRESH_READS: usize = 4;

#[derive(Debug, Clone)]
pub struct ManagerConfig {
    pub hard: Vec<Threshold>,
    pub soft: Vec<Threshold>,
    pub pressure_transition: Duration,
    /// `evictionMaxPodGracePeriod`; 0 or less: the pod's own.
    pub max_pod_grace_secs: i64,
    pub housekeeping: Duration,
    pub order: Order,
    /// How long to wait for an evicted unit's memory (upstream's podCleanupTimeout is 30 s).
    pub release_timeout: Duration,
}

impl ManagerConfig {
    pub(crate) fn from_settings(s: &NodeSettings, q: &QosletConfiguration) -> Self {
        Self {
            hard: s.hard_eviction.clone(),
            soft: s.soft_eviction.clone(),
            pressure_transition: Duration::from_secs(s.eviction_pressure_transition_secs),
            max_pod_grace_secs: s.eviction_max_pod_grace_secs,
            housekeeping: q.housekeeping_interval,
            order: if q.gang_eviction != crate::config::GangEviction::None {
                Order::GangAware
            } else {
                Order::Kubelet
            },
            release_timeout: Duration::from_secs(30),
        }
    }

    /// Usage at which the cgroup `signal` reads (the node root for `memory.available`, the pods'
    /// cgroup for `allocatableMemory.available`) is worth a look: `capacity` minus the largest
    /// amount of `signal`'s thresholds (for the watcher).
    pub fn watch_level(&self, signal: &str, capacity: i64) -> i64 {
        let largest = self
            .hard
            .iter()
            .chain(&self.soft)
            .filter(|t| t.signal == signal)
            .map(|t| threshold_amount(t, capacity, false))
            .max()
            .unwrap_or(0);
        capacity - largest
    }
}

#[derive(Debug, Error)]
pub(crate) enum ManagerError {
    #[error("reading the eviction signals")]
    Signals(#[from] SignalError),
    #[error("evicting {pod}")]
    Action {
        pod: PodKey,
        #[source]
        source: ActionError,
    },
}

pub struct Manager<A> {
    cfg: ManagerConfig,
    signals: NodeSignals,
    action: A,
    inventory: watch::Receiver<Arc<Inventory>>,
    thresholds: ThresholdState,
    conditions: ConditionState,
    conditions_tx: watch::Sender<Vec<NodeCondition>>,
    /// Pods this manager evicted that the inventory still lists: treated as Failed until the
    /// node's next inventory leaves them out (it then counts them Failed itself). Forgotten
    /// then, so a pod that runs again after its eviction, which the node lists again, is a
    /// candidate again.
    evicted: BTreeSet<PodKey>,
    /// The pod whose handed-over eviction the last pass waited for (said once per pod).
    awaited: Option<PodKey>,
    /// The pods of the last decision, as the inventory listed them then: the node drops a pod
    /// from the inventory once it is decided, while with the Eviction API its processes run
    /// until the API takes the eviction and then out their grace period.
    last_decided: Vec<ManagedPod>,
    stats: Arc<Mutex<EvictionStats>>,
    /// Each signal as the last pass observed it.
    observed_tx: watch::Sender<Observations>,
    /// Every decision, to whoever listens (the node: metrics, status, persisted state).
    decisions_tx: Option<mpsc::UnboundedSender<Decision>>,
    /// The pods' `inactive_file` as last read, by anyone (the ranking takes it off the usage
    /// read now).
    usage: UsageCache,
    reader: Box<dyn PodReader>,
    /// Told once start-up's code is paged out and the binary's locked: a rehearsal follows.
    rehearse_on: Option<Arc<Notify>>,
    /// The eviction whose pods are releasing what they hold (its number, counted from 1), from
    /// the action's call until `Released.`; `None` otherwise. The node holds its own reaction
    /// to the eviction until then (`node/app.rs`).
    releasing_tx: watch::Sender<Option<u64>>,
    releases: u64,
}

/// Sets the manager's releasing eviction back to none when the pass is done with it, returned
/// early or was dropped (shutdown).
struct Releasing(watch::Sender<Option<u64>>);

impl Drop for Releasing {
    fn drop(&mut self) {
        self.0.send_replace(None);
    }
}

/// The candidates of one pass: `samples[i]` with `fresh[i]` when read in this pass.
struct Samples<'a> {
    samples: Vec<Sample>,
    fresh: Vec<bool>,
    /// The most `samples[i]`'s working set can be: its usage read now (a working set is its
    /// usage less its page cache), or the working set itself when read whole.
    most: Vec<i64>,
    pods: BTreeMap<PodKey, &'a ManagedPod>,
    /// Pods whose working set was read whole in this pass, and those of them a value was held
    /// for; pods whose usage alone was read.
    reads: usize,
    held_reads: usize,
    usage_reads: usize,
}

impl<A: EvictionAction> Manager<A> {
    pub fn new(
        cfg: ManagerConfig,
        signals: NodeSignals,
        action: A,
        inventory: watch::Receiver<Arc<Inventory>>,
    ) -> Self {
        Self {
            signals,
            action,
            inventory,
            thresholds: ThresholdState::default(),
            conditions: ConditionState::default(),
            conditions_tx: watch::Sender::new(Vec::new()),
            evicted: BTreeSet::new(),
            awaited: None,
            last_decided: Vec::new(),
            stats: Arc::default(),
            observed_tx: watch::Sender::new(Observations::new()),
            decisions_tx: None,
            usage: UsageCache::new(2 * cfg.housekeeping),
            reader: Box::new(CgroupFiles),
            rehearse_on: None,
            releasing_tx: watch::Sender::new(None),
            releases: 0,
            cfg,
        }
    }

    /// Ranks on `usage` (shared with the node's statistics sampling) instead of a cache of its
    /// own.
    pub(crate) fn with_usage(mut self, usage: UsageCache) -> Self {
        self.usage = usage;
        self
    }

    /// Rehearses a decision (`rehearse`) each time `paged_out` is told: the node tells it once
    /// start-up's code is paged out and the binary's code locked.
    pub(crate) fn with_rehearsal_on(mut self, paged_out: Arc<Notify>) -> Self {
        self.rehearse_on = Some(paged_out);
        self
    }

    /// Reads the pods with `reader` instead of their cgroup files (tests).
    #[cfg(test)]
    pub(crate) fn with_reader(mut self, reader: impl PodReader + 'static) -> Self {
        self.reader = Box::new(reader);
        self
    }

    /// The `inactive_file` values this manager ranks with (taken off each pod's usage read now).
    pub(crate) fn usage(&self) -> UsageCache {
        self.usage.clone()
    }

    /// Every decision from now on, in order, none dropped (decisions are rare: at most one per
    /// pass, and a pass that evicts waits for the memory to come back).
    pub(crate) fn decisions(&mut self) -> mpsc::UnboundedReceiver<Decision> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.decisions_tx = Some(tx);
        rx
    }

    /// Each signal as the last pass observed it.
    pub(crate) fn observations(&self) -> watch::Receiver<Observations> {
        self.observed_tx.subscribe()
    }

    /// Shared counters, histogram and recent decisions.
    pub fn stats(&self) -> Arc<Mutex<EvictionStats>> {
        self.stats.clone()
    }

    /// The eviction being released, from the action's call until its pods have released what
    /// they hold (or the release timed out): its number, counted from 1.
    pub(crate) fn releasing(&self) -> watch::Receiver<Option<u64>> {
        self.releasing_tx.subscribe()
    }

    /// MemoryPressure / PIDPressure in force, for status and admission.
    pub(crate) fn conditions(&self) -> watch::Receiver<Vec<NodeCondition>> {
        self.conditions_tx.subscribe()
    }

    fn with_stats(&self, f: impl FnOnce(&mut EvictionStats)) {
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s);
        }
    }

    /// Opens the descriptors the next passes need (`held.rs`): the node's files and those of
    /// every pod of the current inventory; closes those of pods that left it.
    pub(crate) fn hold_files(&self) {
        let inventory = self.inventory.borrow().clone();
        let mut wanted: Vec<(&CgroupBeneath, &str, Access)> = self
            .signals
            .files()
            .into_iter()
            .map(|(dir, file)| (dir, file, Access::Read))
            .collect();
        for p in &inventory.pods {
            wanted.extend(
                p.memory
                    .files()
                    .map(|(dir, file)| (dir, file, Access::Read)),
            );
            // The containers' working sets go into the eviction message, read before the
            // action is called.
            for c in &p.containers {
                wanted.extend(
                    c.memory
                        .working_set_files()
                        .map(|(dir, file)| (dir, file, Access::Read)),
                );
            }
            // Only the v2 directory's: see `action.rs` `procs` for why not v1's.
            if let Some(u) = &p.cgroups.unified {
                wanted.push((u, "cgroup.procs", Access::Read));
                wanted.push((u, "cgroup.kill", Access::Write));
            }
        }
        let failed = held::hold_only(wanted);
        if let Some((path, e)) = failed.first() {
            tracing::warn!(path = %path.display(), error = %e, failed = failed.len(), "Could not keep eviction files open; they are opened when needed.");
        }
    }

    /// Runs passes on wake-ups and every housekeeping interval, until `stop` turns true (or its
    /// sender goes). A pass in progress, and the eviction in it, finishes first.
    pub async fn run(mut self, mut wakes: mpsc::Receiver<Wake>, mut stop: watch::Receiver<bool>) {
        let mut open = true;
        let mut trigger: Option<Wake> = None;
        let (mut first, mut rehearsed) = (true, false);
        let rehearse_on = self.rehearse_on.clone();
        self.hold_files();
        loop {
            if *stop.borrow() {
                return;
            }
            let evicted = match self.pass(trigger.take()).await {
                Ok(d) => d.is_some(),
                Err(e) => {
                    self.with_stats(|s| s.errors += 1);
                    tracing::error!(error = %e, source = ?std::error::Error::source(&e), "An eviction pass failed.");
                    false
                }
            };
            // Wake-ups queued during a pass that evicted are stale: the re-check follows now.
            while let Ok(w) = wakes.try_recv() {
                self.with_stats(|s| *s.wakes.entry(w.source.as_str()).or_default() += 1);
                if !evicted && trigger.is_none() {
                    trigger = Some(w);
                }
            }
            if evicted || trigger.is_some() {
                continue;
            }
            // After the first pass (and on the inventory's changes, until one has ranked a
            // pod): the first real decision finds its set-up done.
            if first {
                first = false;
                rehearsed = self.rehearse() > 0;
            }
            tokio::select! {
                w = wakes.recv(), if open => match w {
                    Some(w) => {
                        self.with_stats(|s| *s.wakes.entry(w.source.as_str()).or_default() += 1);
                        trigger = Some(w);
                    }
                    None => open = false,
                },
                r = stop.changed() => if r.is_err() || *stop.borrow() {
                    return;
                },
                _ = tokio::time::sleep(self.cfg.housekeeping) => {}
                Ok(()) = self.inventory.changed() => {
                    // Pods added: their files are opened now, not at decision time.
                    self.hold_files();
                    // The first pods: the rehearsal that had none to rank is made with them.
                    if !rehearsed {
                        rehearsed = self.rehearse() > 0;
                    }
                }
                () = told(rehearse_on.as_deref()) => {
                    // The pages the decision needs come back now, where the lock keeps them.
                    self.rehearse();
                }
            }
        }
    }

    /// One `synchronize`: observe, update thresholds and conditions, evict at most one unit and
    /// wait for its memory. Returns the decision, if any.
    ///
    /// Between the pass's start and the action's call (the decide stage) it does only what the
    /// action needs: the node's signals, the ranking and the requests with their messages (the
    /// mark, the hold and the pod's status carry them). What only reports (the observations and
    /// conditions sent to the node, whose loop they wake, the "Evicting" line) follows the call.
    pub(crate) async fn pass(
        &mut self,
        trigger: Option<Wake>,
    ) -> Result<Option<Decision>, ManagerError> {
        let now = Instant::now();
        let seen = trigger.map_or(now, |w| w.at.min(now));
        self.with_stats(|s| s.passes += 1);
        let obs = self.signals.observe()?;
        let signals_at = now.elapsed();
        let all: Vec<Threshold> = self
            .cfg
            .hard
            .iter()
            .chain(&self.cfg.soft)
            .cloned()
            .collect();
        let eval = self.thresholds.observe(&all, &obs, now);
        let conditions = self
            .conditions
            .update(&eval.met, self.cfg.pressure_transition, now);
        let Some((threshold, resource)) = to_reclaim(&eval.actionable) else {
            self.publish(obs, conditions);
            return Ok(None);
        };
        let threshold = threshold.clone();
        let o = obs[&threshold.signal];
        let hard = threshold.is_hard();
        // A hard threshold acts at once, whatever is still handed over (it kills locally).
        if !hard && let Some(pod) = self.action.awaiting() {
            self.publish(obs, conditions);
            self.with_stats(|s| s.awaiting_handover += 1);
            if self.awaited.as_ref() != Some(&pod) {
                tracing::warn!(signal = %threshold.signal, observed = o.available, %pod, "A soft threshold is met, but the last eviction still waits for the Eviction API (a PodDisruptionBudget refuses it for now, or the API server is away): no other pod is evicted until it goes.");
            }
            self.awaited = Some(pod);
            return Ok(None);
        }
        // The Eviction API has just taken the eviction that waited: its pod is terminating now.
        // As the kubelet waits for an evicted pod's cleanup before it evicts again
        // (`waitForPodsCleanup`), the pass waits for the pod to release what it holds; choosing
        // now would evict a second pod for the same shortfall.
        if !hard
            && let Some(pod) = self.awaited.take()
            && let Some(p) = self.last_decided.iter().find(|p| p.key == pod)
        {
            self.publish(obs, conditions);
            let holds = p.memory.working_set().unwrap_or(0);
            tracing::info!(%pod, "The Eviction API took the eviction that waited; waiting for the pod to release its resources before choosing again.");
            self.wait_released(&threshold, &[p], holds, resource).await;
            return Ok(None);
        }
        self.awaited = None;
        let need = shortfall(&threshold, &o);
        let inventory = self.inventory.borrow().clone();
        self.evicted
            .retain(|k| inventory.pods.iter().any(|p| &p.key == k));
        let mut candidates = self.samples(&inventory, resource, now);
        let sampled_at = now.elapsed();
        let forests = self.forests_with_evictions(&inventory);
        let Some(choice) = self.choose_fresh(&mut candidates, &forests, resource, need) else {
            self.publish(obs, conditions);
            self.with_stats(|s| s.nothing_to_evict += 1);
            tracing::warn!(signal = %threshold.signal, observed = o.available, candidates = candidates.samples.len(), managed = inventory.pods.len(), "A threshold is met but no pod can be evicted.");
            return Ok(None);
        };
        let chosen_at = now.elapsed();
        let amount = threshold_amount(&threshold, o.capacity, false);
        let (requests, unit) = self.requests(
            &choice,
            &candidates,
            &threshold,
            amount,
            o.available,
            resource,
        );
        let Samples {
            samples,
            pods,
            reads,
            held_reads,
            usage_reads,
            ..
        } = candidates;
        let action = &self.action;
        let evictions = requests.into_iter().map(|req| async move {
            match action.evict(&req).await {
                Ok(o) => Ok((req.pod, o)),
                Err(source) => Err(ManagerError::Action {
                    pod: req.pod,
                    source,
                }),
            }
        });
        let acting = Instant::now();
        // `join_all` polls each eviction in turn, up to its first wait: the kill (or the
        // freeze) goes out before anything below runs.
        let mut evicting = std::pin::pin!(futures::future::join_all(evictions));
        let polled = futures::poll!(evicting.as_mut());
        // Before the conditions and the decision go out: the node's reaction to them waits
        // for the release (`releasing`).
        self.releases += 1;
        self.releasing_tx.send_replace(Some(self.releases));
        let _releasing = Releasing(self.releasing_tx.clone());
        // What only reports, now that the action is called.
        let names: Vec<String> = choice.pods.iter().map(ToString::to_string).collect();
        tracing::warn!(
            signal = %threshold.signal,
            observed = o.available,
            threshold = amount,
            need,
            unit = unit.as_deref().unwrap_or("single pod"),
            pods = ?names,
            reason = %choice.reason,
            wake = trigger.map_or("none", |w| w.source.as_str()),
            ranked = samples.len(),
            read_fresh = reads,
            read_fresh_held = held_reads,
            read_usage = usage_reads,
            signals_ms = signals_at.as_secs_f64() * 1e3,
            sampled_ms = sampled_at.as_secs_f64() * 1e3,
            chosen_ms = chosen_at.as_secs_f64() * 1e3,
            "Evicting to relieve node pressure."
        );
        self.publish(obs, conditions);
        let results = match polled {
            Poll::Ready(results) => results,
            Poll::Pending => evicting.await,
        };
        self.evicted.extend(choice.pods.iter().cloned());
        let mut first_signal: Option<Instant> = None;
        let mut statuses = Vec::new();
        let mut failure = None;
        for r in results {
            match r {
                Ok((k, out)) => {
                    first_signal = match (first_signal, out.first_signal_at) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    statuses.push((k, out.status));
                }
                Err(e) => failure = Some(e),
            }
        }
        let decision = Decision {
            signal: threshold.signal.clone(),
            observed: o.available,
            threshold: amount,
            pods: choice.pods.clone(),
            qos: choice
                .pods
                .iter()
                .map(|k| (k.clone(), pods[k].qos))
                .collect(),
            unit,
            reason: choice.reason.to_string(),
            latency: first_signal.map(|f| f.saturating_duration_since(seen)),
            stages: first_signal.map(|f| Stages {
                wake: now.saturating_duration_since(seen),
                decide: acting.saturating_duration_since(now),
                kill: f.saturating_duration_since(acting),
            }),
            first_signal_at: first_signal,
            statuses,
        };
        tracing::info!(
            pods = ?names,
            latency_ms = decision.latency.map(|l| l.as_secs_f64() * 1e3),
            // Each decision's own decide stage: the metric's buckets double from 0.1 ms, too
            // coarse to read a 2 ms p99 from a handful of evictions.
            decide_ms = decision.stages.map(|s| s.decide.as_secs_f64() * 1e3),
            "Evicted."
        );
        self.with_stats(|s| s.record(decision.clone()));
        if let Some(tx) = &self.decisions_tx {
            // The node may be gone at shutdown; the decision is in the stats either way.
            let _ = tx.send(decision.clone());
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let unit_pods: Vec<&ManagedPod> = choice.pods.iter().map(|k| pods[k]).collect();
        self.last_decided = unit_pods.iter().map(|p| (*p).clone()).collect();
        // Standalone, the action returns once the unit's processes are gone (its kill loop):
        // `acted_ms` tells that part of the release from the wait below.
        let acted = first_signal.map(|f| f.elapsed());
        let polls = self
            .wait_released(&threshold, &unit_pods, choice.frees, resource)
            .await;
        if let Some(f) = first_signal {
            tracing::info!(
                pods = ?names,
                release_ms = f.elapsed().as_secs_f64() * 1e3,
                acted_ms = acted.map(|a| a.as_secs_f64() * 1e3),
                polls,
                "Released."
            );
        }
        Ok(Some(decision))
    }

    /// Sends a pass's observations and node conditions to whoever listens (the node's loop, which
    /// each change wakes).
    fn publish(&self, obs: Observations, conditions: Vec<NodeCondition>) {
        self.observed_tx.send_replace(obs);
        self.conditions_tx.send_if_modified(|c| {
            let changed = *c != conditions;
            *c = conditions;
            changed
        });
    }

    /// The requests for `choice` at `threshold` (of `amount`, with `available` observed), with
    /// their messages, and the unit's name: the pipeline marks the pod's cgroup with its message
    /// before the mode's step, and cluster mode's status carries it. Their containers' reads
    /// are one `pread` each, through the descriptors `hold_files` keeps.
    fn requests(
        &self,
        choice: &Choice,
        c: &Samples<'_>,
        threshold: &Threshold,
        amount: i64,
        available: i64,
        resource: Resource,
    ) -> (Vec<EvictionRequest>, Option<String>) {
        let hard = threshold.is_hard();
        let unit = choice.unit.as_ref().map(|(ns, r)| match r {
            UnitRoot::Group(g) => format!("{ns}/{g}"),
            UnitRoot::Pod(p) => format!("{ns}/Pod/{p}"),
        });
        let unit_group = choice.unit.as_ref().and_then(|(_, r)| match r {
            UnitRoot::Group(g) => Some(g.to_string()),
            UnitRoot::Pod(_) => None,
        });
        let requests = choice
            .pods
            .iter()
            .map(|k| {
                let p = c.pods[k];
                let grace = eviction_grace_secs(hard, p.grace_secs, self.cfg.max_pod_grace_secs);
                let usage = c
                    .samples
                    .iter()
                    .find(|s| &s.key == k)
                    .map(|s| s.candidate.usage_bytes);
                let pod_usage = pod_usage(p, usage, resource);
                let (message, mut annotations) =
                    eviction_message(resource, threshold, amount, available, &pod_usage);
                if let Some(g) = &unit_group {
                    annotations.insert(UNIT_ANNOTATION.into(), g.clone());
                }
                EvictionRequest {
                    pod: k.clone(),
                    cgroups: p.cgroups.clone(),
                    grace: Duration::from_secs(grace.max(0) as u64),
                    message,
                    annotations,
                    seen: p.seen.clone(),
                    signal: threshold.signal.clone(),
                    hard,
                    unit: unit.clone(),
                    revision: p.revision,
                }
            })
            .collect();
        (requests, unit)
    }

    /// Makes a memory decision and drops it: the node's signals, every pod's usage, the
    /// ranking, the head of the kubelet's order read whole and its request with its message, as
    /// a pass at a memory threshold makes them, but with no action, no report and no state
    /// changed (the `inactive_file` it reads is held, as any read's is). Run after the manager's
    /// first pass (and as pods come, until one has ranked a pod) and once start-up's code is
    /// paged out and the binary's code locked (`node/housekeeping.rs`): the first real
    /// decision then finds its code in memory, and its one-time set-up done, instead of paying
    /// for them under pressure, from the disk when the kernel has dropped the binary's pages.
    /// How many pods it ranked.
    pub(crate) fn rehearse(&self) -> usize {
        let memory = |t: &&Threshold| resource_of(&t.signal) == Some(Resource::Memory);
        let Some(threshold) = self.cfg.hard.iter().chain(&self.cfg.soft).find(memory) else {
            return 0;
        };
        let Ok(obs) = self.signals.observe() else {
            return 0;
        };
        let Some(o) = obs.get(&threshold.signal) else {
            return 0;
        };
        let inventory = self.inventory.borrow().clone();
        let mut candidates = self.samples(&inventory, Resource::Memory, Instant::now());
        let forests = self.forests_with_evictions(&inventory);
        // Any shortfall chooses the head of the order.
        if let Some(choice) = self.choose_fresh(&mut candidates, &forests, Resource::Memory, 1) {
            let amount = threshold_amount(threshold, o.capacity, false);
            std::hint::black_box(self.requests(
                &choice,
                &candidates,
                threshold,
                amount,
                o.available,
                Resource::Memory,
            ));
        }
        candidates.samples.len()
    }

    /// The candidates: every pod of `inv` but those this manager evicted, on its usage read now
    /// less the `inactive_file` held for it, else on its working set read now (a pod whose
    /// cgroup is gone or unreadable is left out). Process counts are read only to rank for
    /// pids.
    fn samples<'a>(&self, inv: &'a Inventory, resource: Resource, now: Instant) -> Samples<'a> {
        let live: Vec<&ManagedPod> = inv
            .pods
            .iter()
            .filter(|p| !self.evicted.contains(&p.key))
            .collect();
        let held = self.usage.held(live.iter().map(|p| &p.key), now);
        let mut c = Samples {
            samples: Vec::with_capacity(live.len()),
            fresh: Vec::with_capacity(live.len()),
            most: Vec::with_capacity(live.len()),
            pods: BTreeMap::new(),
            reads: 0,
            held_reads: 0,
            usage_reads: 0,
        };
        for (p, held) in live.into_iter().zip(held) {
            let (usage, fresh, most) = match held {
                Some(inactive) => {
                    c.usage_reads += 1;
                    match self.reader.usage(p) {
                        Ok(u) => ((u - inactive).max(0), false, u),
                        Err(e) => {
                            tracing::debug!(pod = %p.key, error = %e, "Skipping a pod without memory stats.");
                            continue;
                        }
                    }
                }
                None => {
                    c.reads += 1;
                    match self.read_fresh(p) {
                        Some(v) => (v, true, v),
                        None => continue,
                    }
                }
            };
            let processes = if resource == Resource::Pids {
                // Its cgroup.procs files, there but unreadable.
                let Some(n) = self.reader.processes(p) else {
                    continue;
                };
                n
            } else {
                0
            };
            c.samples.push(Sample {
                key: p.key.clone(),
                candidate: Candidate {
                    usage_bytes: usage,
                    request_bytes: p.request_bytes,
                    priority: p.priority,
                    critical: p.critical,
                    start_time: p.start_time,
                    processes,
                },
            });
            c.fresh.push(fresh);
            c.most.push(most);
            c.pods.insert(p.key.clone(), p);
        }
        c
    }

    /// The pod's working set read now (its `inactive_file` held from now on); `None` when it
    /// cannot be read.
    fn read_fresh(&self, p: &ManagedPod) -> Option<i64> {
        match self.reader.reading(p) {
            Ok(r) => {
                self.usage
                    .record(&p.key, r.inactive_file_bytes, Instant::now());
                Some(r.working_set())
            }
            Err(e) => {
                // A pod whose cgroup is gone or unreadable cannot be ranked this pass.
                tracing::debug!(pod = %p.key, error = %e, "Skipping a pod without memory stats.");
                None
            }
        }
    }

    /// `choose` on the candidates, reading whole the working sets the choice turns on: the
    /// chosen unit's pods that were ranked on a held `inactive_file`, then (while fewer than
    /// [`FRESH_READS`] held pods were read) the next candidate in the kubelet's order, until the
    /// choice is read whole and holds against the next candidate read whole, or against its
    /// usage read now where that alone leaves the choice as it is (`holds_at_most`). A pod whose
    /// page cache moved since its `inactive_file` was held is ranked on its usage less the old
    /// value and set right when it comes to the head or next to it. Pids rank on process
    /// counts, read fresh already.
    fn choose_fresh(
        &self,
        c: &mut Samples<'_>,
        forests: &BTreeMap<String, Forest>,
        resource: Resource,
        need: i64,
    ) -> Option<Choice> {
        loop {
            let mut choice = choose(&c.samples, forests, resource, need, self.cfg.order)?;
            if resource != Resource::Memory {
                return Some(choice);
            }
            let index = |k: &PodKey| c.samples.iter().position(|s| &s.key == k);
            let chosen: Vec<usize> = choice.pods.iter().filter_map(index).collect();
            let stale: Vec<usize> = chosen.iter().copied().filter(|&i| !c.fresh[i]).collect();
            let confirming = c.held_reads < FRESH_READS;
            let read = if !stale.is_empty() {
                stale.clone()
            } else if confirming {
                match next_candidate(&c.samples, &chosen).filter(|&i| !c.fresh[i]) {
                    // At the most its working set can be, the next candidate leaves the choice
                    // as it is: it holds whatever that pod's page cache is now, unread.
                    Some(i) if self.holds_at_most(c, i, forests, resource, need, &choice) => {
                        Vec::new()
                    }
                    next => next.into_iter().collect(),
                }
            } else {
                Vec::new()
            };
            if read.is_empty() {
                return Some(choice);
            }
            let mut gone = Vec::new();
            for &i in &read {
                let p = c.pods[&c.samples[i].key];
                c.reads += 1;
                c.held_reads += 1;
                match self.read_fresh(p) {
                    Some(v) => {
                        c.samples[i].candidate.usage_bytes = v;
                        c.fresh[i] = true;
                        c.most[i] = v;
                    }
                    None => gone.push(i),
                }
            }
            // Gone since its value was held: not a candidate.
            gone.sort_unstable();
            for &i in gone.iter().rev() {
                c.pods.remove(&c.samples[i].key);
                c.samples.remove(i);
                c.fresh.remove(i);
                c.most.remove(i);
            }
            // Read as many held pods as allowed: the choice stands, on its own fresh values.
            if !confirming && gone.is_empty() {
                choice.frees = chosen
                    .iter()
                    .map(|&i| c.samples[i].candidate.usage_bytes)
                    .sum();
                return Some(choice);
            }
        }
    }

    /// Whether `choice` is still what `choose` makes of the candidates with `samples[i]` at the
    /// most its working set can be. A pod's usage moves it ahead in the kubelet's order, and
    /// makes its unit free more, only as it grows: a choice that holds with the pod at its most
    /// holds at any working set the pod has now.
    fn holds_at_most(
        &self,
        c: &mut Samples<'_>,
        i: usize,
        forests: &BTreeMap<String, Forest>,
        resource: Resource,
        need: i64,
        choice: &Choice,
    ) -> bool {
        let estimate = std::mem::replace(&mut c.samples[i].candidate.usage_bytes, c.most[i]);
        let holds = choose(&c.samples, forests, resource, need, self.cfg.order)
            .is_some_and(|at_most| at_most.pods == choice.pods);
        c.samples[i].candidate.usage_bytes = estimate;
        holds
    }

    /// The hierarchies with the pods this manager evicted marked Failed, so gangs count right
    /// before the source catches up.
    fn forests_with_evictions(&self, inv: &Inventory) -> BTreeMap<String, Forest> {
        let mut forests = inv.forests.clone();
        for k in &self.evicted {
            if let Some(p) = forests
                .get_mut(&k.namespace)
                .and_then(|f| f.pods.get_mut(&k.name))
            {
                p.phase = Some("Failed".into());
            }
        }
        forests
    }

    /// Waits until the unit's processes are gone and its memory has left the node (most of it
    /// out of the pods' cgroups, or the threshold no longer met), up to the release timeout.
    /// While a process remains (a pod the Eviction API took stops within its grace period, up
    /// to 30 s) only `cgroup.procs` is read: reading the memory then (the pods' `memory.stat`,
    /// the node's signals, whose root `memory.stat` flushes every cgroup's statistics) every
    /// 10 ms would only take CPU from the kernel freeing it. How many polls it took.
    async fn wait_released(
        &self,
        t: &Threshold,
        unit: &[&ManagedPod],
        frees: i64,
        resource: Resource,
    ) -> u32 {
        let deadline = tokio::time::Instant::now() + self.cfg.release_timeout;
        let mut polls = 0;
        loop {
            polls += 1;
            if unit_gone(unit) {
                if resource == Resource::Pids {
                    return polls;
                }
                self.with_stats(|s| s.release_reads += 1);
                let held: i64 = unit
                    .iter()
                    .map(|p| p.memory.working_set().unwrap_or(0))
                    .sum();
                // The node's signals only when the pods still hold their memory.
                if held <= frees / 10
                    || self.signals.observe().is_ok_and(|o: Observations| {
                        o.get(&t.signal).is_some_and(|x| shortfall(t, x) == 0)
                    })
                {
                    return polls;
                }
            }
            if tokio::time::Instant::now() > deadline {
                self.with_stats(|s| s.release_timeouts += 1);
                tracing::warn!(timeout = ?self.cfg.release_timeout, "An evicted unit did not release its resources in time; re-checking.");
                return polls;
            }
            tokio::time::sleep(RELEASE_POLL).await;
        }
    }
}

/// Completes when `notify` is told; never without one.
async fn told(notify: Option<&Notify>) {
    match notify {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// Whether none of the unit's cgroups holds a process (one `cgroup.procs` read each).
fn unit_gone(unit: &[&ManagedPod]) -> bool {
    unit.iter().all(|p| {
        p.cgroups
            .procs
            .iter()
            .chain(&p.cgroups.unified)
            .all(|d| d.read_procs().is_ok_and(|v| v.is_empty()))
    })
}

/// The first pod in the kubelet's memory order, after the chosen ones, that can be evicted.
fn next_candidate(samples: &[Sample], chosen: &[usize]) -> Option<usize> {
    let candidates: Vec<Candidate> = samples.iter().map(|s| s.candidate.clone()).collect();
    rank_memory(&candidates)
        .into_iter()
        .find(|i| !chosen.contains(i) && !samples[*i].candidate.critical)
}

#[cfg(test)]
mod fresh_tests;
#[cfg(test)]
mod tests;

/// What the kubelet's `evictionMessage` reads of one pod: its name, its stats (the pod's and its
/// containers' working sets, `statsapi.PodStats`) and its memory requests.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodUsage<'a> {
    name: &'a str,
    /// The pod's working set and its pod-level memory request, when it has one.
    pod: Option<(i64, Quantity)>,
    /// In the order of the pod's stats; a container whose working set could not be read has no
    /// memory stats and is left out, as the kubelet skips one without them.
    containers: Vec<ContainerUsage<'a>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ContainerUsage<'a> {
    name: &'a str,
    working_set: i64,
    request: Option<Quantity>,
}

/// The stats of an evicted pod at decision time: its working set as sampled for the ranking
/// (`usage`), and its containers' read now. Only memory evictions read them: the kubelet computes
/// usage for memory and ephemeral storage only (helpers.go `evictionMessage`, line 1278).
fn pod_usage(p: &ManagedPod, usage: Option<i64>, resource: Resource) -> PodUsage<'_> {
    let mut stats = PodUsage {
        name: &p.key.name,
        pod: None,
        containers: Vec::new(),
    };
    if resource != Resource::Memory {
        return stats;
    }
    stats.pod = usage.zip(p.pod_memory_request);
    for c in &p.containers {
        match c.memory.working_set() {
            Ok(working_set) => stats.containers.push(ContainerUsage {
                name: &c.name,
                working_set,
                request: c.memory_request,
            }),
            Err(e) => {
                tracing::debug!(pod = %p.key, container = %c.name, error = %e, "No memory stats for a container of an evicted pod; the message leaves it out.");
            }
        }
    }
    stats
}

/// The Event annotation keys (pkg/kubelet/eviction/helpers.go, lines 63-72).
const OFFENDING_CONTAINERS: &str = "offending_containers";
const OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
const OFFENDING_POD: &str = "offending_pod";
const OFFENDING_POD_USAGE: &str = "offending_pod_usage";
const STARVED_RESOURCE: &str = "starved_resource";

/// The kubelet's eviction message and Event annotations for one pod (pkg/kubelet/eviction/
/// helpers.go `evictionMessage`, line 1240), with the quantities as the kubelet prints them:
///
/// - "The node was low on resource: R. Threshold quantity: T, available: A. ": the threshold as
///   configured, or for a percentage its amount of capacity in BinarySI
///   (`GetThresholdQuantity`); the available amount in the observation's format (BinarySI for
///   memory, DecimalSI for pids).
/// - For memory and a pod with a pod-level memory request: "Pod P was using U, request is Q,
///   has larger consumption of memory. " whatever the usage, with annotations `offending_pod`
///   and `offending_pod_usage` (line 1255).
/// - For each container of the pod's stats, in their order, matched by name against the spec's
///   app then init containers, whose usage (a BinarySI quantity of its working set) is above its
///   memory request (Go's zero Quantity when unset): "Container C was using U, request is Q,
///   has larger consumption of memory. " (line 1273). Pids have no usage: no sentence.
/// - `offending_containers` and `offending_containers_usage` (those containers and usages
///   joined by ",", empty when none) and `starved_resource` (line 1299).
///
/// Usages print as `resource.NewQuantity(v, BinarySI).String()`; a request as its spec
/// quantity's `String()` (its own format: "100M" stays "100M").
fn eviction_message(
    resource: Resource,
    t: &Threshold,
    amount: i64,
    available: i64,
    stats: &PodUsage<'_>,
) -> (String, BTreeMap<String, String>) {
    let (r, observed) = match resource {
        Resource::Memory => ("memory", Format::BinarySI),
        Resource::Pids => ("pids", Format::DecimalSI),
    };
    let threshold = match &t.value {
        ThresholdValue::Quantity(q) => q.canonical(),
        ThresholdValue::Percentage(_) => Quantity::from_int(amount, Format::BinarySI).canonical(),
    };
    let available = Quantity::from_int(available, observed).canonical();
    let mut message = format!(
        "The node was low on resource: {r}. Threshold quantity: {threshold}, available: {available}. "
    );
    let mut annotations = BTreeMap::new();
    if resource == Resource::Memory
        && let Some((usage, request)) = &stats.pod
    {
        let usage = Quantity::from_int(*usage, Format::BinarySI).canonical();
        message.push_str(&format!(
            "Pod {} was using {usage}, request is {}, has larger consumption of {r}. ",
            stats.name,
            request.canonical()
        ));
        annotations.insert(OFFENDING_POD.into(), stats.name.to_owned());
        annotations.insert(OFFENDING_POD_USAGE.into(), usage);
    }
    let zero = Quantity::from_int(0, Format::DecimalSI);
    let mut offending = Vec::new();
    let mut usages = Vec::new();
    // Pids have no container usage (`usage` stays nil in the kubelet's switch).
    let containers = if resource == Resource::Memory {
        stats.containers.as_slice()
    } else {
        &[]
    };
    for c in containers {
        let usage = Quantity::from_int(c.working_set, Format::BinarySI);
        let request = c.request.unwrap_or(zero);
        if usage > request {
            let usage = usage.canonical();
            message.push_str(&format!(
                "Container {} was using {usage}, request is {}, has larger consumption of {r}. ",
                c.name,
                request.canonical()
            ));
            offending.push(c.name);
            usages.push(usage);
        }
    }
    annotations.insert(OFFENDING_CONTAINERS.into(), offending.join(","));
    annotations.insert(OFFENDING_CONTAINERS_USAGE.into(), usages.join(","));
    annotations.insert(STARVED_RESOURCE.into(), r.into());
    (message, annotations)
}
