//! Host prerequisites of the VM matrix: QEMU, cpio, a static busybox, the musl target and a musl
//! C compiler.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

pub(super) use crate::apt::run;

/// Debian packages the VM matrix needs on the host (the musl C compiler comes with
/// [`ensure_musl_target`]).
const PACKAGES: &[&str] = &["qemu-system-x86", "cpio", "busybox-static"];
/// Gives cc-rs the `x86_64-linux-musl-gcc` that ring (kube's TLS) compiles its C and assembly
/// with for the musl target: every musl build needs it, the image's as much as the VM's.
const MUSL_C_PACKAGES: &[&str] = &["musl-tools"];
/// The test binaries run in an initramfs without a libc, so they are static musl builds (and so
/// is the agent in its container image).
pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// Installs what is missing; when everything is there it only asks dpkg and rustc (well under 1 s).
pub fn ensure_vm_prerequisites() -> Result<()> {
    crate::apt::ensure("vm-test", PACKAGES)?;
    ensure_musl_target()
}

/// `rustup target add` the musl target unless the toolchain has it, and the musl C compiler
/// unless dpkg has it.
pub fn ensure_musl_target() -> Result<()> {
    crate::apt::ensure("musl build", MUSL_C_PACKAGES)?;
    ensure_rust_target(MUSL_TARGET)
}

/// `rustup target add <triple>` unless the toolchain has it.
pub fn ensure_rust_target(triple: &str) -> Result<()> {
    if !target_installed(triple)? {
        println!("xtask: installing the rustup target {triple}");
        run(Command::new("rustup").args(["target", "add", triple]))?;
        println!("xtask: installed the rustup target {triple}");
    }
    Ok(())
}

/// Looks for the target's std in the sysroot of the toolchain that cargo will use here
/// (rust-toolchain.toml applies), which is faster than `rustup target list`.
fn target_installed(triple: &str) -> Result<bool> {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .context("running rustc --print sysroot")?;
    if !out.status.success() {
        bail!("rustc --print sysroot failed");
    }
    let sysroot = String::from_utf8(out.stdout)?;
    Ok(Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(triple)
        .join("lib")
        .is_dir())
}
