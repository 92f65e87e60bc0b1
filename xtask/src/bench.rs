//! `cargo xtask bench`: builds the `tests` crate's `qoslet-bench-*` binaries in release mode, runs
//! each (as root), prints their markdown tables and writes them all to `target/bench/report.md`.
//! Speed and memory targets are measured here, never asserted in tests. `peers`
//! (`qoslet-bench-peers`) is the exception: it runs in a VM, never on the host, and only when
//! named (`cargo xtask bench peers`, see `vm/peers.rs`). `cpu` runs on the host, then again on
//! each VM kernel (`vm/cpu.rs`): what its levers buy is the scheduler's answer.

use std::{fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, toolchain::Toolchain};

pub fn run(tc: &Toolchain, only: &[String]) -> Result<PathBuf> {
    let peers = only.iter().any(|o| o == PEERS);
    let host: Vec<String> = only.iter().filter(|o| *o != PEERS).cloned().collect();
    let mut benches = if peers && host.is_empty() {
        Vec::new()
    } else {
        host_benches(tc, &host)?
    };
    benches.retain(|b| !b.ends_with(format!("qoslet-bench-{PEERS}")));
    if benches.is_empty() && !peers {
        bail!("no qoslet-bench-* binaries to run");
    }
    let root = cargo::workspace_root();
    let mut report = format!(
        "# qoslet bench\n\nkernel {}, {} CPUs, {}, run {}\n\n",
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        cpu_model(),
        Command::new("date")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    );
    let mut failed = Vec::new();
    if peers {
        in_vm(
            PEERS,
            || crate::vm::peers::run(tc),
            &mut report,
            &mut failed,
        );
    }
    run_host(tc, root, &benches, &mut report, &mut failed)?;
    let dir = cargo::target_dir().join("bench");
    fs::create_dir_all(&dir)?;
    let path = dir.join("report.md");
    fs::write(&path, report)?;
    println!("xtask: bench report written to {}", path.display());
    if !failed.is_empty() {
        bail!("bench binaries failed: {}", failed.join(", "));
    }
    Ok(path)
}

const PEERS: &str = "peers";

/// Runs one bench in VMs, prints and reports its text, or records it as failed.
fn in_vm(
    name: &str,
    run: impl FnOnce() -> Result<String>,
    report: &mut String,
    failed: &mut Vec<String>,
) {
    println!("xtask: running {name} in VMs");
    let t = Instant::now();
    match run() {
        Ok(text) => {
            print!("{text}");
            report.push_str(&text);
        }
        Err(e) => {
            eprintln!("xtask: {name} failed: {e:#}");
            failed.push(name.to_owned());
        }
    }
    report.push_str(&format!("\n_{name}: {:.1?}_\n\n", t.elapsed()));
}

/// The machine's CPU model, for the report's header.
fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Builds the host benches and returns those `only` names (all when empty).
fn host_benches(tc: &Toolchain, only: &[String]) -> Result<Vec<PathBuf>> {
    // qoslet-bench-agent counts the daemon's system calls with strace.
    crate::apt::ensure("bench", &["strace"])?;
    cargo::run(tc, &["build", "--release", "-p", "qoslet-tests", "--bins"])?;
    // qoslet-bench-agent measures the release daemon itself.
    cargo::run(
        tc,
        &["build", "--release", "-p", "qoslet", "--bin", "qoslet"],
    )?;
    let release = cargo::target_dir().join("release");
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
    if benches.is_empty() && !only.is_empty() {
        bail!(
            "no qoslet-bench-* binaries in {} match {only:?}",
            release.display()
        );
    }
    Ok(benches)
}

fn run_host(
    tc: &Toolchain,
    root: &std::path::Path,
    benches: &[PathBuf],
    report: &mut String,
    failed: &mut Vec<String>,
) -> Result<()> {
    for bench in benches {
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
        if name == "qoslet-bench-cpu" {
            in_vm(
                &format!("{name} (VMs)"),
                || crate::vm::cpu::run(tc),
                report,
                failed,
            );
        }
    }
    Ok(())
}
