//! The CPU-pressure controller on the real kernel (agent/src/policy/cpu_pressure.rs): the
//! standalone node (`qoslet::standalone::run`, what `qoslet run --standalone` runs) in this
//! process, a Guaranteed pod that wakes every millisecond (`qoslet-test-wake`) and BestEffort
//! pods. Runs on the host and on every VM kernel.
//!
//! The first test is issue #22's "Done when": BestEffort CPU hogs beside the Guaranteed pod;
//! when a window's p99 passes the 5 ms target the controller must engage, bring the p99 under
//! the target with its levers while the hogs run, and give the tier back its kubelet values
//! once they are gone. Whether the kubelet's weights alone let the pod wait is the scheduler's
//! call (`cargo xtask bench cpu`, docs/benchmarks.md "CPU pressure"): on the 6.18 host they keep the p99 at
//! about 2 µs and the controller rightly stays at level 0, which the test then checks instead;
//! in the VMs the hogs push it past 5 ms. Each run prints its windows (`QOSLET-CPU-PRESSURE`).
//!
//! The second drives every level on any machine (a 1 µs target) and checks each lever's files,
//! the v1 cpuset ordering between the tier and its pods included, and their release.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use qoslet::{
    cgroup::{Tree, layout::Controller},
    policy::{cpu_pressure::besteffort_cpus, cpuset::CpuSet, settings::Capacity},
    standalone::{self, StandaloneOptions},
};
use qoslet_tests::{
    InProcessAgent, Layout, NodeRoot, TempDir, free_port, http_get, layout, online_cpus,
    poll_until, require_root, wake_path,
};

/// The controller's default target.
const TARGET_US: u64 = 5000;

/// How long a wait for something that must happen may take: generous, because a TCG VM on a
/// loaded 2-core host took over 30 s to serve /readyz (2026-12-03). A wait ends as soon as what
/// it waits for is seen, so a generous bound costs a passing run nothing.
const SETTLE: Duration = Duration::from_secs(180);

const KUBELET: &str = include_str!("../../deploy/examples/standalone/kubelet-config.yaml");

/// One node at a time: the hogs of one test would be the other's load.
static ONE_NODE: Mutex<()> = Mutex::new(());

struct Node {
    work: TempDir,
    root: NodeRoot,
    addr: SocketAddr,
    /// Held until the node's cgroups and files are gone (dropped last).
    _one: MutexGuard<'static, ()>,
}

impl Node {
    /// A node (not started yet) with the Guaranteed pod that wakes every millisecond.
    fn with_waker() -> Self {
        require_root();
        let one = ONE_NODE.lock().unwrap_or_else(PoisonError::into_inner);
        let work = TempDir::new();
        fs::create_dir_all(work.path.join("pods")).unwrap();
        let node = Self {
            work,
            root: NodeRoot::create(),
            addr: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            _one: one,
        };
        let wake = wake_path();
        node.pod(
            "wake",
            "{limits: {cpu: '1', memory: 64Mi}}",
            &[wake.to_str().unwrap()],
        );
        node
    }

    fn start(&self, target_us: u64) -> InProcessAgent {
        let kubelet = self.work.path.join("kubelet.yaml");
        fs::write(&kubelet, KUBELET).unwrap();
        let config = self.work.path.join("qoslet.yaml");
        fs::write(
            &config,
            format!(
                "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: {}\nnodeRootCgroup: /{}\nhousekeepingInterval: 1s\nstateDir: {}\ncpuPressure:\n  enabled: true\n  latencyTarget: {target_us}us\n  calmWindows: 3\n  maxCalmWindows: 6\n",
                self.addr,
                self.root.name,
                self.work.path.join("state").display(),
            ),
        )
        .unwrap();
        let opts = StandaloneOptions {
            kubelet_config: kubelet,
            config: Some(config),
            dir: self.work.path.join("pods"),
            observe: false,
            log_dir: self.work.path.join("logs"),
            shutdown_grace: Duration::from_secs(2),
        };
        let agent = InProcessAgent::start(async move {
            let capacity = |_: &_, _: Option<i64>| {
                let cpus = online_cpus();
                Ok(Capacity {
                    cpu_millis: i64::from(cpus) * 1000,
                    memory_bytes: 1 << 30,
                    pids: 4096,
                    cpus: CpuSet::first(cpus),
                })
            };
            if let Err(e) = standalone::run(opts, capacity).await {
                panic!("qoslet stopped: {e}: {:?}", std::error::Error::source(&e));
            }
        });
        wait_for("/readyz", SETTLE, || http_get(self.addr, "/readyz"));
        agent
    }

