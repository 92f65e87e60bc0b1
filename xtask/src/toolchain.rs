//! The eBPF toolchain, installed on first use and cached: the nightly's rust-src (for
//! `-Z build-std=core`) and bpf-linker built against the nightly rustc's own LLVM (no matching
//! LLVM is packaged for this machine). A second run only checks, in well under a second.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// bpf-linker release known to build against LLVM 21-23 with `--features llvm-<N>`.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Where the toolchain lives: `$QOSLET_TOOLCHAIN_DIR`, else `~/.cache/qoslet` (agent/build.rs
/// looks for bpf-linker there too).
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = env::var_os("QOSLET_TOOLCHAIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let home = env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/qoslet"))
}

/// Ready to build eBPF: `PATH` to use for cargo (with bpf-linker first).
pub struct Toolchain {
    pub path_env: std::ffi::OsString,
}

pub fn ensure() -> Result<Toolchain> {
    let cache = cache_dir()?;
    ensure_nightly()?;
    ensure_rust_src()?;
    let linker_bin = ensure_bpf_linker(&cache)?;
    let mut paths = vec![linker_bin];
    paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    Ok(Toolchain {
        path_env: env::join_paths(paths)?,
    })
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn ensure_nightly() -> Result<()> {
    let list = output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !list.lines().any(|l| l.starts_with("nightly")) {
        println!("xtask: installing the nightly toolchain (for the eBPF programs)");
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    Ok(())
}

fn nightly_sysroot() -> Result<PathBuf> {
    Ok(PathBuf::from(
        output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?.trim(),
    ))
}

fn ensure_rust_src() -> Result<()> {
    let core = nightly_sysroot()?.join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if !core.exists() {
        println!("xtask: installing rust-src for nightly (needed by -Z build-std=core)");
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    Ok(())
}

/// The LLVM major version of the nightly rustc (`LLVM version: 22.1.4` -> 22).
pub fn nightly_llvm_major() -> Result<u32> {
    let vv = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    parse_llvm_major(&vv).context("rustc +nightly -vV printed no LLVM version")
}

fn parse_llvm_major(vv: &str) -> Option<u32> {
    vv.lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse().ok())
}

fn linker_works(linker: &Path) -> bool {
    Command::new(linker)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs bpf-linker into `<cache>/bpf-linker` unless a working one is there. The binary
/// finds libLLVM through its RUNPATH `<cache>/llvm/lib`, where symlinks point into the nightly
/// sysroot; after a nightly update the symlinks are renewed and, if LLVM changed, the linker
/// is rebuilt.
fn ensure_bpf_linker(cache: &Path) -> Result<PathBuf> {
    let root = cache.join("bpf-linker");
    let bin = root.join("bin");
    let linker = bin.join("bpf-linker");
    let llvm_lib = cache.join("llvm/lib");
    link_nightly_llvm(&llvm_lib)?;
    if linker_works(&linker) {
        return Ok(bin);
    }
    let major = nightly_llvm_major()?;
    println!(
        "xtask: installing bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM {major} (about a minute, once)"
    );
    let llvm_prefix = cache.join("llvm");
    run(Command::new("cargo")
        .args(["+stable", "install", "bpf-linker", "--force"])
        .args(["--version", BPF_LINKER_VERSION])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .arg("--root")
        .arg(&root)
        .env("LLVM_PREFIX", &llvm_prefix))?;
    if !linker_works(&linker) {
        bail!(
            "bpf-linker was installed at {} but does not run",
            linker.display()
        );
    }
    println!("xtask: installed {}", linker.display());
    Ok(bin)
}

/// `libLLVM.so` (for the build) and the versioned soname (for the RUNPATH at run time), both
/// pointing at the nightly's own libLLVM.
fn link_nightly_llvm(llvm_lib: &Path) -> Result<()> {
    let sysroot_lib = nightly_sysroot()?.join("lib");
    let real = fs::read_dir(&sysroot_lib)?
        .filter_map(std::result::Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .with_context(|| format!("no libLLVM.so.*-rust-* in {}", sysroot_lib.display()))?;
    fs::create_dir_all(llvm_lib)?;
    let soname = real.file_name().context("libLLVM file name")?;
    for link in [llvm_lib.join("libLLVM.so"), llvm_lib.join(soname)] {
        if fs::read_link(&link).ok().as_deref() == Some(real.as_path()) {
            continue;
        }
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_llvm_major_version_of_rustc() {
        let vv = "rustc 1.97.0-nightly (e50aa6fba 2026-05-19)\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.4\n";
        assert_eq!(parse_llvm_major(vv), Some(22));
        assert_eq!(parse_llvm_major("rustc 1.0\n"), None);
    }
}
