//! `cargo xtask vm-test`: the cgroup v2 kernel matrix. Boots Debian's kernels under QEMU (TCG)
//! with an initramfs holding the static test binaries and reads their results from the serial
//! console.

pub mod cpu;
mod deps;
mod initramfs;
mod kernels;
pub mod peers;
mod qemu;
mod report;
pub mod sensor_table;

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

pub use deps::{MUSL_TARGET, ensure_musl_target, ensure_rust_target, ensure_vm_prerequisites};

/// The kernel series of the test matrix (`vm-test`'s default, and `bench cpu`'s VMs).
pub const MATRIX: [&str; 3] = ["5.10", "6.1", "6.12"];

#[derive(Debug, Clone, clap::Args)]
pub struct VmTestArgs {
    /// Kernel series ("5.10", "6.1", "6.12") or exact Debian ABI ("6.1.0-57"); the newest
    /// cloud-amd64 package of each that the archive serves is used (5.10 from bullseye, through a
    /// private apt source list). "arm64": bookworm's cloud-arm64 kernel under
    /// qemu-system-aarch64 with arm64 test binaries (not in the default list). Repeatable.
    #[arg(long = "kernel", value_name = "VERSION", default_values = MATRIX)]
    pub kernels: Vec<String>,
    /// Seconds one VM may run, boot and tests included, before it is killed and counted failed.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Memory of each VM in MiB; the initramfs lives in it too.
    #[arg(long, default_value_t = 1024)]
    pub memory: u32,
    /// Only the `qoslet-tests` integration test of this name (e.g. `cpu_pressure`), with the
    /// helper binaries; repeatable. All of them by default.
    #[arg(long = "test", value_name = "NAME")]
    pub tests: Vec<String>,
}

impl VmTestArgs {
    /// `binaries` without the test executables `--test` did not name (helpers always stay).
    pub fn select(&self, binaries: Vec<PathBuf>) -> Vec<PathBuf> {
        if self.tests.is_empty() {
            return binaries;
        }
        binaries
            .into_iter()
            .filter(|b| {
                // Test executables are `deps/<name>-<hash>`; helpers sit in the profile directory.
                let is_test = b.parent().is_some_and(|d| d.ends_with("deps"));
                let name = b.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                !is_test
                    || self.tests.iter().any(|t| {
                        name.strip_prefix(t.as_str())
                            .is_some_and(|r| r.starts_with('-'))
                    })
            })
            .collect()
    }
}

/// For a VM job (`bench peers`, `bench cpu`): the VM prerequisites, then `bins` (`-p PKG --bin
/// BIN` arguments) as static musl release binaries; returns their directory.
fn build_vm_binaries(tc: &crate::toolchain::Toolchain, bins: &[&str]) -> Result<PathBuf> {
    ensure_vm_prerequisites()?;
    let mut args = vec!["build", "--release", "--target", MUSL_TARGET];
    args.extend_from_slice(bins);
    crate::cargo::run(tc, &args)?;
    Ok(crate::cargo::target_dir().join(MUSL_TARGET).join("release"))
}

/// The outcome on one kernel.
#[derive(Debug, Clone)]
pub struct KernelReport {
    /// `uname -r` inside the VM (the Debian ABI when the VM never got that far).
    pub kernel: String,
    pub cgroup_layout: String,
    pub passed: u32,
    pub failed: u32,
    pub ignored: u32,
    /// All binaries ran, none failed, the VM finished in time.
    pub ok: bool,
    pub log_path: PathBuf,
    /// The `QOSLET-SENSOR` lines of the run: which hook each sensor used.
    pub sensors: Vec<sensor_table::SensorLine>,
}

