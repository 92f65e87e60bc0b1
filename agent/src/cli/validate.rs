//! `qoslet validate`: placeholder until the workload model lands (issue 4).

use std::{path::PathBuf, process::ExitCode};

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub fn run(_args: ValidateArgs) -> ExitCode {
    eprintln!("qoslet validate is not built yet.");
    ExitCode::from(2)
}
