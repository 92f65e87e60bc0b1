//! Bench: the eBPF sensors' cost per event under a context-switch storm, and the agent's added
//! CPU time, with 100 watched cgroups. Prints GitHub-markdown tables; asserts nothing.
//!
//! The stressor is this binary re-run as `qoslet-bench-sensors stress SECONDS`: two threads
//! ping-ponging one byte over two pipes. Two loads, each run twice, in watched cgroups (every
//! switch takes the program's watched path) and in unwatched ones (the path of every task qoslet
//! does not manage):
//! - one stressor: each hand-off goes through the idle task, and on a VM through a halted vCPU,
//!   so each switch finds cold caches;
//! - two stressors per CPU, each in its own cgroup: the CPUs never idle and switch from task to
//!   task, across cgroups, the scheduler-heavy case.
//!
//! An empty program on the same hook (`floor.rs`) gives what the kernel itself spends per program
//! run on this machine.
//!
//! All of the above runs with the kernel diagnostics off (the default). Then the programs are
//! loaded again with them on and two of the runs repeated: the size of `sched_switch` as the
//! kernel runs it, both ways, shows whether the verifier removed the logging.

mod floor;

use std::{
    fs,
    io::{Read as _, Write as _},
    os::unix::fs::MetadataExt as _,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use floor::Floor;
use qoslet::sensors::{Sensors, SensorsConfig, WatchedCgroup, kmaps::ProgramCost};

const WATCHED: usize = 100;
const SECONDS: u64 = 5;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("stress") {
        let secs = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(SECONDS);
        stress(Duration::from_secs(secs));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(bench());
}

/// Two threads handing a byte back and forth: two context switches per round trip.
fn stress(duration: Duration) {
    let (mut a_rx, mut a_tx) = std::io::pipe().expect("pipe");
    let (mut b_rx, mut b_tx) = std::io::pipe().expect("pipe");
    let deadline = Instant::now() + duration;
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while a_rx.read_exact(&mut byte).is_ok() {
            if b_tx.write_all(&byte).is_err() {
                return;
            }
        }
    });
    let mut byte = [0u8; 1];
    let mut rounds = 0u64;
    while Instant::now() < deadline {
        a_tx.write_all(&byte).expect("ping");
        b_rx.read_exact(&mut byte).expect("pong");
        rounds += 1;
    }
    drop(a_tx);
    let _ = echo.join();
    println!("{rounds}");
}

struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What one stressor run cost.
struct Phase {
    wall: Duration,
    /// Per attached program, over the run.
    costs: Vec<ProgramCost>,
    /// The empty program's, when it could be attached.
    floor: Option<ProgramCost>,
    agent_cpu: Duration,
    rounds: u64,
}

impl Phase {
    fn cost(&self, program: &str) -> Option<&ProgramCost> {
        self.costs.iter().find(|c| c.program == program)
    }

    fn percent_of_core(&self, ns: u64) -> f64 {
        ns as f64 / self.wall.as_nanos() as f64 * 100.0
    }
}

fn delta(before: &[ProgramCost], after: &[ProgramCost]) -> Vec<ProgramCost> {
    after
        .iter()
        .map(|a| {
            let (t, n) = before
                .iter()
                .find(|b| b.program == a.program)
                .map_or((0, 0), |b| (b.run_time_ns, b.run_count));
            ProgramCost {
                program: a.program.clone(),
                run_time_ns: a.run_time_ns - t,
                run_count: a.run_count - n,
            }
        })
        .collect()
}

