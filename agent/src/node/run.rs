//! The node's run loop: everything a mode hands in (source, executor, eviction action) wired to
//! the cgroups, the sensors, the eviction manager and the HTTP server, until a signal; then a
//! drain (the pass or eviction in progress finishes, bounded by the grace period), the pods
//! stopped and the cgroups qoslet created removed.
//!
//! Threading (docs/architecture.md, "Threads"): one task owns the node and runs every pass;
//! the eviction manager, the memory watcher, the sensors' readers and the HTTP server run on
//! their own tasks and reach the node through channels only.

use std::{io, net::SocketAddr, os::fd::AsFd as _, sync::Arc, time::Duration};

use thiserror::Error;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, watch},
};
use tracing::{info, warn};

use super::{
    Node, NodeParts, SensorControl,
    seams::{PodExecutor, PodSource},
    summary::{CgroupSummary, StatsCgroup},
    trees,
};
use crate::{
    cgroup::{
        self, CgroupBeneath, CgroupFs, CgroupPath, ContainerRuntime, Mode, Naming, Runner,
        fs::OpenRootError,
    },
    config::QosletConfiguration,
    eviction::{
        CgroupKill, EvictionAction, EvictionRequest, Manager, ManagerConfig, MemoryCgroup,
        NodeSignals, Pipeline, PodCgroups, Wake, watch::WatchConfig,
    },
    exit,
    persist::{EvictionMark, NodeLock, StateError, StateFile},
    policy::{
        cgroup_name::render,
        pod::PodKey,
        settings::{CgroupDriver, NodeSettings},
    },
    sensors::{SensorEvent, SensorMode, Sensors, SensorsConfig},
    server::{self, AgentState, BindError, Metrics, Readiness, StatusStore, metrics::SensorLabels},
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
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NoMemoryHierarchy => exit::OSFILE,
            Self::State(StateError::Locked { .. }) | Self::Bind(_) => exit::UNAVAILABLE,
            Self::NodeRoot(_) | Self::State(_) | Self::Signal { .. } => exit::OSERR,
        }
    }
}

/// What the mode decided: the node's settings, its cgroups and how it runs.
pub struct RunConfig {
    pub settings: NodeSettings,
    pub qc: QosletConfiguration,
    pub mode: Mode,
    /// The node root, opened by the mode at start ([`super::startup::ModeStart::open_root`]).
    pub fs: Arc<CgroupFs>,
    /// How the container runtime names container cgroups.
    pub runtime: ContainerRuntime,
    pub validation: ValidationOptions,
    pub addr: SocketAddr,
    /// `addr` bound already by the mode (cluster mode answers `/healthz` on it while it waits
    /// for the API server), served from here on; `None` binds `addr`.
    pub listener: Option<std::net::TcpListener>,
    /// How long pods get to stop at shutdown, and how long a pass or an eviction in progress
    /// may take to finish.
    pub shutdown_grace: Duration,
    /// Called once the agent's state exists, before the first pass: a mode's own tasks (cluster
    /// mode: the API watch readiness, node conditions and the lease) read and report through it.
    pub on_start: Option<Box<dyn FnOnce(Arc<AgentState>) + Send>>,
    /// The Node object's name (cluster mode), which `/stats/summary` reports as `nodeName`, as the
    /// kubelet does; `None`: the hostname (standalone).
    pub node_name: Option<String>,
}

