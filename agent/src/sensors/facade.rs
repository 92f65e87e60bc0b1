//! The `Sensors` facade: decides at start-up which sensor runs on which hook or fallback, logs
//! one line per sensor, and runs the intake (ring buffer, memory.events poller, PSI triggers,
//! the removed-cgroup scan) as tokio tasks feeding one channel.

use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use qoslet_common::sched::ReclaimStats;
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{debug, info, warn};

use crate::{cgroup::CgroupBeneath, support::lock};

use super::{
    EbpfSensors, SensorError,
    cpu_usage::{CpuUsage, read_cgroup_cpu},
    ebpf::{EbpfOptions, error_chain},
    event::{CgroupOp, CgroupOwner, PressureScope, SensorEvent, boot_now_ns},
    kernel_log,
    kmaps::ProgramCost,
    memory_events::{MemoryEventsWatch, MemoryNotifier, Notified},
    owners::CgroupOwners,
    psi::{PressureFile, PsiTrigger, SYSTEM_MEMORY_PRESSURE, is_gone},
    scores::{ExpectedScores, ScoreKey, read_score, reset_score},
    table::{Attachment, Fallback, SENSORS, SWITCHED_OFF, Sensor, SensorSwitches},
};

/// What to start.
#[derive(Debug, Clone)]
pub struct SensorsConfig {
    /// `ebpf.enabled` of the configuration; false runs the fallbacks only.
    pub ebpf: bool,
    /// `ebpf.sensors` of the configuration: sensors switched off run their fallback.
    pub switches: SensorSwitches,
    pub prefer_btf: bool,
    /// `ebpf.kernelDiagnostics`: the programs log their rare paths into the agent's log (target
    /// `qoslet::kernel`).
    pub kernel_diagnostics: bool,
    /// Period of the score check without a kernel hook, of the memory.events reads while a v1
    /// OOM is followed, and of every memory.events read where the kernel cannot notify.
    pub poll_interval: Duration,
    /// Period at which every watched cgroup's memory.events is read even without a
    /// notification (v1 `memory.failcnt` notifies nothing).
    pub memory_events_resync: Duration,
    /// PSI trigger: stall per window.
    pub psi_stall: Duration,
    pub psi_window: Duration,
}

impl Default for SensorsConfig {
    fn default() -> Self {
        Self {
            ebpf: true,
            switches: SensorSwitches::default(),
            prefer_btf: true,
            kernel_diagnostics: false,
            poll_interval: Duration::from_millis(100),
            // The kubelet's statistics period.
            memory_events_resync: Duration::from_secs(10),
            psi_stall: Duration::from_millis(150),
            psi_window: Duration::from_secs(1),
        }
    }
}

/// How a sensor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SensorMode {
    /// On its kernel hook.
    Active,
    /// On a fallback (polling, PSI).
    Fallback,
    /// Not available on this node.
    Off,
}

/// One line of `/readyz` and of the `qoslet_sensor_info` metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SensorStatus {
    pub name: &'static str,
    pub mode: SensorMode,
    /// The hook or fallback in use.
    pub source: String,
    /// Why the preferred hook is not used.
    pub reason: Option<String>,
}

/// A cgroup the agent manages. Its directories are named from pod UIDs and container ids, so
/// every file of them is opened beneath the node root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedCgroup {
    /// cgroup v2 id (the unified-tree cgroup on hybrid hosts).
    pub id: u64,
    /// The v2 directory (for `memory.pressure`), when there is one.
    pub v2_dir: Option<CgroupBeneath>,
    /// The memory cgroup directory (v2 or v1) for the memory.events fallback.
    pub memory_dir: Option<CgroupBeneath>,
    /// The v1 cpu,cpuacct directory (hybrid and v1 hosts) for the CPU fallback.
    pub cpu_dir: Option<CgroupBeneath>,
}

impl WatchedCgroup {
    /// A directory whose disappearance means the cgroup was removed.
    fn any_dir(&self) -> Option<&CgroupBeneath> {
        self.v2_dir
            .as_ref()
            .or(self.memory_dir.as_ref())
            .or(self.cpu_dir.as_ref())
    }
}

