//! The node's parts built from the mode's [`RunConfig`] into one [`App`] value (as
//! linkerd2-proxy's `Config::build()` builds its proxy), so that the run loop is only the loop:
//! [`App::build`] takes the node lock, serves HTTP, starts the sensors, recovers from a crash and
//! starts the eviction manager and its memory watchers; [`App::run_until`] is the select loop;
//! [`App::shutdown`] drains and stops. The order of the steps in `build` is the order the node
//! needs: the lock before anything is written, the state before the server reads it, the
//! sensors before the first pass.

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use thiserror::Error;
use tokio::{
    sync::{mpsc, watch},
    task::{AbortHandle, JoinHandle},
};
use tracing::{info, warn};

use super::{
    Node, NodeParts, SensorControl,
    leftovers::stop_leftovers,
    seams::{PodExecutor, PodSource},
    summary::{CgroupSummary, StatsCgroup},
    trees,
};
use crate::{
    cgroup::{
        CgroupBeneath, CgroupFs, CgroupPath, ContainerRuntime, Mode, Naming, Runner,
        fs::OpenRootError,
    },
    config::{EnforceArea, EvictionWakeups, QosletConfiguration},
    eviction::{
        Decision, EvictionAction, Manager, ManagerConfig, MemoryCgroup, NodeCondition, NodeSignals,
        Pipeline, UsageCache, Wake, thresholds::Observations, watch::WatchConfig,
    },
    exit,
    hub::AgentState,
    persist::{NodeLock, StateError, StateFile},
    policy::{cgroup_name::render, cpu_pressure::CpuPressureConfig, settings::NodeSettings},
    sensors::SensorEvent,
    server::{self, BindError},
    workload::ValidationOptions,
};

/// Why the node could not start (configuration errors are the mode's, exit 64).
#[derive(Debug, Error)]
pub enum NodeError {
    #[error("cannot open the node root cgroup")]
    NodeRoot(#[source] OpenRootError),
    #[error("no memory cgroup hierarchy is mounted")]
    NoMemoryHierarchy,
    #[error(transparent)]
    State(StateError),
    #[error(transparent)]
    Bind(BindError),
    #[error("cannot watch {signal}")]
    Signal {
        signal: &'static str,
        #[source]
        source: io::Error,
    },
}

impl NodeError {
    /// The process's exit status for this error.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::NoMemoryHierarchy => exit::OSFILE,
            Self::State(StateError::Locked { .. }) | Self::Bind(_) => exit::UNAVAILABLE,
            Self::NodeRoot(_) | Self::State(_) | Self::Signal { .. } => exit::OSERR,
        }
    }
}

/// What the mode decided: the node's settings, its cgroups and how it runs.
pub(crate) struct RunConfig {
    pub(crate) settings: NodeSettings,
    pub(crate) qc: QosletConfiguration,
    pub(crate) mode: Mode,
    /// The node root, opened by the mode at start ([`super::startup::ModeStart::open_root`]).
    pub(crate) fs: Arc<CgroupFs>,
    /// How the container runtime names container cgroups.
    pub(crate) runtime: ContainerRuntime,
    pub(crate) validation: ValidationOptions,
    pub(crate) addr: SocketAddr,
    /// `addr` bound already by the mode (cluster mode answers `/healthz` on it while it waits
    /// for the API server), served from here on; `None` binds `addr`.
    pub(crate) listener: Option<std::net::TcpListener>,
    /// How long pods get to stop at shutdown, and how long a pass or an eviction in progress
    /// may take to finish.
    pub(crate) shutdown_grace: Duration,
    /// Called once the agent's state exists, before the first pass: a mode's own tasks (cluster
    /// mode: the API watch readiness, node conditions and the lease) read and report through it.
    pub(crate) on_start: Option<Box<dyn FnOnce(Arc<AgentState>) + Send>>,
    /// The Node object's name (cluster mode), which `/stats/summary` reports as `nodeName`, as the
    /// kubelet does; `None`: the hostname (standalone).
    pub(crate) node_name: Option<String>,
    /// Guards `/metrics` and `/stats/summary` (cluster mode's `endpointAuth: tokenReview`).
    pub(crate) auth: Option<Arc<server::auth::Guard>>,
}

