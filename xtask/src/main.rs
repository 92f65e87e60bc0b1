//! `cargo xtask`: builds, tests and runs qoslet, installing what it needs first.
//!
//! - `build-ebpf`: the eBPF toolchain (rust-src, bpf-linker), then the agent with its programs.
//! - `build --target x86_64|aarch64`: the static release agent for that architecture, cross-built.
//! - `test`: the unused-dependency check (cargo-machete), formatting and clippy, unit tests, the root integration tests on this kernel, then the cgroup v2 kernel
//!   matrix under QEMU (`--no-vm` skips it). The README's test command.
//! - `run`: the README's main command: the agent on the embedded example node.
//! - `lint`: formatting and clippy alone.
//! - `vm-test`: the kernel matrix alone.
//! - `bench`: the speed and memory measurements (`tests/src/bin/qoslet-bench-*`).
//! - `image`: the OCI image (static agent, deploy/Containerfile) in local storage and an
//!   oci-archive; `--test` runs it as the DaemonSet describes.
//! - `validate-deploy`: deploy/kubernetes (kustomize) and the Helm chart deploy/helm/qoslet
//!   against the Kubernetes and prometheus-operator schemas, each other and `qoslet validate`;
//!   the alert rules through promtool.
//! - `deploy-test`: the deploy checks of `test` alone (validation, image, container, Prometheus).
//! - `helm-install`, `helm-uninstall`: the Helm chart on a cluster, with the pinned helm.
//! - `fuzz`: the cargo-fuzz targets of `fuzz/` (not part of `test`).
//! - `cluster up|down|test`: a real one-node Kubernetes cluster with qoslet installed on it,
//!   and the tests against it (its own CI step, not part of `test`).

mod apt;
mod bench;
mod cargo;
mod cluster;
mod container;
mod cross;
mod deploy;
mod disk;
mod fuzz;
mod gotools;
mod image;
mod lint;
mod load;
mod machete;
mod toolchain;
mod vm;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Build, test and run qoslet")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the eBPF toolchain if missing and build the agent with its kernel programs.
    BuildEbpf,
    /// The static release agent with its eBPF object for an architecture (cross-built here).
    Build {
        /// x86_64 (amd64) or aarch64 (arm64).
        #[arg(long, value_enum, default_value = "x86_64")]
        target: cross::Arch,
    },
    /// Unit tests, root integration tests on this kernel, then the VM kernel matrix.
    Test(TestArgs),
    /// Run qoslet's standalone demo node in deploy/examples/standalone (Ctrl-C stops it).
    Run {
        /// Extra arguments for `qoslet run`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `cargo fmt --check` and clippy with warnings as errors (the first step of `test`).
    Lint,
    /// Run the integration tests on Debian kernels with pure cgroup v2 under QEMU.
    VmTest(vm::VmTestArgs),
    /// Run the cargo-fuzz targets of fuzz/ (nightly, libFuzzer), each for --time seconds.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        time: u64,
        /// Only these targets (quantity, manifest_plan, kubelet_config, qoslet_config, workload).
        targets: Vec<String>,
    },
    /// Measure speed and memory targets; writes target/bench/report.md.
    Bench {
        /// Only the benches whose name ends with one of these (e.g. `reconcile`).
        only: Vec<String>,
    },
    /// Build the OCI image: a static release agent from deploy/Containerfile, with buildah.
    Image {
        /// Then run it under podman as deploy/kubernetes/daemonset.yaml describes (root).
        #[arg(long)]
        test: bool,
    },
    /// Validate deploy/: kustomize's and the Helm chart's objects (Kubernetes 1.37 and
    /// prometheus-operator schemas, each other, qoslet validate), promtool.
    ValidateDeploy,
    /// The deploy checks of `test` alone: validation, image and container test, Prometheus test.
    DeployTest,
    /// Install (or upgrade) the Helm chart deploy/helm/qoslet on a cluster: `helm upgrade
    /// --install qoslet -n qoslet-system --create-namespace` with the pinned helm.
    HelmInstall {
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Chart values, KEY=VALUE (helm --set), e.g. image.tag=dev.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Values files (helm --values), after the chart's defaults.
        #[arg(long = "values", value_name = "FILE")]
        values: Vec<PathBuf>,
        /// Wait until the DaemonSet's pods are ready, at most this many seconds.
        #[arg(long, value_name = "SECONDS")]
        wait: Option<u64>,
        /// Run helm in the network namespace /run/netns/NAME (a `cargo xtask cluster`'s).
        #[arg(long, value_name = "NAME")]
        netns: Option<String>,
    },
    /// Remove the Helm release of `helm-install` and its objects (not the namespace).
    HelmUninstall {
        #[arg(long)]
        kubeconfig: PathBuf,
        #[arg(long, value_name = "NAME")]
        netns: Option<String>,
    },
    /// A real one-node Kubernetes cluster (parts built from the Go module proxy) with qoslet
    /// installed as the README says, and the tests against it.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
}