/// Counters for the metrics; each error log is paired with one of these.
#[derive(Debug, Default)]
pub struct SensorCounters {
    pub(crate) undecodable_records: AtomicU64,
    pub score_tampering: AtomicU64,
    pub(crate) score_reset_failures: AtomicU64,
    pub(crate) memory_events_read_errors: AtomicU64,
    pub(crate) psi_errors: AtomicU64,
    pub map_update_errors: AtomicU64,
}

#[derive(Default)]
struct CgroupWatches {
    cgroups: HashMap<u64, WatchedCgroup>,
    polled: HashMap<u64, MemoryEventsWatch>,
    /// The polled cgroup of each inotify watch.
    polled_by_wd: HashMap<nix::sys::inotify::WatchDescriptor, u64>,
    psi: HashMap<u64, JoinHandle<()>>,
}

struct Shared {
    ebpf: Mutex<Option<EbpfSensors>>,
    watch: Mutex<CgroupWatches>,
    owners: Mutex<CgroupOwners>,
    scores: Mutex<ExpectedScores>,
    counters: SensorCounters,
    tx: mpsc::Sender<SensorEvent>,
    config: SensorsConfig,
    /// Which fallbacks the poller runs.
    poll_memory_events: bool,
    /// Notifications of counter changes for the memory.events fallback; without them (an
    /// inotify or eventfd the kernel refused) the counters are read every `poll_interval`.
    memory_notifier: Option<MemoryNotifier>,
    poll_scores: bool,
    /// CPU figures come from the cgroup files, not the scheduler programs.
    cpu_from_files: bool,
    /// Without the rmdir program, watched cgroups whose directory is gone are unwatched here.
    scan_removed: bool,
}

/// The node's sensors. Dropping it stops the tasks and detaches the programs.
pub struct Sensors {
    shared: Arc<Shared>,
    statuses: Vec<SensorStatus>,
    tasks: Vec<JoinHandle<()>>,
}

/// Events waiting for the consumer; beyond this the producers wait (the ring keeps counting).
const CHANNEL_DEPTH: usize = 4096;

/// Period of the scan for removed cgroups (one stat per watched cgroup).
const REMOVED_SCAN_PERIOD: Duration = Duration::from_secs(1);

