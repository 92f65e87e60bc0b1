//! Bench: a Guaranteed pod's wake-up latency beside BestEffort CPU hogs, with the kubelet's
//! weights alone and with each lever of the CPU-pressure controller
//! (agent/src/policy/cpu_pressure.rs), side by side in one run, and the BestEffort CPU each lever
//! costs. The cgroups are the kubelet's shape under a unique root (kubepods, the BestEffort tier
//! at the minimum weight, a Guaranteed pod of 1 CPU); the levers are written directly, as the
//! controller's levels would have the reconciler write them. Run as root; everything is removed
//! afterwards.
//!
//! The Guaranteed pod is this binary re-run with `--wake SECS`: it sleeps 1 ms, spins 50 µs, and
//! records how late each wake-up was (timer slack set to 1 ns), so the figure needs no eBPF.
//! The hogs are `sh -c 'while :; do :; done'`, twice as many as CPUs. `QOSLET_BENCH_CPU_SECS`
//! sets each scenario's length (default 5).

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, ExitCode, Stdio},
    thread,
    time::{Duration, Instant},
};

use qoslet_tests::{Layout, TestCgroup, layout, unique_name};

fn secs() -> u64 {
    std::env::var("QOSLET_BENCH_CPU_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5)
}

/// The Guaranteed pod's loop: prints `p50_us p99_us wakeups` after `secs`.
fn wake(secs: u64) {
    // SAFETY: prctl with PR_SET_TIMERSLACK takes a plain integer.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    // Placed into its cgroup by the parent meanwhile.
    thread::sleep(Duration::from_millis(200));
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
    println!("{} {} {}", q(0.5), q(0.99), late.len());
}

/// CPU time (clock ticks) a process has used.
fn cpu_ticks(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
}

/// The cgroups: `<root>/kubepods/{besteffort,podg}` in the hierarchy with the cpu controller.
struct Tree {
    v2: bool,
    besteffort: TestCgroup,
    guaranteed: TestCgroup,
    _kubepods: TestCgroup,
    _root: TestCgroup,
}

impl Tree {
    fn new() -> Self {
        let v2 = layout() == Layout::Unified;
        let hierarchy = if v2 {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/cpu")
        };
        let root = TestCgroup::create(&hierarchy, &unique_name());
        if v2 {
            root.write("cgroup.subtree_control", "+cpu");
        }
        let kubepods = TestCgroup::create(&root.path, "kubepods");
        if v2 {
            kubepods.write("cgroup.subtree_control", "+cpu");
        }
        let besteffort = TestCgroup::create(&kubepods.path, "besteffort");
        let guaranteed = TestCgroup::create(&kubepods.path, "podg");
        // The kubelet's values: BestEffort at the minimum, a 1-CPU Guaranteed pod.
        if v2 {
            besteffort.write("cpu.weight", "1");
            guaranteed.write("cpu.weight", "39");
            guaranteed.write("cpu.max", "100000 100000");
        } else {
            besteffort.write("cpu.shares", "2");
            guaranteed.write("cpu.shares", "1024");
            guaranteed.write("cpu.cfs_quota_us", "100000");
        }
        Self {
            v2,
            besteffort,
            guaranteed,
            _kubepods: kubepods,
            _root: root,
        }
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

struct Row {
    name: String,
    p50_us: u64,
    p99_us: u64,
    wakeups: u64,
    be_cores: Option<f64>,
}

fn measure(tree: &Tree, hogs: &[Child], secs: u64) -> Option<(u64, u64, u64, f64)> {
    let exe = std::env::current_exe().ok()?;
    let child = Command::new(exe)
        .arg("--wake")
        .arg(secs.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    tree.guaranteed.add_pid(child.id());
    let before: u64 = hogs.iter().map(|h| cpu_ticks(h.id())).sum();
    let t = Instant::now();
    let out = child.wait_with_output().ok()?;
    let after: u64 = hogs.iter().map(|h| cpu_ticks(h.id())).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cores = (after - before) as f64 / hz / t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    Some((*v.first()?, *v.get(1)?, *v.get(2)?, cores))
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
    let tree = Tree::new();
    let idle = tree.has_idle();
    let mut rows = Vec::new();
    let mut record = |name: &str, m: Option<(u64, u64, u64, f64)>, hogs: bool| {
        if let Some((p50_us, p99_us, wakeups, cores)) = m {
            rows.push(Row {
                name: name.into(),
                p50_us,
                p99_us,
                wakeups,
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
        tree.besteffort.add_pid(h.id());
    }
    let capacity_us = cpus as u64 * 100_000;
    // The controller's levels at its defaults (50% cap, 10% floor), and the cap without
    // cpu.idle as on kernels without it.
    let mut scenarios: Vec<(String, bool, Option<u64>)> =
        vec![("kubelet weights only".into(), false, None)];
    if idle {
        scenarios.push(("level 1: cpu.idle".into(), true, None));
    }
    scenarios.push((
        format!("level 2: {}cap 50%", if idle { "cpu.idle + " } else { "" }),
        idle,
        Some(capacity_us / 2),
    ));
    scenarios.push((
        format!(
            "level 3: {}cap 10% (floor)",
            if idle { "cpu.idle + " } else { "" }
        ),
        idle,
        Some(capacity_us / 10),
    ));
    if idle {
        scenarios.push((
            "cap 10% without cpu.idle".into(),
            false,
            Some(capacity_us / 10),
        ));
    }
    for (name, idle, quota) in &scenarios {
        tree.lever(*idle, *quota);
        thread::sleep(Duration::from_millis(500));
        record(name, measure(&tree, &hogs, secs), true);
    }
    tree.lever(false, None);
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
        "cgroup {}, {cpus} CPUs, {secs} s per row; wake-up = lateness of a 1 ms sleep (then 50 µs of work); BestEffort CPU = the hogs' CPU time / wall time\n",
        if tree.v2 { "v2" } else { "v1 (hybrid)" }
    );
    println!(
        "| scenario | wake-up p50 | wake-up p99 | wake-ups | BestEffort CPU | BestEffort CPU lost |"
    );
    println!("|---|---|---|---|---|---|");
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
            "| {} | {} µs | {} µs | {} | {cores} | {lost} |",
            r.name, r.p50_us, r.p99_us, r.wakeups
        );
    }
    drop(tree);
    ExitCode::SUCCESS
}