#[derive(clap::Args)]
struct TestArgs {
    /// Skip the VM kernel matrix (quick local runs).
    #[arg(long)]
    no_vm: bool,
    /// Run N CPU hogs (stress-ng --cpu N) beside the whole suite, as a shared machine has:
    /// timing tests must pass under it.
    #[arg(long, value_name = "N")]
    load: Option<u32>,
    #[command(flatten)]
    vm: vm::VmTestArgs,
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::BuildEbpf => {
            let tc = toolchain::ensure()?;
            cargo::run(&tc, &["build", "-p", "qoslet"])?;
            println!(
                "xtask: built {} with its eBPF programs",
                cargo::target_dir().join("debug/qoslet").display()
            );
            Ok(())
        }
        Cmd::Build { target } => {
            let tc = toolchain::ensure()?;
            cross::build(&tc, target).map(drop)
        }
        Cmd::Test(args) => test(&args),
        Cmd::Lint => lint::check(&toolchain::ensure()?),
        Cmd::Fuzz { time, targets } => {
            let outcomes = fuzz::run(time, &targets)?;
            println!("\nxtask fuzz: {time} s per target");
            for o in &outcomes {
                let runs = o.runs.map_or_else(|| "?".to_owned(), |r| r.to_string());
                println!(
                    "  {:<16} {:>12} runs in {:>5.0} s (build included), {} new crash input(s)",
                    o.target,
                    runs,
                    o.seconds,
                    o.crashes.len()
                );
                for c in &o.crashes {
                    println!("    {}", c.display());
                }
            }
            if outcomes.iter().any(|o| !o.crashes.is_empty()) {
                bail!("fuzzing found crashes: make each a unit test of the agent, then fix it");
            }
            Ok(())
        }
        Cmd::Run { args } => run_example(&args),
        Cmd::Bench { only } => {
            let tc = toolchain::ensure()?;
            bench::run(&tc, &only).map(|_| ())
        }
        Cmd::Image { test } => {
            let tc = toolchain::ensure()?;
            image::build(&tc)?;
            if test {
                container::run()?;
            }
            Ok(())
        }
        Cmd::Cluster(cmd) => cluster::run(&cmd),
        Cmd::ValidateDeploy => validate_deploy(&toolchain::ensure()?),
        Cmd::DeployTest => {
            let tc = toolchain::ensure()?;
            let (lines, counts) = deploy_checks(&tc);
            println!("\n== qoslet deploy checks ==");
            for l in &lines {
                println!("{l}");
            }
            println!("xtask: {} passed, {} failed", counts.passed, counts.failed);
            if !counts.ok {
                bail!("deploy checks failed");
            }
            Ok(())
        }
        Cmd::HelmInstall {
            kubeconfig,
            set,
            values,
            wait,
            netns,
        } => {
            let set = set
                .iter()
                .map(|kv| {
                    kv.split_once('=')
                        .ok_or_else(|| anyhow::anyhow!("--set {kv}: not KEY=VALUE"))
                })
                .collect::<Result<Vec<_>>>()?;
            deploy::install(&deploy::Install {
                kubeconfig: &kubeconfig,
                set: &set,
                values: &values,
                wait: wait.map(Duration::from_secs),
                netns: netns.as_deref(),
            })?;
            println!(
                "xtask: helm release qoslet installed (kubeconfig {})",
                kubeconfig.display()
            );
            Ok(())
        }
        Cmd::HelmUninstall { kubeconfig, netns } => {
            deploy::uninstall(&kubeconfig, netns.as_deref())
        }
        Cmd::VmTest(args) => {
            let tc = toolchain::ensure()?;
            let reports = vm_matrix(&tc, &args)?;
            vm::write_kernel_table(&reports, "cargo xtask vm-test")?;
            if reports.iter().any(|r| !r.ok) {
                bail!("vm-test failed");
            }
            Ok(())
        }
    }
}

