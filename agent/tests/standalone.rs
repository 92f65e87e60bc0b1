//! The standalone node end to end, as root on the real kernel: the `qoslet` daemon on a copy of
//! deploy/examples/standalone inside its own node root cgroup (1Gi), checked through its HTTP
//! endpoints and the cgroup files.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;

mod common;
use common::{WorkDir, free_port, get, phase, root_or_skip, start_node, status, wait_until};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/standalone")
}

fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `/a/b` with the node root `a` in front or not: `b`.
fn relative(cgroup: &str, node_root: &str) -> String {
    let c = cgroup.trim_start_matches('/');
    c.strip_prefix(&format!("{node_root}/"))
        .unwrap_or(c)
        .to_owned()
}

/// A cgroup's memory directory and its cgroup v2 directory (the controller-less tree on hybrid
/// hosts, where qoslet also places every container).
struct CgroupDirs {
    memory: PathBuf,
    v2: PathBuf,
    pure_v2: bool,
}

/// The numbers the Summary API takes from one cgroup, read by the test itself.
#[derive(Debug)]
struct Reading {
    usage: u64,
    working_set: u64,
    rss: u64,
    page_faults: u64,
    major_page_faults: u64,
    limit: Option<u64>,
    cpu_ns: u64,
}

fn stat(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} missing"))
}

impl CgroupDirs {
    fn new(node_root: &str, rel: &str, pure_v2: bool) -> Self {
        let under = |base: &str| Path::new(base).join(node_root).join(rel);
        let (memory, v2) = if pure_v2 {
            (under("/sys/fs/cgroup"), under("/sys/fs/cgroup"))
        } else {
            (
                under("/sys/fs/cgroup/memory"),
                under("/sys/fs/cgroup/unified"),
            )
        };
        assert!(memory.is_dir() && v2.is_dir(), "{}", memory.display());
        Self {
            memory,
            v2,
            pure_v2,
        }
    }

    fn read(&self) -> Reading {
        let file = |f: &str| fs::read_to_string(self.memory.join(f)).unwrap();
        let memory_stat = file("memory.stat");
        let (usage, inactive_file, rss, limit) = if self.pure_v2 {
            (
                file("memory.current"),
                stat(&memory_stat, "inactive_file"),
                stat(&memory_stat, "anon"),
                file("memory.max"),
            )
        } else {
            (
                file("memory.usage_in_bytes"),
                stat(&memory_stat, "total_inactive_file"),
                stat(&memory_stat, "total_rss"),
                file("memory.limit_in_bytes"),
            )
        };
        let usage: u64 = usage.trim().parse().unwrap();
        let cpu_stat = fs::read_to_string(self.v2.join("cpu.stat")).unwrap();
        Reading {
            usage,
            working_set: usage.saturating_sub(inactive_file),
            rss,
            page_faults: stat(&memory_stat, "pgfault"),
            major_page_faults: stat(&memory_stat, "pgmajfault"),
            // v1 says "unlimited" with a page-rounded i64::MAX.
            limit: limit.trim().parse().ok().filter(|&l: &u64| l < 1 << 62),
            cpu_ns: stat(&cpu_stat, "usage_usec") * 1000,
        }
    }
}

/// The stats of `what`: `node`, a system container, `pod` or `pod/container`.
fn summary_stats<'a>(summary: &'a Value, what: &str) -> Option<&'a Value> {
    let named = |list: &'a Value, key: &str, name: &str| {
        list.as_array()?
            .iter()
            .find(|v| v[key] == name || v["podRef"][key] == name)
    };
    match what.split_once('/') {
        _ if what == "node" => Some(&summary["node"]),
        _ if what == "pods" => named(&summary["node"]["systemContainers"], "name", "pods"),
        Some((pod, c)) => named(
            &named(&summary["pods"], "name", pod)?["containers"],
            "name",
            c,
        ),
        None => named(&summary["pods"], "name", what),
    }
}

