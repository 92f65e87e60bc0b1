//! Cluster mode's cost, release build: `qoslet run --kube` against the fake API server
//! (`qoslet_tests::fake_api`, an in-process stand-in that speaks the API server's wire protocol
//! on loopback: no API server can be installed here) with 110 pods on a kubelet-shaped cgroupfs
//! / containerd tree below a unique node root (one `sleep` each, 20 of them in ten gangs), and
//! 50,000 Workload-API objects (25,000 Workloads, 25,000 PodGroups) in the fake, of which the
//! node's pods reference ten PodGroups (and, through them, ten Workloads): qoslet watches those
//! by name, so its cost should not follow the cluster's 50,000.
//!
//! Run twice: with plain pods, and with pods that each carry 256 KiB of annotations (the API
//! server's limit for all of an object's annotations), which qoslet must not keep
//! (`agent/src/cluster/source/trim.rs`).
//!
//! Measured: the agent's CPU (utime + stime over 30 s, share of one core) and VmRSS at steady
//! state; the API requests it makes per minute in that window, by verb; and the time from a pod
//! appearing in the API (its cgroups already made, as the kubelet does before the pod runs) to
//! qoslet exporting its per-pod metrics, which it does once a pass has found the pod's cgroups
//! and put them under its sensors' watch. Last, VmRSS again with 220 pods more (about 330): its
//! growth per pod.

