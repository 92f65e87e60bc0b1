//! `cargo xtask bench cpu` in the VMs: the CPU-pressure bench (`tests/src/bin/qoslet-bench-cpu.rs`)
//! on each kernel of the test matrix (pure cgroup v2, 2 vCPUs under TCG), after its run on the
//! host. The scheduler decides what the levers buy, and 5.10 and 6.1 schedule with CFS where 6.12
//! and the host schedule with EEVDF, so one kernel's table says little about another's.

use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use super::{initramfs, kernels, qemu};
use crate::{cargo, toolchain::Toolchain};

/// The VM's main, sourced by init.sh once cgroup v2 is mounted: the bench's lines behind a
/// prefix, its exit status, power off.
const MAIN: &str = "dmesg -n 1
/bin/qoslet-bench-cpu > /tmp/cpu.out
rc=$?
sed 's/^/QOSLET-VM-CPU| /' /tmp/cpu.out
echo \"QOSLET-VM-CPU-EXIT rc=$rc\"
sync
poweroff -f
";
const DRIVER: &str = "qoslet-bench-cpu";
const MEMORY_MIB: u32 = 512;
const TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The markdown report of every kernel of the test matrix ([`super::MATRIX`]).
pub fn run(tc: &Toolchain) -> Result<String> {
    let release = super::build_vm_binaries(tc, &["-p", "qoslet-tests", "--bin", DRIVER])?;
    let out_dir = cargo::target_dir().join("bench");
    fs::create_dir_all(&out_dir)?;
    let files = [(
        release.join(DRIVER),
        PathBuf::from(format!("/bin/{DRIVER}")),
    )];
    // The bench's own settings (`QOSLET_BENCH_CPU_*`) reach the VM's shell as exports; anything
    // but letters and digits (and `_` in a name) would be shell syntax there.
    let exports = std::env::vars()
        .filter(|(k, v)| {
            k.starts_with("QOSLET_BENCH_CPU_")
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && v.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .fold(String::new(), |s, (k, v)| s + &format!("export {k}={v}\n"));
    let initrd = initramfs::build_scripted(&(exports + MAIN), &files, &out_dir, "cpu-initramfs")?;
    let cache = kernels::cache_dir()?;
    let mut report = String::new();
    for s in super::MATRIX {
        let started = Instant::now();
        let kernel = kernels::fetch(s, &cache)?;
        let log = out_dir.join(format!("cpu-vm-{s}.log"));
        let boot = qemu::boot(
            qemu::Machine::X86_64,
            &kernel.vmlinuz,
            &initrd,
            MEMORY_MIB,
            TIMEOUT,
            &log,
            &format!("cpu-{s}"),
            &[],
        )?;
        if boot.timed_out
            || !boot
                .lines
                .iter()
                .any(|l| l.contains("QOSLET-VM-CPU-EXIT rc=0"))
        {
            bail!(
                "the CPU bench did not finish on {} (timed out: {}); the console is in {}",
                kernel.package,
                boot.timed_out,
                log.display()
            );
        }
        report.push_str(&format!(
            "\n### VM: Debian {} ({:.0} s)\n\n{}",
            kernel.package,
            started.elapsed().as_secs_f64(),
            boot.report("QOSLET-VM-CPU| ")
        ));
    }
    Ok(report)
}