/// Runs `test_binaries` (static musl builds, see [`build_test_binaries`]) on every kernel of
/// `args` and prints one line per kernel. Returns `Ok` with the reports even when tests fail: the
/// caller must fail when any report is not `ok`. `Err` means the harness itself broke.
pub fn vm_test(args: &VmTestArgs, test_binaries: &[PathBuf]) -> Result<Vec<KernelReport>> {
    run_matrix(args, test_binaries, qemu::Machine::X86_64)
}

/// [`vm_test`] for the arm64 kernels (`--kernel arm64`) on `qemu-system-aarch64`, with test
/// binaries built for [`AARCH64_MUSL_TARGET`].
pub fn vm_test_arm64(args: &VmTestArgs, test_binaries: &[PathBuf]) -> Result<Vec<KernelReport>> {
    crate::apt::ensure("vm-test", ARM64_PACKAGES)?;
    run_matrix(args, test_binaries, qemu::Machine::Aarch64)
}

/// The musl target of the arm64 VM's test binaries.
pub const AARCH64_MUSL_TARGET: &str = "aarch64-unknown-linux-musl";
/// What the arm64 VM needs besides the x86-64 one's: the emulator and the cross binutils'
/// `strip` (the arm64 busybox comes from Debian's arm64 archive, see `kernels::BOOKWORM_ARM64`).
const ARM64_PACKAGES: &[&str] = &["qemu-system-arm", "binutils-aarch64-linux-gnu"];

/// Whether `--kernel <series>` is the arm64 VM.
pub fn is_arm64(series: &str) -> bool {
    kernels::is_arm64(series)
}

/// Writes `target/vm-test/kernel-table.md` from the reports' sensor lines (see [`sensor_table`]).
pub fn write_kernel_table(reports: &[KernelReport], command: &str) -> Result<()> {
    let lines: Vec<_> = reports.iter().flat_map(|r| r.sensors.clone()).collect();
    if let Some(table) = write_sensor_lines(&lines, command)? {
        println!("vm-test: kernel table {}", table.display());
    }
    Ok(())
}

/// Writes `target/vm-test/kernel-table.md` from `lines` (the host's and the VMs'); returns its
/// path, or `None` when there was no line.
pub fn write_sensor_lines(
    lines: &[sensor_table::SensorLine],
    command: &str,
) -> Result<Option<PathBuf>> {
    let out_dir = crate::cargo::target_dir().join("vm-test");
    std::fs::create_dir_all(&out_dir)?;
    let table = out_dir.join("kernel-table.md");
    Ok(sensor_table::write(lines, command, &table)?.then_some(table))
}

fn run_matrix(
    args: &VmTestArgs,
    test_binaries: &[PathBuf],
    machine: qemu::Machine,
) -> Result<Vec<KernelReport>> {
    if test_binaries.is_empty() {
        bail!("vm-test: no test binaries to run");
    }
    let t = Instant::now();
    ensure_vm_prerequisites()?;
    println!("vm-test: prerequisites checked in {:.1?}", t.elapsed());
    let cache = kernels::cache_dir()?;
    let out_dir = crate::cargo::target_dir().join("vm-test");
    std::fs::create_dir_all(&out_dir)?;

    let t = Instant::now();
    let initrd = match machine {
        qemu::Machine::X86_64 => initramfs::build(test_binaries, &out_dir)?,
        qemu::Machine::Aarch64 => {
            let busybox =
                kernels::BOOKWORM_ARM64.file_of(&cache, "busybox-static", "bin/busybox")?;
            initramfs::build_with(
                test_binaries,
                &out_dir,
                &busybox,
                "aarch64-linux-gnu-strip",
                "initramfs-arm64",
            )?
        }
    };
    println!(
        "vm-test: initramfs {} ({} MiB) in {:.1?}",
        initrd.display(),
        std::fs::metadata(&initrd)?.len() >> 20,
        t.elapsed()
    );

    let mut reports = Vec::new();
    for series in &args.kernels {
        let t = Instant::now();
        let kernel = kernels::fetch(series, &cache)?;
        println!(
            "vm-test: kernel {} ready in {:.1?}",
            kernel.package,
            t.elapsed()
        );
        let log_path = out_dir.join(format!("{}.log", sanitize(series)));
        let timeout = Duration::from_secs(args.timeout);
        match (machine, kernel.arch) {
            (qemu::Machine::X86_64, "amd64") | (qemu::Machine::Aarch64, "arm64") => {}
            (machine, arch) => bail!("--kernel {series} is an {arch} kernel, not for {machine:?}"),
        }
        let boot = qemu::boot(
            machine,
            &kernel.vmlinuz,
            &initrd,
            args.memory,
            timeout,
            &log_path,
            series,
            &[],
        )?;
        println!("vm-test: {series} VM finished in {:.1?}", boot.elapsed);
        reports.push(report::parse(
            &boot.lines,
            test_binaries
                .iter()
                .filter(|b| initramfs::is_test_binary(b))
                .count(),
            boot.timed_out,
            &kernel.package,
            log_path,
        ));
    }
    report::print(&reports);
    Ok(reports)
}