/// The shortest housekeeping interval: a smaller setting would spin the loop.
const MIN_HOUSEKEEPING: Duration = Duration::from_millis(100);

/// The longest the node holds its reaction to an eviction while the evicted pods release their
/// memory: a victim's exit on a loaded node takes a few hundred milliseconds; one the Eviction
/// API took stops within its grace period, which the node does not wait out.
pub(super) const RELEASE_HOLD: Duration = Duration::from_secs(1);

/// The memory watcher's poll at its level: earlyoom's 100 ms divided by ten (far from it, up to
/// 1 s).
const WATCH_POLL: Duration = Duration::from_millis(10);

/// Everything the run loop touches, built and started.
pub(super) struct App<S, E, C> {
    source: S,
    executor: Arc<E>,
    node: Node,
    sensors: C,
    sensor_events: mpsc::Receiver<SensorEvent>,
    /// Sensor events that may cross the memory level wake the manager (`evictionWakeups:
    /// events`), as the memory watchers do through clones of `wakes`.
    wake_on_events: bool,
    wakes: mpsc::Sender<Wake>,
    node_memory_ids: Vec<u64>,
    decisions: mpsc::UnboundedReceiver<Decision>,
    observations: watch::Receiver<Observations>,
    conditions: watch::Receiver<Vec<NodeCondition>>,
    /// The eviction whose pods release their memory now ([`Manager::releasing`]).
    releasing: watch::Receiver<Option<u64>>,
    /// The eviction manager's task (enforce mode only) and its stop.
    manager: Option<JoinHandle<()>>,
    manager_stop: watch::Sender<bool>,
    server: AbortHandle,
    state: Arc<AgentState>,
    housekeeping: Duration,
    shutdown_grace: Duration,
    enforce: bool,
    /// Held until the app is gone: one instance per node root.
    _lock: Option<NodeLock>,
}

/// When the node's reaction to the eviction being released resumes: [`RELEASE_HOLD`] after the
/// node first saw it, or as soon as it is released.
#[derive(Debug, Default)]
struct ReleaseHold {
    /// The eviction being released and when the node first saw it.
    seen: Option<(u64, tokio::time::Instant)>,
}

impl ReleaseHold {
    /// The end of the hold given the manager's releasing eviction now; `None`: no hold.
    fn until(&mut self, releasing: Option<u64>) -> Option<tokio::time::Instant> {
        let Some(eviction) = releasing else {
            self.seen = None;
            return None;
        };
        let now = tokio::time::Instant::now();
        let since = match self.seen {
            Some((e, at)) if e == eviction => at,
            _ => {
                self.seen = Some((eviction, now));
                now
            }
        };
        let end = since + RELEASE_HOLD;
        (end > now).then_some(end)
    }
}

/// The node root's memory cgroup, and the pods' cgroup (kubepods) the kubelet keeps, whose
/// `allocatableMemory.available` the kubelet adds beside every hard `memory.available`
/// threshold.
struct NodeMemory {
    node_root: MemoryCgroup,
    kubepods: Option<MemoryCgroup>,
}

