//! Bench: a Guaranteed pod's wake-up latency beside BestEffort CPU hogs, with the kubelet's
//! weights alone and with each lever of the CPU-pressure controller
//! (agent/src/policy/cpu_pressure.rs), side by side in one run, and the BestEffort CPU each lever
//! costs. The cgroups are the kubelet's shape under a unique root (kubepods, the BestEffort tier
//! at the minimum weight, a Guaranteed pod of 1 CPU); the levers are written directly, as the
//! controller's levels would have the reconciler write them. Run as root; everything is removed
//! afterwards. `cargo xtask bench cpu` runs it on the host, then on each VM kernel
//! (xtask/src/vm/cpu.rs).
//!
//! After the levels (each with the ones below it), single levers alone: the floor's cap without
//! `cpu.idle`, and the cpuset without `cpu.idle`, as on kernels without it.
//!
//! The Guaranteed pod is this binary re-run with `--wake SECS`: it sleeps 1 ms, spins 50 µs, and
//! records how late each wake-up was (timer slack set to 1 ns), so the figure needs no eBPF.
//! The hogs are `sh -c 'while :; do :; done'`, twice as many as CPUs. `QOSLET_BENCH_CPU_SECS`
//! sets each scenario's length (default 5), `QOSLET_BENCH_CPU_MILLIS` the Guaranteed pod's CPU
//! (default 1000; its shares, weight and quota follow the kubelet's formulas).

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, ExitCode, Stdio},
    thread,
    time::{Duration, Instant},
};

use qoslet::policy::{
    cpu,
    cpu_pressure::{CpuPressureConfig, besteffort_cpus},
    cpuset::CpuSet,
};
use qoslet_tests::{Layout, TestCgroup, cpu_ticks, layout, unique_name};

