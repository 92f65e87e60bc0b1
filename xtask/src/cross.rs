//! `cargo xtask build --target <arch>`: the static (musl) release agent for x86-64 or arm64 with
//! its eBPF object, built on this x86-64 machine with what xtask installs: the rustup target,
//! rust-lld (shipped with rustup's toolchain) as the linker against the target's self-contained
//! musl, and Debian's cross gcc for the C and assembly that ring (kube's TLS) and psm (pest's
//! stack guard) compile for the target.
//!
//! The eBPF object is the same for both: the programs are built for `bpfel-unknown-none` (both
//! architectures are little-endian) and carry no architecture-specific code; struct offsets come
//! from the running kernel's BTF at load time and tracepoint record layouts from tracefs (see the
//! "How the kernel side copes with different kernels" in docs/kernels.md). The build compares the two
//! objects' program and map sections when both exist and says whether they are the same.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::{apt, cargo, cargo::target_dir, toolchain::Toolchain, vm};

/// The architectures `--target` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64", alias = "amd64", alias = "x86-64")]
    X86_64,
    #[value(name = "aarch64", alias = "arm64")]
    Aarch64,
}

impl Arch {
    pub fn triple(self) -> &'static str {
        match self {
            Arch::X86_64 => vm::MUSL_TARGET,
            Arch::Aarch64 => vm::AARCH64_MUSL_TARGET,
        }
    }

    /// ELF `e_machine`.
    fn elf_machine(self) -> u16 {
        match self {
            Arch::X86_64 => 62,
            Arch::Aarch64 => 183,
        }
    }

    /// Debian packages with the C compiler cc-rs uses for this target.
    fn c_packages(self) -> &'static [&'static str] {
        match self {
            // musl-gcc, as for the VM's test binaries.
            Arch::X86_64 => &["musl-tools"],
            // No arm64 musl-gcc in Debian: the glibc cross gcc (with the C headers its stdint.h
            // includes) compiles ring's and psm's C and assembly; nothing links against glibc
            // (rust-lld links musl).
            Arch::Aarch64 => &["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"],
        }
    }

    /// Environment for cargo: the linker and the C compiler of the target.
    pub fn env(self) -> Vec<(String, String)> {
        match self {
            Arch::X86_64 => Vec::new(),
            Arch::Aarch64 => {
                let t = self.triple();
                let upper = t.to_uppercase().replace('-', "_");
                let lower = t.replace('-', "_");
                vec![
                    // rustc finds rust-lld in the toolchain's own bin directory; the musl
                    // target then links its self-contained crt objects and libc.
                    (
                        format!("CARGO_TARGET_{upper}_LINKER"),
                        "rust-lld".to_owned(),
                    ),
                    (format!("CC_{lower}"), "aarch64-linux-gnu-gcc".to_owned()),
                    (format!("AR_{lower}"), "aarch64-linux-gnu-ar".to_owned()),
                ]
            }
        }
    }
}

/// Installs what building for `arch` needs: its C compiler and the rustup target.
pub fn ensure(arch: Arch) -> Result<()> {
    apt::ensure("build", arch.c_packages())?;
    vm::ensure_rust_target(arch.triple())
}

/// Builds `qoslet` for `arch` (release, static) and returns the binary; prints where the eBPF
/// object embedded in it is.
pub fn build(tc: &Toolchain, arch: Arch) -> Result<PathBuf> {
    if std::env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1" || v == "true") {
        bail!("AYA_BUILD_SKIP is set: the agent needs its eBPF programs; unset it");
    }
    let triple = arch.triple();
    ensure(arch)?;
    let t = Instant::now();
    let env = arch.env();
    cargo::run_env(
        tc,
        &["build", "--release", "-p", "qoslet", "--target", triple],
        &env,
    )?;
    let binary = target_dir().join(triple).join("release/qoslet");
    let elf = fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    let machine = elf_machine(&elf).context("not an ELF file")?;
    if machine != arch.elf_machine() {
        bail!(
            "{} is for ELF machine {machine}, not {}",
            binary.display(),
            arch.elf_machine()
        );
    }
    crate::image::check_static(&binary)?;
    let ebpf_object = ebpf_object(triple)?;
    println!(
        "build: {} ({} MiB, static, {triple}) in {:.1?}",
        binary.display(),
        elf.len() >> 20,
        t.elapsed()
    );
    println!("build: eBPF object {}", ebpf_object.display());
    compare_objects(arch, &ebpf_object);
    Ok(binary)
}