/// `qoslet-tests` targets that run on the host only: the fake API server's own tests, and the
/// API fault suite with the copy of qoslet it starts (`qoslet-test-agent`): the client's
/// behaviour under faults does not depend on the kernel, and the suite's 455 s on the host on
/// 2026-12-05, about 2 minutes more since (a first list silent for 90 s, a hung list, SIGTERM
/// before the first list), would push a VM past its limit.
///
/// And `real_cluster`: its tests run against the real cluster of `cargo xtask cluster`, never in
/// a VM, and its 57 MB took the initramfs past what a 1 GiB VM could unpack (2026-12-06).
const HOST_ONLY: &[&str] = &[
    "fake_api",
    "qoslet-fake-api",
    "api_faults",
    "qoslet-test-agent",
    "real_cluster",
];

/// Builds the `qoslet-tests` integration test binaries for musl and returns their paths.
pub fn build_test_binaries(path_env: &std::ffi::OsStr) -> Result<Vec<PathBuf>> {
    build_test_binaries_for(path_env, MUSL_TARGET, &[])
}

/// [`build_test_binaries`] for `triple`, with `env` (a cross linker and C compiler).
pub fn build_test_binaries_for(
    path_env: &std::ffi::OsStr,
    triple: &str,
    env: &[(String, String)],
) -> Result<Vec<PathBuf>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args(["test", "-p", "qoslet-tests", "--no-run", "--target", triple])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(["--message-format=json"])
        .current_dir(crate::cargo::workspace_root())
        // `cargo xtask` runs with xtask's CARGO_MANIFEST_DIR, which ring's build script tracks:
        // left in, every switch between `cargo xtask` and plain cargo rebuilds the TLS stack.
        .env_remove("CARGO_MANIFEST_DIR")
        .env("PATH", path_env)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the musl test binaries failed: {}", out.status);
    }
    let mut binaries = Vec::new();
    for line in out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let msg: serde_json::Value = serde_json::from_slice(line)?;
        let kind_is = |want: &str| {
            msg["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == want))
        };
        // Test executables, and the helper binaries the tests start (e.g. qoslet-test-hog).
        // Bench binaries are not needed in the VM, nor the fake API server and its tests, which
        // exercise kube over loopback and nothing of the kernel.
        let name = msg["target"]["name"].as_str().unwrap_or_default();
        let is_bench = name.starts_with("qoslet-bench-");
        let host_only = HOST_ONLY.contains(&name);
        let wanted = (msg["profile"]["test"] == true && kind_is("test") && !host_only)
            || (msg["profile"]["test"] == false && kind_is("bin") && !is_bench && !host_only);
        if msg["reason"] == "compiler-artifact"
            && wanted
            && let Some(exe) = msg["executable"].as_str()
        {
            binaries.push(PathBuf::from(exe));
        }
    }
    Ok(binaries)
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
