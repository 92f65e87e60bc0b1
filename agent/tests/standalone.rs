//! The standalone node end to end, as root on the real kernel: the `qoslet` daemon on a copy of
//! deploy/examples/standalone inside its own node root cgroup (1Gi), checked through its HTTP
//! endpoints and the cgroup files.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/standalone")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(200));
    }
}

fn status(addr: SocketAddr) -> Option<Value> {
    let (code, body) = get(addr, "/status")?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

fn phase(status: &Value, name: &str) -> Option<String> {
    status["pods"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["phase"].as_str().map(str::to_owned))
}

fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Stops the daemon (SIGINT) if the test fails half way; the daemon removes its cgroups.
struct Daemon {
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of the child this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_standalone_node_runs_reconciles_evicts_and_cleans_up() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the standalone node needs root (real cgroups and processes)");
        return;
    }
    let work = std::env::temp_dir().join(format!("qoslet-standalone-{}", std::process::id()));
    let pods = work.join("pods");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&pods).unwrap();
    for f in [
        "guaranteed.yaml",
        "burstable.yaml",
        "besteffort-idle.yaml",
        "gang.yaml",
    ] {
        fs::copy(examples().join("pods").join(f), pods.join(f)).unwrap();
    }
    let hog = fs::read_to_string(examples().join("pods/besteffort-hog.yaml"))
        .unwrap()
        .replace("sleep 10", "sleep 4");
    fs::write(pods.join("besteffort-hog.yaml"), hog).unwrap();
    let node_root = format!("qoslet-test-{}-standalone", std::process::id());
    let port = free_port();
    let config = work.join("qoslet.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /{node_root}\ncapacity:\n  memory: 1Gi\nhousekeepingInterval: 1s\n"
        ),
    )
    .unwrap();
    let kubelet = examples().join("kubelet-config.yaml");
    let stderr_path = work.join("qoslet.log");
    let child = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .arg("run")
        .arg("--kubelet-config")
        .arg(&kubelet)
        .arg("--config")
        .arg(&config)
        .arg("--standalone")
        .arg(&pods)
        .arg("--log-dir")
        .arg(work.join("logs"))
        .arg("--shutdown-grace-seconds")
        .arg("5")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("starting qoslet");
    let mut daemon = Daemon { child };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    wait_until("/readyz 200", Duration::from_secs(30), || {
        get(addr, "/readyz").filter(|(c, _)| *c == 200)
    });
    let s = wait_until("db, web and idle Running", Duration::from_secs(20), || {
        let s = status(addr)?;
        ["db", "web", "idle"]
            .iter()
            .all(|n| phase(&s, n).as_deref() == Some("Running"))
            .then_some(s)
    });
    assert_eq!(s["node"]["mode"], "enforce");

    // /metrics agrees with `qoslet plan` for the same input and node.
    let cpus = fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let cpu_count: usize = cpus
        .trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum();
    let plan_out = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .arg("plan")
        .arg("--kubelet-config")
        .arg(&kubelet)
        .arg("--config")
        .arg(&config)
        .arg("--capacity")
        .arg(format!("cpu={cpu_count},memory=1Gi"))
        .arg("--output")
        .arg("json")
        .arg(&pods)
        .output()
        .unwrap();
    assert!(
        plan_out.status.success(),
        "{}",
        String::from_utf8_lossy(&plan_out.stderr)
    );
    let plan: Value = serde_json::from_slice(&plan_out.stdout).unwrap();
    let (_, metrics) = get(addr, "/metrics").unwrap();
    assert_eq!(
        metric(&metrics, "qoslet_node_allocatable{resource=\"memory\"}"),
        plan["node"]["allocatable"]["memory_bytes"].as_f64()
    );
    for p in plan["pods"].as_array().unwrap() {
        let info = format!(
            "qoslet_pod_info{{namespace=\"{}\",pod=\"{}\",uid=\"{}\",qos_class=\"{}\"}}",
            p["namespace"].as_str().unwrap(),
            p["name"].as_str().unwrap(),
            p["uid"].as_str().unwrap(),
            p["qos_class"].as_str().unwrap()
        );
        assert_eq!(metric(&metrics, &info), Some(1.0), "{info}");
        for c in p["containers"].as_array().unwrap() {
            let line = format!(
                "qoslet_container_oom_score_adj{{namespace=\"{}\",pod=\"{}\",container=\"{}\"}}",
                p["namespace"].as_str().unwrap(),
                p["name"].as_str().unwrap(),
                c["name"].as_str().unwrap()
            );
            assert_eq!(
                metric(&metrics, &line),
                c["oom_score_adj"].as_f64(),
                "{line}"
            );
        }
    }

    // Run-queue latency of each pod, from the kernel's histograms, at the next housekeeping.
    wait_until(
        "the run-queue histogram of db",
        Duration::from_secs(5),
        || {
            let (_, metrics) = get(addr, "/metrics")?;
            metric(
                &metrics,
                "qoslet_runqueue_latency_seconds_count{namespace=\"demo\",pod=\"db\"}",
            )
        },
    );

    // Kernel time of the eBPF programs, from the kernel's BPF run-time statistics.
    wait_until("eBPF program run time", Duration::from_secs(5), || {
        let (_, metrics) = get(addr, "/metrics")?;
        metrics
            .lines()
            .filter(|l| l.starts_with("qoslet_ebpf_program_run_seconds_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .any(|v| v > 0.0)
            .then_some(())
    });

    // The cgroups are real: the Guaranteed pod's memory limit is in its cgroup file.
    let db = plan["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "db")
        .unwrap();
    let db_cgroup = db["cgroup"].as_str().unwrap().trim_start_matches('/');
    let db_cgroup = db_cgroup
        .strip_prefix(&format!("{node_root}/"))
        .unwrap_or(db_cgroup);
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let limit_file = if v2 {
        format!("/sys/fs/cgroup/{node_root}/{db_cgroup}/memory.max")
    } else {
        format!("/sys/fs/cgroup/memory/{node_root}/{db_cgroup}/memory.limit_in_bytes")
    };
    assert_eq!(
        fs::read_to_string(&limit_file).unwrap().trim(),
        db["memory_limit_bytes"].as_i64().unwrap().to_string(),
        "{limit_file}"
    );

    // A manifest added starts a pod; removed, stops it.
    fs::write(
        pods.join("extra.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: extra, namespace: demo}\nspec:\n  containers:\n  - name: extra\n    command: [\"sleep\", \"3600\"]\n",
    )
    .unwrap();
    wait_until("the added pod Running", Duration::from_secs(15), || {
        (phase(&status(addr)?, "extra").as_deref() == Some("Running")).then_some(())
    });
    fs::remove_file(pods.join("extra.yaml")).unwrap();
    wait_until("the removed pod gone", Duration::from_secs(20), || {
        phase(&status(addr)?, "extra").is_none().then_some(())
    });

    // A broken manifest: one clear error, the others keep running.
    fs::write(
        pods.join("broken.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: broken, namespace: demo}\nspec:\n  containers:\n  - name: b\n    command: [\"sleep\", \"1\"]\n    resources:\n      requests: {memory: 12XYZ}\n",
    )
    .unwrap();
    wait_until(
        "the broken manifest reported",
        Duration::from_secs(10),
        || {
            let log = fs::read_to_string(&stderr_path).ok()?;
            (log.lines().filter(|l| l.contains("broken.yaml")).count() == 1).then_some(())
        },
    );

    // The allocating BestEffort pod is evicted; the Guaranteed pod lives on.
    let s = wait_until("the hog evicted", Duration::from_secs(60), || {
        let s = status(addr)?;
        phase(&s, "hog")?.contains("Evicted").then_some(s)
    });
    assert_eq!(phase(&s, "db").as_deref(), Some("Running"));
    assert_eq!(
        phase(&s, "idle").as_deref(),
        Some("Running"),
        "one eviction was enough"
    );
    // Counted at the next housekeeping tick (1 s).
    let evictions = wait_until("the eviction counted", Duration::from_secs(5), || {
        let (_, metrics) = get(addr, "/metrics")?;
        metric(
            &metrics,
            "qoslet_evictions_total{signal=\"memory.available\",qos_class=\"BestEffort\"}",
        )
    });
    assert_eq!(evictions, 1.0);

    // /stats/summary has the kubelet's shape and numbers from the cgroup files.
    let (code, body) = get(addr, "/stats/summary").unwrap();
    assert_eq!(code, 200);
    let summary: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        summary["node"]["memory"]["availableBytes"]
            .as_i64()
            .unwrap()
            + summary["node"]["memory"]["workingSetBytes"]
                .as_i64()
                .unwrap(),
        1 << 30
    );
    let pod_names: Vec<&str> = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["podRef"]["name"].as_str().unwrap())
        .collect();
    for n in ["db", "web", "idle", "train-0", "train-1"] {
        assert!(pod_names.contains(&n), "{n} in {pod_names:?}");
    }

    // Stopping qoslet stops its pods and removes the cgroups it created.
    // SAFETY: plain kill(2) of the child this test started.
    unsafe { libc::kill(daemon.child.id() as i32, libc::SIGINT) };
    let status = wait_until("qoslet to exit", Duration::from_secs(30), || {
        daemon.child.try_wait().ok().flatten()
    });
    assert!(status.success(), "{status:?}");
    let root_dir = if v2 {
        format!("/sys/fs/cgroup/{node_root}")
    } else {
        format!("/sys/fs/cgroup/memory/{node_root}")
    };
    assert!(!Path::new(&root_dir).exists(), "{root_dir} removed");
    let _ = fs::remove_dir_all(&work);
}
