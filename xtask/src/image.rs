//! `cargo xtask image`: qoslet's OCI image. A static (musl) release build of the agent, its eBPF
//! object embedded by agent/build.rs, copied alone into a build context and built from
//! deploy/Containerfile with Debian's buildah. The image lands in the local containers storage
//! (vfs driver, which needs no kernel overlay support, so podman on this host can run it) and
//! in an `oci-archive` file that `skopeo copy oci-archive:...` or `ctr image import` loads.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::{apt, cargo, cargo::target_dir, toolchain::Toolchain, vm};

/// The image's name in local storage and in the DaemonSet (`localhost/` is where podman and
/// buildah put an image without a registry).
pub const IMAGE: &str = "localhost/qoslet:latest";
/// The containers tools (podman and runc run it in the container test; skopeo inspects the
/// archive as a node's import would).
pub const PACKAGES: &[&str] = &["buildah", "podman", "skopeo", "runc"];

pub struct Image {
    pub archive: PathBuf,
    /// The binary inside (uncompressed).
    pub binary_bytes: u64,
    pub archive_bytes: u64,
}

/// The global options every containers tool gets here: vfs storage (no overlay mounts needed).
pub fn storage_args() -> [&'static str; 2] {
    ["--storage-driver", "vfs"]
}

pub fn build(tc: &Toolchain) -> Result<Image> {
    if std::env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1" || v == "true") {
        bail!("AYA_BUILD_SKIP is set: the image's agent needs its eBPF programs; unset it");
    }
    apt::ensure("image", PACKAGES)?;
    vm::ensure_musl_target()?;
    let t = Instant::now();
    cargo::run(
        tc,
        &[
            "build",
            "--release",
            "-p",
            "qoslet",
            "--target",
            vm::MUSL_TARGET,
        ],
    )?;
    let binary = target_dir().join(vm::MUSL_TARGET).join("release/qoslet");
    println!("image: musl release build in {:.1?}", t.elapsed());
    check_static(&binary)?;

    let t = Instant::now();
    let out = target_dir().join("image");
    let context = out.join("context");
    let _ = fs::remove_dir_all(&context);
    fs::create_dir_all(&context)?;
    fs::copy(&binary, context.join("qoslet"))?;
    let containerfile = cargo::workspace_root().join("deploy/Containerfile");
    let previous = image_id();
    apt::run(
        Command::new("buildah")
            .args(storage_args())
            .args(["bud", "--quiet", "--layers=false", "--tag", IMAGE, "--file"])
            .arg(&containerfile)
            .arg(&context),
    )?;
    let archive = out.join("qoslet.oci.tar");
    let _ = fs::remove_file(&archive);
    apt::run(
        Command::new("buildah")
            .args(storage_args())
            .args(["push", "--quiet", IMAGE])
            .arg(format!("oci-archive:{}:{IMAGE}", archive.display())),
    )?;
    // The tag moved to the new image: drop the one it replaced (vfs keeps full copies).
    if let Some(old) = previous.filter(|old| image_id().as_ref() != Some(old)) {
        let _ = Command::new("buildah")
            .args(storage_args())
            .args(["rmi", &old])
            .output();
    }
    // Loadable as a node would load it: skopeo reads the archive's manifest and config.
    let inspect = Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci-archive:{}", archive.display()))
        .output()
        .context("running skopeo")?;
    if !inspect.status.success() {
        bail!(
            "skopeo cannot read {}: {}",
            archive.display(),
            String::from_utf8_lossy(&inspect.stderr).trim()
        );
    }
    let image = Image {
        binary_bytes: fs::metadata(&binary)?.len(),
        archive_bytes: fs::metadata(&archive)?.len(),
        archive,
    };
    println!(
        "image: {IMAGE} built in {:.1?}: binary {:.1} MiB, oci-archive {} {:.1} MiB",
        t.elapsed(),
        mib(image.binary_bytes),
        image.archive.display(),
        mib(image.archive_bytes)
    );
    Ok(image)
}

/// The image id `IMAGE` names in local storage, if any.
fn image_id() -> Option<String> {
    let out = Command::new("buildah")
        .args(storage_args())
        .args(["images", "--quiet", "--no-trunc", IMAGE])
        .output()
        .ok()?;
    let id = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !id.is_empty()).then_some(id)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// A static executable has no program interpreter (`PT_INTERP`): nothing to load from a libc
/// the image does not have.
pub fn check_static(binary: &Path) -> Result<()> {
    let elf = fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    if has_interp(&elf).context("not a 64-bit ELF file")? {
        bail!("{} is dynamically linked", binary.display());
    }
    Ok(())
}

/// Whether a little-endian ELF64 file has a `PT_INTERP` program header.
fn has_interp(elf: &[u8]) -> Option<bool> {
    if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 {
        return None;
    }
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?);
        if p_type == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_has_an_interpreter() {
        // Tools on every Linux machine are dynamically linked against its libc.
        let ls = fs::read("/bin/ls").unwrap();
        assert_eq!(has_interp(&ls), Some(true));
        assert_eq!(has_interp(b"#!/bin/sh\n"), None);
    }
}