    /// The BestEffort tier's directories with the cpu and the cpuset controllers (one on v2).
    fn tiers(&self) -> (PathBuf, PathBuf) {
        let (cpu, cpuset) = if layout() == Layout::Unified {
            (Tree::V2, Tree::V2)
        } else {
            (Tree::V1(Controller::Cpu), Tree::V1(Controller::Cpuset))
        };
        let at = |tree| self.root.path(tree, "kubepods/besteffort");
        (at(cpu), at(cpuset))
    }

    fn pod(&self, name: &str, resources: &str, command: &[&str]) {
        let command: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
        fs::write(
            self.pod_file(name),
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    command: [{}]\n    resources: {resources}\n",
                command.join(", ")
            ),
        )
        .unwrap();
    }

    fn pod_file(&self, name: &str) -> PathBuf {
        self.work.path.join("pods").join(format!("{name}.yaml"))
    }

    fn metric(&self, series: &str) -> Option<f64> {
        http_get(self.addr, "/metrics")?
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    fn level(&self) -> Option<u8> {
        self.metric("qoslet_cpu_pressure_level ").map(|v| v as u8)
    }

    fn guaranteed_p99_us(&self) -> Option<f64> {
        self.metric("qoslet_qos_runqueue_latency_p99_seconds{qos_class=\"Guaranteed\"}")
            .map(|s| s * 1e6)
    }
}

fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll_until(timeout, Duration::from_millis(200), f)
        .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// A line on stderr that libtest does not capture, so a passing run in the VMs shows its
/// figures too.
fn report(line: String) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "QOSLET-CPU-PRESSURE {line}");
}

/// One housekeeping window later (the gauges are rewritten every second).
fn next_window() {
    std::thread::sleep(Duration::from_millis(1100));
}

/// The tier's quota in µs; `None` unlimited.
fn quota(tier: &Path) -> Option<i64> {
    let read = |f: &str| fs::read_to_string(tier.join(f)).ok();
    if let Some(max) = read("cpu.max") {
        return max.split_whitespace().next()?.parse().ok();
    }
    read("cpu.cfs_quota_us")?
        .trim()
        .parse()
        .ok()
        .filter(|q: &i64| *q >= 0)
}

/// The tier holds what the kubelet gave it: no `cpu.idle`, no quota, its weight, every pod CPU.
fn kubelet_values(
    tier: &Path,
    cpuset_tier: &Path,
    weight: &[Option<String>; 2],
    pod_cpus: &Option<String>,
) -> bool {
    let idle = fs::read_to_string(tier.join("cpu.idle")).ok();
    let now = ["cpu.shares", "cpu.weight"].map(|f| fs::read_to_string(tier.join(f)).ok());
    let cpus = fs::read_to_string(cpuset_tier.join("cpuset.cpus")).ok();
    idle.is_none_or(|i| i.trim() == "0")
        && quota(tier).is_none()
        && &now == weight
        && (pod_cpus.is_none() || &cpus == pod_cpus)
}

