//! `qoslet run`: the daemon.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct RunArgs {}

pub fn run(_args: RunArgs) -> ExitCode {
    ExitCode::SUCCESS
}