/// Runs one stressor for `SECONDS` inside each of `cgroups`, all at once.
async fn phase(sensors: &Sensors, cgroups: &[&Cgroup], floor: Option<&Floor>) -> Phase {
    let floor_cost = || {
        floor
            .and_then(|f| f.cost().ok())
            .into_iter()
            .collect::<Vec<_>>()
    };
    let before_costs = sensors.program_costs();
    let before_floor = floor_cost();
    let before_cpu = qoslet_tests::process_cpu();
    let start = Instant::now();
    let children: Vec<_> = cgroups
        .iter()
        .map(|cg| {
            let child = Command::new(std::env::current_exe().expect("current_exe"))
                .args(["stress", &SECONDS.to_string()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("starting a stressor");
            // Moved in at once: the first few switches happen before the move.
            let _ = fs::write(cg.0.join("cgroup.procs"), child.id().to_string());
            child
        })
        .collect();
    let out = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|mut child| {
                let mut s = String::new();
                if let Some(mut o) = child.stdout.take() {
                    let _ = o.read_to_string(&mut s);
                }
                let _ = child.wait();
                s.trim().parse::<u64>().unwrap_or(0)
            })
            .sum::<u64>()
    })
    .await
    .unwrap_or_default();
    let wall = start.elapsed();
    Phase {
        wall,
        costs: delta(&before_costs, &sensors.program_costs()),
        floor: delta(&before_floor, &floor_cost()).pop(),
        agent_cpu: qoslet_tests::process_cpu() - before_cpu,
        rounds: out,
    }
}

/// The sensors, with or without kernel diagnostics, watching `cgroups`.
fn start_sensors(kernel_diagnostics: bool, cgroups: &[Cgroup]) -> Sensors {
    let (sensors, mut rx) = Sensors::start(SensorsConfig {
        kernel_diagnostics,
        ..SensorsConfig::default()
    });
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    for cg in cgroups {
        watch(&sensors, &cg.0);
    }
    sensors
}

fn watch(sensors: &Sensors, dir: &std::path::Path) {
    let id = fs::metadata(dir).expect("stat").ino();
    sensors.watch(WatchedCgroup {
        id,
        v2_dir: Some(qoslet_tests::cgroup_beneath(dir)),
        memory_dir: dir
            .join("memory.events")
            .exists()
            .then(|| qoslet_tests::cgroup_beneath(dir)),
        cpu_dir: None,
    });
}

/// `sched_switch`'s bytecode and JIT sizes, as text.
fn sched_switch_size(sensors: &Sensors) -> String {
    sensors
        .with_ebpf(|e| e.program_size("sched_switch"))
        .flatten()
        .map_or("-".to_owned(), |(x, j)| format!("{x} / {j}"))
}

fn sched_switch_ns(p: &Phase) -> String {
    p.cost("sched_switch")
        .and_then(ProgramCost::mean_ns)
        .map_or("-".to_owned(), |m| format!("{m:.0}"))
}

