//! The agent's own cost, release build:
//!
//! - Memory with the standalone example running: the release `qoslet` on a copy of
//!   deploy/examples/standalone (a unique 1Gi node root, a free port) starts the pods and evicts
//!   the allocating one while VmRSS / VmHWM are sampled. Target: under 40 MiB.
//! - The steady state with 110 and 500 idle pods (one `sleep` container each, housekeeping 1 s,
//!   the default statistics interval): CPU (utime + stime over 30 s, as a share of one core),
//!   VmRSS, and system calls per second (strace -c -f over 10 s, a separate window since
//!   tracing slows the traced process). Targets: under 1 % of a core at 110 pods, under 3 % at
//!   500; the kubelet's own stats loop runs every 10 s.

use qoslet_tests::{cpu_ticks, status_kib};
use std::{
    fs,
    net::TcpListener,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

fn main() {
    example_memory();
    println!();
    println!("## qoslet agent steady state (idle pods, housekeeping 1 s, release build)\n");
    println!("| pods | CPU (% of a core) | target | VmRSS | syscalls/s | opens/s | target met |");
    println!("|---:|---:|---:|---:|---:|---:|---|");
    for (pods, target) in [(110, 1.0), (500, 3.0)] {
        match steady_state(pods) {
            Ok(m) => println!(
                "| {pods} | {:.2} | < {target} | {:.1} MiB | {:.0} | {:.0} | {} |",
                m.cpu_pct,
                m.rss_kib as f64 / 1024.0,
                m.syscalls_per_s,
                m.opens_per_s,
                if m.cpu_pct < target { "yes" } else { "no" }
            ),
            Err(e) => println!("| {pods} | failed: {e} | | | | | |"),
        }
    }
}

struct SteadyState {
    cpu_pct: f64,
    rss_kib: u64,
    syscalls_per_s: f64,
    opens_per_s: f64,
}

/// Runs qoslet with `n` idle pods until they all run, then measures.
fn steady_state(n: usize) -> Result<SteadyState, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let qoslet = root.join("target/release/qoslet");
    let examples = root.join("deploy/examples/standalone");
    let work = std::env::temp_dir().join(format!("qoslet-bench-steady-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let pods = work.join("pods");
    fs::create_dir_all(&pods).map_err(|e| e.to_string())?;
    for i in 0..n {
        fs::write(
            pods.join(format!("p{i}.yaml")),
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: idle-{i}, namespace: bench}}\nspec:\n  containers:\n  - name: main\n    command: [\"sleep\", \"3600\"]\n    resources: {{requests: {{cpu: 10m, memory: 4Mi}}}}\n"
            ),
        )
        .map_err(|e| e.to_string())?;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let config = work.join("qoslet.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /qoslet-bench-steady-{}-{n}\ncapacity:\n  memory: 8Gi\nhousekeepingInterval: 1s\nstateDir: {}\n",
            std::process::id(),
            work.join("state").display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut child = Command::new(&qoslet)
        .arg("run")
        .arg("--kubelet-config")
        .arg(examples.join("kubelet-config.yaml"))
        .arg("--config")
        .arg(&config)
        .arg("--standalone")
        .arg(&pods)
        .arg("--log-dir")
        .arg(work.join("logs"))
        .arg("--shutdown-grace-seconds")
        .arg("5")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let pid = child.id();
    let result = (|| {
        // Every pod running: n sleep processes below the node root.
        let deadline = Instant::now() + Duration::from_secs(120);
        let procs = format!(
            "/sys/fs/cgroup/unified/qoslet-bench-steady-{}-{n}",
            std::process::id()
        );
        loop {
            let running = count_procs(Path::new(&procs))
                .max(count_procs(Path::new(&procs.replace("/unified", ""))));
            if running >= n {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("only {running} of {n} pods running after 120 s"));
            }
            thread::sleep(Duration::from_millis(500));
        }
        // Let start-up settle (the first statistics samples, the first full reconcile).
        thread::sleep(Duration::from_secs(15));
        let hz = 100.0; // USER_HZ on Linux
        let (t0, c0) = (Instant::now(), cpu_ticks(pid).ok_or("no /proc stat")?);
        thread::sleep(Duration::from_secs(30));
        let (t1, c1) = (Instant::now(), cpu_ticks(pid).ok_or("no /proc stat")?);
        let cpu_pct = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0;
        let rss_kib = status_kib(pid, "VmRSS:").unwrap_or(0);
        let (syscalls_per_s, opens_per_s) = strace_rates(pid, 10)?;
        Ok(SteadyState {
            cpu_pct,
            rss_kib,
            syscalls_per_s,
            opens_per_s,
        })
    })();
    // SAFETY: plain kill(2) of the child this bench started.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let _ = child.wait();
    let _ = fs::remove_dir_all(&work);
    result
}

/// Processes in a cgroup tree (every cgroup.procs below `dir`).
fn count_procs(dir: &Path) -> usize {
    let own = fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().count())
        .unwrap_or(0);
    let children: usize = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| count_procs(&e.path()))
        .sum();
    own + children
}

