//! Placeholder entry point of the vm branch; the real xtask merges `vm-test` by hand.

mod vm;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the integration tests on Debian kernels with pure cgroup v2 under QEMU.
    VmTest(vm::VmTestArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::VmTest(args) => {
            vm::ensure_vm_prerequisites()?;
            let binaries = vm::build_test_binaries()?;
            let reports = vm::vm_test(&args, &binaries)?;
            if let Some(bad) = reports.iter().find(|r| !r.ok) {
                bail!(
                    "vm-test failed on {} (see {})",
                    bad.kernel,
                    bad.log_path.display()
                );
            }
            Ok(())
        }
    }
}
