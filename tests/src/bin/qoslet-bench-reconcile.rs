//! Bench: reconcile 1,000 pods (one container each, the three QoS classes in turn) from
//! scratch under a unique test root, then no-op passes over them; prints the time and the number
//! of writes of each as a markdown table. Run as root; everything is removed afterwards.

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use qoslet::{
    cgroup::{
        CgroupPath, ContainerIds, ContainerRuntime, Mode, Naming, OomTargets, Reconciler,
        desired_state, scan_oom_scores,
    },
    policy::plan::plan_node,
};
use qoslet_tests::{NodeRoot, layout, node_settings, pod_view};

const PODS: usize = 1000;
/// No-op passes measured; `QOSLET_BENCH_NOOP_RUNS` raises it (for profiling under perf).
fn noop_runs() -> usize {
    std::env::var("QOSLET_BENCH_NOOP_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5)
}

/// Median wall and CPU time of repeated passes, and the slowest wall time.
struct Passes {
    wall: Duration,
    cpu: Duration,
    max_wall: Duration,
}

impl Passes {
    fn measure(runs: usize, mut pass: impl FnMut() -> (Duration, Duration)) -> Self {
        let (mut walls, mut cpus): (Vec<_>, Vec<_>) = (0..runs).map(|_| pass()).unzip();
        walls.sort();
        cpus.sort();
        Self {
            wall: walls[runs / 2],
            cpu: cpus[runs / 2],
            max_wall: walls[runs - 1],
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn main() -> ExitCode {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("qoslet-bench-reconcile needs root (it creates cgroups).");
        return ExitCode::FAILURE;
    }
    let root = NodeRoot::create();
    let s = node_settings("");
    let mut pods = Vec::with_capacity(PODS);
    let mut ids = ContainerIds::new();
    for i in 0..PODS {
        let uid = format!("{i:08x}-0000-4000-8000-{i:012x}");
        let c = match i % 3 {
            0 => ("app", "100m", "64Mi", "100m", "64Mi"),
            1 => ("app", "100m", "32Mi", "200m", "128Mi"),
            _ => ("app", "", "", "", ""),
        };
        pods.push(pod_view(&format!("pod-{i}"), &uid, &[c]));
        ids.insert((uid, "app".into()), format!("{:064x}", i + 1));
    }
    let t = Instant::now();
    let plan = match plan_node(&s, &pods) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("planning failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let naming = Naming {
        driver: s.cgroup_driver,
        runtime: ContainerRuntime::Containerd,
        node_root: CgroupPath::root(),
        runner: qoslet::cgroup::Runner::Qoslet,
        enforce: Default::default(),
    };
    let desired = desired_state(&plan, &naming, &ids);
    let planning = t.elapsed();
    // The agent's reconciler: inotify says which cgroups may have changed since a pass.
    let mut reconciler = Reconciler::new(root.open(), Mode::Enforce);
    if let Err(e) = reconciler.enable_change_feed(Duration::from_secs(3600)) {
        eprintln!("no inotify: {e}");
        return ExitCode::FAILURE;
    }
    // The same node read in full on every pass (the agent's fallback, and its periodic pass).
    let full_reader = Reconciler::new(root.open(), Mode::Enforce);

    let (t, cpu) = (Instant::now(), qoslet_tests::process_cpu());
    let scratch = reconciler.reconcile(&desired);
    let (scratch_time, scratch_cpu) = (t.elapsed(), qoslet_tests::process_cpu() - cpu);
    if !scratch.errors.is_empty() {
        eprintln!(
            "reconcile errors: {:#?}",
            &scratch.errors[..scratch.errors.len().min(5)]
        );
        return ExitCode::FAILURE;
    }
    let runs = noop_runs();
    let mut noop_writes = 0;
    let mut timed = |r: &Reconciler| {
        let (t, cpu) = (Instant::now(), qoslet_tests::process_cpu());
        let report = r.reconcile(&desired);
        noop_writes = noop_writes.max(report.writes_issued() + report.created.len());
        (t.elapsed(), qoslet_tests::process_cpu() - cpu)
    };
    // The first pass after scratch re-reads what scratch wrote (its own writes raise events).
    let settle = timed(&reconciler);
    let full = Passes::measure(runs, || timed(&full_reader));
    let feed = Passes::measure(runs, || timed(&reconciler));
    let targets = OomTargets::new(reconciler.fs(), &desired);
    let (t, cpu) = (Instant::now(), qoslet_tests::process_cpu());
    let oom = scan_oom_scores(reconciler.fs(), &targets, Mode::Enforce);
    let (oom_time, oom_cpu) = (t.elapsed(), qoslet_tests::process_cpu() - cpu);

    println!("## cgroup reconcile, {PODS} pods ({:?} cgroups)", layout());
    println!();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?");
    println!("Load average (1 min) at the end: {load}. Wall time includes waiting for the CPU;");
    println!("CPU time is the pass's own (user + system) time.");
    println!();
    println!("| pass | wall (ms) | CPU (ms) | file writes | cgroups created | target |");
    println!("|---|---:|---:|---:|---:|---|");
    println!("| plan + desired state | {} | | 0 | 0 | |", ms(planning));
    println!(
        "| from scratch | {} | {} | {} | {} | < 1000 ms |",
        ms(scratch_time),
        ms(scratch_cpu),
        scratch.writes_issued(),
        scratch.created.len()
    );
    println!(
        "| no-op, every file read (median of {runs}; max {} ms wall) | {} | {} | {noop_writes} | 0 | < 50 ms, 0 writes |",
        ms(full.max_wall),
        ms(full.wall),
        ms(full.cpu)
    );
    println!(
        "| first pass after scratch (re-reads the {} written files' cgroups) | {} | {} | 0 | 0 | |",
        scratch.writes_issued(),
        ms(settle.0),
        ms(settle.1)
    );
    println!(
        "| no-op, change feed: reads only what inotify reported changed (median of {runs}; max {} ms wall; {} cgroup directories watched) | {} | {} | {noop_writes} | 0 | < 50 ms, 0 writes |",
        ms(feed.max_wall),
        reconciler.watched_cgroups(),
        ms(feed.wall),
        ms(feed.cpu)
    );
    println!(
        "| oom_score_adj scan, {} containers without processes | {} | {} | {} | 0 | |",
        targets.len(),
        ms(oom_time),
        ms(oom_cpu),
        oom.writes.len()
    );
    // The no-op pass must be a no-op; a bench that hides a regression is worse than none.
    if noop_writes != 0 {
        eprintln!("the no-op pass wrote {noop_writes} times");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
