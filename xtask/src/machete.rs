//! The unused-dependency check `cargo xtask test` runs first: cargo-machete, installed on first
//! use into `<cache>/cargo-machete` (`cargo install --locked`, about 2 minutes of CPU; 13.5
//! minutes of wall time when it was measured on a busy 2-core machine). It reads the sources
//! rather than compiling them, so a run takes under a second. It checks `[dependencies]` only,
//! not dev- or build-dependencies (measured: an unused one in either passes). cargo-udeps would
//! check all three exactly, but it needs nightly and a full build of every crate, and it would
//! flag the two build-dependencies qoslet declares on purpose without using them in code
//! (agent's `qoslet-ebpf`, agent-ebpf's `aya-build` pin).

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, toolchain};

const VERSION: &str = "0.9.2";

/// Fails when a crate of the workspace declares a dependency its sources never name.
pub fn check() -> Result<()> {
    let bin = ensure()?;
    println!("xtask: checking for unused dependencies (cargo-machete {VERSION})");
    let status = Command::new(&bin)
        .arg("--skip-target-dir")
        .arg(cargo::workspace_root())
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(1) => bail!("unused dependencies (listed above): remove them from Cargo.toml"),
        _ => bail!("cargo-machete failed: {status}"),
    }
}

fn works(bin: &Path) -> bool {
    Command::new(bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(VERSION))
}

fn ensure() -> Result<std::path::PathBuf> {
    let root = toolchain::cache_dir()?.join("cargo-machete");
    let bin = root.join("bin/cargo-machete");
    if works(&bin) {
        return Ok(bin);
    }
    println!("xtask: installing cargo-machete {VERSION} (a few minutes, once)");
    let status = Command::new("cargo")
        .args(["+stable", "install", "--locked", "--force", "cargo-machete"])
        .args(["--version", VERSION])
        .arg("--root")
        .arg(&root)
        .status()
        .context("running cargo install cargo-machete")?;
    if !status.success() || !works(&bin) {
        bail!(
            "cargo-machete could not be installed into {}",
            root.display()
        );
    }
    Ok(bin)
}