impl<S, E, C> App<S, E, C>
where
    S: PodSource,
    E: PodExecutor,
    C: SensorControl,
{
    /// Builds and starts the node's parts; the first pass is [`App::first_pass`].
    pub(super) async fn build<A: EvictionAction + 'static>(
        cfg: RunConfig,
        source: S,
        executor: Arc<E>,
        action: A,
        sensors: impl FnOnce(&AgentState) -> (C, mpsc::Receiver<SensorEvent>),
    ) -> Result<Self, NodeError> {
        let enforce = cfg.mode == Mode::Enforce;
        let fs = cfg.fs.clone();
        let memory_tree = trees::memory_tree(fs.trees()).ok_or(NodeError::NoMemoryHierarchy)?;
        let node_root = |tree| CgroupBeneath::new(&fs, tree, &CgroupPath::root());
        // The lock is taken before anything is written.
        let lock = if enforce {
            Some(NodeLock::acquire(&node_root(memory_tree)).map_err(NodeError::State)?)
        } else {
            None
        };
        let memory = NodeMemory::open(&cfg, memory_tree);
        let summary = CgroupSummary::new(
            StatsCgroup {
                memory: Some(memory.node_root.clone()),
                cpu: trees::unified_tree(fs.trees()).map(node_root),
            },
            cfg.node_name.clone(),
        );
        let state = Arc::new(AgentState::new(Box::new(summary.clone()), cfg.auth.clone()));
        for s in ["sensors", "reconciler", "eviction"] {
            state.readiness.register(s);
        }
        if let Some(f) = cfg.on_start {
            f(state.clone());
        }
        let server = serve(cfg.addr, cfg.listener, cfg.mode, &state)?;
        let (sensors, sensor_events) = off_the_workers(|| sensors(&state));

        let mut persisted = if enforce {
            StateFile::load(Some(&cfg.qc.state_dir), fs.node_root())
        } else {
            StateFile::in_memory()
        };
        let runner = executor.runner();
        if enforce && runner == Runner::Qoslet {
            stop_leftovers(&fs, cfg.settings.cgroup_driver, &mut persisted).await;
        }
        let (mut node, inventory) = Node::new(NodeParts {
            settings: cfg.settings.clone(),
            naming: Naming {
                driver: cfg.settings.cgroup_driver,
                runtime: cfg.runtime,
                node_root: fs.node_root().clone(),
                runner,
                enforce: cfg.qc.enforce.iter().map(|a| a.area()).collect(),
            },
            fs,
            mode: cfg.mode,
            validation: cfg.validation,
            state: state.clone(),
            summary,
            persisted,
            stats_interval: cfg.qc.stats_interval,
            cpu_pressure: cpu_pressure_policy(&cfg.qc, runner),
        });

        let (wakes, wake_rx) = mpsc::channel::<Wake>(256);
        let manager_cfg = ManagerConfig::from_settings(&cfg.settings, &cfg.qc);
        let mut manager = Manager::new(
            manager_cfg.clone(),
            NodeSignals {
                node_root: memory.node_root.clone(),
                capacity_bytes: Some(cfg.settings.capacity.memory_bytes),
                kubepods: memory.kubepods.clone(),
                pids: None,
            },
            Pipeline::new(action, executor.clone(), node.state_file()),
            inventory,
        )
        // Ranked on the usage less the inactive_file the statistics sampling reads; a value missed
        // by one sampling is still used, one older is read fresh.
        .with_usage(UsageCache::new(2 * cfg.qc.stats_interval));
        // Observe mode runs no manager: nothing would read what the sampling hands over.
        if enforce {
            node.share_usage(manager.usage());
            let paged_out = Arc::new(tokio::sync::Notify::new());
            node.tell_start_up_released(paged_out.clone());
            manager = manager.with_rehearsal_on(paged_out);
        }
        let decisions = manager.decisions();
        let observations = manager.observations();
        let conditions = manager.conditions();
        let releasing = manager.releasing();
        let (manager_stop, stop_rx) = watch::channel(false);
        let manager = enforce.then(|| tokio::spawn(manager.run(wake_rx, stop_rx)));
        // `evictionWakeups: housekeeping`: the kubelet's loop, no watcher and no sensor wake-ups.
        let wake_on_events = cfg.qc.eviction_wakeups == EvictionWakeups::Events;
        if enforce && wake_on_events {
            memory.spawn_watchers(
                &manager_cfg,
                cfg.settings.capacity.memory_bytes,
                &wakes,
                &releasing,
            );
        }
        state
            .readiness
            .set("eviction", true, format!("{:?} order", manager_cfg.order));

        Ok(Self {
            source,
            executor,
            node,
            sensors,
            sensor_events,
            wake_on_events,
            wakes,
            node_memory_ids: trees::memory_ids(&memory.node_root),
            decisions,
            observations,
            conditions,
            releasing,
            manager,
            manager_stop,
            server,
            state,
            housekeeping: cfg.qc.housekeeping_interval.max(MIN_HOUSEKEEPING),
            shutdown_grace: cfg.shutdown_grace,
            enforce,
            _lock: lock,
        })
    }

    /// The pass over the pods the source holds at start; the reconciler is ready after it.
    pub(super) fn first_pass(&mut self) {
        self.node.note_problems(&self.source.pods().problems);
        self.pass();
        self.node.on_conditions(&self.conditions.borrow());
        self.node.save_state();
        self.state
            .readiness
            .set("reconciler", true, "first pass done");
    }

    /// The select loop, until `stop` resolves: its reason.
    pub(super) async fn run_until(
        &mut self,
        stop: impl Future<Output = &'static str>,
    ) -> &'static str {
        let mut housekeeping = tokio::time::interval(self.housekeeping);
        info!("qoslet node is running; SIGINT, SIGTERM or SIGHUP stops it.");
        let mut stop = std::pin::pin!(stop);
        let mut release = ReleaseHold::default();
        let mut releasing = self.releasing.clone();
        loop {
            // While an evicted pod's exit hands its memory back, the node's reaction to the
            // eviction waits: the pass the MemoryPressure condition asks for, the decision's
            // report and state, the runtime's status. On a busy node (the bench's VM: its
            // vCPUs on one host thread) that work took 90-180 ms of CPU out of the victim's
            // exit (docs/benchmarks.md). Nothing is lost meanwhile: what comes waits in its
            // channel until it is read.
            let hold = release.until(*releasing.borrow_and_update());
            tokio::select! {
                // The release before what the eviction sent after it (the conditions, the
                // decision), which may be ready at the same time.
                biased;
                signal = &mut stop => return signal,
                Ok(()) = releasing.changed() => {}
                () = tokio::time::sleep_until(hold.unwrap_or_else(tokio::time::Instant::now)), if hold.is_some() => {}
                () = self.react(hold.is_some(), &mut housekeeping) => {}
            }
        }
    }

    /// Waits for the next thing to react to, in no order, and reacts to it; while `holding`,
    /// only to the sensors' events (drained throughout). Cancel-safe: each branch's future
    /// loses nothing when dropped, and a reaction runs to its end without a wait.
    async fn react(&mut self, holding: bool, housekeeping: &mut tokio::time::Interval) {
        tokio::select! {
            changed = self.source.changed(), if !holding => match changed {
                Ok(diff) => {
                    self.node.note_problems(&self.source.pods().problems);
                    // An event that changed nothing the pass reads (a Node heartbeat, an
                    // object written back unchanged) starts no pass.
                    if !diff.is_empty() {
                        info!(added = diff.pods_added.len(), changed = diff.pods_changed.len(), removed = diff.pods_removed.len(), "Pods changed.");
                        self.pass();
                        self.node.save_state();
                    }
                }
                Err(e) => warn!(error = %e, source = ?std::error::Error::source(&e), "Reading the pod source failed; keeping the last good state."),
            },
            Ok(()) = self.conditions.changed(), if !holding => {
                let now = self.conditions.borrow_and_update().clone();
                self.node.on_conditions(&now);
                // Admission depends on MemoryPressure: apply again when it changes.
                self.pass();
            }
            Some(d) = self.decisions.recv(), if !holding => self.node.on_eviction(&d),
            Ok(()) = self.observations.changed(), if !holding => {
                let obs = self.observations.borrow_and_update().clone();
                self.node.on_observations(&obs);
            }
            Some(e) = self.sensor_events.recv() => {
                if self.wake_on_events && let Some(w) = Wake::from_sensor(&e, &self.node_memory_ids) {
                    let _ = self.wakes.try_send(w);
                }
                self.node.on_sensor_event(&e);
            }
            _ = housekeeping.tick(), if !holding => {
                // A managed cgroup changed or removed behind qoslet's back is put back.
                if self.node.housekeeping(&self.sensors) {
                    self.pass();
                    self.node.save_state();
                }
            }
            () = self.executor.changed(), if !holding => self.node.refresh_status(&self.conditions.borrow(), self.executor.status()),
            // Held, with the sensors gone: the caller's stop and hold remain.
            else => std::future::pending().await,
        }
    }

    /// A pass over the source's pods under the node's conditions now.
    fn pass(&mut self) {
        let conditions = self.conditions.borrow().clone();
        self.node.pass(
            self.source.pods(),
            self.executor.as_ref(),
            &conditions,
            &self.sensors,
        );
    }

    /// The eviction in progress first (bounded by the grace period), then the pods, then the
    /// cgroups qoslet created.
    pub(super) async fn shutdown(mut self) {
        info!(
            "Stopping: the eviction in progress first, then the pods, then the cgroups qoslet created."
        );
        let _ = self.manager_stop.send(true);
        if let Some(mut t) = self.manager.take()
            && tokio::time::timeout(self.shutdown_grace, &mut t)
                .await
                .is_err()
        {
            warn!(
                grace_secs = self.shutdown_grace.as_secs(),
                "The eviction manager did not finish within the grace period; stopping it."
            );
            t.abort();
        }
        // Decisions made while draining still count and are persisted.
        while let Ok(d) = self.decisions.try_recv() {
            self.node.on_eviction(&d);
        }
        self.executor.stop_all(self.shutdown_grace).await;
        if self.enforce {
            self.node.cgroups.remove_all();
            self.node.save_state();
        }
        self.server.abort();
        info!("qoslet stopped.");
    }
}