fn secs() -> u64 {
    std::env::var("QOSLET_BENCH_CPU_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5)
}

/// The Guaranteed pod's CPU in millicores (`QOSLET_BENCH_CPU_MILLIS`, default 1000).
fn guaranteed_millis() -> i64 {
    std::env::var("QOSLET_BENCH_CPU_MILLIS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1000)
}

/// The Guaranteed pod's loop: prints `p50_us p99_us wakeups` after `secs`.
fn wake(secs: u64) {
    // SAFETY: prctl with PR_SET_TIMERSLACK takes a plain integer.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    // Placed into its cgroup by the parent meanwhile.
    thread::sleep(Duration::from_millis(200));
    let before = schedstat();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut late = Vec::new();
    while Instant::now() < end {
        let due = Instant::now() + Duration::from_millis(1);
        thread::sleep(Duration::from_millis(1));
        late.push(Instant::now().saturating_duration_since(due).as_micros() as u64);
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_micros(50) {
            std::hint::spin_loop();
        }
    }
    late.sort_unstable();
    let q = |f: f64| late[((late.len() as f64 * f).ceil() as usize).clamp(1, late.len()) - 1];
    let after = schedstat();
    // The kernel's own account: time spent runnable but waiting, per time slice run.
    let wait_us = (after[1] - before[1]) / (after[2] - before[2]).max(1) / 1000;
    println!("{} {} {} {wait_us}", q(0.5), q(0.99), late.len());
}

/// `/proc/self/schedstat`: time on CPU (ns), time waiting on a run queue (ns), time slices.
fn schedstat() -> [u64; 3] {
    let text = fs::read_to_string("/proc/self/schedstat").unwrap_or_default();
    let mut v = text.split_whitespace().map(|f| f.parse().unwrap_or(0));
    [(); 3].map(|()| v.next().unwrap_or(0))
}

/// The cgroups: `<root>/kubepods/{besteffort,podg}` in the hierarchy with the cpu controller.
struct Tree {
    v2: bool,
    cpus: usize,
    /// The directory whose `cpuset.cpus` confines the BestEffort tier: `besteffort` itself on
    /// v2, its twin in the v1 cpuset hierarchy; `None` without a cpuset controller.
    cpuset_dir: Option<PathBuf>,
    /// v1: the twin tree in the cpuset hierarchy, tier first (removed on drop).
    v1_cpuset: Vec<TestCgroup>,
    besteffort: TestCgroup,
    guaranteed: TestCgroup,
    _kubepods: TestCgroup,
    _root: TestCgroup,
}

impl Tree {
    fn new(cpus: usize) -> Self {
        let v2 = layout() == Layout::Unified;
        let hierarchy = if v2 {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/cpu")
        };
        let name = unique_name();
        let root = TestCgroup::create(&hierarchy, &name);
        let cpuset_v2 = v2 && root.read("cgroup.controllers").contains("cpuset");
        let controllers = if cpuset_v2 { "+cpu +cpuset" } else { "+cpu" };
        if v2 {
            root.write("cgroup.subtree_control", controllers);
        }
        let kubepods = TestCgroup::create(&root.path, "kubepods");
        if v2 {
            kubepods.write("cgroup.subtree_control", controllers);
        }
        let besteffort = TestCgroup::create(&kubepods.path, "besteffort");
        let guaranteed = TestCgroup::create(&kubepods.path, "podg");
        // The kubelet's values: BestEffort at the minimum, the Guaranteed pod's from its CPU.
        let millis = guaranteed_millis();
        let shares = cpu::milli_cpu_to_shares(millis);
        let quota = cpu::milli_cpu_to_quota(millis, cpu::QUOTA_PERIOD_US);
        if v2 {
            besteffort.write("cpu.weight", "1");
            let weight = cpu::WeightFormula::KubeletLinear.weight(shares);
            guaranteed.write("cpu.weight", &weight.to_string());
            guaranteed.write("cpu.max", &format!("{quota} {}", cpu::QUOTA_PERIOD_US));
        } else {
            besteffort.write("cpu.shares", "2");
            guaranteed.write("cpu.shares", &shares.to_string());
            guaranteed.write("cpu.cfs_quota_us", &quota.to_string());
        }
        // v1: a parallel tree in the cpuset hierarchy, each level with its parent's CPUs and
        // memory nodes (a v1 cpuset takes no task until both are set).
        let v1_hierarchy = PathBuf::from("/sys/fs/cgroup/cpuset");
        let mut v1_cpuset: Vec<TestCgroup> = Vec::new();
        if !v2 && v1_hierarchy.join("cpuset.cpus").exists() {
            for part in [name.as_str(), "kubepods", "besteffort"] {
                let parent = v1_cpuset
                    .last()
                    .map_or(v1_hierarchy.clone(), |c| c.path.clone());
                let cg = TestCgroup::create(&parent, part);
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = fs::read_to_string(parent.join(f)).unwrap_or_default();
                    cg.write(f, v.trim());
                }
                v1_cpuset.push(cg);
            }
            // Removed children first.
            v1_cpuset.reverse();
        }
        let cpuset_dir = if cpuset_v2 {
            Some(besteffort.path.clone())
        } else {
            v1_cpuset.first().map(|c| c.path.clone())
        };
        Self {
            v2,
            cpus,
            cpuset_dir,
            v1_cpuset,
            besteffort,
            guaranteed,
            _kubepods: kubepods,
            _root: root,
        }
    }

    fn add_hog(&self, pid: u32) {
        self.besteffort.add_pid(pid);
        if let Some(be) = self.v1_cpuset.first() {
            be.add_pid(pid);
        }
    }

    /// Confines the BestEffort tier to the CPUs the controller's cpuset level leaves it (`false`:
    /// all CPUs again).
    fn confine(&self, on: bool) {
        let Some(dir) = &self.cpuset_dir else { return };
        let all = CpuSet::first(self.cpus as u32);
        let cpus = if on {
            besteffort_cpus(&all, CpuPressureConfig::default().cap_percent)
        } else {
            all
        };
        fs::write(dir.join("cpuset.cpus"), cpus.to_string())
            .unwrap_or_else(|e| panic!("writing {cpus} to {}/cpuset.cpus: {e}", dir.display()));
    }

    fn has_idle(&self) -> bool {
        self.besteffort.path.join("cpu.idle").exists()
    }

    /// The BestEffort tier's lever: `cpu.idle`, and a quota in µs per 100 ms (`None`: none).
    fn lever(&self, idle: bool, quota: Option<u64>) {
        if self.has_idle() {
            self.besteffort
                .write("cpu.idle", if idle { "1" } else { "0" });
        }
        if !idle {
            // Leaving idle resets the weight to the default.
            let (file, v) = if self.v2 {
                ("cpu.weight", "1")
            } else {
                ("cpu.shares", "2")
            };
            self.besteffort.write(file, v);
        }
        match (self.v2, quota) {
            (true, Some(q)) => self.besteffort.write("cpu.max", &format!("{q} 100000")),
            (true, None) => self.besteffort.write("cpu.max", "max 100000"),
            (false, Some(q)) => self.besteffort.write("cpu.cfs_quota_us", &q.to_string()),
            (false, None) => self.besteffort.write("cpu.cfs_quota_us", "-1"),
        }
    }
}

/// One row: the tier's levers.
#[derive(Clone)]
struct Scenario {
    name: String,
    idle: bool,
    cpuset: bool,
    quota_us: Option<u64>,
}

impl Scenario {
    fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            idle: false,
            cpuset: false,
            quota_us: None,
        }
    }
}

struct Row {
    name: String,
    p50_us: u64,
    p99_us: u64,
    wakeups: u64,
    wait_us: u64,
    be_cores: Option<f64>,
}

