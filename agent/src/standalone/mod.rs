//! The standalone node: pods from a manifest directory, run as processes by qoslet's own runtime
//! in real cgroups, evicted by a cgroup kill. This module only holds what is standalone: its
//! options, the node root cgroup (created when missing, with the configured memory limit), and
//! the wiring of the manifest source, the process executor and the cgroup-kill action into
//! [`crate::node`].

mod node_root;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use thiserror::Error;

pub use node_root::{NodeRoot, NodeRootError};

use crate::{
    cgroup::{CgroupPath, ContainerRuntime, Mode, Mounts, Naming, layout::LayoutError},
    config::{CapacityOverride, ConfigError, KubeletConfig, QosletConfiguration, node_settings},
    eviction::CgroupKill,
    node::{self, NodeError, RunConfig},
    policy::{quantity::Quantity, settings::Capacity},
    runtime::{BackoffConfig, Runtime, RuntimeConfig},
    source::watch::{ManifestWatch, WatchError},
    workload::ValidationOptions,
};

/// sysexits.h: a configuration error (the file and field are named).
pub const EX_CONFIG: u8 = 64;

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
    /// A QosletConfiguration value the node cannot use.
    #[error("{file}: QosletConfiguration: {field}: {message}")]
    Setting {
        file: String,
        field: &'static str,
        message: String,
    },
    #[error("cannot detect the cgroup layout")]
    Layout(#[source] LayoutError),
    #[error(transparent)]
    NodeRoot(#[from] NodeRootError),
    #[error("cannot watch the manifest directory")]
    Manifests(#[source] WatchError),
    #[error(transparent)]
    Node(#[from] NodeError),
}

impl StandaloneError {
    /// The process's exit status: 64 for configuration errors only.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Setting { .. } => EX_CONFIG,
            Self::Layout(_) => 72,
            Self::NodeRoot(_) | Self::Manifests(_) => 71,
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
    let kc = KubeletConfig::load(&opts.kubelet_config)?;
    let qc = match &opts.config {
        Some(f) => QosletConfiguration::load(f)?,
        None => QosletConfiguration::default(),
    };
    let config_file = opts
        .config
        .as_ref()
        .map_or_else(|| "(defaults)".to_owned(), |f| f.display().to_string());
    let setting = |field: &'static str| {
        let file = config_file.clone();
        move |e: &dyn std::fmt::Display| StandaloneError::Setting {
            file,
            field,
            message: e.to_string(),
        }
    };
    let mode = if opts.observe || qc.mode == crate::config::Mode::Observe {
        Mode::Observe
    } else {
        Mode::Enforce
    };
    let addr: SocketAddr = qc
        .metrics_address
        .parse()
        .map_err(|e| setting("metricsAddress")(&e))?;
    let node_root_path = CgroupPath::parse(qc.node_root_cgroup.as_deref().unwrap_or("/"))
        .map_err(|e| setting("nodeRootCgroup")(&e))?;
    let node_memory = qc
        .capacity
        .memory
        .as_deref()
        .map(|m| m.parse::<Quantity>().map(|q| q.value()))
        .transpose()
        .map_err(|e| setting("capacity.memory")(&e))?;

    let mounts = Mounts::detect().map_err(StandaloneError::Layout)?;
    let node_root = if mode == Mode::Enforce {
        let marker = node::state::node_root_marker(&qc.state_dir, &node_root_path);
        NodeRoot::ensure(&mounts, &node_root_path, node_memory, Some(marker))?
    } else {
        NodeRoot::default()
    };
    let result = run_node(opts, kc, qc, mode, addr, mounts, node_root_path, capacity).await;
    // Removed however the node ended (a node root qoslet made is qoslet's alone), unless
    // another instance owns it.
    if !matches!(
        result,
        Err(StandaloneError::Node(NodeError::State(
            node::state::StateError::Locked { .. }
        )))
    ) {
        node_root.remove();
    }
    result
}

#[expect(
    clippy::too_many_arguments,
    reason = "the parts run() prepared, passed once"
)]
async fn run_node(
    opts: StandaloneOptions,
    kc: KubeletConfig,
    qc: QosletConfiguration,
    mode: Mode,
    addr: SocketAddr,
    mounts: Mounts,
    node_root: CgroupPath,
    capacity: impl FnOnce(&CapacityOverride, Option<i64>) -> Result<Capacity, String>,
) -> Result<(), StandaloneError> {
    let root_limit = crate::cgroup::fs::CgroupFs::open(mounts.clone(), node_root.clone())
        .ok()
        .and_then(|fs| crate::cgroup::node_root_memory_limit(&fs).ok().flatten());
    let capacity = capacity(&qc.capacity, root_limit).map_err(|e| StandaloneError::Setting {
        file: opts
            .config
            .as_ref()
            .map_or_else(|| "(defaults)".to_owned(), |f| f.display().to_string()),
        field: "capacity",
        message: e,
    })?;
    let mut settings = node_settings(&opts.kubelet_config, &kc, &qc, capacity)?;
    // The node root takes the place of cgroupRoot; names below it are the kubelet's.
    settings.cgroup_root = "/".into();
    let naming = Naming {
        driver: settings.cgroup_driver,
        runtime: ContainerRuntime::Standalone,
        node_root: node_root.clone(),
        create_containers: true,
        owner: crate::cgroup::desired::Owner::Qoslet,
    };
    let validation = ValidationOptions {
        pod_group_preemption_policy: kc.gate("PodGroupPreemptionPolicy") == Some(true),
    };
    let mut manifests = ManifestWatch::new(&opts.dir, Duration::from_millis(200), validation)
        .map_err(StandaloneError::Manifests)?
        .with_max_manifest_bytes(qc.max_manifest_bytes);
    manifests.reload().map_err(StandaloneError::Manifests)?;
    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        log_dir: opts.log_dir.clone(),
        backoff: BackoffConfig::default(),
    }));
    let state_dir = (mode == Mode::Enforce).then(|| qc.state_dir.clone());
    let cfg = RunConfig {
        settings,
        qc,
        mode,
        mounts,
        node_root,
        naming,
        validation,
        addr,
        listener: None,
        shutdown_grace: opts.shutdown_grace,
        state_dir,
        on_start: None,
    };
    tracing::info!(dir = %opts.dir.display(), "Standalone node: pods from the manifest directory.");
    node::run(cfg, manifests, runtime, CgroupKill).await?;
    Ok(())
}