#[test]
fn besteffort_hogs_are_constrained_while_a_guaranteed_pod_waits_and_released_after() {
    let node = Node::with_waker();
    let _q = node.start(TARGET_US);
    wait_for("the run-queue sensor", SETTLE, || {
        http_get(node.addr, "/metrics")?
            .lines()
            .any(|l| {
                l.starts_with("qoslet_sensor_active{")
                    && l.contains("sched_switch")
                    && l.ends_with(" 1")
            })
            .then_some(())
    });
    wait_for("the Guaranteed pod's p99", SETTLE, || {
        node.guaranteed_p99_us().filter(|p| *p > 0.0)
    });
    let (tier, cpuset_tier) = node.tiers();
    // Unset without a cpuset controller: then the CPUs are not compared.
    let pod_cpus = fs::read_to_string(cpuset_tier.join("cpuset.cpus")).ok();
    let kubelet_weight =
        ["cpu.shares", "cpu.weight"].map(|f| fs::read_to_string(tier.join(f)).ok());
    let hogs = 2 * online_cpus();
    for i in 0..hogs {
        node.pod(
            &format!("hog{i}"),
            "{}",
            &["sh", "-c", "while :; do :; done"],
        );
    }
    // Engaged in the first window whose p99 passes the target; the kubelet's weights may keep
    // every window under it (the host: about 2 µs), and then nothing may be constrained.
    let started = Instant::now();
    let mut seen = Vec::new();
    let engaged = loop {
        if started.elapsed() > Duration::from_secs(30) {
            break false;
        }
        next_window();
        let (p, l) = (node.guaranteed_p99_us(), node.level());
        seen.push((p, l));
        if l.is_some_and(|l| l >= 1) {
            break true;
        }
    };
    if !engaged {
        assert!(
            seen.iter()
                .all(|(p, _)| p.is_some_and(|p| p <= TARGET_US as f64)),
            "a window passed the target and the controller did not engage: {seen:?}"
        );
        assert!(
            kubelet_values(&tier, &cpuset_tier, &kubelet_weight, &pod_cpus),
            "the BestEffort tier was constrained: cpu.idle {:?}, quota {:?}",
            fs::read_to_string(tier.join("cpu.idle")).ok(),
            quota(&tier)
        );
        report(format!(
            "the kubelet's weights kept the Guaranteed p99 under {TARGET_US} µs beside the hogs for 30 s, and the tier was left alone: {seen:?}"
        ));
        return;
    }
    report(format!(
        "engaged after {:.1} s: {seen:?}",
        started.elapsed().as_secs_f64()
    ));
    // Two windows in a row under the target while the hogs run (one alone can be a lucky one),
    // at least one of them with a lever on. Not both with a lever: a spike that engaged the
    // controller may pass at once, and then its calm windows (3 here) release the tier before
    // this loop, a window behind the controller's, sees a second one (a loaded host, CI of
    // 2026-12-03: (1861 µs, level 1), then level 0 at under 2 ms for a minute).
    let mut seen = Vec::new();
    let mut in_a_row = 0;
    let mut lever_held = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while in_a_row < 2 || !lever_held {
        assert!(
            Instant::now() < deadline,
            "the p99 did not fall under the {TARGET_US} µs target: (p99 µs, level) per window: {seen:?}"
        );
        next_window();
        let (Some(p), Some(l)) = (node.guaranteed_p99_us(), node.level()) else {
            continue;
        };
        seen.push((p, l));
        let under = p <= TARGET_US as f64;
        in_a_row = if under { in_a_row + 1 } else { 0 };
        // Held under the target with a lever on, within the current run.
        lever_held = under && (l >= 1 || (lever_held && in_a_row > 1));
    }
    report(format!("under the target: {seen:?}"));
    for i in 0..hogs {
        fs::remove_file(node.pod_file(&format!("hog{i}"))).unwrap();
    }
    // Released: level 0 with the tier back at the kubelet's values, both at once. The
    // Guaranteed pod alone can still wait past the target in a busy TCG VM (the run in the 6.1
    // VM of 2026-12-03 saw 4-16 ms p99 for minutes after the hogs left); with the tier idle that
    // wait is not blamed on BestEffort, so the calm windows release it all the same.
    let mut windows = Vec::new();
    let released = poll_until(Duration::from_secs(180), Duration::from_millis(500), || {
        let window = (
            node.level(),
            node.guaranteed_p99_us(),
            node.metric("qoslet_besteffort_cpu_used_millicores "),
        );
        if windows.last() != Some(&window) {
            windows.push(window);
        }
        (window.0 == Some(0) && kubelet_values(&tier, &cpuset_tier, &kubelet_weight, &pod_cpus))
            .then_some(())
    });
    assert!(
        released.is_some(),
        "not released to the kubelet's values {kubelet_weight:?} cpus {pod_cpus:?} in 180 s: \
         (level, p99 µs, BestEffort millicores used) seen {windows:?}; the tier: cpu.idle {:?}, quota {:?}, weight {:?}, cpus {:?}",
        fs::read_to_string(tier.join("cpu.idle")).ok(),
        quota(&tier),
        ["cpu.shares", "cpu.weight"].map(|f| fs::read_to_string(tier.join(f)).ok()),
        fs::read_to_string(cpuset_tier.join("cpuset.cpus")).ok(),
    );
    report(format!(
        "released: (level, p99 µs, BestEffort millicores used) seen {windows:?}"
    ));
    let status = http_get(node.addr, "/status").unwrap_or_default();
    for step in [
        "cpu pressure: engage BestEffort tier",
        "cpu pressure: release BestEffort tier",
    ] {
        assert!(status.contains(step), "no {step:?} event: {status}");
    }
}