impl NodeMemory {
    fn open(cfg: &RunConfig, memory_tree: crate::cgroup::Tree) -> Self {
        let fs = &cfg.fs;
        let kubepods = cfg
            .settings
            .cgroups_per_qos
            .then(|| {
                let name = render(
                    cfg.settings.cgroup_driver,
                    &cfg.settings.cgroup_root,
                    &["kubepods"],
                );
                CgroupPath::under_root(&name, fs.node_root()).ok()
            })
            .flatten()
            .map(|path| MemoryCgroup::new(CgroupBeneath::new(fs, memory_tree, &path)));
        Self {
            node_root: MemoryCgroup::new(CgroupBeneath::new(fs, memory_tree, &CgroupPath::root())),
            kubepods,
        }
    }

    /// The node root's memory watcher, and the pods' cgroup's where it crosses its own level
    /// (`allocatableMemory.available`) before the node's: when its limit is lower than the
    /// node's capacity less that threshold.
    fn spawn_watchers(
        &self,
        manager: &ManagerConfig,
        capacity_bytes: i64,
        wakes: &mpsc::Sender<Wake>,
        releasing: &watch::Receiver<Option<u64>>,
    ) {
        let node = WatchConfig {
            node_root: self.node_root.clone(),
            level_bytes: manager.watch_level("memory.available", capacity_bytes),
            poll: Some(WATCH_POLL),
        };
        if let Err(e) = crate::eviction::watch::spawn_watcher_pausing(
            node,
            wakes.clone(),
            Some(releasing.clone()),
        ) {
            warn!(error = %e, "Memory watcher unavailable; eviction runs on sensor events and housekeeping.");
        }
        let kubepods_limit = self
            .kubepods
            .as_ref()
            .and_then(|k| Some((k.clone(), k.read().ok()?.limit_bytes?)));
        if let Some((kubepods, limit)) = kubepods_limit
            && let level = manager.watch_level("allocatableMemory.available", limit)
            && level < limit
        {
            let pods = WatchConfig {
                node_root: kubepods,
                level_bytes: level,
                poll: Some(WATCH_POLL),
            };
            if let Err(e) = crate::eviction::watch::spawn_watcher_pausing(
                pods,
                wakes.clone(),
                Some(releasing.clone()),
            ) {
                warn!(error = %e, "Memory watcher of the pods' cgroup unavailable; allocatableMemory.available is read on the node's wake-ups and housekeeping.");
            }
        }
    }
}

