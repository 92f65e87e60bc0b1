//! The `qoslet` binary: the command line, logging, then the command. A command-line error is
//! clap's own message, before any logging.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = qoslet::cli::Cli::parse();
    qoslet::cli::init_tracing(cli.log_format);
    qoslet::cli::run(cli)
}
