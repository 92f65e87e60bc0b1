//! The code checks `cargo xtask test` runs after the dependency check: `cargo fmt --check` and
//! `cargo clippy --all-targets -- -D warnings` with the workspace's lint set (the root
//! Cargo.toml, `[workspace.lints]`). Clippy runs without the eBPF build (`AYA_BUILD_SKIP=1`)
//! in its own target directory, so it neither waits for bpf-linker nor invalidates the test
//! build's artifacts (a different build-script environment would rebuild the agent).

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{cargo, toolchain::Toolchain};

/// Fails on unformatted code or on any clippy warning.
pub fn check(tc: &Toolchain) -> Result<()> {
    ensure_components()?;
    println!("xtask: checking formatting (cargo fmt --check)");
    cargo::run(tc, &["fmt", "--all", "--check"])
        .context("unformatted code: run `cargo fmt --all`")?;
    println!("xtask: running clippy (all targets, warnings are errors)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .args(["clippy", "--all-targets", "--", "-D", "warnings"])
        .current_dir(cargo::workspace_root())
        .env("PATH", &tc.path_env)
        .env("AYA_BUILD_SKIP", "1")
        .env("CARGO_TARGET_DIR", cargo::target_dir().join("clippy"))
        .status()
        .context("running cargo clippy")?;
    if !status.success() {
        bail!("clippy found problems (listed above)");
    }
    Ok(())
}

/// rustup's default profile has both; a minimal one has neither.
fn ensure_components() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["component", "list", "--installed"])
        .output()
        .context("running rustup component list")?;
    let installed = String::from_utf8_lossy(&installed.stdout);
    for component in ["clippy", "rustfmt"] {
        if !installed.lines().any(|l| l.starts_with(component)) {
            println!("xtask: installing the {component} component");
            let status = Command::new("rustup")
                .args(["component", "add", component])
                .status()
                .context("running rustup component add")?;
            if !status.success() {
                bail!("rustup component add {component} failed: {status}");
            }
        }
    }
    Ok(())
}
