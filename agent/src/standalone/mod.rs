//! The standalone node: pods from a manifest directory, run as processes in real cgroups, with
//! the cgroup reconciler, the sensors, the eviction manager and the HTTP endpoints together.
//!
//! One loop owns the desired state. A manifest change or a housekeeping tick recomputes the plan
//! (policy), reconciles cgroups, applies it to the runtime and hands the pods to the eviction
//! manager; sensor events feed the eviction manager's wake-ups, oom_score_adj re-application and
//! the metrics.

mod cleanup;
mod eviction_action;
mod housekeeping;
mod node_root;
mod status;
mod summary;
mod summary_targets;
mod sync;
mod trees;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

pub use node_root::{NodeRoot, NodeRootError};

use crate::{
    cgroup::{self, CgroupFs, CgroupPath, ContainerRuntime, Mode, Mounts, Naming},
    config::{CapacityOverride, ConfigError, KubeletConfig, QosletConfiguration, node_settings},
    eviction::{CgroupKill, Inventory, Manager, ManagerConfig, NodeSignals, Wake},
    policy::settings::Capacity,
    runtime::{BackoffConfig, Runtime, RuntimeConfig},
    sensors::{SensorMode, Sensors, SensorsConfig},
    server::{self, AgentState, Metrics, Readiness, StatusStore, metrics::SensorLabels},
    source::watch::ManifestWatch,
    workload::ValidationOptions,
};

pub use sync::Synced;

/// How the standalone node was asked to run.
#[derive(Debug, Clone)]
pub struct StandaloneOptions {
    pub kubelet_config: PathBuf,
    pub config: Option<PathBuf>,
    pub dir: PathBuf,
    /// Compute and report, write nothing, evict nobody, start nothing.
    pub observe: bool,
    /// Container logs.
    pub log_dir: PathBuf,
    /// How long pods get to stop when qoslet stops.
    pub shutdown_grace: Duration,
}

#[derive(Debug, Error)]
pub enum StandaloneError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    NodeRoot(#[from] NodeRootError),
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> StandaloneError + '_ {
    move |e| StandaloneError::Setup(format!("{what}: {e}"))
}