/// `e_machine` of an ELF file (little-endian).
fn elf_machine(elf: &[u8]) -> Option<u16> {
    if elf.get(..4)? != b"\x7fELF" {
        return None;
    }
    Some(u16::from_le_bytes(elf.get(18..20)?.try_into().ok()?))
}

/// The newest `qoslet` object agent/build.rs left for the release build of `triple`.
fn ebpf_object(triple: &str) -> Result<PathBuf> {
    let build = target_dir().join(triple).join("release/build");
    let newest = fs::read_dir(&build)
        .with_context(|| format!("reading {}", build.display()))?
        .filter_map(std::result::Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("qoslet-"))
        .map(|e| e.path().join("out/qoslet"))
        .filter(|p| p.is_file())
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok());
    newest.with_context(|| format!("no eBPF object under {}", build.display()))
}

/// Says whether the other architecture's object, if built, has the same programs and maps.
/// Debug info and BTF are left out: they carry the source paths and the crate's hash, which
/// `--cfg bpf_target_arch` (set by aya-build from the agent's target) changes.
fn compare_objects(arch: Arch, object: &Path) {
    let other = match arch {
        Arch::X86_64 => Arch::Aarch64,
        Arch::Aarch64 => Arch::X86_64,
    };
    let Ok(other_object) = ebpf_object(other.triple()) else {
        return;
    };
    let (Ok(a), Ok(b)) = (fs::read(object), fs::read(&other_object)) else {
        return;
    };
    let (Some(sa), Some(sb)) = (loaded_sections(&a), loaded_sections(&b)) else {
        println!("build: could not read the eBPF objects' sections to compare them");
        return;
    };
    if sa == sb {
        println!(
            "build: the eBPF programs and maps are byte for byte those of the {} build ({} sections; debug info and BTF aside)",
            other.triple(),
            sa.len()
        );
    } else {
        let differ: Vec<&str> = sa
            .iter()
            .filter(|(n, d)| sb.iter().find(|(m, _)| m == n).map(|(_, e)| e) != Some(d))
            .map(|(n, _)| n.as_str())
            .collect();
        println!(
            "build: the eBPF object differs from the {} build's in {differ:?}",
            other.triple()
        );
    }
}

/// The sections of a little-endian ELF64 object, by name, except debug info and BTF.
fn loaded_sections(elf: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at =
        |o: usize| usize::try_from(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?)).ok();
    let shoff = u64_at(0x28)?;
    let (shentsize, shnum, shstrndx) = (
        usize::from(u16_at(0x3a)?),
        usize::from(u16_at(0x3c)?),
        usize::from(u16_at(0x3e)?),
    );
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18)?;
    const SHT_NOBITS: u32 = 8;
    let mut out = Vec::new();
    for i in 0..shnum {
        let h = header(i);
        let name_at = strtab + usize::try_from(u32_at(h)?).ok()?;
        let end = name_at + elf.get(name_at..)?.iter().position(|&c| c == 0)?;
        let name = String::from_utf8_lossy(elf.get(name_at..end)?).into_owned();
        let skipped = ["debug", "BTF"]
            .iter()
            .any(|p| name.starts_with(&format!(".{p}")) || name.starts_with(&format!(".rel.{p}")));
        if skipped {
            continue;
        }
        let (offset, size) = (u64_at(h + 0x18)?, u64_at(h + 0x20)?);
        let data = if u32_at(h + 4)? == SHT_NOBITS {
            Vec::new()
        } else {
            elf.get(offset..offset + size)?.to_vec()
        };
        out.push((name, data));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_elf_machine() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[18..20].copy_from_slice(&183u16.to_le_bytes());
        assert_eq!(elf_machine(&elf), Some(Arch::Aarch64.elf_machine()));
        assert_eq!(elf_machine(b"#!/bin/sh"), None);
    }

    #[test]
    fn arm64_links_with_rust_lld_and_compiles_c_with_the_cross_gcc() {
        let env = Arch::Aarch64.env();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER"),
            Some("rust-lld")
        );
        assert_eq!(
            get("CC_aarch64_unknown_linux_musl"),
            Some("aarch64-linux-gnu-gcc")
        );
    }
}
