//! The standalone node: pods from a manifest directory, run as processes by qoslet's own runtime
//! in real cgroups, evicted by a cgroup kill. This module only holds what is standalone: its
//! options, the node root cgroup (created when missing, with the configured memory limit), and
//! the manifest directory's watch ([`watch`]), and the wiring of it, the process executor and the cgroup-kill action into
//! [`crate::node`].

mod node_root;
pub mod watch;

use std::{path::PathBuf, sync::Arc, time::Duration};

use thiserror::Error;

pub(crate) use node_root::{NodeRoot, NodeRootError};

use watch::{ManifestDirError, ManifestWatch};

use crate::{
    cgroup::{ContainerRuntime, Mounts},
    config::{CapacityOverride, KubeletConfig},
    eviction::CgroupKill,
    exit,
    node::{self, ModeStart, NodeError, PodExecutor, StartError},
    policy::{quantity::Quantity, settings::Capacity},
    runtime::{BackoffConfig, Runtime, RuntimeConfig},
};

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
    Start(#[from] StartError),
    #[error(transparent)]
    NodeRoot(#[from] NodeRootError),
    #[error("cannot watch the manifest directory")]
    Manifests(#[source] ManifestDirError),
    #[error(transparent)]
    Node(#[from] NodeError),
}

impl StandaloneError {
    /// The process's exit status: 64 for configuration errors only.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Start(e) => e.exit_code(),
            Self::NodeRoot(_) | Self::Manifests(_) => exit::OSERR,
            Self::Node(e) => e.exit_code(),
        }
    }
}

/// Runs until SIGINT, SIGTERM or SIGHUP; then stops the pods and removes the cgroups qoslet
/// created.
pub async fn run(
    opts: StandaloneOptions,
    capacity: impl FnOnce(&CapacityOverride, Option<i64>) -> Result<Capacity, String>,
) -> Result<(), StandaloneError> {
    // First: a signal from here on stops qoslet the same way (node::Signals).
    let signals = node::Signals::new()?;
    let kc = KubeletConfig::load(&opts.kubelet_config).map_err(StartError::from)?;
    let start = ModeStart::load(opts.config.as_deref(), opts.observe, false)?;
    let node_memory = start
        .qc
        .capacity
        .memory
        .as_deref()
        .map(|m| m.parse::<Quantity>().map(|q| q.value()))
        .transpose()
        .map_err(|e| start.setting("capacity.memory", e))?;
    let mounts = ModeStart::mounts()?;
    let node_root = if start.enforce() {
        let marker = crate::persist::node_root_marker(&start.qc.state_dir, &start.node_root);
        NodeRoot::ensure(&mounts, &start.node_root, node_memory, Some(marker))?
    } else {
        NodeRoot::default()
    };
    let result = run_node(opts, kc, start, mounts, capacity, signals).await;
    // Removed however the node ended (a node root qoslet made is qoslet's alone), unless
    // another instance owns it.
    if !matches!(
        result,
        Err(StandaloneError::Node(NodeError::State(
            crate::persist::StateError::Locked { .. }
        )))
    ) {
        node_root.remove();
    }
    result
}

async fn run_node(
    opts: StandaloneOptions,
    kc: KubeletConfig,
    start: ModeStart,
    mounts: Mounts,
    capacity: impl FnOnce(&CapacityOverride, Option<i64>) -> Result<Capacity, String>,
    signals: node::Signals,
) -> Result<(), StandaloneError> {
    let fs = start.open_root(mounts).map_err(NodeError::NodeRoot)?;
    let mut settings = start.settings(&opts.kubelet_config, &kc, &fs, capacity)?;
    // The node root takes the place of cgroupRoot; names below it are the kubelet's.
    settings.cgroup_root = "/".into();
    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        log_dir: opts.log_dir.clone(),
        backoff: BackoffConfig::default(),
    }));
    let cfg = start.run_config(
        settings,
        &kc,
        fs,
        ContainerRuntime::Standalone,
        opts.shutdown_grace,
    );
    let mut manifests = ManifestWatch::new(
        &opts.dir,
        Duration::from_millis(200),
        cfg.validation,
        runtime.runner(),
    )
    .map_err(StandaloneError::Manifests)?
    .with_max_manifest_bytes(cfg.qc.max_manifest_bytes);
    manifests.reload().map_err(StandaloneError::Manifests)?;
    tracing::info!(dir = %opts.dir.display(), "Standalone node: pods from the manifest directory.");
    node::run(cfg, manifests, runtime, CgroupKill, signals).await?;
    Ok(())
}
