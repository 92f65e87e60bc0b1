//! `cargo xtask bench`: builds the `tests` crate's `qoslet-bench-*` binaries in release mode, runs
//! each (as root), prints their markdown tables and writes them all to `target/bench/report.md`.
//! Speed and memory targets are measured here, never asserted in tests.

use std::{fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, toolchain::Toolchain};

pub fn run(tc: &Toolchain, only: &[String]) -> Result<PathBuf> {
    // qoslet-bench-agent counts the daemon's system calls with strace.
    crate::apt::ensure("bench", &["strace"])?;
    cargo::run(tc, &["build", "--release", "-p", "qoslet-tests", "--bins"])?;
    // qoslet-bench-agent measures the release daemon itself.
    cargo::run(
        tc,
        &["build", "--release", "-p", "qoslet", "--bin", "qoslet"],
    )?;
    let root = cargo::workspace_root();
    let release = target_dir().join("release");
    let mut benches: Vec<PathBuf> = fs::read_dir(&release)
        .with_context(|| format!("reading {}", release.display()))?
        .filter_map(std::result::Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("qoslet-bench-") && !n.contains('.'))
        })
        .filter(|p| {
            only.is_empty()
                || only.iter().any(|o| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.ends_with(o.as_str()))
                })
        })
        .collect();
    benches.sort();
    if benches.is_empty() {
        bail!("no qoslet-bench-* binaries in {}", release.display());
    }
    let mut report = format!(
        "# qoslet bench\n\nkernel {}, {} CPUs, run {}\n\n",
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        Command::new("date")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    );
    let mut failed = Vec::new();
    for bench in &benches {
        let name = bench.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        println!("xtask: running {name}");
        let t = Instant::now();
        let out = Command::new(bench)
            .current_dir(root)
            .env("PATH", &tc.path_env)
            .output()
            .with_context(|| format!("running {}", bench.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        report.push_str(&text);
        report.push_str(&format!("\n_{name}: {:.1?}_\n\n", t.elapsed()));
        if !out.status.success() {
            failed.push(name.to_owned());
        }
    }
    let dir = target_dir().join("bench");
    fs::create_dir_all(&dir)?;
    let path = dir.join("report.md");
    fs::write(&path, report)?;
    println!("xtask: bench report written to {}", path.display());
    if !failed.is_empty() {
        bail!("bench binaries failed: {}", failed.join(", "));
    }
    Ok(path)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cargo::workspace_root().join("target"))
}
