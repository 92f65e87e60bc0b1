//! `cargo xtask bench peers`: qoslet beside its peers (a kubelet-like loop, Debian's earlyoom,
//! the kernel alone) in one 6.12 VM where the whole machine is the node. Builds the static agent
//! and the bench driver (`tests/src/bin/qoslet-bench-peers.rs`), fetches earlyoom from Debian,
//! packs them with their own init script, boots the VM with a fixed memory and no swap, and
//! returns the driver's markdown report.
//!
//! `QOSLET_BENCH_PEERS_REPETITIONS` (default 2) and `QOSLET_BENCH_PEERS_SCENARIOS` (comma
//! separated keys: fast, 100, 20, four, churn; default all) narrow a run.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{initramfs, kernels, qemu};
use crate::{cargo, toolchain::Toolchain};

const MAIN: &str = include_str!("peers.sh");
const KERNEL: &str = "6.12";
/// The node's memory: fixed, so every system and run sees the same machine.
const MEMORY_MIB: u32 = 1024;
/// The whole VM run: boot and setup, then about 4 min per repetition of every row (measured:
/// 508 s for 2, before each repetition restarted every system's node), with room for TCG on a
/// busy machine.
fn timeout(repetitions: u64) -> Duration {
    Duration::from_secs((5 + 7 * repetitions) * 60)
}
const DRIVER: &str = "qoslet-bench-peers";

pub fn run(tc: &Toolchain) -> Result<String> {
    let started = Instant::now();
    let release = super::build_vm_binaries(
        tc,
        &[
            "-p",
            "qoslet",
            "--bin",
            "qoslet",
            "-p",
            "qoslet-tests",
            "--bin",
            DRIVER,
        ],
    )?;
    let cache = kernels::cache_dir()?;
    let earlyoom = earlyoom(&cache.join("earlyoom"))?;
    let mut files = vec![
        (release.join("qoslet"), PathBuf::from("/bin/qoslet")),
        (
            release.join(DRIVER),
            PathBuf::from(format!("/bin/{DRIVER}")),
        ),
        (earlyoom.clone(), PathBuf::from("/usr/bin/earlyoom")),
    ];
    for lib in shared_libraries(&earlyoom)? {
        files.push((lib.clone(), lib));
    }
    let out_dir = cargo::target_dir().join("bench");
    fs::create_dir_all(&out_dir)?;
    let conf = out_dir.join("peers.conf");
    let mut text = String::new();
    let repetitions: u64 = match std::env::var("QOSLET_BENCH_PEERS_REPETITIONS") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|&n| (1..=50).contains(&n))
            .context("QOSLET_BENCH_PEERS_REPETITIONS must be a number from 1 to 50")?,
        Err(_) => 2,
    };
    for (var, key) in [
        ("QOSLET_BENCH_PEERS_REPETITIONS", "repetitions"),
        ("QOSLET_BENCH_PEERS_SCENARIOS", "scenarios"),
    ] {
        if let Ok(v) = std::env::var(var) {
            text.push_str(&format!("{key}={v}\n"));
        }
    }
    fs::write(&conf, text)?;
    files.push((conf, PathBuf::from("/peers.conf")));
    let initrd = initramfs::build_scripted(MAIN, &files, &out_dir, "peers-initramfs")?;
    let kernel = kernels::fetch(KERNEL, &cache)?;
    println!(
        "bench peers: {} ready, VM {MEMORY_MIB} MiB, after {:.1?}",
        kernel.package,
        started.elapsed()
    );
    let log = out_dir.join("peers-vm.log");
    // The page-cache churn goes through an NVMe disk (built into Debian's cloud kernel) on a null
    // device: writes vanish on the host, reads are zeros, nothing lands on the host's disk.
    let extra: Vec<String> = [
        "-blockdev",
        "driver=null-co,node-name=churn,size=8589934592,read-zeroes=on",
        "-device",
        "nvme,drive=churn,serial=peers",
    ]
    .map(str::to_owned)
    .to_vec();
    let boot = qemu::boot(
        qemu::Machine::X86_64,
        &kernel.vmlinuz,
        &initrd,
        MEMORY_MIB,
        timeout(repetitions),
        &log,
        "peers",
        &extra,
    )?;
    println!(
        "bench peers: VM finished in {:.1?} ({:.1?} in all)",
        boot.elapsed,
        started.elapsed()
    );
    let report = boot.report("QOSLET-VM-PEERS| ");
    if boot.timed_out
        || !boot
            .lines
            .iter()
            .any(|l| l.contains("QOSLET-VM-PEERS-DONE"))
    {
        bail!(
            "the peers bench did not finish (timed out: {}); the VM's console is in {}",
            boot.timed_out,
            log.display()
        );
    }
    Ok(format!(
        "{report}\nVM: Debian {}, {MEMORY_MIB} MiB, 2 vCPUs under TCG; {:.0} s for the whole bench (build, boot and runs).\n",
        kernel.package,
        started.elapsed().as_secs_f64()
    ))
}

/// Debian's earlyoom binary, downloaded and unpacked once into `cache`.
fn earlyoom(cache: &Path) -> Result<PathBuf> {
    let binary = cache.join("earlyoom");
    if binary.is_file() {
        return Ok(binary);
    }
    let work = cache.join("download");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let download = |work: &Path| {
        Command::new("apt-get")
            .args([
                "download",
                "-q",
                "-o",
                "APT::Sandbox::User=root",
                "earlyoom",
            ])
            .current_dir(work)
            .status()
            .is_ok_and(|s| s.success())
    };
    // A fresh machine may have no package lists yet.
    if !download(&work) {
        crate::apt::run(Command::new("apt-get").args(["update", "-q"]))?;
        if !download(&work) {
            bail!("apt-get download earlyoom failed");
        }
    }
    let deb = fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no earlyoom .deb")?;
    let root = work.join("root");
    crate::apt::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    fs::copy(root.join("usr/bin/earlyoom"), cache.join("earlyoom.tmp"))?;
    // Renamed last: its presence marks a complete cache entry.
    fs::rename(cache.join("earlyoom.tmp"), &binary)?;
    fs::remove_dir_all(&work)?;
    Ok(binary)
}

/// The shared libraries and the dynamic loader a binary links, from `ldd` (the host's, which
/// are Debian's own for a Debian package).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    if !out.status.success() {
        bail!("ldd {} failed", binary.display());
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_libraries_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f32)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f33)\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }
}
