//! The command line (a contract: see docs/usage.md). Each subcommand lives in its own module and
//! returns the process exit code; errors are printed as one clear line, never a backtrace.

mod http;
mod plan;
mod recommend_reserved;
mod run;
mod status;
pub mod validate;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "qoslet",
    version,
    about = "eBPF-backed node enforcement agent for Kubernetes"
)]
pub(crate) struct Cli {
    /// Log lines as text (coloured only when stderr is a terminal) or as JSON objects, one per
    /// line, for a log pipeline.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        env = "QOSLET_LOG_FORMAT"
    )]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Print the desired node and pod cgroup state for the pods in PATH, touching nothing.
    ///
    /// The plan follows the kubelet of one Kubernetes version: `kubernetesVersion` in the
    /// QosletConfiguration (1.34, 1.35, 1.36 or 1.37; default 1.37), named on the first line
    /// and in the JSON (`node.kubernetes_version`). What changes between them is Memory QoS:
    /// 1.34 and 1.35 protect every memory request with memory.min and default
    /// memoryThrottlingFactor to 0.9; 1.36 adds memoryReservationPolicy (None, the default: no
    /// protection, memory.min/memory.low written as 0; TieredReservation: Guaranteed
    /// memory.min, Burstable memory.low, the kubepods root covering every tier); 1.37 turns the
    /// MemoryQoS gate on by default, drops the throttling factor's default (no memory.high
    /// unless set), and adds pod-level memory.high and BestEffort memory.high. Everything else
    /// (QoS classes, cpu conversions, allocatable, eviction thresholds, oom_score_adj with the
    /// KubeletOOMScoreAdjTieBreak gate) is the same in all four.
    Plan(plan::PlanArgs),
    /// Check Pods, Workloads, PodGroups, CompositePodGroups and KubeletConfiguration files.
    Validate(validate::ValidateArgs),
    /// Run the agent.
    Run(run::RunArgs),
    /// A live table of a running agent (pods, class, weight, oom_score_adj, pressure, events).
    Status(status::StatusArgs),
    /// Recommend systemReserved and kubeReserved from what the system and the kube daemons use.
    ///
    /// Polls a running agent's /stats/summary (--from URL, --window, --interval) or reads
    /// recorded Summary documents (--samples FILE, JSON lines), sizes each reservation at p99
    /// plus headroom over the samples, prints OpenShift's automatic node sizing for the same
    /// node beside it, and the KubeletConfiguration fragment. kubelet and runtime system
    /// containers count as kubeReserved; misc (or node - pods - kube when there is no misc) as
    /// systemReserved.
    RecommendReserved(recommend_reserved::RecommendReservedArgs),
}

/// The `qoslet` binary's `main`: the command line, logging, then the command. A command-line
/// error is clap's own message, before any logging. A function of the library so that the
/// tests' copy of the binary (`qoslet-tests`'s `qoslet-test-agent`) is the same program.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    run(cli)
}

/// Runs one command and maps its outcome to an exit status.
pub(crate) fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Plan(args) => plan::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Run(args) => run::run(args),
        Command::Status(args) => status::run(args),
        Command::RecommendReserved(args) => recommend_reserved::run(args),
    }
}

/// Logs go to stderr; `RUST_LOG` filters them (default [`DEFAULT_LOG_FILTER`]). Text carries
/// colour only on a terminal: `kubectl logs` and journald show the escape codes as they are.
/// `info`, but kube's client module at `error`: it warns of every watch stream the server cuts
/// ("eof in poll", one a cut; it ends the stream, which `cluster/client.rs` counts and backs off
/// from, saying so once) and of a body it cannot decode with the whole body in the line (an API
/// server's garbage, unbounded); qoslet logs the errors it gets back itself.
pub const DEFAULT_LOG_FILTER: &str = "info,kube_client::client=error";

pub(crate) fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // With stderr gone (a closed pipe) tracing-subscriber would report the failed write with
        // eprintln!, which panics: qoslet must go on, and stop its pods when told to.
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Paths given on the command line, for subcommands that read manifests.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ManifestPaths {
    /// Files or directories of YAML (multi-document allowed).
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
}