async fn bench() {
    let sensors = start_sensors(false, &[]);
    let root = if PathBuf::from("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/unified"
    };
    let top = Cgroup(PathBuf::from(root).join(format!("qoslet-bench-{}", std::process::id())));
    fs::create_dir(&top.0).expect("creating the bench cgroup");
    let mut cgroups = Vec::new();
    for i in 0..WATCHED {
        let dir = top.0.join(format!("pod{i}"));
        fs::create_dir(&dir).expect("creating a bench cgroup");
        watch(&sensors, &dir);
        cgroups.push(Cgroup(dir));
    }
    let busy = 2 * std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let unwatched: Vec<Cgroup> = (0..busy)
        .map(|i| {
            let dir = top.0.join(format!("unwatched{i}"));
            fs::create_dir(&dir).expect("creating an unwatched bench cgroup");
            Cgroup(dir)
        })
        .collect();
    // Attached after qoslet's programs, so it runs after them on each switch and finds the
    // caches they warmed: a floor, not an overstatement.
    let empty_program = Floor::attach()
        .map_err(|e| eprintln!("empty program not attached: {e}"))
        .ok();
    let floor = empty_program.as_ref();
    let watched = phase(&sensors, &[&cgroups[0]], floor).await;
    let idle_unwatched = phase(&sensors, &[&unwatched[0]], floor).await;
    let busy_watched = phase(&sensors, &cgroups[..busy].iter().collect::<Vec<_>>(), floor).await;
    let busy_unwatched = phase(&sensors, &unwatched.iter().collect::<Vec<_>>(), floor).await;
    let stats = sensors.with_ebpf(|e| e.stats_enabled()).unwrap_or(false);

    println!(
        "## eBPF sensors: cost per event ({WATCHED} watched cgroups, pipe ping-pong {SECONDS} s)"
    );
    println!();
    println!(
        "Kernel BPF statistics {}. Every program, stressor in a watched cgroup:",
        if stats { "on" } else { "unavailable" }
    );
    println!();
    println!("| program | runs | mean ns/run | BPF CPU % of one core |");
    println!("|---|---:|---:|---:|");
    let mut bpf_total = 0u64;
    for d in &watched.costs {
        bpf_total += d.run_time_ns;
        let mean = d.mean_ns().map_or("-".to_owned(), |m| format!("{m:.0}"));
        println!(
            "| {} | {} | {} | {:.3} |",
            d.program,
            d.run_count,
            mean,
            watched.percent_of_core(d.run_time_ns)
        );
    }
    println!(
        "| all programs | - | - | {:.3} |",
        watched.percent_of_core(bpf_total)
    );
    println!(
        "| agent userspace CPU ({} ping-pong rounds) | - | - | {:.3} |",
        watched.rounds,
        watched.percent_of_core(watched.agent_cpu.as_nanos() as u64)
    );
    println!();
    println!(
        "`sched_switch` by load and path, beside an empty program on the same hook (the kernel's \
         own dispatch and timing cost per run on this machine; target: at or under 150 ns per \
         event):"
    );
    println!();
    println!(
        "| load | stressors in | switches/s | sched_switch ns/run | empty program ns/run | sched_switch above the empty program, ns | sched_switch CPU % of one core |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let idle = "1 stressor, hand-offs through idle";
    let saturated = format!("{busy} stressors, CPUs saturated");
    for (load, label, p) in [
        (idle, "a watched cgroup", &watched),
        (idle, "an unwatched cgroup", &idle_unwatched),
        (saturated.as_str(), "watched cgroups", &busy_watched),
        (saturated.as_str(), "unwatched cgroups", &busy_unwatched),
    ] {
        let Some(c) = p.cost("sched_switch").filter(|c| c.run_count > 0) else {
            println!("| {load} | {label} | - | - | - | - | - |");
            continue;
        };
        let mean = c.mean_ns().unwrap_or(0.0);
        let floor = p.floor.as_ref().and_then(ProgramCost::mean_ns);
        println!(
            "| {load} | {label} | {:.0} | {:.0} | {} | {} | {:.3} |",
            c.run_count as f64 / p.wall.as_secs_f64(),
            mean,
            floor.map_or("-".to_owned(), |f| format!("{f:.0}")),
            floor.map_or("-".to_owned(), |f| format!("{:.0}", mean - f)),
            p.percent_of_core(c.run_time_ns)
        );
    }
    let size_off = sched_switch_size(&sensors);
    drop(empty_program);
    drop(sensors);

    let sensors = start_sensors(true, &cgroups);
    let size_on = sched_switch_size(&sensors);
    let watched_on = phase(&sensors, &[&cgroups[0]], None).await;
    let busy_unwatched_on = phase(&sensors, &unwatched.iter().collect::<Vec<_>>(), None).await;
    println!();
    println!(
        "Kernel diagnostics (`ebpf.kernelDiagnostics`): `sched_switch` as the kernel runs it \
         (bytecode after the verifier / JIT-compiled bytes) and its cost, off (the runs above) \
         and on (loaded again, two runs repeated; none of these cgroups lacks a CPU slot, so \
         nothing is logged):"
    );
    println!();
    println!(
        "| kernel diagnostics | sched_switch bytes (bytecode / JIT) | ns/run, 1 stressor in a watched cgroup | ns/run, {busy} stressors in unwatched cgroups |"
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| off (default) | {size_off} | {} | {} |",
        sched_switch_ns(&watched),
        sched_switch_ns(&busy_unwatched)
    );
    println!(
        "| on | {size_on} | {} | {} |",
        sched_switch_ns(&watched_on),
        sched_switch_ns(&busy_unwatched_on)
    );
    drop(sensors);
    drop(unwatched);
    drop(cgroups);
}