/// Runs until SIGINT or SIGTERM; then stops the pods and removes the cgroups qoslet created.
pub async fn run(
    opts: StandaloneOptions,
    capacity: impl FnOnce(&CapacityOverride, Option<i64>) -> Result<Capacity, String>,
) -> Result<(), StandaloneError> {
    let kc = KubeletConfig::load(&opts.kubelet_config)?;
    let qc = match &opts.config {
        Some(f) => QosletConfiguration::load(f)?,
        None => QosletConfiguration::default(),
    };
    let mode = if opts.observe || qc.mode == crate::config::Mode::Observe {
        Mode::Observe
    } else {
        Mode::Enforce
    };
    let addr: SocketAddr = qc
        .metrics_address
        .parse()
        .map_err(setup("QosletConfiguration metricsAddress"))?;

    let mounts = Mounts::detect().map_err(setup("detecting the cgroup layout"))?;
    let node_root_path = CgroupPath::parse(qc.node_root_cgroup.as_deref().unwrap_or("/"))
        .map_err(setup("QosletConfiguration nodeRootCgroup"))?;
    let node_memory = qc
        .capacity
        .memory
        .as_deref()
        .map(|m| {
            m.parse::<crate::policy::quantity::Quantity>()
                .map(|q| q.value())
        })
        .transpose()
        .map_err(setup("QosletConfiguration capacity.memory"))?;
    let node_root = if mode == Mode::Enforce {
        NodeRoot::ensure(&mounts, &node_root_path, node_memory)?
    } else {
        NodeRoot::default()
    };
    let fs = CgroupFs::open(mounts.clone(), node_root_path.clone())
        .map_err(setup("opening the node root cgroup"))?;
    if mode == Mode::Enforce && !cgroup::oom::can_lower_scores() {
        warn!(
            "qoslet lacks CAP_SYS_RESOURCE: negative oom_score_adj (Guaranteed pods' -997, qoslet's own -999) cannot be set; give the DaemonSet that capability."
        );
    }
    if mode == Mode::Enforce
        && let Err(e) = cgroup::set_own_oom_score()
    {
        warn!(error = %e, "Could not set qoslet's own oom_score_adj to -999.");
    }
    let root_limit = cgroup::node_root_memory_limit(&fs).ok().flatten();
    let capacity = capacity(&qc.capacity, root_limit).map_err(StandaloneError::Setup)?;
    let mut settings = node_settings(&opts.kubelet_config, &kc, &qc, capacity)?;
    // The node root takes the place of cgroupRoot; names below it are the kubelet's.
    settings.cgroup_root = "/".into();
    let naming = Naming {
        driver: settings.cgroup_driver,
        runtime: ContainerRuntime::Standalone,
        node_root: node_root_path.clone(),
        create_containers: true,
    };
    let validation = ValidationOptions {
        pod_group_preemption_policy: kc.gate("PodGroupPreemptionPolicy") == Some(true),
    };
    let mut manifests = ManifestWatch::new(&opts.dir, Duration::from_millis(200), validation)
        .map_err(setup("watching the manifest directory"))?;

    // Eviction: the node root is the node; kubepods gives allocatableMemory.available.
    let memory_tree = trees::memory_tree(mounts.trees.keys().copied())
        .ok_or_else(|| StandaloneError::Setup("no memory cgroup hierarchy is mounted".into()))?;
    let node_root_memory = trees::memory_cgroup(
        memory_tree,
        fs.display_path(memory_tree, &CgroupPath::root()),
    );
    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        log_dir: opts.log_dir.clone(),
        backoff: BackoffConfig::default(),
    }));
    let unified_tree = trees::unified_tree(mounts.trees.keys().copied());
    let summary = summary::CgroupSummary::new(
        summary::StatsCgroup {
            memory: Some(node_root_memory.clone()),
            cpu: unified_tree.map(|t| fs.display_path(t, &CgroupPath::root())),
        },
        runtime.clone(),
    );
    let state = Arc::new(AgentState {
        metrics: Metrics::new(),
        readiness: Readiness::default(),
        status: StatusStore::default(),
        summary: Box::new(summary.clone()),
    });
    for s in ["sensors", "reconciler", "eviction"] {
        state.readiness.register(s);
    }
    let (local, serve) = server::bind(addr, state.clone())
        .await
        .map_err(|e| StandaloneError::Setup(format!("{e}: {}", e.source)))?;
    let server_task = tokio::spawn(serve);
    info!(addr = %local, mode = ?mode, "Serving /metrics, /healthz, /readyz, /stats/summary and /status.");

    let (sensors, mut sensor_events) = Sensors::start(SensorsConfig {
        ebpf: qc.ebpf.enabled,
        ..SensorsConfig::default()
    });
    report_sensors(&state, &sensors);
    release_freed_memory();

    let (inventory_tx, inventory_rx) = watch::channel(Arc::new(Inventory::default()));
    let (wake_tx, wake_rx) = mpsc::channel::<Wake>(256);
    let manager_cfg = ManagerConfig::from_settings(&settings, &qc);
    let manager = Manager::new(
        manager_cfg.clone(),
        NodeSignals {
            node_root: node_root_memory.clone(),
            capacity_bytes: Some(settings.capacity.memory_bytes),
            kubepods: None,
            pids: None,
        },
        eviction_action::RuntimeEviction::new(runtime.clone(), CgroupKill),
        inventory_rx,
    );
    let eviction_stats = manager.stats();
    let conditions = manager.conditions();
    let manager_task = if mode == Mode::Enforce {
        Some(tokio::spawn(manager.run(wake_rx)))
    } else {
        drop(wake_rx);
        None
    };
    if mode == Mode::Enforce {
        let watch_cfg = crate::eviction::watch::WatchConfig {
            node_root: node_root_memory.clone(),
            level_bytes: manager_cfg.watch_level(settings.capacity.memory_bytes),
            poll: Some(Duration::from_millis(100)),
        };
        if let Err(e) = crate::eviction::watch::spawn_watcher(watch_cfg, wake_tx.clone()) {
            warn!(error = %e, "Memory watcher unavailable; eviction runs on sensor events and housekeeping.");
        }
    }
    state
        .readiness
        .set("eviction", true, format!("{:?} order", manager_cfg.order));

    let mut synced = sync::Synced::new(
        settings,
        naming,
        fs,
        mode,
        runtime.clone(),
        state.clone(),
        validation,
        inventory_tx,
        summary,
    );
    synced.node_memory_ids = trees::memory_ids(&node_root_memory);
    let first = manifests
        .reload()
        .map_err(setup("reading the manifest directory"))?;
    synced.note_problems(&first.new_problems);
    synced.sync(&manifests, &conditions.borrow(), &sensors);
    state.readiness.set("reconciler", true, "first pass done");

    let mut housekeeping =
        tokio::time::interval(qc.housekeeping_interval.max(Duration::from_millis(100)));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(setup("watching SIGTERM"))?;
    let mut conditions_rx = conditions.clone();
    info!(dir = %opts.dir.display(), "qoslet standalone node is running; Ctrl-C stops it.");
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            changed = manifests.changed() => match changed {
                Ok(diff) => {
                    synced.note_problems(&diff.new_problems);
                    if !diff.is_empty() {
                        info!(added = diff.pods_added.len(), changed = diff.pods_changed.len(), removed = diff.pods_removed.len(), "Manifests changed.");
                    }
                    synced.sync(&manifests, &conditions.borrow(), &sensors);
                }
                Err(e) => warn!(error = %e, "Reading the manifest directory failed; keeping the last good state."),
            },
            Ok(()) = conditions_rx.changed() => {
                // Admission depends on MemoryPressure: re-apply when it changes.
                synced.sync(&manifests, &conditions_rx.borrow(), &sensors);
            }
            Some(e) = sensor_events.recv() => {
                if let Some(w) = Wake::from_sensor(&e, &synced.node_memory_ids) {
                    let _ = wake_tx.try_send(w);
                }
                synced.on_sensor_event(&e);
            }
            _ = housekeeping.tick() => {
                synced.housekeeping(&eviction_stats, &conditions.borrow(), &sensors);
            }
            () = runtime.changed() => synced.on_runtime_change(&conditions.borrow()),
        }
    }
    info!("Stopping: pods first, then the cgroups qoslet created.");
    if let Some(t) = manager_task {
        t.abort();
    }
    runtime.stop_all(opts.shutdown_grace).await;
    if mode == Mode::Enforce {
        synced.remove_cgroups();
        node_root.remove();
    }
    server_task.abort();
    info!("qoslet stopped.");
    Ok(())
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
