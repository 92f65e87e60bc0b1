//! Bench: the eBPF sensors' cost per event under a context-switch storm, and the agent's added
//! CPU time, with 100 watched cgroups. Prints a GitHub-markdown table; asserts nothing.
//!
//! The stressor is this binary re-run as `qoslet-bench-sensors stress SECONDS`: two threads
//! ping-ponging one byte over two pipes, inside one of the watched cgroups.

use std::{
    fs,
    io::{Read as _, Write as _},
    os::unix::fs::MetadataExt as _,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use qoslet::sensors::{Sensors, SensorsConfig, WatchedCgroup, kmaps::ProgramCost};

const WATCHED: usize = 100;
const SECONDS: u64 = 10;

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

/// The process's user+system CPU time.
fn self_cpu() -> Duration {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
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

async fn bench() {
    let (sensors, mut rx) = Sensors::start(SensorsConfig::default());
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
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
        let id = fs::metadata(&dir).expect("stat").ino();
        sensors.watch(WatchedCgroup {
            id,
            v2_dir: Some(dir.clone()),
            memory_dir: dir.join("memory.events").exists().then(|| dir.clone()),
            cpu_dir: None,
        });
        cgroups.push(Cgroup(dir));
    }
    let before_costs = sensors.program_costs();
    let before_cpu = self_cpu();
    let start = Instant::now();
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["stress", &SECONDS.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting the stressor");
    // Moved in at once: the first few switches happen before the move, not measured.
    let _ = fs::write(cgroups[0].0.join("cgroup.procs"), child.id().to_string());
    let out = tokio::task::spawn_blocking(move || {
        let mut s = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut s);
        }
        let _ = child.wait();
        s
    })
    .await
    .unwrap_or_default();
    let wall = start.elapsed();
    let agent_cpu = self_cpu() - before_cpu;
    let after_costs = sensors.program_costs();
    let rounds: u64 = out.trim().parse().unwrap_or(0);

    println!(
        "## eBPF sensors: cost per event ({WATCHED} watched cgroups, pipe ping-pong {SECONDS} s)"
    );
    println!();
    println!("| program | runs | mean ns/run | BPF CPU % of one core |");
    println!("|---|---:|---:|---:|");
    let mut bpf_total = 0u64;
    for after in &after_costs {
        let before = before_costs
            .iter()
            .find(|b| b.program == after.program)
            .cloned()
            .unwrap_or(ProgramCost {
                program: after.program.clone(),
                run_time_ns: 0,
                run_count: 0,
            });
        let d = ProgramCost {
            program: after.program.clone(),
            run_time_ns: after.run_time_ns - before.run_time_ns,
            run_count: after.run_count - before.run_count,
        };
        bpf_total += d.run_time_ns;
        let mean = d.mean_ns().map_or("-".to_owned(), |m| format!("{m:.0}"));
        println!(
            "| {} | {} | {} | {:.3} |",
            d.program,
            d.run_count,
            mean,
            d.run_time_ns as f64 / wall.as_nanos() as f64 * 100.0
        );
    }
    let stats = sensors.with_ebpf(|e| e.stats_enabled()).unwrap_or(false);
    println!(
        "| all programs (stats {}) | - | - | {:.3} |",
        if stats { "on" } else { "unavailable" },
        bpf_total as f64 / wall.as_nanos() as f64 * 100.0
    );
    println!(
        "| agent userspace CPU ({} ping-pong rounds) | - | - | {:.3} |",
        rounds,
        agent_cpu.as_nanos() as f64 / wall.as_nanos() as f64 * 100.0
    );
    drop(cgroups);
}