use std::{
    collections::BTreeMap,
    fs,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use qoslet::cgroup::{Tree, layout::Controller};
use qoslet_tests::{
    NodeRoot, TempDir, cpu_ticks,
    fake_api::{FakeApi, Options},
    free_port, http_get,
    kubelet_tree::{Driver, KPod, Runtime, create, join, make_cgroup},
    poll_until, reconcile_passes, release_qoslet, require_root, status_kib,
};
use serde_json::json;

const NODE: &str = "bench-node";
const PODS: usize = 110;
const GANG_PODS: usize = 20;
const WORKLOAD_OBJECTS: usize = 50_000;
const NEW_POD_SAMPLES: usize = 5;

/// The annotations each pod carries in the second run: the API server's limit for all of them.
const BULK_ANNOTATIONS: usize = 256 << 10;

fn main() {
    require_root();
    let rt = tokio::runtime::Runtime::new().expect("a runtime for the fake");
    for bulk in [0, BULK_ANNOTATIONS] {
        match rt.block_on(measure(bulk)) {
            Ok(report) => print!("{report}"),
            Err(e) => {
                println!("## qoslet cluster mode (fake API server)\n\nfailed: {e}");
                std::process::exit(1);
            }
        }
    }
}

async fn measure(bulk: usize) -> Result<String, String> {
    let fake = FakeApi::start(Options::default())
        .await
        .map_err(|e| format!("fake API: {e}"))?;
    let root = NodeRoot::create();
    let limit = (8u64 << 30).to_string();
    if root.mounts.trees.contains_key(&Tree::V2) {
        fs::write(root.path(Tree::V2, "").join("memory.max"), &limit)
    } else {
        fs::write(
            root.path(Tree::V1(Controller::Memory), "")
                .join("memory.limit_in_bytes"),
            &limit,
        )
    }
    .map_err(|e| format!("node root memory limit: {e}"))?;
    fake.seed([json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE},
        "status": {"nodeInfo": {"containerRuntimeVersion": "containerd://2.1.0", "machineID": "",
            "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
            "kubeletVersion": "v1.37.0", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64"}},
    })])
    .map_err(|e| e.to_string())?;
    fake.seed(workload_objects()).map_err(|e| e.to_string())?;

    let mut sleepers = Sleepers(Vec::new());
    for i in 0..PODS {
        let mut pod = KPod::new(
            format!("idle-{i}"),
            &format!("00000000-0000-0000-0000-{i:012}"),
            if i % 2 == 0 {
                "BestEffort"
            } else {
                "Burstable"
            },
        );
        if i < GANG_PODS {
            pod.group = Some(GANG_NAMES[i / 2]);
        }
        add_pod(&fake, &root, &mut pod, bulk, &mut sleepers)?;
    }

    let work = TempDir::new();
    let kubeconfig = work.path.join("kubeconfig");
    fake.write_kubeconfig(&kubeconfig)
        .map_err(|e| e.to_string())?;
    let kubelet = work.path.join("kubelet.yaml");
    fs::write(
        &kubelet,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\n",
    )
    .map_err(|e| e.to_string())?;
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = work.path.join("qoslet.yaml");
    // The shipped ConfigMap's housekeeping (1 s); capacity from the node root's limit.
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nnodeRootCgroup: /{}\nmetricsAddress: \"{metrics}\"\nstateDir: {}\nhousekeepingInterval: 1s\nleaseNamespace: qoslet-system\nendpointAuth: none\ngangEviction: node\n",
            root.name,
            work.path.join("state").display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let qoslet = release_qoslet();
    let child = Command::new(&qoslet)
        .args(["run", "--kube", "--node-name", NODE])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--kubelet-config")
        .arg(&kubelet)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            fs::File::create(work.path.join("qoslet.log")).map_err(|e| e.to_string())?,
        ))
        .spawn()
        .map_err(|e| format!("{}: {e}", qoslet.display()))?;
    let agent = Agent(child);
    let pid = agent.0.id();

    let started = Instant::now();
    wait_until(Duration::from_secs(120), || pods_exported(metrics) >= PODS).ok_or_else(|| {
        format!(
            "only {} of {PODS} pods exported after 120 s (log: {})",
            pods_exported(metrics),
            work.path.join("qoslet.log").display()
        )
    })?;
    let all_found = started.elapsed();
    // Start-up settles: the first statistics samples, the first full reconcile, the lease.
    tokio::time::sleep(Duration::from_secs(15)).await;

    let window = Duration::from_secs(30);
    let before = fake.requests().len();
    let c0 = cpu_ticks(pid).ok_or("no /proc stat")?;
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let c1 = cpu_ticks(pid).ok_or("no /proc stat")?;
    let elapsed = t0.elapsed();
    let requests = fake.requests();
    let rss_kib = status_kib(pid, "VmRSS:").unwrap_or(0);
    let cpu_pct = (c1 - c0) as f64 / 100.0 / elapsed.as_secs_f64() * 100.0;
    let per_minute = 60.0 / elapsed.as_secs_f64();
    let mut by_verb: BTreeMap<String, usize> = BTreeMap::new();
    for r in &requests[before..] {
        let what = if r.path.contains("/leases") {
            format!("{} lease", r.method)
        } else {
            format!("{} {}", r.method, r.path.rsplit('/').next().unwrap_or(""))
        };
        *by_verb.entry(what).or_default() += 1;
    }
    let steady_requests = requests.len() - before;
    // Workload-API requests since the start: which objects qoslet asked for, and whether any
    // request covered a whole kind (no `metadata.name` field selector).
    let workload: Vec<_> = requests
        .iter()
        .filter(|r| {
            r.path.starts_with("/apis/scheduling.k8s.io/") && r.path.contains("/namespaces/")
        })
        .collect();
    let named: std::collections::BTreeSet<String> = workload
        .iter()
        .filter_map(|r| {
            let name = r
                .param("fieldSelector")?
                .strip_prefix("metadata.name=")?
                .to_owned();
            Some(format!(
                "{}/{name}",
                r.path.rsplit('/').next().unwrap_or("")
            ))
        })
        .collect();
    let whole_kind = requests
        .iter()
        .filter(|r| r.path.starts_with("/apis/scheduling.k8s.io/"))
        .filter(|r| r.path.split('/').count() > 4)
        .filter(|r| {
            r.param("fieldSelector")
                .is_none_or(|f| !f.starts_with("metadata.name="))
        })
        .count();

    // New pods: cgroups and process first, then the pod in the API, then wait for its metrics.
    let mut appear = Vec::new();
    for i in 0..NEW_POD_SAMPLES {
        let name = format!("new-{i}");
        let mut pod = KPod::new(
            name.clone(),
            &format!("11111111-0000-0000-0000-{i:012}"),
            "BestEffort",
        );
        let dirs = make_cgroup(
            &root,
            &pod.container_cgroup(Driver::Cgroupfs, Runtime::Containerd),
        );
        let s = sleeper()?;
        join(&dirs, s.id());
        sleepers.0.push(s);
        let t = Instant::now();
        create(&fake, &mut pod, Runtime::Containerd, NODE);
        let needle = format!("pod=\"{name}\"");
        wait_until(Duration::from_secs(30), || {
            http_get(metrics, "/metrics").is_some_and(|m| m.contains(&needle))
        })
        .ok_or_else(|| format!("{name} was not exported within 30 s"))?;
        appear.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    appear.sort();

    // Events that change nothing qoslet reads: the Node's status rewritten every 2 s (a
    // heartbeat). Then churn: a pod created and the one before it deleted every second, and the
    // heartbeat every 10 s. A pass only where the desired state changed.
    let heartbeats = churn_window(&fake, metrics, pid, None, Duration::from_secs(2)).await?;
    let churn = churn_window(
        &fake,
        metrics,
        pid,
        Some(Duration::from_secs(1)),
        Duration::from_secs(10),
    )
    .await?;
    let growth = rss_growth(&fake, &root, metrics, pid, bulk, &mut sleepers).await?;
    drop(agent);

    let mut out = String::new();
    out.push_str(&format!(
        "## qoslet cluster mode (fake API server on loopback, release build), {} KiB of annotations a pod\n\n",
        bulk >> 10
    ));
    out.push_str(&format!(
        "{PODS} pods ({GANG_PODS} in gangs) on a cgroupfs/containerd tree, each with {} KiB of annotations, {WORKLOAD_OBJECTS} Workload-API objects in the fake ({} of their PodGroups referenced by the node's pods), housekeeping 1 s; every pod exported {:.1} s after start.\n\n",
        bulk >> 10,
        GANG_NAMES.len(),
        all_found.as_secs_f64()
    ));
    out.push_str("| CPU (% of a core) | VmRSS | API requests/min | new pod in the API → its metrics (median, max of 5) |\n|---:|---:|---:|---:|\n");
    out.push_str(&format!(
        "| {cpu_pct:.2} | {:.1} MiB | {:.1} | {} ms, {} ms |\n\n",
        rss_kib as f64 / 1024.0,
        steady_requests as f64 * per_minute,
        appear[appear.len() / 2].as_millis(),
        appear[appear.len() - 1].as_millis(),
    ));
    out.push_str("Events over 30 s each, and what the agent did for them:\n\n| events | CPU (% of a core) | reconcile passes/s |\n|---|---:|---:|\n");
    for (what, w) in [
        (
            "the Node's status rewritten every 2 s, nothing else",
            heartbeats,
        ),
        (
            "a pod created and one deleted every second, the Node every 10 s",
            churn,
        ),
    ] {
        out.push_str(&format!(
            "| {what} | {:.2} | {:.2} |\n",
            w.cpu_pct, w.passes_per_sec
        ));
    }
    out.push('\n');
    out.push_str(&format!(
        "VmRSS by pods on the node ({} KiB of annotations each), {SETTLE:?} after the last was exported: {:.1} MiB at {} pods, {:.1} MiB at {} pods: {:.3} MiB ({:.0} KiB) a pod more.\n\n",
        bulk >> 10,
        growth.before_kib as f64 / 1024.0,
        growth.before_pods,
        growth.after_kib as f64 / 1024.0,
        growth.after_pods,
        growth.kib_a_pod() / 1024.0,
        growth.kib_a_pod(),
    ));
    out.push_str(&format!(
        "Workload-API objects watched (by name, from the start): {} ({} requests); requests for a whole kind: {whole_kind}.\n\n",
        named.len(),
        workload.len(),
    ));
    out.push_str(
        "Requests in the steady window, per minute:\n\n| request | per minute |\n|---|---:|\n",
    );
    for (what, n) in by_verb {
        out.push_str(&format!("| {what} | {:.1} |\n", n as f64 * per_minute));
    }
    drop(sleepers);
    drop(root);
    Ok(out)
}