/// Runs the node until SIGINT, SIGTERM or SIGHUP; then drains and stops.
pub async fn run<S, E, A>(
    cfg: RunConfig,
    source: S,
    executor: Arc<E>,
    action: A,
) -> Result<(), NodeError>
where
    S: PodSource,
    E: PodExecutor,
    A: EvictionAction + 'static,
{
    let mut signals = Signals::new()?;
    let enforce = cfg.mode == Mode::Enforce;
    if enforce && !cgroup::oom::can_lower_scores() {
        warn!(
            "qoslet lacks CAP_SYS_RESOURCE: negative oom_score_adj (Guaranteed pods' -997, qoslet's own -999) cannot be set; give the DaemonSet that capability."
        );
    }
    if enforce && let Err(e) = cgroup::set_own_oom_score() {
        warn!(error = %e, "Could not set qoslet's own oom_score_adj to -999.");
    }
    let ebpf = SensorsConfig::from(&cfg.qc.ebpf);
    let sensors = move |state: &AgentState| {
        let (sensors, events) = Sensors::start(ebpf);
        report_sensors(state, &sensors);
        release_freed_memory();
        (sensors, events)
    };
    drive(cfg, source, executor, action, sensors, async move {
        signals.next().await
    })
    .await
}

/// The loop of [`run`] with the machine's parts handed in: `sensors` starts the sensors once the
/// agent's state exists (the kernel's, or a fake), and `stop` resolves with the reason the node
/// stops (a signal). The node's tests run it over a cgroup tree in a temporary directory.
pub(super) async fn drive<S, E, A, C>(
    cfg: RunConfig,
    mut source: S,
    executor: Arc<E>,
    action: A,
    sensors: impl FnOnce(&AgentState) -> (C, mpsc::Receiver<SensorEvent>),
    stop: impl Future<Output = &'static str>,
) -> Result<(), NodeError>
where
    S: PodSource,
    E: PodExecutor,
    A: EvictionAction + 'static,
    C: SensorControl,
{
    let enforce = cfg.mode == Mode::Enforce;
    let fs = cfg.fs.clone();
    let memory_tree = trees::memory_tree(fs.trees()).ok_or(NodeError::NoMemoryHierarchy)?;
    let node_root = |tree| CgroupBeneath::new(&fs, tree, &CgroupPath::root());
    // One instance per node root: the lock is taken before anything is written.
    let _lock = if enforce {
        Some(NodeLock::acquire(&node_root(memory_tree)).map_err(NodeError::State)?)
    } else {
        None
    };
    let node_root_memory = MemoryCgroup::new(node_root(memory_tree));
    // `allocatableMemory.available`, which the kubelet adds beside every hard
    // `memory.available` threshold, reads the pods' cgroup (kubepods) the kubelet keeps.
    let kubepods_memory = cfg
        .settings
        .cgroups_per_qos
        .then(|| {
            let name = render(
                cfg.settings.cgroup_driver,
                &cfg.settings.cgroup_root,
                &["kubepods"],
            );
            CgroupPath::under_root(&name, cfg.fs.node_root()).ok()
        })
        .flatten()
        .map(|path| MemoryCgroup::new(CgroupBeneath::new(&fs, memory_tree, &path)));
    let summary = CgroupSummary::new(
        StatsCgroup {
            memory: Some(node_root_memory.clone()),
            cpu: trees::unified_tree(fs.trees()).map(node_root),
        },
        cfg.node_name.clone(),
    );
    let state = Arc::new(AgentState {
        metrics: Metrics::new(),
        readiness: Readiness::default(),
        status: StatusStore::default(),
        summary: Box::new(summary.clone()),
        conditions: Default::default(),
    });
    for s in ["sensors", "reconciler", "eviction"] {
        state.readiness.register(s);
    }
    if let Some(f) = cfg.on_start {
        f(state.clone());
    }
    let bind_err = |source| {
        NodeError::Bind(BindError {
            addr: cfg.addr,
            source,
        })
    };
    let listener = match cfg.listener {
        Some(l) => l
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(l))
            .map_err(bind_err)?,
        None => server::serve::listen(cfg.addr).map_err(bind_err)?,
    };
    let (local, serve) = server::serve_on(
        listener,
        state.clone(),
        server::serve::ServeLimits::default(),
    )
    .map_err(NodeError::Bind)?;
    let server_task = tokio::spawn(serve);
    info!(addr = %local, mode = ?cfg.mode, "Serving /metrics, /healthz, /readyz, /stats/summary and /status.");

    let (sensors, mut sensor_events) = sensors(&state);

    let mut persisted = if enforce {
        StateFile::load(Some(&cfg.qc.state_dir), cfg.fs.node_root())
    } else {
        StateFile::in_memory()
    };
    let runner = executor.runner();
    if enforce && runner == Runner::Qoslet {
        stop_leftovers(&fs, cfg.settings.cgroup_driver, &mut persisted).await;
    }

    // The BestEffort tier is qoslet's where it runs the pods itself; the kubelet's otherwise,
    // so there writing it is opt-in (the `cpuPressure` area of `enforce`).
    let owns_tier = runner == Runner::Qoslet
        || cfg
            .qc
            .enforce
            .contains(&crate::config::EnforceArea::CpuPressure);
    let cpu_pressure = match cfg.qc.cpu_pressure.policy() {
        Ok(p) => cfg
            .qc
            .cpu_pressure
            .enabled
            .unwrap_or(owns_tier)
            .then_some(p),
        Err((field, message)) => {
            warn!(
                field,
                message, "The CPU-pressure controller is off: its configuration is invalid."
            );
            None
        }
    };
    if let Some(p) = &cpu_pressure {
        info!(
            latency_target_ms = p.latency_target.as_millis() as u64,
            protect_burstable = p.protect_burstable,
            "The CPU-pressure controller protects latency-sensitive pods from BestEffort CPU."
        );
    }
    let (mut node, inventory_rx) = Node::new(NodeParts {
        settings: cfg.settings.clone(),
        naming: Naming {
            driver: cfg.settings.cgroup_driver,
            runtime: cfg.runtime,
            node_root: cfg.fs.node_root().clone(),
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
        cpu_pressure,
    });

    let state_file = node.state_file();
    let (wake_tx, wake_rx) = mpsc::channel::<Wake>(256);
    let manager_cfg = ManagerConfig::from_settings(&cfg.settings, &cfg.qc);
    let mut manager = Manager::new(
        manager_cfg.clone(),
        NodeSignals {
            node_root: node_root_memory.clone(),
            capacity_bytes: Some(cfg.settings.capacity.memory_bytes),
            kubepods: kubepods_memory.clone(),
            pids: None,
        },
        Pipeline::new(action, executor.clone(), state_file),
        inventory_rx,
    );
    let mut decisions = manager.decisions();
    let mut observations = manager.observations();
    let conditions = manager.conditions();
    let (stop_tx, stop_rx) = watch::channel(false);
    let manager_task = enforce.then(|| tokio::spawn(manager.run(wake_rx, stop_rx)));
    // `evictionWakeups: housekeeping`: the kubelet's loop, no watcher and no sensor wake-ups.
    let wake_on_events = cfg.qc.eviction_wakeups == crate::config::EvictionWakeups::Events;
    if enforce && wake_on_events {
        let watch_cfg = WatchConfig {
            node_root: node_root_memory.clone(),
            level_bytes: manager_cfg
                .watch_level("memory.available", cfg.settings.capacity.memory_bytes),
            // At the level: earlyoom's 100 ms divided by ten; far from it, up to 1 s.
            poll: Some(Duration::from_millis(10)),
        };
        if let Err(e) = crate::eviction::watch::spawn_watcher(watch_cfg, wake_tx.clone()) {
            warn!(error = %e, "Memory watcher unavailable; eviction runs on sensor events and housekeeping.");
        }
        // The pods' cgroup crosses its own level (`allocatableMemory.available`) before the
        // node's when its limit is lower than the node's capacity less that threshold.
        let kubepods_limit = kubepods_memory
            .as_ref()
            .and_then(|k| Some((k.clone(), k.read().ok()?.limit_bytes?)));
        if let Some((kubepods, limit)) = kubepods_limit
            && let level = manager_cfg.watch_level("allocatableMemory.available", limit)
            && level < limit
        {
            let watch_cfg = WatchConfig {
                node_root: kubepods,
                level_bytes: level,
                poll: Some(Duration::from_millis(10)),
            };
            if let Err(e) = crate::eviction::watch::spawn_watcher(watch_cfg, wake_tx.clone()) {
                warn!(error = %e, "Memory watcher of the pods' cgroup unavailable; allocatableMemory.available is read on the node's wake-ups and housekeeping.");
            }
        }
    }
    state
        .readiness
        .set("eviction", true, format!("{:?} order", manager_cfg.order));
    let node_memory_ids = trees::memory_ids(&node_root_memory);

    node.note_problems(&source.pods().problems);
    node.pass(
        source.pods(),
        executor.as_ref(),
        &conditions.borrow(),
        &sensors,
    );
    node.on_conditions(&conditions.borrow());
    node.save_state();
    state.readiness.set("reconciler", true, "first pass done");

    let mut housekeeping =
        tokio::time::interval(cfg.qc.housekeeping_interval.max(Duration::from_millis(100)));
    let mut conditions_rx = conditions.clone();
    info!("qoslet node is running; SIGINT, SIGTERM or SIGHUP stops it.");
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            signal = &mut stop => {
                info!(signal, "Stopping on a signal.");
                break;
            }
            changed = source.changed() => match changed {
                Ok(diff) => {
                    node.note_problems(&source.pods().problems);
                    // An event that changed nothing the pass reads (a Node heartbeat, an object
                    // written back unchanged) starts no pass: the desired state is the last one.
                    if !diff.is_empty() {
                        info!(added = diff.pods_added.len(), changed = diff.pods_changed.len(), removed = diff.pods_removed.len(), "Pods changed.");
                        node.pass(source.pods(), executor.as_ref(), &conditions.borrow(), &sensors);
                        node.save_state();
                    }
                }
                Err(e) => warn!(error = %e, source = ?std::error::Error::source(&e), "Reading the pod source failed; keeping the last good state."),
            },
            Ok(()) = conditions_rx.changed() => {
                let now = conditions_rx.borrow_and_update().clone();
                node.on_conditions(&now);
                // Admission depends on MemoryPressure: apply again when it changes.
                node.pass(source.pods(), executor.as_ref(), &now, &sensors);
            }
            Some(d) = decisions.recv() => node.on_eviction(&d),
            Ok(()) = observations.changed() => {
                let obs = observations.borrow_and_update().clone();
                node.on_observations(&obs);
            }
            Some(e) = sensor_events.recv() => {
                if wake_on_events && let Some(w) = Wake::from_sensor(&e, &node_memory_ids) {
                    let _ = wake_tx.try_send(w);
                }
                node.on_sensor_event(&e);
            }
            _ = housekeeping.tick() => {
                if node.housekeeping(&sensors) {
                    // A managed cgroup was changed or removed behind qoslet's back.
                    node.pass(source.pods(), executor.as_ref(), &conditions.borrow(), &sensors);
                    node.save_state();
                }
            }
            () = executor.changed() => node.refresh_status(&conditions.borrow(), executor.status()),
        }
    }

    info!(
        "Stopping: the eviction in progress first, then the pods, then the cgroups qoslet created."
    );
    let _ = stop_tx.send(true);
    if let Some(mut t) = manager_task
        && tokio::time::timeout(cfg.shutdown_grace, &mut t)
            .await
            .is_err()
    {
        warn!(
            grace_secs = cfg.shutdown_grace.as_secs(),
            "The eviction manager did not finish within the grace period; stopping it."
        );
        t.abort();
    }
    // Decisions made while draining still count and are persisted.
    while let Ok(d) = decisions.try_recv() {
        node.on_eviction(&d);
    }
    executor.stop_all(cfg.shutdown_grace).await;
    if enforce {
        node.cgroups.remove_all();
        node.save_state();
    }
    server_task.abort();
    info!("qoslet stopped.");
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP: each stops the node the same way.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, NodeError> {
        let watch = |kind, name| {
            signal(kind).map_err(|source| NodeError::Signal {
                signal: name,
                source,
            })
        };
        Ok(Self {
            int: watch(SignalKind::interrupt(), "SIGINT")?,
            term: watch(SignalKind::terminate(), "SIGTERM")?,
            hup: watch(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// After a crash (SIGKILL, power loss) the earlier run's pods may still run in the cgroups it
/// created, unsupervised: qoslet cannot adopt a process it did not start (it would never learn
/// its exit status), so it stops them and removes their cgroups; the pass then starts the pods
/// again. Evicted pods stay evicted: that is in the state file, or (after a crash between an
/// eviction's kill and the state file's write) in the [`EvictionMark`] on the pod's cgroup v2
/// directory, read back here before the cgroup is removed. A mark counts only on the cgroup of
/// the pod it names: a pod's processes that can write their own cgroup's attributes cannot keep
/// another pod from starting again.
async fn stop_leftovers(fs: &Arc<CgroupFs>, driver: CgroupDriver, persisted: &mut StateFile) {
    let mut paths = persisted.created_cgroups();
    if paths.is_empty() {
        return;
    }
    paths.sort_by_key(|p| std::cmp::Reverse(p.depth()));
    let procs_tree = fs.mounts().procs_tree();
    let unified = trees::unified_tree(fs.trees());
    let mut stopped = 0;
    for p in &paths {
        let dir = |tree| CgroupBeneath::new(fs, tree, p);
        let cgroups = PodCgroups {
            procs: procs_tree.map(dir).into_iter().collect(),
            unified: unified.map(dir),
        };
        if !cgroups
            .procs
            .iter()
            .any(|d| d.read_procs().is_ok_and(|v| !v.is_empty()))
        {
            continue;
        }
        let req = EvictionRequest {
            pod: PodKey {
                namespace: String::new(),
                name: p.to_string(),
                uid: String::new(),
            },
            cgroups,
            grace: Duration::ZERO,
            message: "left by an earlier run of qoslet".into(),
            annotations: Default::default(),
            seen: Default::default(),
            signal: String::new(),
            hard: true,
            unit: None,
            revision: 0,
        };
        match CgroupKill.evict(&req).await {
            Ok(_) => stopped += 1,
            Err(e) => {
                warn!(cgroup = %p, error = %e, "Could not stop a process left by an earlier run.");
            }
        }
    }
    let mut recovered = 0;
    for (t, p) in unified
        .iter()
        .flat_map(|&t| paths.iter().map(move |p| (t, p)))
    {
        let Some(mark) = fs
            .open_dir_fd(t, p)
            .ok()
            .and_then(|d| EvictionMark::read(d.as_fd()))
        else {
            continue;
        };
        if cgroup::name::check_pod_component(p, driver, &mark.uid).is_err() {
            warn!(cgroup = %p, uid = %mark.uid, "An eviction mark names a pod other than its cgroup's; ignored.");
            continue;
        }
        persisted.record_evicted(&mark.key(), mark.spec, &mark.message, mark.at);
        recovered += 1;
    }
    let mut removed = 0;
    for p in &paths {
        let gone = fs.trees().map(|t| fs.rmdir(t, p)).all(|r| r.is_ok());
        removed += usize::from(gone);
    }
    info!(
        cgroups = paths.len(),
        stopped,
        removed,
        recovered,
        "Stopped what an earlier run of qoslet left running and removed its cgroups."
    );
    persisted.set_created_cgroups(&Default::default());
}

/// Loading the sensors parses the kernel's BTF and leaves its freed memory scattered in the heap,
/// which glibc keeps resident; hand whole free pages back to the kernel once.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn report_sensors(state: &AgentState, sensors: &Sensors) {
    let mut active = Vec::new();
    for st in sensors.statuses() {
        let on = st.mode != SensorMode::Off;
        if on {
            active.push(format!("{} ({})", st.name, st.source));
        }
        state
            .metrics
            .sensor_active
            .get_or_create(&SensorLabels {
                sensor: st.name.into(),
                source: st.source.clone(),
            })
            .set(on.into());
    }
    state.status.update(|s| s.node.sensors = active.clone());
    state.readiness.set("sensors", true, active.join(", "));
}