/// Memory gauges may move between the test's two reads and the agent's; they must lie within
/// the two readings, widened by one memcg charge batch per CPU (64 pages: the kernel charges
/// and uncharges per-CPU stock in such batches, so usage can step that far and back between
/// two reads without any allocation the test could see). Counters (CPU time, page faults) only
/// grow: they lie within the two readings exactly.
fn check_summary(what: &str, s: &Value, b: &Reading, a: &Reading, cpus: u64) {
    let tolerance = 64 * 4096 * cpus;
    let m = &s["memory"];
    let gauge = |field: &str, before: u64, after: u64| {
        let v = m[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: memory.{field} in {s}"));
        assert!(
            v + tolerance >= before.min(after) && v <= before.max(after) + tolerance,
            "{what}: memory.{field} {v}, the cgroup said {before} then {after}"
        );
        v
    };
    let counter = |v: &Value, field: &str, before: u64, after: u64| {
        let v = v[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: {field} in {s}"));
        assert!(
            before <= v && v <= after,
            "{what}: {field} {v}, the cgroup said {before} then {after}"
        );
    };
    gauge("usageBytes", b.usage, a.usage);
    let working_set = gauge("workingSetBytes", b.working_set, a.working_set);
    gauge("rssBytes", b.rss, a.rss);
    counter(m, "pageFaults", b.page_faults, a.page_faults);
    counter(
        m,
        "majorPageFaults",
        b.major_page_faults,
        a.major_page_faults,
    );
    assert_eq!(
        m["availableBytes"].as_u64(),
        b.limit.map(|l| l.saturating_sub(working_set)),
        "{what}: availableBytes = limit - workingSet"
    );
    counter(&s["cpu"], "usageCoreNanoSeconds", b.cpu_ns, a.cpu_ns);
    // A rate since the last housekeeping sample (1 s): at most every CPU busy, with slack for
    // the sample's timestamp being taken just after its read.
    let cores = s["cpu"]["usageNanoCores"]
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: usageNanoCores in {s}"));
    assert!(
        cores <= cpus * 1_100_000_000,
        "{what}: usageNanoCores {cores}"
    );
}

#[test]
fn the_standalone_node_runs_reconciles_evicts_and_cleans_up() {
    if !root_or_skip() {
        return;
    }
    let work_dir = WorkDir::create("standalone");
    let work = work_dir.0.clone();
    let pods = work.join("pods");
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
    let kubelet = examples().join("kubelet-config.yaml");
    let stderr_path = work.join("qoslet.log");
    let mut daemon = start_node(&work, &node_root, port);
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
    // Its per-pod series (info, requests, run-queue histogram from the kernel) appear...
    wait_until("the added pod's series", Duration::from_secs(10), || {
        let (_, metrics) = get(addr, "/metrics")?;
        metric(
            &metrics,
            "qoslet_runqueue_latency_seconds_count{namespace=\"demo\",pod=\"extra\"}",
        )?;
        metric(
            &metrics,
            "qoslet_pod_requests{namespace=\"demo\",pod=\"extra\",resource=\"memory\"}",
        )
    });
    fs::remove_file(pods.join("extra.yaml")).unwrap();
    wait_until("the removed pod gone", Duration::from_secs(20), || {
        phase(&status(addr)?, "extra").is_none().then_some(())
    });
    // ... and go with it, so series do not pile up as pods come and go.
    wait_until(
        "the removed pod's series gone",
        Duration::from_secs(5),
        || {
            let (_, metrics) = get(addr, "/metrics")?;
            (!metrics.contains("pod=\"extra\"")).then_some(())
        },
    );

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
    // Counted by the signal the manager named. The example kubelet configuration reserves
    // 128Mi, so the pods' cgroup crosses allocatableMemory.available before the node crosses
    // memory.available; the hog covers the 128 MiB between them in a fraction of a second, so
    // which one a pass finds first is timing (the Prometheus test says the same), and a run of
    // 2026-12-04 beside a build named allocatableMemory.available.
    let evictions = wait_until("the eviction counted", Duration::from_secs(30), || {
        let (_, metrics) = get(addr, "/metrics")?;
        let counted: Vec<(String, f64)> = metrics
            .lines()
            .filter_map(|l| l.strip_prefix("qoslet_evictions_total{"))
            .filter_map(|l| {
                let (labels, value) = l.rsplit_once(' ')?;
                Some((labels.to_owned(), value.parse().ok()?))
            })
            .collect();
        (!counted.is_empty()).then_some(counted)
    });
    assert!(
        matches!(
            evictions.as_slice(),
            [(labels, 1.0)] if [
                "signal=\"memory.available\",qos_class=\"BestEffort\"}",
                "signal=\"allocatableMemory.available\",qos_class=\"BestEffort\"}",
            ]
            .contains(&labels.as_str())
        ),
        "one BestEffort eviction for a memory signal: {evictions:?}"
    );

    // /stats/summary has the kubelet's shape and its numbers are the cgroup files', read by this
    // test just before and just after the request.
    let kubepods = plan["node"]["kubepods"]["cgroup"].as_str().unwrap();
    let mut cgroups = vec![
        ("node".to_owned(), String::new()),
        ("pods".to_owned(), relative(kubepods, &node_root)),
    ];
    for name in ["db", "web", "idle", "train-0", "train-1"] {
        let p = plan["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap();
        let rel = relative(p["cgroup"].as_str().unwrap(), &node_root);
        for c in p["containers"].as_array().unwrap() {
            let c = c["name"].as_str().unwrap();
            cgroups.push((format!("{name}/{c}"), format!("{rel}/{c}")));
        }
        cgroups.push((name.to_owned(), rel));
    }
    let dirs: Vec<(String, CgroupDirs)> = cgroups
        .into_iter()
        .map(|(what, rel)| (what, CgroupDirs::new(&node_root, &rel, v2)))
        .collect();
    let before: Vec<Reading> = dirs.iter().map(|(_, d)| d.read()).collect();
    let (code, body) = get(addr, "/stats/summary").unwrap();
    let after: Vec<Reading> = dirs.iter().map(|(_, d)| d.read()).collect();
    assert_eq!(code, 200);
    let summary: Value = serde_json::from_str(&body).unwrap();
    assert!(summary["node"]["nodeName"].as_str().is_some());
    for (((what, _), b), a) in dirs.iter().zip(&before).zip(&after) {
        let stats = summary_stats(&summary, what)
            .unwrap_or_else(|| panic!("{what} missing in {summary:#}"));
        check_summary(what, stats, b, a, cpu_count as u64);
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
}

/// The `Locked:` kB of each mapping in a `/proc/PID/smaps` text, by the mapping's path (or
/// `[heap]`, `[stack]`; anonymous ones as "").
fn locked_by_mapping(smaps: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for line in smaps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first()
            .is_some_and(|a| a.contains('-') && !a.ends_with(':'))
        {
            out.push((f.get(5).copied().unwrap_or("").to_owned(), 0));
        } else if let (Some(&"Locked:"), Some(kb), Some(last)) =
            (f.first(), f.get(1), out.last_mut())
        {
            last.1 = kb.parse().unwrap();
        }
    }
    out
}

/// Once start-up's code is paged out (30 s after the start), the agent locks its own binary's
/// pages in memory as they run, so that memory pressure cannot drop the code an eviction needs;
/// not its heap, nor other files' pages.
#[test]
fn the_agent_locks_its_own_code_once_start_up_is_paged_out() {
    if !root_or_skip() {
        return;
    }
    let work_dir = WorkDir::create("locked");
    let work = work_dir.0.clone();
    fs::copy(
        examples().join("pods/guaranteed.yaml"),
        work.join("pods/guaranteed.yaml"),
    )
    .unwrap();
    let node_root = format!("qoslet-test-{}-locked", std::process::id());
    let daemon = start_node(&work, &node_root, free_port());
    let pid = daemon.child.id();
    let binary = fs::canonicalize(env!("CARGO_BIN_EXE_qoslet")).unwrap();
    let binary = binary.to_str().unwrap();
    let log_path = work.join("qoslet.log");
    // The log line follows the lock.
    let log = wait_until("the code locked", Duration::from_secs(90), || {
        let log = fs::read_to_string(&log_path).ok()?;
        (log.contains("qoslet's code is locked in memory as it runs")
            || log.contains("Could not lock"))
        .then_some(log)
    });
    assert!(!log.contains("Could not lock"), "{log}");
    let locked = locked_by_mapping(&fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap());
    let in_binary: u64 = locked
        .iter()
        .filter(|(path, _)| path == binary)
        .map(|(_, kb)| kb)
        .sum();
    let elsewhere: Vec<&(String, u64)> = locked
        .iter()
        .filter(|(path, kb)| path != binary && *kb > 0)
        .collect();
    assert!(in_binary > 0, "{locked:?}");
    assert!(
        elsewhere.is_empty(),
        "only the binary is locked: {elsewhere:?}"
    );
    drop(daemon);
    assert!(
        !Path::new("/sys/fs/cgroup/unified")
            .join(&node_root)
            .exists()
            && !Path::new("/sys/fs/cgroup/memory").join(&node_root).exists()
            && !Path::new("/sys/fs/cgroup")
                .join(&node_root)
                .join("cgroup.procs")
                .exists(),
        "the node root is removed"
    );
}
