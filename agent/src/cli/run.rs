//! `qoslet run`: the daemon. `--standalone DIR` runs the standalone node (pods from manifests,
//! run as processes in real cgroups; see `crate::standalone`). The cluster mode (`--kube`) needs
//! an API server and is not built yet.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use super::{EXIT_CONFIG, plan::machine_capacity};
use crate::{
    config::{CapacityOverride, KubeletConfig},
    standalone::{self, StandaloneOptions},
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The node's KubeletConfiguration (kubelet.config.k8s.io/v1beta1).
    #[arg(long, value_name = "FILE")]
    pub kubelet_config: PathBuf,
    /// qoslet's own QosletConfiguration.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Standalone node: pods come from the manifests in DIR.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "kube",
        conflicts_with = "kube"
    )]
    pub standalone: Option<PathBuf>,
    /// Cluster mode: pods come from the Kubernetes API.
    #[arg(long)]
    pub kube: bool,
    /// Compute and report everything, write nothing, evict nobody.
    #[arg(long)]
    pub observe: bool,
    /// Where container logs go (`<dir>/<namespace>_<name>_<uid>/<container>/<restart>.log`).
    #[arg(long, value_name = "DIR", default_value = "/var/log/qoslet/pods")]
    pub log_dir: PathBuf,
    /// How long pods get to stop when qoslet stops (each pod's own grace period if shorter).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub shutdown_grace_seconds: u64,
}

pub fn run(args: RunArgs) -> ExitCode {
    let Some(dir) = args.standalone.clone() else {
        eprintln!(
            "qoslet run --kube is not built yet (it needs the cluster source); use --standalone DIR."
        );
        return ExitCode::from(EXIT_CONFIG);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("qoslet could not start its runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Said once at start; a file that does not load is reported by the node itself.
    if let Ok(kc) = KubeletConfig::load(&args.kubelet_config)
        && let Some(note) = kc.ignored_note()
    {
        tracing::warn!(file = %args.kubelet_config.display(), fields = kc.ignored.len(), "{note}.");
    }
    let opts = StandaloneOptions {
        kubelet_config: args.kubelet_config,
        config: args.config,
        dir,
        observe: args.observe,
        log_dir: args.log_dir,
        shutdown_grace: Duration::from_secs(args.shutdown_grace_seconds),
    };
    let capacity = |over: &CapacityOverride, root_limit: Option<i64>| {
        let mut c = machine_capacity(over)?;
        // A node root with its own memory limit is the node (unless capacity.memory says).
        if let (Some(limit), None) = (root_limit, &over.memory) {
            c.memory_bytes = limit;
        }
        Ok(c)
    };
    match runtime.block_on(standalone::run(opts, capacity)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qoslet: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}