/// The pods added for the second RSS figure: about three times the first's 110.
const EXTRA_PODS: usize = 220;

/// How long RSS is left to settle after the pods are exported (start-up's statistics samples
/// and first full reconcile, as before the steady window).
const SETTLE: Duration = Duration::from_secs(15);

/// VmRSS at two pod counts.
struct Growth {
    before_pods: usize,
    before_kib: u64,
    after_pods: usize,
    after_kib: u64,
}

impl Growth {
    fn kib_a_pod(&self) -> f64 {
        (self.after_kib as f64 - self.before_kib as f64)
            / (self.after_pods.saturating_sub(self.before_pods).max(1)) as f64
    }
}

/// VmRSS with the pods on the node now, then with [`EXTRA_PODS`] more (cgroups, a process and
/// `bulk` bytes of annotations each, as the first 110), each [`SETTLE`] after the pods are
/// exported: RSS does not follow CPU load, so one run gives the growth per pod.
async fn rss_growth(
    fake: &FakeApi,
    root: &NodeRoot,
    metrics: SocketAddr,
    pid: u32,
    bulk: usize,
    sleepers: &mut Sleepers,
) -> Result<Growth, String> {
    tokio::time::sleep(SETTLE).await;
    let before_pods = pods_exported(metrics);
    let before_kib = status_kib(pid, "VmRSS:").ok_or("no VmRSS")?;
    for i in 0..EXTRA_PODS {
        let mut pod = KPod::new(
            format!("more-{i}"),
            &format!("33333333-0000-0000-0000-{i:012}"),
            if i % 2 == 0 {
                "BestEffort"
            } else {
                "Burstable"
            },
        );
        add_pod(fake, root, &mut pod, bulk, sleepers)?;
    }
    let after_pods = before_pods + EXTRA_PODS;
    wait_until(Duration::from_secs(180), || {
        pods_exported(metrics) >= after_pods
    })
    .ok_or_else(|| {
        format!(
            "only {} of {after_pods} pods exported 180 s after adding {EXTRA_PODS}",
            pods_exported(metrics)
        )
    })?;
    tokio::time::sleep(SETTLE).await;
    let after_kib = status_kib(pid, "VmRSS:").ok_or("no VmRSS")?;
    Ok(Growth {
        before_pods,
        before_kib,
        after_pods: pods_exported(metrics),
        after_kib,
    })
}