/// What a clean `cargo xtask test` writes under target/ at its largest: 6.9 GB, measured on a
/// fresh clone run as .ci/run runs it (CARGO_INCREMENTAL=0), 2026-12-02.
const TEST_TARGET_BYTES: u64 = 7_000_000_000;
/// What it installs under ~/.cache/qoslet: the Python venv, npm packages, bpf-linker, the VM
/// kernels, kustomize and helm with their Go modules. Measured: 2.2 GB with the cluster's parts
/// included, so an upper bound.
const TEST_CACHE_BYTES: u64 = 2_200_000_000;

fn test(args: &TestArgs) -> Result<()> {
    let mut lines = disk::warn_if_short(&[
        disk::Need {
            path: cargo::target_dir(),
            bytes: TEST_TARGET_BYTES,
            what: "the builds",
        },
        disk::Need {
            path: toolchain::cache_dir()?,
            bytes: TEST_CACHE_BYTES,
            what: "the tools",
        },
    ]);
    let machine_state_before = entries_below(Path::new(MACHINE_STATE_DIR));
    let load = args.load.map(load::Load::start).transpose()?;
    if let Some(l) = &load {
        lines.push(l.describe());
    }
    machete::check()?;
    let tc = toolchain::ensure()?;
    lint::check(&tc)?;
    let mut total = cargo::TestCounts::default();

    let unit = cargo::test(
        &tc,
        &["test", "-p", "qoslet-common", "-p", "qoslet", "-p", "xtask"],
    )?;
    lines.push(format!("unit and CLI tests: {}", unit.summary()));
    total.add(&unit);

    if !is_root() {
        bail!(
            "the integration tests need root (real cgroups and eBPF); run `cargo xtask test` as root"
        );
    }
    let (host, host_sensor_lines) = cargo::test_keeping(
        &tc,
        &["test", "-p", "qoslet-tests"],
        Some(vm::sensor_table::MARKER),
    )?;
    let mut sensor_lines =
        vm::sensor_table::parse_all(host_sensor_lines.iter().map(String::as_str));
    lines.push(format!(
        "host kernel {}, cgroup {}: {}",
        uname_r(),
        host_cgroup_layout(),
        host.summary()
    ));
    total.add(&host);

    let (deploy_lines, deploy_counts) = deploy_checks(&tc);
    lines.extend(deploy_lines);
    total.add(&deploy_counts);

    // The VMs have their own disks; everything that ran on this machine has run by now.
    let leaked = new_entries(Path::new(MACHINE_STATE_DIR), &machine_state_before);
    if leaked.is_empty() {
        lines.push(format!("{MACHINE_STATE_DIR}: no test wrote there"));
        total.passed += 1;
    } else {
        lines.push(format!(
            "{MACHINE_STATE_DIR}: FAILED: tests left {} there (a test must give qoslet a stateDir \
             of its own): {}",
            leaked.len(),
            leaked.join(", ")
        ));
        total.failed += 1;
    }

    let mut vm_failed = false;
    if !args.no_vm {
        for r in vm_matrix(&tc, &args.vm)? {
            lines.push(format!(
                "VM kernel {}, cgroup {}: {} passed, {} failed, {} ignored{}",
                r.kernel,
                r.cgroup_layout,
                r.passed,
                r.failed,
                r.ignored,
                if r.ok {
                    String::new()
                } else {
                    format!(" (FAILED, log {})", r.log_path.display())
                }
            ));
            sensor_lines.extend(r.sensors.iter().cloned());
            total.passed += r.passed as u64;
            total.failed += r.failed as u64;
            total.ignored += r.ignored as u64;
            vm_failed |= !r.ok;
        }
    }

    if let Some(table) = vm::write_sensor_lines(&sensor_lines, "cargo xtask test")? {
        lines.push(format!("kernel table: {}", table.display()));
    }

    println!("\n== qoslet test report ==");
    for l in &lines {
        println!("{l}");
    }
    println!(
        "xtask: {} passed, {} failed, {} skipped",
        total.passed, total.failed, total.ignored
    );
    if total.failed > 0 || vm_failed || !unit.ok || !host.ok || !deploy_counts.ok {
        bail!("tests failed");
    }
    Ok(())
}