impl Sensors {
    /// Starts every sensor, on eBPF where it can and on its fallback otherwise. Call inside a
    /// tokio runtime.
    pub fn start(config: SensorsConfig) -> (Self, mpsc::Receiver<SensorEvent>) {
        let (ebpf, why_not) = if !config.ebpf {
            (None, Some("eBPF disabled by configuration".to_owned()))
        } else if !config.switches.any_on() {
            (None, None)
        } else {
            match EbpfSensors::load_switched(
                EbpfOptions {
                    prefer_btf: config.prefer_btf,
                    diagnostics: config.kernel_diagnostics,
                },
                &config.switches,
            ) {
                Ok(s) => (Some(s), None),
                Err(e) => (None, Some(error_chain(&e))),
            }
        };
        let outcomes = match &ebpf {
            Some(e) => e.outcomes().to_vec(),
            None => unloaded_outcomes(&config.switches, why_not.as_deref()),
        };
        let statuses = decide(&outcomes, Path::new(SYSTEM_MEMORY_PRESSURE).exists());
        // Why eBPF as a whole is unavailable is said once, not on every sensor's line.
        if let Some(why) = &why_not {
            warn!(reason = %why, "eBPF sensors unavailable; running on the fallbacks.");
        }
        for s in &statuses {
            let reason = s
                .reason
                .as_deref()
                .filter(|r| Some(*r) != why_not.as_deref())
                .unwrap_or("");
            info!(
                sensor = s.name,
                mode = ?s.mode,
                source = %s.source,
                reason,
                "Sensor started."
            );
        }
        let mode_of = |name: &str| {
            statuses
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.mode)
                .unwrap_or(SensorMode::Off)
        };
        let poll_memory_events = mode_of("memcg_events") == SensorMode::Fallback;
        let poll_scores = mode_of("oom_score_adj") == SensorMode::Fallback;
        let cpu_from_files = mode_of("cpu_runqueue") == SensorMode::Fallback;
        let scan_removed = mode_of("cgroup_lifecycle") == SensorMode::Fallback;
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        let mut ebpf = ebpf;
        let reader = ebpf.as_mut().and_then(|s| match s.event_reader() {
            Ok(r) => Some(r),
            Err(e) => {
                warn!(reason = %error_chain(&e), "eBPF event intake unavailable.");
                None
            }
        });
        let kernel_log = ebpf
            .as_mut()
            .filter(|_| config.kernel_diagnostics)
            .and_then(|s| match s.kernel_log_reader() {
                Ok(r) => Some(r),
                Err(e) => {
                    warn!(reason = %error_chain(&e), "Kernel diagnostics unavailable.");
                    None
                }
            });
        let shared = Arc::new(Shared {
            ebpf: Mutex::new(ebpf),
            watch: Mutex::new(CgroupWatches::default()),
            owners: Mutex::new(CgroupOwners::default()),
            scores: Mutex::new(ExpectedScores::default()),
            counters: SensorCounters::default(),
            tx,
            config,
            poll_memory_events,
            memory_notifier: poll_memory_events
                .then(|| {
                    MemoryNotifier::new()
                        .inspect_err(|e| {
                            warn!(error = %e, "No memory.events notifications; the counters are read on a timer.");
                        })
                        .ok()
                })
                .flatten(),
            poll_scores,
            cpu_from_files,
            scan_removed,
        });
        let mut tasks = Vec::new();
        if let Some(reader) = reader {
            tasks.push(tokio::spawn(intake(shared.clone(), reader)));
        }
        if let Some(kernel_log) = kernel_log {
            info!(
                log_target = kernel_log::TARGET,
                "Kernel diagnostics on; the programs log their rare paths."
            );
            tasks.push(tokio::spawn(kernel_log.run()));
        }
        tasks.push(tokio::spawn(poller(shared.clone())));
        if shared.poll_memory_events {
            tasks.push(tokio::spawn(memory_events_task(shared.clone())));
        }
        if Path::new(SYSTEM_MEMORY_PRESSURE).exists() {
            tasks.push(tokio::spawn(psi_task(
                shared.clone(),
                PressureFile::System,
                PressureScope::System,
            )));
        }
        (
            Self {
                shared,
                statuses,
                tasks,
            },
            rx,
        )
    }

    /// Which sensors run and how (for `/readyz` and a metric).
    pub fn statuses(&self) -> &[SensorStatus] {
        &self.statuses
    }

    pub fn counters(&self) -> &SensorCounters {
        &self.shared.counters
    }

    /// Starts watching a managed cgroup: kernel watch list, memory.events fallback, PSI.
    pub fn watch(&self, cgroup: WatchedCgroup) {
        self.shared.watch_cgroup(cgroup);
    }

    pub(crate) fn unwatch(&self, id: u64) {
        self.shared.unwatch_cgroup(id);
    }

    /// Whether a cgroup is watched (removed cgroups stop being watched by themselves).
    pub fn is_watched(&self, id: u64) -> bool {
        lock(&self.shared.watch).cgroups.contains_key(&id)
    }

    /// Records which pod and container a cgroup (v2 id or v1 memcg id) belongs to.
    pub(crate) fn set_owner(&self, cgroup_id: u64, owner: CgroupOwner) {
        lock(&self.shared.owners).insert(cgroup_id, owner);
    }

    /// Records the score qoslet set, so a change away from it is reported and reset.
    pub fn expect_score(&self, key: ScoreKey, score: i32) {
        lock(&self.shared.scores).set(key, score);
    }

    /// Runs `f` on the eBPF sensors, when they are loaded.
    pub fn with_ebpf<R>(&self, f: impl FnOnce(&mut EbpfSensors) -> R) -> Option<R> {
        lock(&self.shared.ebpf).as_mut().map(f)
    }

    /// CPU use of a watched cgroup, from the scheduler programs or, on the fallback, read now
    /// from its cgroup files (see [`CpuUsage`] for which fields each source fills). `None` for a
    /// cgroup that is not watched or no longer exists.
    pub fn cpu_stats(&self, id: u64) -> Result<Option<CpuUsage>, SensorError> {
        if !self.shared.cpu_from_files {
            return self
                .with_ebpf(|e| e.cpu_stats(id))
                .unwrap_or(Ok(None))
                .map(|s| s.map(CpuUsage::from));
        }
        let Some(c) = lock(&self.shared.watch).cgroups.get(&id).cloned() else {
            return Ok(None);
        };
        if c.v2_dir.is_none() && c.cpu_dir.is_none() {
            return Ok(None);
        }
        match read_cgroup_cpu(c.v2_dir.as_ref(), c.cpu_dir.as_ref()) {
            Ok(u) => Ok(Some(u)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SensorError::CgroupFiles {
                cgroup_id: id,
                source,
            }),
        }
    }

    pub fn reclaim_stats(&self, id: u64) -> Result<Option<ReclaimStats>, SensorError> {
        self.with_ebpf(|e| e.reclaim_stats(id)).unwrap_or(Ok(None))
    }

    pub fn program_costs(&self) -> Vec<ProgramCost> {
        self.with_ebpf(|e| e.program_costs()).unwrap_or_default()
    }

    /// Records lost because the ring buffer was full (one ring).
    pub fn events_lost(&self) -> u64 {
        self.with_ebpf(|e| e.events_lost().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Drop for Sensors {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for (_, t) in lock(&self.shared.watch).psi.drain() {
            t.abort();
        }
    }
}

/// Each sensor's outcome when the eBPF object is not loaded: switched off, or without its
/// hooks because of `why_not`.
fn unloaded_outcomes(
    switches: &SensorSwitches,
    why_not: Option<&str>,
) -> Vec<(&'static Sensor, Attachment)> {
    SENSORS
        .iter()
        .map(|s| {
            let outcome = if switches.is_on(s.name) {
                Attachment::Unhooked {
                    reason: why_not.unwrap_or("eBPF unavailable").to_owned(),
                }
            } else {
                Attachment::SwitchedOff
            };
            (s, outcome)
        })
        .collect()
}

/// The one-line-per-sensor decision: the table's sensors as attaching left them, then
/// `memory_pressure` (PSI, no program). `psi` is whether the kernel has PSI.
pub(super) fn decide(outcomes: &[(&'static Sensor, Attachment)], psi: bool) -> Vec<SensorStatus> {
    let mut statuses: Vec<SensorStatus> = outcomes
        .iter()
        .map(|(sensor, outcome)| {
            let reason = match outcome {
                Attachment::Hooked(programs) => {
                    let hooks: Vec<&str> = programs.iter().map(|p| p.hook.as_str()).collect();
                    return SensorStatus {
                        name: sensor.name,
                        mode: SensorMode::Active,
                        source: hooks.join(","),
                        reason: None,
                    };
                }
                Attachment::Unhooked { reason } => reason.clone(),
                Attachment::SwitchedOff => SWITCHED_OFF.to_owned(),
            };
            let fallback = match sensor.fallback {
                Fallback::Always(text) => Some(text),
                Fallback::Psi(text) => psi.then_some(text),
            };
            SensorStatus {
                name: sensor.name,
                mode: if fallback.is_some() {
                    SensorMode::Fallback
                } else {
                    SensorMode::Off
                },
                source: fallback.unwrap_or("none").to_owned(),
                reason: Some(reason),
            }
        })
        .collect();
    statuses.push(SensorStatus {
        name: "memory_pressure",
        mode: if psi {
            SensorMode::Active
        } else {
            SensorMode::Off
        },
        source: if psi { "PSI triggers" } else { "none" }.to_owned(),
        reason: (!psi).then(|| format!("{SYSTEM_MEMORY_PRESSURE} is missing (PSI off)")),
    });
    statuses
}

impl Shared {
    /// Appends the counter deltas of the watches `read` names.
    fn read_memory_events(&self, read: &MemoryRead, out: &mut Vec<SensorEvent>) {
        let boot_ns = boot_now_ns();
        let mut w = lock(&self.watch);
        let CgroupWatches {
            polled,
            polled_by_wd,
            ..
        } = &mut *w;
        let mut poll = |m: &mut MemoryEventsWatch| {
            if let Err(e) = m.poll(boot_ns, out) {
                self.counters
                    .memory_events_read_errors
                    .fetch_add(1, Ordering::Relaxed);
                debug!(path = %m.dir.display().display(), error = %e, "Memory events unreadable (cgroup removed?).");
            }
        };
        match read {
            MemoryRead::All => polled.values_mut().for_each(poll),
            MemoryRead::V1 => polled.values_mut().filter(|m| m.is_v1()).for_each(poll),
            MemoryRead::Files(wds) => {
                for wd in wds {
                    if let Some(m) = polled_by_wd.get(wd).and_then(|id| polled.get_mut(id)) {
                        poll(m);
                    }
                }
            }
        }
    }

    fn watch_cgroup(self: &Arc<Self>, cgroup: WatchedCgroup) {
        if let Some(e) = lock(&self.ebpf).as_mut()
            && let Err(err) = e.watch_cgroup(cgroup.id)
        {
            self.counters
                .map_update_errors
                .fetch_add(1, Ordering::Relaxed);
            warn!(cgroup_id = cgroup.id, error = %error_chain(&err), "Could not watch a cgroup in the kernel.");
        }
        let mut w = lock(&self.watch);
        if self.poll_memory_events
            && let Some(dir) = &cgroup.memory_dir
        {
            match MemoryEventsWatch::new(dir.clone()) {
                Ok(mut m) => {
                    if let Some(n) = &self.memory_notifier
                        && let Err(e) = n.register(&mut m)
                    {
                        // The resync still reads it.
                        warn!(path = %dir.display().display(), error = %e, "Could not ask for memory.events notifications of a cgroup.");
                    }
                    if let Some(wd) = m.notify_wd {
                        w.polled_by_wd.insert(wd, cgroup.id);
                    }
                    if let Some(old) = w.polled.insert(cgroup.id, m) {
                        self.unregister_memory_events(&mut w, &old);
                    }
                }
                Err(e) => {
                    self.counters
                        .memory_events_read_errors
                        .fetch_add(1, Ordering::Relaxed);
                    warn!(path = %dir.display().display(), error = %e, "Could not read memory events of a cgroup.");
                }
            }
        }
        if let Some(dir) = &cgroup.v2_dir {
            // Without PSI there is no trigger to arm; a file that cannot be opened (a symlink out
            // of the root) is left to the task, which says so and counts it.
            if !matches!(dir.has_file("memory.pressure"), Ok(false)) {
                let task = tokio::spawn(psi_task(
                    self.clone(),
                    PressureFile::Cgroup(dir.clone()),
                    PressureScope::Cgroup(cgroup.id),
                ));
                if let Some(old) = w.psi.insert(cgroup.id, task) {
                    old.abort();
                }
            }
        }
        w.cgroups.insert(cgroup.id, cgroup);
    }

    /// The `cgroup_lifecycle` fallback: unwatches cgroups whose directory is gone.
    fn unwatch_removed(&self) {
        let gone: Vec<u64> = lock(&self.watch)
            .cgroups
            .values()
            .filter(|c| c.any_dir().is_some_and(|d| !d.exists()))
            .map(|c| c.id)
            .collect();
        for id in gone {
            debug!(cgroup_id = id, "Watched cgroup removed; unwatching it.");
            self.unwatch_cgroup(id);
        }
    }

    fn unwatch_cgroup(&self, id: u64) {
        if let Some(e) = lock(&self.ebpf).as_mut()
            && let Err(err) = e.unwatch_cgroup(id)
        {
            self.counters
                .map_update_errors
                .fetch_add(1, Ordering::Relaxed);
            warn!(cgroup_id = id, error = %error_chain(&err), "Could not unwatch a cgroup in the kernel.");
        }
        self.forget(id);
    }

    fn unregister_memory_events(&self, w: &mut CgroupWatches, watch: &MemoryEventsWatch) {
        if let Some(wd) = watch.notify_wd {
            w.polled_by_wd.remove(&wd);
        }
        if let Some(n) = &self.memory_notifier {
            n.unregister(watch);
        }
    }

    /// Drops every userspace entry of a cgroup (the kernel program drops its hash entries on
    /// rmdir).
    fn forget(&self, id: u64) {
        let mut w = lock(&self.watch);
        w.cgroups.remove(&id);
        if let Some(old) = w.polled.remove(&id) {
            self.unregister_memory_events(&mut w, &old);
        }
        if let Some(t) = w.psi.remove(&id) {
            t.abort();
        }
        drop(w);
        lock(&self.owners).remove(id);
        lock(&self.scores).remove(ScoreKey::Cgroup(id));
    }

    /// Enriches, reacts to and forwards one event.
    async fn handle(&self, mut event: SensorEvent) -> bool {
        match &mut event {
            SensorEvent::OomVictim(v) => lock(&self.owners).attribute(v),
            SensorEvent::OomScoreAdj {
                pid,
                cgroup_id,
                oom_score_adj,
                comm,
                ..
            } => {
                let expected = lock(&self.scores).expected(*pid, *cgroup_id);
                if let Some(expected) = expected
                    && expected != *oom_score_adj
                {
                    self.reset(*pid, *oom_score_adj, expected, comm);
                }
            }
            SensorEvent::Cgroup {
                op: CgroupOp::Removed,
                id,
                ..
            } => {
                // The kernel program deleted the hash entries; the filter bit and the slot are
                // the agent's to free.
                self.unwatch_cgroup(*id);
            }
            _ => {}
        }
        self.tx.send(event).await.is_ok()
    }

    fn reset(&self, pid: u32, found: i32, expected: i32, comm: &str) {
        self.counters
            .score_tampering
            .fetch_add(1, Ordering::Relaxed);
        match reset_score(pid, expected) {
            Ok(()) => warn!(
                pid,
                comm, found, expected, "A process changed its oom_score_adj; reset it."
            ),
            Err(e) => {
                self.counters
                    .score_reset_failures
                    .fetch_add(1, Ordering::Relaxed);
                warn!(pid, comm, found, expected, error = %e, "Could not reset a changed oom_score_adj.");
            }
        }
    }
}

async fn intake(shared: Arc<Shared>, mut reader: super::EventReader) {
    let mut events = Vec::new();
    let mut bad = Vec::new();
    loop {
        if let Err(e) = reader.read_batch(&mut events, &mut bad).await {
            shared
                .counters
                .undecodable_records
                .fetch_add(1, Ordering::Relaxed);
            warn!(error = %e, "eBPF event intake failed; continuing without it.");
            return;
        }
        for e in bad.drain(..) {
            shared
                .counters
                .undecodable_records
                .fetch_add(1, Ordering::Relaxed);
            warn!(error = %e, "Undecodable eBPF record dropped.");
        }
        for e in events.drain(..) {
            if !shared.handle(e).await {
                return;
            }
        }
    }
}

/// Which watched cgroups' memory.events to read.
enum MemoryRead {
    All,
    Files(Vec<nix::sys::inotify::WatchDescriptor>),
    V1,
}

/// How long after a v1 OOM notification the v1 cgroups are read every `poll_interval`: the
/// kernel signals before its OOM killer runs, so the kill's count comes later.
const V1_OOM_FOLLOW_UP: Duration = Duration::from_secs(2);

/// The memory.events fallback: reads a cgroup's counters when the kernel says they changed,
/// every cgroup's at the resync, and every `poll_interval` where there are no notifications.
async fn memory_events_task(shared: Arc<Shared>) {
    let notifier = shared.memory_notifier.as_ref();
    let mut resync = tokio::time::interval(if notifier.is_some() {
        shared.config.memory_events_resync
    } else {
        shared.config.poll_interval
    });
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut follow_up = tokio::time::interval(shared.config.poll_interval);
    let mut follow_up_until = None::<tokio::time::Instant>;
    let mut out = Vec::new();
    loop {
        let following = follow_up_until.is_some_and(|t| tokio::time::Instant::now() < t);
        let read = tokio::select! {
            n = async { notifier.expect("guarded").next().await }, if notifier.is_some() => match n {
                Ok(Notified::Files(wds)) => MemoryRead::Files(wds),
                Ok(Notified::V1Oom) => {
                    follow_up_until = Some(tokio::time::Instant::now() + V1_OOM_FOLLOW_UP);
                    follow_up.reset();
                    MemoryRead::V1
                }
                Err(e) => {
                    warn!(error = %e, "memory.events notification failed; the resync remains.");
                    tokio::time::sleep(shared.config.memory_events_resync).await;
                    continue;
                }
            },
            _ = resync.tick() => MemoryRead::All,
            _ = follow_up.tick(), if following => MemoryRead::V1,
        };
        shared.read_memory_events(&read, &mut out);
        for e in out.drain(..) {
            if shared.tx.send(e).await.is_err() {
                return;
            }
        }
    }
}

/// The polling fallbacks: expected scores of pids and removed cgroups.
async fn poller(shared: Arc<Shared>) {
    if !shared.poll_scores && !shared.scan_removed {
        return;
    }
    let mut tick = tokio::time::interval(if shared.poll_scores {
        shared.config.poll_interval
    } else {
        REMOVED_SCAN_PERIOD
    });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_scan = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        if shared.scan_removed && last_scan.elapsed() >= REMOVED_SCAN_PERIOD {
            last_scan = tokio::time::Instant::now();
            shared.unwatch_removed();
        }
        if shared.poll_scores {
            let expected: Vec<(u32, i32)> = lock(&shared.scores).pids().collect();
            for (pid, want) in expected {
                if let Ok(found) = read_score(pid)
                    && found != want
                {
                    shared.reset(pid, found, want, "");
                }
            }
        }
        if shared.tx.is_closed() {
            return;
        }
    }
}

async fn psi_task(shared: Arc<Shared>, file: PressureFile, scope: PressureScope) {
    let config = &shared.config;
    let path = file.display();
    let mut trigger = match PsiTrigger::open(&file, config.psi_stall, config.psi_window) {
        Ok(t) => t,
        Err(e) => {
            shared.counters.psi_errors.fetch_add(1, Ordering::Relaxed);
            warn!(path = %path.display(), error = %e, "Could not arm a PSI trigger.");
            return;
        }
    };
    loop {
        if let Err(e) = trigger.fired().await {
            if is_gone(&e) {
                debug!(path = %path.display(), "PSI trigger's cgroup removed; trigger task ends.");
                return;
            }
            shared.counters.psi_errors.fetch_add(1, Ordering::Relaxed);
            warn!(path = %path.display(), error = %e, "PSI trigger failed.");
            return;
        }
        if shared
            .tx
            .send(SensorEvent::MemoryPressure { scope })
            .await
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::cgroup::beneath::RootWithLink;

    /// A watched cgroup's directory (or one of its files) replaced by a symlink out of the node
    /// root is not read: not its memory.events (nor its id), its CPU files or its
    /// memory.pressure, and it counts as removed. The control, a real directory, is read, and
    /// its memory.events is watched through the descriptor opened beneath the root.
    #[tokio::test]
    async fn a_watched_cgroup_replaced_by_a_symlink_out_of_the_root_is_not_read() {
        let t = RootWithLink::new("sensors-beneath");
        let (root, outside) = (&t.root, &t.outside);
        // The files the sensors' fallbacks read, as the kernel shows them on cgroup v2.
        for (file, text) in [
            ("memory.events", "oom_kill 0\n"),
            ("memory.pressure", "some total=0\n"),
            ("cpu.stat", "usage_usec 7\n"),
        ] {
            t.write(file, text, text);
        }
        fs::create_dir_all(root.join("filelink")).unwrap();
        for file in ["memory.events", "memory.pressure", "cpu.stat"] {
            std::os::unix::fs::symlink(outside.join(file), root.join("filelink").join(file))
                .unwrap();
        }
        let dir = |path: &str| t.dir(path);

        let real = dir("/real");
        assert!(real.exists());
        let usage = read_cgroup_cpu(Some(&real), None).unwrap();
        assert_eq!(usage.usage_ns, 7000);
        PressureFile::Cgroup(real.clone()).open().unwrap();
        let mut watch = MemoryEventsWatch::new(real).unwrap();
        let notifier = MemoryNotifier::new().unwrap();
        notifier.register(&mut watch).unwrap();
        fs::write(root.join("real/memory.events"), "oom_kill 1\n").unwrap();
        let notified = tokio::time::timeout(Duration::from_secs(5), notifier.next()).await;
        assert_eq!(
            notified.ok().and_then(Result::ok),
            Some(Notified::Files(vec![watch.notify_wd.unwrap()]))
        );
        let mut events = Vec::new();
        watch.poll(0, &mut events).unwrap();
        assert_eq!(events.len(), 1, "{events:?}");

        for link in ["/link", "/filelink"] {
            let d = dir(link);
            // A symlink in the path is ELOOP; the directory itself opened as one, ENOTDIR.
            let loops =
                |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR));
            let e = MemoryEventsWatch::new(d.clone()).unwrap_err();
            assert!(loops(&e), "{link}: {e}");
            let e = read_cgroup_cpu(Some(&d), None).unwrap_err();
            assert!(loops(&e), "{link}: {e}");
            let e = PressureFile::Cgroup(d.clone()).open().unwrap_err();
            assert!(loops(&e), "{link}: {e}");
        }
        assert!(
            !dir("/link").exists(),
            "a symlinked directory counts as removed"
        );
    }
}