/// What the agent did in one window of events.
#[derive(Clone, Copy)]
struct Window {
    cpu_pct: f64,
    passes_per_sec: f64,
}

/// 30 s of events: every `heartbeat` the Node's status rewritten with a new heartbeat time,
/// and with `churn`, at that interval a new pod created and the previous one deleted (no
/// cgroups: the kubelet has not made them yet). The agent's CPU and reconcile passes (the
/// `qoslet_reconcile_duration_seconds` count) in that time.
async fn churn_window(
    fake: &FakeApi,
    metrics: SocketAddr,
    pid: u32,
    churn: Option<Duration>,
    heartbeat: Duration,
) -> Result<Window, String> {
    let window = Duration::from_secs(30);
    let tick = churn.unwrap_or(heartbeat).min(heartbeat);
    let passes = || reconcile_passes(metrics);
    let p0 = passes().ok_or("no reconcile count")?;
    let c0 = cpu_ticks(pid).ok_or("no /proc stat")?;
    let t0 = Instant::now();
    let (mut last_beat, mut beats, mut created) = (t0, 0u32, 0usize);
    let mut previous: Option<String> = None;
    while t0.elapsed() < window {
        tokio::time::sleep(tick).await;
        if last_beat.elapsed() >= heartbeat {
            last_beat = Instant::now();
            beats += 1;
            let at = format!("2026-12-04T00:{:02}:{:02}Z", beats / 60 % 60, beats % 60);
            fake.modify::<k8s_openapi::api::core::v1::Node>("", NODE, |n| {
                n["status"]["conditions"] = json!([{"type": "Ready", "status": "True",
                    "lastHeartbeatTime": at, "lastTransitionTime": "2026-11-30T10:00:00Z"}]);
            })
            .map_err(|e| format!("node heartbeat: {e}"))?;
        }
        if churn.is_some() {
            let name = format!("churn-{created}");
            let mut pod = KPod::new(
                name.clone(),
                &format!("22222222-0000-0000-0000-{created:012}"),
                "BestEffort",
            );
            create(fake, &mut pod, Runtime::Containerd, NODE);
            created += 1;
            if let Some(old) = previous.replace(name) {
                fake.remove::<k8s_openapi::api::core::v1::Pod>("ns", &old);
            }
        }
    }
    if let Some(old) = previous {
        fake.remove::<k8s_openapi::api::core::v1::Pod>("ns", &old);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let c1 = cpu_ticks(pid).ok_or("no /proc stat")?;
    let p1 = passes().ok_or("no reconcile count")?;
    Ok(Window {
        cpu_pct: (c1 - c0) as f64 / 100.0 / elapsed * 100.0,
        passes_per_sec: (p1 - p0) as f64 / elapsed,
    })
}

/// Ten gangs of two among the node's pods; their PodGroups are part of the 50,000 objects.
const GANG_NAMES: [&str; 10] = [
    "gang-0", "gang-1", "gang-2", "gang-3", "gang-4", "gang-5", "gang-6", "gang-7", "gang-8",
    "gang-9",
];

/// Half Workloads, half PodGroups; the first ten PodGroups are the node's gangs, the rest
/// belong to other nodes' pods, as in a large cluster.
fn workload_objects() -> Vec<serde_json::Value> {
    let mut objects = Vec::with_capacity(WORKLOAD_OBJECTS);
    for i in 0..WORKLOAD_OBJECTS / 2 {
        let workload = format!("wl-{i}");
        let group = GANG_NAMES
            .get(i)
            .map_or_else(|| format!("pg-{i}"), |g| (*g).to_owned());
        objects.push(json!({
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": workload, "namespace": "ns"},
            "spec": {"controllerRef": {"apiGroup": "batch", "kind": "Job", "name": workload},
                "podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"gang": {"minCount": 2}}}]},
        }));
        objects.push(json!({
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": group, "namespace": "ns"},
            "spec": {"workloadRef": {"workloadName": workload, "templateName": "workers"},
                "schedulingPolicy": {"gang": {"minCount": 2}}},
        }));
    }
    objects
}

/// A pod in the API with `bulk` bytes of annotations, its cgroups, and a process in them.
fn add_pod(
    fake: &FakeApi,
    root: &NodeRoot,
    pod: &mut KPod,
    bulk: usize,
    sleepers: &mut Sleepers,
) -> Result<(), String> {
    if bulk == 0 {
        create(fake, pod, Runtime::Containerd, NODE);
    } else {
        let mut object = pod.object(Runtime::Containerd, NODE);
        object["metadata"]["annotations"] = json!({"example.com/bulk": "x".repeat(bulk)});
        let created = fake.create_json(object).map_err(|e| e.to_string())?;
        pod.uid = created["metadata"]["uid"]
            .as_str()
            .ok_or("no uid")?
            .to_owned();
    }
    let dirs = make_cgroup(
        root,
        &pod.container_cgroup(Driver::Cgroupfs, Runtime::Containerd),
    );
    let s = sleeper()?;
    join(&dirs, s.id());
    sleepers.0.push(s);
    Ok(())
}

fn sleeper() -> Result<Child, String> {
    Command::new("sleep")
        .arg("3600")
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("sleep: {e}"))
}

/// The pods' processes, killed however the bench ends (before the node root is removed).
struct Sleepers(Vec<Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The agent, stopped with SIGTERM (and waited for) however the bench ends.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

fn pods_exported(metrics: SocketAddr) -> usize {
    http_get(metrics, "/metrics").map_or(0, |m| {
        m.lines()
            .filter(|l| l.starts_with("qoslet_pod_info{"))
            .count()
    })
}

/// Polls `f` every 10 ms (the appearance times are measured by it) until true or `timeout`.
fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> Option<()> {
    poll_until(timeout, Duration::from_millis(10), || f().then_some(()))
}
