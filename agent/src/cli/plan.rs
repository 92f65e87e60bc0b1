//! `qoslet plan`: placeholder until the policy core lands (issue 3).

use std::{path::PathBuf, process::ExitCode};

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub fn run(_args: PlanArgs) -> ExitCode {
    eprintln!("qoslet plan is not built yet.");
    ExitCode::from(2)
}