/// Runs `f`, which blocks (loading the eBPF programs takes seconds under emulation), with this
/// worker's queued tasks handed to another thread meanwhile. The server task spawned just before
/// sits in this worker's LIFO slot, which no other worker steals: run in place, `f` held every
/// probe unanswered until it returned (a VM's `/metrics` request waited out its 5 s). A
/// current-thread runtime (unit tests) has no other thread to hand them to.
fn off_the_workers<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Serves HTTP on the mode's listener (or a new one on `addr`).
fn serve(
    addr: SocketAddr,
    listener: Option<std::net::TcpListener>,
    mode: Mode,
    state: &Arc<AgentState>,
) -> Result<AbortHandle, NodeError> {
    let bind_err = |source| NodeError::Bind(BindError { addr, source });
    let listener = match listener {
        Some(l) => l
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(l))
            .map_err(bind_err)?,
        None => server::serve::listen(addr).map_err(bind_err)?,
    };
    let (local, serve) = server::serve_on(
        listener,
        state.clone(),
        server::serve::ServeLimits::default(),
    )
    .map_err(NodeError::Bind)?;
    let task = tokio::spawn(serve);
    info!(addr = %local, mode = ?mode, "Serving /metrics, /healthz, /readyz, /stats/summary and /status.");
    Ok(task.abort_handle())
}