fn measure(tree: &Tree, hogs: &[Child], secs: u64) -> Option<(u64, u64, u64, u64, f64)> {
    let exe = std::env::current_exe().ok()?;
    let child = Command::new(exe)
        .arg("--wake")
        .arg(secs.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    tree.guaranteed.add_pid(child.id());
    let before: u64 = hogs.iter().filter_map(|h| cpu_ticks(h.id())).sum();
    let t = Instant::now();
    let out = child.wait_with_output().ok()?;
    let after: u64 = hogs.iter().filter_map(|h| cpu_ticks(h.id())).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cores = (after - before) as f64 / hz / t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    Some((*v.first()?, *v.get(1)?, *v.get(2)?, *v.get(3)?, cores))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--wake") {
        wake(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5));
        return ExitCode::SUCCESS;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("qoslet-bench-cpu needs root (it creates cgroups).");
        return ExitCode::FAILURE;
    }
    let secs = secs();
    let cpus = thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let tree = Tree::new(cpus);
    let idle = tree.has_idle();
    let mut rows = Vec::new();
    let mut record = |name: &str, m: Option<(u64, u64, u64, u64, f64)>, hogs: bool| {
        if let Some((p50_us, p99_us, wakeups, wait_us, cores)) = m {
            rows.push(Row {
                name: name.into(),
                p50_us,
                p99_us,
                wakeups,
                wait_us,
                be_cores: hogs.then_some(cores),
            });
        } else {
            eprintln!("{name}: the wake-up loop gave no figures");
        }
    };
    record("no hogs", measure(&tree, &[], secs), false);
    let mut hogs: Vec<Child> = (0..cpus * 2)
        .filter_map(|_| {
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .ok()
        })
        .collect();
    for h in &hogs {
        tree.add_hog(h.id());
    }
    let capacity_us = cpus as u64 * 100_000;
    // The controller's levels at its defaults (cpuset and cap at 50%, floor at 10%), each with
    // the levels below it, skipping those this machine lacks; then single levers alone, as on
    // kernels without cpu.idle.
    let cpuset = cpus > 1 && tree.cpuset_dir.is_some();
    let mut scenarios: Vec<Scenario> = vec![Scenario::new("kubelet weights only")];
    // The controller's level numbers (agent/src/policy/cpu_pressure.rs), fixed: a level this
    // machine lacks is skipped, not renumbered.
    let mut at = |level: u8, what: &str, s: Scenario| {
        scenarios.push(Scenario {
            name: format!("level {level}: {what}"),
            ..s
        });
    };
    let base = Scenario {
        idle,
        ..Scenario::new("")
    };
    if idle {
        at(1, "cpu.idle", base.clone());
    }
    let base = Scenario { cpuset, ..base };
    if cpuset {
        at(2, "+ cpuset 50% of the CPUs", base.clone());
    }
    at(
        3,
        "+ cap 50%",
        Scenario {
            quota_us: Some(capacity_us / 2),
            ..base.clone()
        },
    );
    at(
        4,
        "+ cap 10% (floor)",
        Scenario {
            quota_us: Some(capacity_us / 10),
            ..base
        },
    );
    if idle || cpuset {
        scenarios.push(Scenario {
            quota_us: Some(capacity_us / 10),
            ..Scenario::new("cap 10% alone")
        });
    }
    if idle && cpuset {
        scenarios.push(Scenario {
            cpuset: true,
            ..Scenario::new("cpuset 50% alone")
        });
    }
    for s in &scenarios {
        tree.lever(s.idle, s.quota_us);
        tree.confine(s.cpuset);
        thread::sleep(Duration::from_millis(500));
        record(&s.name, measure(&tree, &hogs, secs), true);
    }
    tree.lever(false, None);
    tree.confine(false);
    for h in &mut hogs {
        let _ = h.kill();
        let _ = h.wait();
    }
    let base = rows
        .iter()
        .find(|r| r.name == "kubelet weights only")
        .and_then(|r| r.be_cores);
    println!(
        "## CPU pressure: a Guaranteed pod's wake-up latency beside {} BestEffort hogs\n",
        cpus * 2
    );
    println!(
        "cgroup {}, {cpus} CPUs, {secs} s per row; wake-up = lateness of a 1 ms sleep (then 50 µs of work); run-queue wait per slice = the pod's schedstat run_delay over its time slices; BestEffort CPU = the hogs' CPU time / wall time\n",
        if tree.v2 { "v2" } else { "v1 (hybrid)" }
    );
    println!(
        "| scenario | wake-up p50 | wake-up p99 | wake-ups | run-queue wait per slice | BestEffort CPU | BestEffort CPU lost |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        let (cores, lost) = match (r.be_cores, base) {
            (Some(c), Some(b)) if b > 0.0 => (
                format!("{c:.2} cores"),
                format!("{:.0}%", (1.0 - c / b) * 100.0),
            ),
            (Some(c), _) => (format!("{c:.2} cores"), "-".into()),
            (None, _) => ("-".into(), "-".into()),
        };
        println!(
            "| {} | {} µs | {} µs | {} | {} µs | {cores} | {lost} |",
            r.name, r.p50_us, r.p99_us, r.wakeups, r.wait_us
        );
    }
    drop(tree);
    ExitCode::SUCCESS
}