/// qoslet's default stateDir. The tests run as root on a machine that may run a real qoslet, so
/// none may write there (three did, until each got a stateDir in its work dir).
const MACHINE_STATE_DIR: &str = "/var/lib/qoslet";

/// Every path beneath `dir` (empty when it does not exist).
fn entries_below(dir: &Path) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(path.clone());
            }
            found.insert(path);
        }
    }
    found
}

/// The paths beneath `dir` that are not in `before`.
fn new_entries(dir: &Path, before: &BTreeSet<PathBuf>) -> Vec<String> {
    entries_below(dir)
        .difference(before)
        .map(|p| p.display().to_string())
        .collect()
}

/// What users install, checked by the programs that consume it: the manifests' schemas and the
/// alert rules, the image run as the DaemonSet describes, and Prometheus scraping a real agent
/// through every dashboard query and alert. One report line per check, with its time.
fn deploy_checks(tc: &toolchain::Toolchain) -> (Vec<String>, cargo::TestCounts) {
    let mut lines = Vec::new();
    let mut counts = cargo::TestCounts {
        ok: true,
        ..Default::default()
    };
    let mut step = |name: &str, f: &mut dyn FnMut() -> Result<()>| {
        let t = Instant::now();
        let r = f();
        let took = secs(t.elapsed());
        match r {
            Ok(()) => {
                counts.passed += 1;
                lines.push(format!("{name}: passed in {took}"));
            }
            Err(e) => {
                eprintln!("xtask: {name} failed: {e:#}");
                counts.failed += 1;
                counts.ok = false;
                lines.push(format!("{name}: FAILED in {took}: {e:#}"));
            }
        }
    };
    step(
        "deploy/ (kustomize, Helm chart): schemas, configuration, alert rules",
        &mut || validate_deploy(tc),
    );
    step("image build (musl release, buildah)", &mut || {
        image::build(tc).map(|_| ())
    });
    step("container test (podman, the DaemonSet's spec)", &mut || {
        container::run()
    });
    step("Prometheus test (dashboard queries, alerts)", &mut || {
        apt::ensure("prometheus-test", deploy::PROMETHEUS_PACKAGES)?;
        let r = cargo::test(
            tc,
            &[
                "test",
                "-p",
                "qoslet",
                "--test",
                "prometheus",
                "--",
                "--ignored",
            ],
        )?;
        if !r.ok || r.passed == 0 {
            anyhow::bail!("cargo test --test prometheus: {}", r.summary());
        }
        Ok(())
    });
    (lines, counts)
}

/// The deploy checks of [`deploy::validate`], with the agent binary that checks the chart's
/// configurations (already built by the unit tests in `cargo xtask test`).
fn validate_deploy(tc: &toolchain::Toolchain) -> Result<()> {
    let tools = deploy::ensure_tools()?;
    cargo::run(tc, &["build", "-p", "qoslet"])?;
    deploy::validate(&tools, &cargo::target_dir().join("debug/qoslet"))
}

fn secs(d: Duration) -> String {
    format!("{:.0} s", d.as_secs_f64())
}

