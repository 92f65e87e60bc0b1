//! The agent's own resident memory with the standalone example running: starts the release
//! `qoslet` on a copy of deploy/examples/standalone (a unique 1Gi node root, a free port), lets
//! it start the pods and evict the allocating one, samples VmRSS / VmHWM, then stops it (which
//! stops the pods and removes the node root). Target: under 40 MiB.

use std::{
    fs,
    net::TcpListener,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

fn status_kib(pid: u32, key: &str) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn main() {
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
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /qoslet-bench-{}\ncapacity:\n  memory: 1Gi\n",
            std::process::id()
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
