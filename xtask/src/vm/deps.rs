//! Host prerequisites of the VM matrix: QEMU, cpio, a static busybox and the musl target.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

/// Debian packages the VM matrix needs on the host.
const PACKAGES: &[&str] = &["qemu-system-x86", "cpio", "busybox-static"];
/// The test binaries run in an initramfs without a libc, so they are static musl builds.
pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// Installs what is missing; when everything is there it only asks dpkg and rustc (well under 1 s).
pub fn ensure_vm_prerequisites() -> Result<()> {
    ensure_debs(PACKAGES)?;
    if !musl_target_installed()? {
        println!("vm-test: installing the rustup target {MUSL_TARGET}");
        run(Command::new("rustup").args(["target", "add", MUSL_TARGET]))?;
        println!("vm-test: installed the rustup target {MUSL_TARGET}");
    }
    Ok(())
}

/// Installs the Debian packages that are missing (asks dpkg only when all are there).
pub fn ensure_debs(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !deb_installed(p))
        .collect();
    if !missing.is_empty() {
        // `apt-get update` is slow and only needed when something has to be fetched.
        println!("xtask: installing {}", missing.join(" "));
        run(Command::new("apt-get").arg("update").arg("-q"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        println!("xtask: installed {}", missing.join(" "));
    }
    Ok(())
}

fn deb_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b"install ok installed"))
}

/// Looks for the target's std in the sysroot of the toolchain that cargo will use here
/// (rust-toolchain.toml applies), which is faster than `rustup target list`.
fn musl_target_installed() -> Result<bool> {
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
        .join(MUSL_TARGET)
        .join("lib")
        .is_dir())
}

pub(super) fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