/// System calls and file opens per second of every thread of `pid`, from `strace -c -f`.
fn strace_rates(pid: u32, secs: u64) -> Result<(f64, f64), String> {
    let out = Command::new("timeout")
        .args([
            "-s",
            "INT",
            &secs.to_string(),
            "strace",
            "-c",
            "-f",
            "-p",
            &pid.to_string(),
        ])
        .output()
        .map_err(|e| format!("strace: {e}"))?;
    let text = String::from_utf8_lossy(&out.stderr);
    let mut total = None;
    let mut opens = 0u64;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // `% time seconds usecs/call calls [errors] syscall`; the total line ends in "total".
        let calls = |f: &[&str]| f.get(3).and_then(|c| c.parse::<u64>().ok());
        match f.last() {
            Some(&"total") => total = calls(&f),
            Some(name) if name.starts_with("open") => opens += calls(&f).unwrap_or(0),
            _ => {}
        }
    }
    let total = total.ok_or_else(|| format!("no strace summary: {text}"))?;
    Ok((total as f64 / secs as f64, opens as f64 / secs as f64))
}

fn example_memory() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let qoslet = root.join("target/release/qoslet");
    if !qoslet.exists() {
        eprintln!(
            "{} missing: `cargo xtask bench` builds it",
            qoslet.display()
        );
        std::process::exit(1);
    }
    let examples = root.join("deploy/examples/standalone");
    let work = std::env::temp_dir().join(format!("qoslet-bench-agent-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = work.join("qoslet.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /qoslet-bench-{}\ncapacity:\n  memory: 1Gi\nstateDir: {}\n",
            std::process::id(),
            work.join("state").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(&qoslet)
        .arg("run")
        .arg("--kubelet-config")
        .arg(examples.join("kubelet-config.yaml"))
        .arg("--config")
        .arg(&config)
        .arg("--standalone")
        .arg(examples.join("pods"))
        .arg("--log-dir")
        .arg(work.join("logs"))
        .arg("--shutdown-grace-seconds")
        .arg("5")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting qoslet");
    let pid = child.id();
    // Pods start at once; the hog allocates after 10 s and is evicted: sample across both.
    let start = Instant::now();
    let mut samples: Vec<u64> = Vec::new();
    while start.elapsed() < Duration::from_secs(20) {
        if let Some(rss) = status_kib(pid, "VmRSS:") {
            samples.push(rss);
        }
        thread::sleep(Duration::from_millis(500));
    }
    let hwm = status_kib(pid, "VmHWM:").unwrap_or(0);
    // SAFETY: plain kill(2) of the child this bench started.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let _ = child.wait();
    let _ = fs::remove_dir_all(&work);
    samples.sort_unstable();
    let median = samples.get(samples.len() / 2).copied().unwrap_or(0);
    let last = samples.last().copied().unwrap_or(0);
    println!("## qoslet agent memory (standalone example, release build)\n");
    println!("| measure | value | target |");
    println!("|---|---:|---:|");
    println!(
        "| VmRSS median over 20 s | {:.1} MiB | < 40 MiB |",
        median as f64 / 1024.0
    );
    println!(
        "| VmRSS max sampled | {:.1} MiB | < 40 MiB |",
        last as f64 / 1024.0
    );
    println!("| VmHWM (peak) | {:.1} MiB | |", hwm as f64 / 1024.0);
    println!("| samples | {} | |", samples.len());
}