/// Every lever reaches the kernel's files and comes back, whatever the scheduler does: with a
/// 1 µs target any wake-up is pressure (the sensor's finest bucket is 0-2 µs, so a window's p99
/// is at least about 2 µs), so the controller climbs to the floor; removing the Guaranteed pod
/// leaves no protected wake-up, so the windows are calm and it releases level by level. A
/// BestEffort hog runs throughout (an idle tier is not blamed for any wait): on cgroup v1 its
/// own cpuset must be narrowed before the tier's (the kernel refuses a parent narrower than a
/// child) and widened after.
#[test]
fn every_lever_reaches_the_kernel_and_comes_back() {
    let node = Node::with_waker();
    node.pod("be", "{}", &["sh", "-c", "while :; do :; done"]);
    let _q = node.start(1);
    let (tier, cpuset_tier) = node.tiers();
    let cpus = online_cpus();
    let read = |dir: &Path, f: &str| {
        fs::read_to_string(dir.join(f))
            .ok()
            .map(|v| v.trim().to_owned())
    };
    // The BestEffort container's cgroup in the cpuset tree (v1 only: on v2 the tier confines it).
    let be_container = || -> Option<PathBuf> {
        let pod = fs::read_dir(&cpuset_tier)
            .ok()?
            .flatten()
            .find(|e| e.file_type().is_ok_and(|t| t.is_dir()))?
            .path();
        fs::read_dir(pod)
            .ok()?
            .flatten()
            .find(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
    };
    wait_for("the floor", SETTLE, || {
        (node.level()? == 4 || (cpus < 2 && node.level()? == 3)).then_some(())
    });
    let want_cpus = besteffort_cpus(&CpuSet::first(cpus), 50).to_string();
    wait_for("the floor's files", SETTLE, || {
        let idle_ok = read(&tier, "cpu.idle").is_none_or(|i| i == "1");
        let quota_ok = quota(&tier).is_some_and(|q| q > 0);
        let cpuset_ok =
            cpus < 2 || read(&cpuset_tier, "cpuset.cpus").as_deref() == Some(&want_cpus);
        let child_ok = cpus < 2
            || layout() == Layout::Unified
            || be_container()
                .is_some_and(|c| read(&c, "cpuset.cpus").as_deref() == Some(&want_cpus));
        (idle_ok && quota_ok && cpuset_ok && child_ok).then_some(())
    });
    // The BestEffort pod is still running (nothing was refused or killed on the way).
    let status = http_get(node.addr, "/status").unwrap_or_default();
    assert!(
        status.contains("cpu pressure: engage BestEffort tier, level 3 -> 4") || cpus < 2,
        "{status}"
    );

    fs::remove_file(node.pod_file("wake")).unwrap();
    wait_for("the release to level 0", SETTLE, || {
        (node.level()? == 0).then_some(())
    });
    let all = CpuSet::first(cpus).to_string();
    wait_for("the tier's kubelet values", SETTLE, || {
        let idle_ok = read(&tier, "cpu.idle").is_none_or(|i| i == "0");
        let cpuset_ok = read(&cpuset_tier, "cpuset.cpus").as_deref() == Some(&all);
        let child_ok = layout() == Layout::Unified
            || be_container().is_some_and(|c| read(&c, "cpuset.cpus").as_deref() == Some(&all));
        (idle_ok && quota(&tier).is_none() && cpuset_ok && child_ok).then_some(())
    });
    // From level 1, or 2 where the kernel has no cpu.idle (5.10).
    let status = http_get(node.addr, "/status").unwrap_or_default();
    assert!(
        status.contains("cpu pressure: release BestEffort tier, level 1 -> 0")
            || status.contains("cpu pressure: release BestEffort tier, level 2 -> 0"),
        "{status}"
    );
}
