//! The start-up both modes share: the QosletConfiguration read, `mode` (and `--observe`),
//! `metricsAddress` and `nodeRootCgroup` checked, the cgroup mounts found and the node root
//! opened in them (once, for every later step), the node's capacity and settings built from the
//! two configuration files, and the [`RunConfig`] handed to [`super::run`]. A mode keeps only what is its own (standalone: the node root it creates and
//! the manifest directory; cluster: the API client, `/configz`, the early `/healthz`).

use std::{fmt::Display, net::SocketAddr, path::Path, sync::Arc, time::Duration};

use thiserror::Error;

use super::RunConfig;
use crate::{
    cgroup::{
        CgroupFs, CgroupPath, ContainerRuntime, Mode, Mounts, fs::OpenRootError,
        layout::LayoutError,
    },
    config::{
        CapacityOverride, ConfigError, EndpointAuth, KubeletConfig, QosletConfiguration,
        node_settings,
    },
    exit,
    policy::settings::{Capacity, NodeSettings},
    workload::ValidationOptions,
};

/// Why a mode could not start, in the steps both share.
#[derive(Debug, Error)]
pub enum StartError {
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
}

impl StartError {
    /// The process's exit status: 64 for configuration errors.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Setting { .. } => exit::CONFIG,
            Self::Layout(_) => exit::OSFILE,
        }
    }
}

/// What both modes read and decide the same way.
pub(crate) struct ModeStart {
    pub(crate) qc: QosletConfiguration,
    /// `qc.mode`, or observe when `--observe` was given.
    pub(crate) mode: Mode,
    pub(crate) addr: SocketAddr,
    /// Whether `/metrics` and `/stats/summary` ask the API server (`endpointAuth`).
    pub(crate) endpoint_auth: EndpointAuth,
    pub(crate) node_root: CgroupPath,
    /// The QosletConfiguration's file, for errors (`(defaults)` without one).
    config_file: String,
}

impl ModeStart {
    /// Reads `config` (the defaults without one) and checks the values every mode reads;
    /// `cluster`: the node has an API server (`endpointAuth`'s default and what it allows).
    pub(crate) fn load(
        config: Option<&Path>,
        observe: bool,
        cluster: bool,
    ) -> Result<Self, StartError> {
        let qc = match config {
            Some(f) => QosletConfiguration::load(f)?,
            None => QosletConfiguration::default(),
        };
        let config_file =
            config.map_or_else(|| "(defaults)".to_owned(), |f| f.display().to_string());
        let setting = |field, e: &dyn Display| setting(&config_file, field, e);
        let endpoint_auth = qc
            .endpoint_auth(cluster)
            .map_err(|e| setting("endpointAuth", &e))?;
        let addr = qc
            .listen_address(endpoint_auth)
            .map_err(|e| setting("metricsAddress", &e))?;
        let node_root = CgroupPath::parse(qc.node_root_cgroup.as_deref().unwrap_or("/"))
            .map_err(|e| setting("nodeRootCgroup", &e))?;
        Ok(Self {
            mode: if observe { Mode::Observe } else { qc.mode },
            qc,
            addr,
            endpoint_auth,
            node_root,
            config_file,
        })
    }

    /// A QosletConfiguration value the node cannot use.
    pub(crate) fn setting(&self, field: &'static str, message: impl Display) -> StartError {
        setting(&self.config_file, field, &message)
    }

    pub(crate) fn enforce(&self) -> bool {
        self.mode == Mode::Enforce
    }

    /// The cgroup hierarchies mounted on this machine.
    pub(crate) fn mounts() -> Result<Mounts, StartError> {
        Mounts::detect().map_err(StartError::Layout)
    }

    /// The node root opened in every hierarchy of `mounts`, once: the capacity, the mode's own
    /// start-up (cluster: the eviction marks) and the node all read through it.
    pub(crate) fn open_root(&self, mounts: Mounts) -> Result<Arc<CgroupFs>, OpenRootError> {
        CgroupFs::open(mounts, self.node_root.clone()).map(Arc::new)
    }

    /// The node's settings from the kubelet's configuration (`kubelet_file` names it in errors),
    /// the QosletConfiguration and the capacity (`capacity` gets the node root's memory limit,
    /// if it has one).
    pub(crate) fn settings(
        &self,
        kubelet_file: &Path,
        kc: &KubeletConfig,
        fs: &CgroupFs,
        capacity: impl FnOnce(&CapacityOverride, Option<i64>) -> Result<Capacity, String>,
    ) -> Result<NodeSettings, StartError> {
        let root_limit = crate::cgroup::node_root_memory_limit(fs).ok().flatten();
        let capacity =
            capacity(&self.qc.capacity, root_limit).map_err(|e| self.setting("capacity", e))?;
        Ok(node_settings(kubelet_file, kc, &self.qc, capacity)?)
    }

    /// What [`super::run`] needs; the mode sets `listener` and `on_start` when it has them.
    pub(crate) fn run_config(
        self,
        settings: NodeSettings,
        kc: &KubeletConfig,
        fs: Arc<CgroupFs>,
        runtime: ContainerRuntime,
        shutdown_grace: Duration,
    ) -> RunConfig {
        RunConfig {
            settings,
            qc: self.qc,
            mode: self.mode,
            fs,
            runtime,
            validation: validation(kc),
            addr: self.addr,
            listener: None,
            shutdown_grace,
            on_start: None,
            node_name: None,
            auth: None,
        }
    }
}

fn setting(file: &str, field: &'static str, message: &dyn Display) -> StartError {
    StartError::Setting {
        file: file.to_owned(),
        field,
        message: message.to_string(),
    }
}

/// Workload validation as the kubelet's feature gates ask.
pub(crate) fn validation(kc: &KubeletConfig) -> ValidationOptions {
    ValidationOptions {
        pod_group_preemption_policy: kc.gate("PodGroupPreemptionPolicy") == Some(true),
    }
}