/// The x86-64 kernels of `args` with x86-64 test binaries, then `arm64` (if asked for) with
/// arm64 ones.
fn vm_matrix(tc: &toolchain::Toolchain, args: &vm::VmTestArgs) -> Result<Vec<vm::KernelReport>> {
    vm::ensure_vm_prerequisites()?;
    let (arm64, x86_64): (Vec<String>, Vec<String>) =
        args.kernels.iter().cloned().partition(|k| vm::is_arm64(k));
    let mut reports = Vec::new();
    if !x86_64.is_empty() {
        let binaries = args.select(vm::build_test_binaries(&tc.path_env)?);
        let args = vm::VmTestArgs {
            kernels: x86_64,
            ..args.clone()
        };
        reports.extend(vm::vm_test(&args, &binaries)?);
    }
    if !arm64.is_empty() {
        let arch = cross::Arch::Aarch64;
        cross::ensure(arch)?;
        let binaries = args.select(vm::build_test_binaries_for(
            &tc.path_env,
            arch.triple(),
            &arch.env(),
        )?);
        let args = vm::VmTestArgs {
            kernels: arm64,
            ..args.clone()
        };
        reports.extend(vm::vm_test_arm64(&args, &binaries)?);
    }
    Ok(reports)
}

fn run_example(extra: &[String]) -> Result<()> {
    let tc = toolchain::ensure()?;
    cargo::run(&tc, &["build", "-p", "qoslet"])?;
    let root = cargo::workspace_root();
    let examples = root.join("deploy/examples/standalone");
    // The example's configuration with a state directory of the demo's own, emptied first: the
    // state file remembers an evicted pod until its manifest changes, so with the machine's
    // /var/lib/qoslet a second demo would never start (and never evict) the hog.
    let demo = cargo::target_dir().join("qoslet-demo");
    let state = demo.join("state");
    if state.exists() {
        std::fs::remove_dir_all(&state)?;
    }
    std::fs::create_dir_all(&demo)?;
    let config = demo.join("qoslet-config.yaml");
    let example = std::fs::read_to_string(examples.join("qoslet-config.yaml"))?;
    std::fs::write(
        &config,
        format!(
            "{}\n# Added by `cargo xtask run`.\nstateDir: {}\n",
            example.trim_end(),
            state.display()
        ),
    )?;
    // Where cargo put it: CARGO_TARGET_DIR, when set, moves it.
    let qoslet = cargo::target_dir().join("debug/qoslet");
    let mut cmd = std::process::Command::new(&qoslet);
    cmd.arg("run")
        .arg("--kubelet-config")
        .arg(examples.join("kubelet-config.yaml"))
        .arg("--config")
        .arg(&config)
        .arg("--standalone")
        .arg(examples.join("pods"))
        .arg("--log-dir")
        .arg(demo.join("logs"))
        .args(extra);
    println!(
        "xtask: the demo node is the cgroup /qoslet-demo (1Gi); watch it with `{} status` in another terminal. Ctrl-C stops it and removes its cgroups.",
        qoslet.display()
    );
    println!("xtask: {cmd:?}");
    let status = cmd.status()?;
    if !status.success() {
        bail!("qoslet exited with {status}");
    }
    Ok(())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn uname_r() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

fn host_cgroup_layout() -> &'static str {
    let root = PathBuf::from("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        "v2"
    } else if root.join("unified/cgroup.procs").exists() {
        "hybrid (v1 controllers + v2 unified)"
    } else {
        "v1"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_entries_names_what_appeared_beneath_the_state_dir_at_any_depth() {
        let dir = std::env::temp_dir().join(format!("xtask-state-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("api-writes")).unwrap();
        std::fs::write(dir.join("node-kept.json"), "{}").unwrap();
        let before = entries_below(&dir);
        assert!(new_entries(&dir, &before).is_empty());

        std::fs::write(dir.join("api-writes/1.json"), "{}").unwrap();
        std::fs::write(dir.join("node-leaked.json"), "{}").unwrap();
        let leaked = new_entries(&dir, &before);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            leaked,
            [
                dir.join("api-writes/1.json").display().to_string(),
                dir.join("node-leaked.json").display().to_string()
            ]
        );
        assert!(
            entries_below(&dir).is_empty(),
            "a missing dir has no entries"
        );
    }
}