/// The CPU-pressure controller's policy, when it is on. The BestEffort tier is qoslet's where it
/// runs the pods itself; the kubelet's otherwise, so there writing it is opt-in (the
/// `cpuPressure` area of `enforce`).
fn cpu_pressure_policy(qc: &QosletConfiguration, runner: Runner) -> Option<CpuPressureConfig> {
    let owns_tier = runner == Runner::Qoslet || qc.enforce.contains(&EnforceArea::CpuPressure);
    let policy = match qc.cpu_pressure.policy() {
        Ok(p) => qc.cpu_pressure.enabled.unwrap_or(owns_tier).then_some(p)?,
        Err((field, message)) => {
            warn!(
                field,
                message, "The CPU-pressure controller is off: its configuration is invalid."
            );
            return None;
        }
    };
    info!(
        latency_target_ms = policy.latency_target.as_millis() as u64,
        protect_burstable = policy.protect_burstable,
        "The CPU-pressure controller protects latency-sensitive pods from BestEffort CPU."
    );
    Some(policy)
}

#[cfg(test)]
mod tests {
    use tokio::time::{Duration, Instant, advance};

    use super::{RELEASE_HOLD, ReleaseHold};

    /// The hold lasts from the node's first sight of an eviction being released until it is
    /// released or `RELEASE_HOLD` has passed; the next eviction is held anew.
    #[tokio::test(start_paused = true)]
    async fn the_hold_ends_at_the_release_or_after_release_hold() {
        let mut hold = ReleaseHold::default();
        assert_eq!(hold.until(None), None);
        let seen = Instant::now();
        assert_eq!(hold.until(Some(1)), Some(seen + RELEASE_HOLD));
        advance(RELEASE_HOLD / 2).await;
        assert_eq!(
            hold.until(Some(1)),
            Some(seen + RELEASE_HOLD),
            "from the first sight"
        );
        advance(RELEASE_HOLD / 2).await;
        assert_eq!(hold.until(Some(1)), None, "no longer than RELEASE_HOLD");
        advance(Duration::from_secs(5)).await;
        assert_eq!(
            hold.until(Some(1)),
            None,
            "the same eviction is not held again"
        );
        let next = Instant::now();
        assert_eq!(
            hold.until(Some(2)),
            Some(next + RELEASE_HOLD),
            "the next is"
        );
        assert_eq!(hold.until(None), None, "released");
        assert_eq!(hold.until(Some(2)), Some(Instant::now() + RELEASE_HOLD));
    }
}
