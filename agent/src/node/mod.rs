//! The node, independent of its mode: the pass (source -> plan -> cgroups -> executor ->
//! eviction inventory, metrics, status), housekeeping, sensor events, eviction results, stale
//! cgroups, the status page and the Summary API, and the run loop with its shutdown. A mode
//! wires in a [`PodSource`], a [`PodExecutor`] and an `EvictionAction` (see
//! docs/architecture.md); nothing here knows which mode it runs in.
//!
//! The node's state is split by job: [`cgroups::NodeCgroups`] (the reconciler and what it
//! wants), [`Tracking`] (the pods on the node and their cgroup ids, for the sensors and the
//! metrics), [`report::Report`] (what operators see), and the state file
//! (`crate::persist::StateFile`, what survives a crash), which it shares with the eviction
//! pipeline; the eviction manager runs on its own task and talks to the node through channels.

mod app;
mod cgroups;
mod cpu_pressure;
mod housekeeping;
mod leftovers;
mod pass;
pub(crate) mod pod_status;
mod report;
mod run;
mod seams;
mod sensing;
pub(crate) mod startup;
mod status;
pub(crate) mod summary;
mod summary_targets;
pub(crate) mod trees;

#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::watch;

#[cfg(test)]
use crate::cgroup::Runner;
pub(crate) use app::{NodeError, RunConfig};
pub use pod_status::ContainerState;
pub use pod_status::PodPhase;
pub use pod_status::PodStatus;
pub(crate) use pod_status::{ContainerStatus, Termination};
pub(crate) use run::{Signals, run};
pub(crate) use seams::{PlannedPod, PodExecutor, PodSource};
pub(crate) use sensing::SensorControl;
pub(crate) use startup::{ModeStart, StartError};

use crate::{
    cgroup::{CgroupFs, Mode, Naming},
    eviction::{Inventory, UsageCache},
    hub::AgentState,
    hub::metrics::MemcgEventLabels,
    persist::StateFile,
    policy::{
        cpu_pressure::CpuPressureConfig, eviction::Threshold, plan::Plan, pod::PodKey,
        settings::NodeSettings,
    },
    workload::ValidationOptions,
};

use self::{
    cgroups::NodeCgroups, cpu_pressure::CpuPressure, pass::PodEntry, report::Report,
    summary::CgroupSummary,
};

/// The pods on the node after the last pass, and the ids the kernel knows their cgroups by.
#[derive(Default)]
struct Tracking {
    pods: BTreeMap<PodKey, PodEntry>,
    /// memcg ids (memory cgroup inodes) of pods and containers, with their memcg event labels
    /// (`event` left empty).
    memcg_owners: BTreeMap<u64, MemcgEventLabels>,
    /// cgroup ids handed to the sensors, so each is watched once and unwatched when it goes.
    watched: BTreeSet<u64>,
}

/// The kernel's cumulative eBPF figures at the last housekeeping (counters grow by the
/// difference).
#[derive(Default)]
struct EbpfSeen {
    run_ns: BTreeMap<String, u64>,
    lost: u64,
}

/// What a node is built from.
pub(crate) struct NodeParts {
    pub(crate) settings: NodeSettings,
    pub(crate) naming: Naming,
    pub(crate) fs: Arc<CgroupFs>,
    pub(crate) mode: Mode,
    pub(crate) validation: ValidationOptions,
    pub(crate) state: Arc<AgentState>,
    pub(crate) summary: CgroupSummary,
    pub(crate) persisted: StateFile,
    /// Per-pod statistics and the oom_score_adj safety scan run this often.
    pub(crate) stats_interval: Duration,
    /// The CPU-pressure controller's configuration; `None` leaves the BestEffort tier alone.
    pub(crate) cpu_pressure: Option<CpuPressureConfig>,
}

pub(crate) struct Node {
    settings: NodeSettings,
    validation: ValidationOptions,
    cgroups: NodeCgroups,
    tracked: Tracking,
    report: Report,
    plan: Option<Plan>,
    inventory_tx: watch::Sender<Arc<Inventory>>,
    summary: CgroupSummary,
    /// Shared with the eviction path, which records an eviction before it acts.
    persisted: Arc<Mutex<StateFile>>,
    /// The eviction thresholds with their kind (`hard`, `soft`), for the metrics.
    thresholds: Vec<(Threshold, &'static str)>,
    stats_interval: Duration,
    next_stats: Option<Instant>,
    ebpf_seen: EbpfSeen,
    cpu_pressure: Option<CpuPressure>,
    /// When the memory only start-up used is handed back (`housekeeping.rs`); `None` once done.
    release_start_up_at: Option<Instant>,
    /// Told once that is done: the eviction manager rehearses a decision then.
    start_up_released: Option<Arc<tokio::sync::Notify>>,
    /// Where the `inactive_file` of each pod the statistics sampling reads is handed to the
    /// eviction manager, which ranks on the usage less it.
    usage: Option<UsageCache>,
}

impl Node {
    /// The node, and the eviction inventory it keeps current.
    pub(crate) fn new(parts: NodeParts) -> (Self, watch::Receiver<Arc<Inventory>>) {
        let (inventory_tx, inventory_rx) = watch::channel(Arc::new(Inventory::default()));
        let thresholds = parts
            .settings
            .hard_eviction
            .iter()
            .map(|t| (t.clone(), "hard"))
            .chain(
                parts
                    .settings
                    .soft_eviction
                    .iter()
                    .map(|t| (t.clone(), "soft")),
            )
            .collect();
        let cpu_pressure = parts
            .cpu_pressure
            .map(|cfg| CpuPressure::new(cfg, &parts.fs));
        let node = Self {
            validation: parts.validation,
            cgroups: NodeCgroups::new(parts.fs, parts.mode, parts.naming),
            tracked: Tracking::default(),
            report: Report::new(parts.state),
            plan: None,
            inventory_tx,
            summary: parts.summary,
            persisted: Arc::new(Mutex::new(parts.persisted)),
            thresholds,
            stats_interval: parts.stats_interval,
            next_stats: None,
            ebpf_seen: EbpfSeen::default(),
            cpu_pressure,
            settings: parts.settings,
            release_start_up_at: Some(Instant::now() + housekeeping::START_UP_SETTLE),
            start_up_released: None,
            usage: None,
        };
        (node, inventory_rx)
    }

    /// Problem lines the source found (already logged by it): status events, once each.
    pub(crate) fn note_problems<'a>(&mut self, lines: impl IntoIterator<Item = &'a String>) {
        let lines: Vec<String> = lines.into_iter().cloned().collect();
        self.report.noted(&lines);
    }

    /// Hands every pod's `inactive_file` the statistics sampling reads to `usage` (the eviction
    /// manager's).
    pub(crate) fn share_usage(&mut self, usage: UsageCache) {
        self.usage = Some(usage);
    }

    /// Tells `rehearse` (the eviction manager's) once start-up's code is paged out and the
    /// binary's code locked (`housekeeping.rs`).
    pub(crate) fn tell_start_up_released(&mut self, rehearse: Arc<tokio::sync::Notify>) {
        self.start_up_released = Some(rehearse);
    }

    /// The state file, for the eviction pipeline (`crate::eviction::Pipeline`).
    pub(crate) fn state_file(&self) -> Arc<Mutex<StateFile>> {
        self.persisted.clone()
    }

    /// The last plan, for tests and the status.
    #[cfg(test)]
    pub(crate) fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }
}
