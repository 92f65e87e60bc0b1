//! The command line (a contract: see DESIGN.md). Each subcommand lives in its own module and
//! returns the process exit code; errors are printed as one clear line, never a backtrace.

mod plan;
mod run;
mod status;
mod validate;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

/// Exit status for a configuration or usage error (EX_USAGE), as the daemon convention goes.
pub const EXIT_CONFIG: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "qoslet",
    version,
    about = "eBPF-backed node enforcement agent for Kubernetes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the desired node and pod cgroup state for the pods in PATH, touching nothing.
    Plan(plan::PlanArgs),
    /// Check Pods, Workloads, PodGroups, CompositePodGroups and KubeletConfiguration files.
    Validate(validate::ValidateArgs),
    /// Run the agent.
    Run(run::RunArgs),
    /// A live table of a running agent (pods, class, weight, oom_score_adj, pressure, events).
    Status(status::StatusArgs),
}

/// Runs one command and maps its outcome to an exit status.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Plan(args) => plan::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Run(args) => run::run(args),
        Command::Status(args) => status::run(args),
    }
}

/// Logs go to stderr; `RUST_LOG` filters them (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // With stderr gone (a closed pipe) tracing-subscriber would report the failed write with
        // eprintln!, which panics: qoslet must go on, and stop its pods when told to.
        .log_internal_errors(false)
        .init();
}

/// Paths given on the command line, for subcommands that read manifests.
#[derive(Debug, Clone, clap::Args)]
pub struct ManifestPaths {
    /// Files or directories of YAML (multi-document allowed).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}
