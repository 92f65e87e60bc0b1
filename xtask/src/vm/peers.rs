//! `cargo xtask bench peers`: qoslet beside its peers (a kubelet-like loop, Debian's earlyoom,
//! oomd and nohang, the kernel alone) in one 6.12 VM where the whole machine is the node. Builds
//! the static agent and the bench driver (`tests/src/bin/qoslet-bench-peers.rs`), fetches the
//! peers from Debian (nohang with the host's Debian python3 and the part of its stdlib nohang
//! imports), packs them with their own init script and their configs (`oomd.json`,
//! `nohang.conf` here), boots the VM with a fixed memory and no swap, and returns the driver's
//! markdown report. systemd-oomd is not among them: it needs systemd, which this VM does not
//! boot (its init is a shell script).
//!
//! `QOSLET_BENCH_PEERS_REPETITIONS` (default 2), `QOSLET_BENCH_PEERS_SCENARIOS` (comma
//! separated keys: fast, 100, 20, four, churn; default all) and `QOSLET_BENCH_PEERS_SYSTEMS`
//! (qoslet, kubelet, earlyoom, oomd, nohang, kernel; default all) narrow a run.

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
const OOMD_JSON: &str = include_str!("oomd.json");
const NOHANG_CONF: &str = include_str!("nohang.conf");
const KERNEL: &str = "6.12";
/// The node's memory: fixed, so every system and run sees the same machine.
const MEMORY_MIB: u32 = 1024;
/// The whole VM run: boot and setup, then about 4 min per repetition of every row with four
/// systems (measured: 508 s for 2, before each repetition restarted every system's node), six
/// now, with room for TCG on a busy machine.
fn timeout(repetitions: u64) -> Duration {
    Duration::from_secs((5 + 11 * repetitions) * 60)
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
    let earlyoom = debian_file(&cache, "earlyoom", "usr/bin/earlyoom")?;
    let oomd = debian_file(&cache, "oomd", "usr/bin/oomd")?;
    let nohang = debian_file(&cache, "nohang", "usr/sbin/nohang")?;
    // oomd's libraries as its package depends on them, for ldd to find on the host.
    crate::apt::ensure(
        "bench peers",
        &["libjsoncpp25", "libsystemd0", "libstdc++6", "libgcc-s1"],
    )?;
    let out_dir = cargo::target_dir().join("bench");
    fs::create_dir_all(&out_dir)?;
    let mut files = vec![
        (release.join("qoslet"), PathBuf::from("/bin/qoslet")),
        (
            release.join(DRIVER),
            PathBuf::from(format!("/bin/{DRIVER}")),
        ),
        (earlyoom.clone(), PathBuf::from("/usr/bin/earlyoom")),
        (oomd.clone(), PathBuf::from("/usr/bin/oomd")),
        (nohang, PathBuf::from("/usr/sbin/nohang")),
    ];
    for binary in [&earlyoom, &oomd] {
        for lib in shared_libraries(binary)? {
            files.push((lib.clone(), lib));
        }
    }
    for (name, text, to) in [
        ("oomd.json.in", OOMD_JSON, "/etc/oomd/oomd.json.in"),
        ("nohang.conf", NOHANG_CONF, "/etc/nohang/nohang.conf"),
    ] {
        let path = out_dir.join(name);
        fs::write(&path, text)?;
        files.push((path, PathBuf::from(to)));
    }
    let python = python_runtime()?;
    let python_bytes: u64 = python
        .iter()
        .filter_map(|(from, _)| fs::metadata(from).ok())
        .map(|m| m.len())
        .sum();
    println!(
        "bench peers: nohang's python3 and its modules: {} files, {:.1} MiB before stripping",
        python.len(),
        python_bytes as f64 / (1 << 20) as f64
    );
    files.extend(python);
    files.sort();
    files.dedup();
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
        ("QOSLET_BENCH_PEERS_SYSTEMS", "systems"),
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
        "bench peers: {} ready, initramfs {:.1} MiB, VM {MEMORY_MIB} MiB, after {:.1?}",
        kernel.package,
        fs::metadata(&initrd).map_or(0, |m| m.len()) as f64 / (1 << 20) as f64,
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

/// `path` of Debian's `package`, downloaded and unpacked once into `cache/<package>/`.
fn debian_file(cache: &Path, package: &str, path: &str) -> Result<PathBuf> {
    let cache = cache.join(package);
    let name = Path::new(path)
        .file_name()
        .context("a package path without a file name")?;
    let file = cache.join(name);
    if file.is_file() {
        return Ok(file);
    }
    let work = cache.join("download");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let download = |work: &Path| {
        Command::new("apt-get")
            .args(["download", "-q", "-o", "APT::Sandbox::User=root", package])
            .current_dir(work)
            .status()
            .is_ok_and(|s| s.success())
    };
    // A fresh machine may have no package lists yet.
    if !download(&work) {
        crate::apt::run(Command::new("apt-get").args(["update", "-q"]))?;
        if !download(&work) {
            bail!("apt-get download {package} failed");
        }
    }
    let deb = fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no {package} .deb"))?;
    let root = work.join("root");
    crate::apt::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    let tmp = cache.join("file.tmp");
    fs::copy(root.join(path), &tmp)?;
    // Renamed last: its presence marks a complete cache entry.
    fs::rename(&tmp, &file)?;
    fs::remove_dir_all(&work)?;
    Ok(file)
}

/// What nohang (a Python 3 script) needs in the VM: Debian's python3 interpreter from the host,
/// the stdlib modules it imports at start and on its paths (found by importing them in that
/// interpreter), and their shared libraries, each at its own path.
fn python_runtime() -> Result<Vec<(PathBuf, PathBuf)>> {
    // python3 and its stdlib (ctypes, logging, subprocess are not in python3-minimal).
    crate::apt::ensure("bench peers", &["python3", "libpython3-stdlib"])?;
    let out = Command::new("/usr/bin/python3")
        .args(["-I", "-W", "ignore", "-c", PYTHON_MODULES])
        .output()
        .context("running Debian's /usr/bin/python3")?;
    if !out.status.success() {
        bail!(
            "listing nohang's python modules failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let interpreter = fs::canonicalize("/usr/bin/python3")?;
    let mut files = vec![(interpreter.clone(), PathBuf::from("/usr/bin/python3"))];
    let mut binaries = vec![interpreter];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = PathBuf::from(line.trim());
        if path.extension().is_some_and(|e| e == "so") {
            binaries.push(path.clone());
        }
        files.push((path.clone(), path));
    }
    for binary in &binaries {
        for lib in shared_libraries(binary)? {
            files.push((lib.clone(), lib));
        }
    }
    Ok(files)
}

/// Imports what nohang 0.2.0 imports (at its start and in the paths its config can take) and
/// prints every loaded module's file.
const PYTHON_MODULES: &str = "import sys, os, ctypes, time, operator, re, sre_constants, signal, random, logging, threading, shlex, subprocess\nfor m in list(sys.modules.values()):\n    f = getattr(m, '__file__', None)\n    if f: print(f)\n";

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
