//! The `qoslet` binary: logging first, then the command line, then the command.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    qoslet::cli::init_tracing();
    let cli = qoslet::cli::Cli::parse();
    qoslet::cli::run(cli)
}
