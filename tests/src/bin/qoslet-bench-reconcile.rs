//! Bench: reconcile 1,000 pods (one container each, the three QoS classes in turn) from
//! scratch under a unique test root, then no-op passes over them; prints the time and the number
//! of writes of each as a markdown table. Run as root; everything is removed afterwards.

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use qoslet::{
    cgroup::{
        CgroupPath, ContainerIds, Mode, Naming, OomTargets, Reconciler, Runtime, desired_state,
        scan_oom_scores,
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

/// CPU time of this process, all threads (user + system): on a loaded shared machine, wall time measures the
/// other tenants too; the CPU time is what the pass itself costs.
fn process_cpu() -> Duration {
    // SAFETY: timespec is plain data and clock_gettime only writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
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
        runtime: Runtime::Containerd,
        node_root: CgroupPath::root(),
        create_containers: true,
    };
    let desired = desired_state(&plan, &naming, &ids);
    let planning = t.elapsed();
    let reconciler = Reconciler::new(root.open(), Mode::Enforce);

    let (t, cpu) = (Instant::now(), process_cpu());
    let scratch = reconciler.reconcile(&desired);
    let (scratch_time, scratch_cpu) = (t.elapsed(), process_cpu() - cpu);
    if !scratch.errors.is_empty() {
        eprintln!(
            "reconcile errors: {:#?}",
            &scratch.errors[..scratch.errors.len().min(5)]
        );
        return ExitCode::FAILURE;
    }
    let mut noop = Vec::new();
    let mut noop_cpu = Vec::new();
    let mut noop_writes = 0;
    let runs = noop_runs();
    for _ in 0..runs {
        let (t, cpu) = (Instant::now(), process_cpu());
        let r = reconciler.reconcile(&desired);
        noop.push(t.elapsed());
        noop_cpu.push(process_cpu() - cpu);
        noop_writes = noop_writes.max(r.writes_issued() + r.created.len());
    }
    noop.sort();
    noop_cpu.sort();
    let targets = OomTargets::new(reconciler.fs(), &desired);
    let (t, cpu) = (Instant::now(), process_cpu());
    let oom = scan_oom_scores(reconciler.fs(), &targets, Mode::Enforce);
    let (oom_time, oom_cpu) = (t.elapsed(), process_cpu() - cpu);

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
        "| no-op (median of {runs}; max {} ms wall) | {} | {} | {noop_writes} | 0 | < 50 ms, 0 writes |",
        ms(noop[runs - 1]),
        ms(noop[runs / 2]),
        ms(noop_cpu[runs / 2])
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
