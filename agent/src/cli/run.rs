//! `qoslet run`: the daemon. `--standalone DIR` runs the standalone node (pods from manifests,
//! run as processes in real cgroups; see `crate::standalone`); `--kube` the node agent of a
//! Kubernetes cluster beside the kubelet (see `crate::cluster`).

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use super::plan::machine_capacity;
use crate::{
    cluster::{self, ClusterOptions, KubeletConfigFrom},
    config::{CapacityOverride, KubeletConfig},
    standalone::{self, StandaloneOptions},
};

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The node's KubeletConfiguration (kubelet.config.k8s.io/v1beta1). Cluster mode without
    /// it finds the running kubelet's configuration itself (its --config, --config-dir and
    /// flags).
    #[arg(long, value_name = "FILE", required_unless_present_any = ["kubelet_configz", "kube"])]
    pub(crate) kubelet_config: Option<PathBuf>,
    /// Cluster mode: where the host's `/` is mounted (read-only); the kubelet's files are read
    /// beneath it when the kubelet's own root (/proc/PID/root) is closed to qoslet.
    #[arg(long, value_name = "DIR", requires = "kube")]
    pub(crate) host_root: Option<PathBuf>,
    /// Cluster mode: read the kubelet's running configuration from its /configz, through the
    /// API server (`/api/v1/nodes/NAME/proxy/configz`).
    #[arg(long, requires = "kube", conflicts_with = "kubelet_config")]
    pub(crate) kubelet_configz: bool,
    /// qoslet's own QosletConfiguration.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Standalone node: pods come from the manifests in DIR.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "kube",
        conflicts_with = "kube"
    )]
    pub(crate) standalone: Option<PathBuf>,
    /// Cluster mode: pods come from the Kubernetes API.
    #[arg(long)]
    pub(crate) kube: bool,
    /// Cluster mode: this node's name (the DaemonSet sets NODE_NAME from spec.nodeName).
    #[arg(long, value_name = "NAME", env = "NODE_NAME", requires = "kube")]
    pub(crate) node_name: Option<String>,
    /// Cluster mode: the kubeconfig to use; without it KUBECONFIG, ~/.kube/config or the
    /// in-cluster service account.
    #[arg(long, value_name = "FILE", requires = "kube")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Compute and report everything, write nothing, evict nobody.
    #[arg(long)]
    pub(crate) observe: bool,
    /// Where container logs go (`<dir>/<namespace>_<name>_<uid>/<container>/<restart>.log`).
    #[arg(long, value_name = "DIR", default_value = "/var/log/qoslet/pods")]
    pub(crate) log_dir: PathBuf,
    /// How long pods get to stop when qoslet stops (each pod's own grace period if shorter).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub(crate) shutdown_grace_seconds: u64,
}

pub(crate) fn run(args: RunArgs) -> ExitCode {
    raise_open_files_limit();
    tune_malloc();
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
    if let Some(file) = &args.kubelet_config
        && let Ok(kc) = KubeletConfig::load(file)
        && let Some(note) = kc.ignored_note()
    {
        tracing::warn!(file = %file.display(), fields = kc.ignored.len(), "{note}.");
    }
    let capacity = |over: &CapacityOverride, root_limit: Option<i64>| {
        let mut c = machine_capacity(over)?;
        // A node root with its own memory limit is the node (unless capacity.memory says).
        if let (Some(limit), None) = (root_limit, &over.memory) {
            c.memory_bytes = limit;
        }
        Ok(c)
    };
    let shutdown_grace = Duration::from_secs(args.shutdown_grace_seconds);
    if args.kube {
        // A file named on the command line first: whoever mounted it meant it. One beneath
        // the host-root mount is the host's: read inside that root.
        let kubelet_config = match (args.kubelet_config, args.kubelet_configz) {
            (Some(f), _) => match args.host_root.as_deref().map(|r| (r, f.strip_prefix(r))) {
                Some((root, Ok(rest))) => KubeletConfigFrom::FileInRoot {
                    root: root.to_owned(),
                    path: Path::new("/").join(rest),
                },
                _ => KubeletConfigFrom::File(f),
            },
            (None, true) => KubeletConfigFrom::Configz,
            (None, false) => KubeletConfigFrom::Discover {
                host_root: args.host_root,
            },
        };
        let opts = ClusterOptions {
            kubelet_config,
            config: args.config,
            node_name: args.node_name.unwrap_or_default(),
            kubeconfig: args.kubeconfig,
            observe: args.observe,
            shutdown_grace,
        };
        return match runtime.block_on(cluster::run(opts, capacity)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e, e.exit_code()),
        };
    }
    let (Some(dir), Some(kubelet_config)) = (args.standalone, args.kubelet_config) else {
        eprintln!("qoslet run --standalone needs --kubelet-config FILE.");
        return ExitCode::from(crate::exit::CONFIG);
    };
    let opts = StandaloneOptions {
        kubelet_config,
        config: args.config,
        dir,
        observe: args.observe,
        log_dir: args.log_dir,
        shutdown_grace,
    };
    match runtime.block_on(standalone::run(opts, capacity)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, e.exit_code()),
    }
}

/// One line naming the cause (the error and its sources), and the exit status.
fn fail(e: &(dyn std::error::Error + 'static), code: u8) -> ExitCode {
    eprintln!("qoslet: {}", crate::support::error_chain(e));
    ExitCode::from(code)
}

/// glibc gives each thread that allocates an arena of its own (up to eight per core) and keeps
/// it after the thread ends: at 500 idle pods the threads that came and went (the reconciler's,
/// tokio's blocking pool) had left four, about 5 MiB more resident than with two (2026-12-04,
/// `cargo xtask bench agent`'s node). Two, for the runtime's two workers; set before any thread
/// starts.
///
/// The mmap threshold is pinned at glibc's default (128 KiB): left dynamic, the first large
/// block freed raises it to that block's size, and from then on each `/metrics` text (394 KB at
/// 110 pods) came from an arena, which kept its pages after the text was sent (0.5 MiB more
/// resident after the first scrape). Pinned, such a block is mapped for the request and
/// unmapped when freed.
fn tune_malloc() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's own parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Raises the soft limit on open files to the hard limit (as Go programs do at start): the
/// eviction path holds a few descriptors per pod (`eviction/held.rs`), and a soft limit of 1024
/// would cap a node at about a hundred pods.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(soft, hard, error = %e, "Could not raise the open-files limit.");
    }
}
