//! The CPU-pressure controller as root on the real kernel: `qoslet run --standalone` with a
//! Guaranteed pod waking every millisecond, then four BestEffort CPU hogs on this 2-CPU machine.
//! The controller must engage (its level and the BestEffort tier's files show the lever), bring
//! the Guaranteed pod's run-queue latency p99 under the target while the hogs run, and give the
//! tier back its kubelet values once the hogs' manifests are removed.
//!
//! The target is the 5 ms default. Measured on the shared 2-CPU development machine (load 6-15
//! from other builds): the Guaranteed pod's p99 is about 3 ms alone and 5-13 ms beside the hogs
//! with the kubelet's weights only, so a 20 ms target never engages there. The test first
//! measures the Guaranteed pod's p99 without hogs and skips (with a line saying so) when the
//! machine alone keeps it above 70% of the target: then no lever on BestEffort can bring it
//! under.
//! The levels' caps are 20% and 5% of the node (the defaults are 50% and 10%): the test's node
//! root is one cgroup among the machine's other load, and time its BestEffort tier spends
//! (idle or not) is time the node root's entity has used against that load, which the
//! Guaranteed pod then waits for; measured here, cpu.idle alone and a 50% cap leave the p99 at
//! 5-7 ms, the 20% cap brings it to about 3-4 ms. On a real node the node root is the whole
//! machine and cpu.idle acts directly.
//! The Guaranteed pod's command is a bash loop of `read -t 0.001` on a pipe nobody writes to:
//! a wake-up every millisecond with no fork.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

const TARGET_MS: f64 = 5.0;
const HOGS: usize = 4;

mod common;
use common::{free_port, get, root_or_skip, wait_until};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/standalone")
}

/// A test node: its work directory, node root name and port; removed however the test ends.
struct TestNode {
    work: PathBuf,
    node_root: String,
    port: u16,
}

impl TestNode {
    fn new(tag: &str) -> Self {
        let id = format!("qoslet-test-{}-{tag}", std::process::id());
        let work = std::env::temp_dir().join(&id);
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(work.join("pods")).unwrap();
        Self {
            work,
            node_root: id,
            port: free_port(),
        }
    }

    fn addr(&self) -> SocketAddr {
        format!("127.0.0.1:{}", self.port).parse().unwrap()
    }

    fn config(&self) -> PathBuf {
        let path = self.work.join("qoslet.yaml");
        fs::write(
            &path,
            format!(
                "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{}\nnodeRootCgroup: /{}\ncapacity:\n  memory: 1Gi\nhousekeepingInterval: 1s\nstateDir: {}\ncpuPressure:\n  enabled: true\n  latencyTarget: {}ms\n  calmWindows: 3\n  capPercent: 20\n  floorPercent: 5\n",
                self.port,
                self.node_root,
                self.work.join("state").display(),
                TARGET_MS as u64,
            ),
        )
        .unwrap();
        path
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
        self.work.join("pods").join(format!("{name}.yaml"))
    }

    fn start(&self) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_qoslet"))
            .arg("run")
            .arg("--kubelet-config")
            .arg(examples().join("kubelet-config.yaml"))
            .arg("--config")
            .arg(self.config())
            .arg("--standalone")
            .arg(self.work.join("pods"))
            .arg("--log-dir")
            .arg(self.work.join("logs"))
            .arg("--shutdown-grace-seconds")
            .arg("5")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.work.join("qoslet.log")).unwrap())
            .spawn()
            .expect("starting qoslet");
        let d = Daemon(child);
        wait_until("/readyz 200", Duration::from_secs(30), || {
            get(self.addr(), "/readyz").filter(|(c, _)| *c == 200)
        });
        d
    }

    /// The BestEffort tier's directory in the hierarchy with the cpu controller.
    fn tier(&self) -> PathBuf {
        let base = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/cpu")
        };
        base.join(&self.node_root).join("kubepods/besteffort")
    }

    fn log(&self) -> String {
        fs::read_to_string(self.work.join("qoslet.log")).unwrap_or_default()
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.work);
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: plain kill(2) of the child this test started.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                thread::sleep(Duration::from_millis(100));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The value of the first series starting with `series` in /metrics.
fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    let (_, body) = get(addr, "/metrics")?;
    body.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn level(addr: SocketAddr) -> Option<u8> {
    metric(addr, "qoslet_cpu_pressure_level ").map(|v| v as u8)
}

fn guaranteed_p99_ms(addr: SocketAddr) -> Option<f64> {
    metric(
        addr,
        "qoslet_qos_runqueue_latency_p99_seconds{qos_class=\"Guaranteed\"}",
    )
    .map(|s| s * 1e3)
}

/// One housekeeping window later (the gauge is rewritten every second).
fn next_window() {
    thread::sleep(Duration::from_millis(1100));
}

fn read(dir: &Path, file: &str) -> Option<String> {
    fs::read_to_string(dir.join(file))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The tier's quota: `None` unlimited.
fn quota(tier: &Path) -> Option<i64> {
    if let Some(max) = read(tier, "cpu.max") {
        return max.split_whitespace().next()?.parse().ok();
    }
    read(tier, "cpu.cfs_quota_us")?
        .parse()
        .ok()
        .filter(|q: &i64| *q >= 0)
}

// Whether four shell hogs push a Guaranteed pod's wake-up p99 past the target depends on the
// machine and its other load (on a quiet 2-CPU VM the kubelet's weights alone can keep it under
// 5 ms, and the controller rightly never engages), so this run is opt-in:
// `cargo test -p qoslet --test cpu_pressure -- --ignored`. The controller itself is unit-tested
// (agent/src/policy/cpu_pressure.rs, agent/src/node/cpu_pressure.rs).
#[test]
#[ignore = "timing-dependent: needs the hogs to push the Guaranteed p99 past the target"]
fn besteffort_hogs_are_constrained_while_a_guaranteed_pod_waits_and_released_after() {
    if !root_or_skip() {
        return;
    }
    if Command::new("bash").arg("-c").arg("true").status().is_err() {
        eprintln!("skipped: no bash for the Guaranteed pod's wake-up loop");
        return;
    }
    let node = TestNode::new("cpu-pressure");
    node.pod(
        "wake",
        "{limits: {cpu: '1', memory: 64Mi}}",
        &[
            "bash",
            "-c",
            "exec 3< <(sleep infinity); while :; do read -t 0.001 -u 3; done",
        ],
    );
    let _daemon = node.start();
    let addr = node.addr();
    let sched_switch = get(addr, "/metrics").is_some_and(|(_, m)| {
        m.lines().any(|l| {
            l.starts_with("qoslet_sensor_active{")
                && l.contains("sched_switch")
                && l.ends_with(" 1")
        })
    });
    if !sched_switch {
        eprintln!(
            "skipped: the eBPF run-queue sensor is not active (built with AYA_BUILD_SKIP, or the kernel refused it)"
        );
        return;
    }
    // The baseline: the Guaranteed pod alone (with the machine's own load).
    wait_until("the Guaranteed pod's p99", Duration::from_secs(30), || {
        guaranteed_p99_ms(addr).filter(|p| *p > 0.0)
    });
    let mut baseline = Vec::new();
    for _ in 0..6 {
        next_window();
        baseline.extend(guaranteed_p99_ms(addr));
    }
    baseline.sort_by(f64::total_cmp);
    let base = baseline[baseline.len() / 2];
    eprintln!("baseline p99 without hogs: {baseline:?} ms (median {base:.2})");
    if base > TARGET_MS * 0.7 {
        eprintln!(
            "skipped: the machine alone keeps the Guaranteed pod's p99 at {base:.1} ms, near the {TARGET_MS} ms target"
        );
        return;
    }
    // A noisy window of the machine's own may have engaged the controller already: the hogs'
    // effect is measured from level 0.
    wait_until("level 0 before the hogs", Duration::from_secs(90), || {
        (level(addr)? == 0).then_some(())
    });
    let tier = node.tier();
    let kubelet_shares = (read(&tier, "cpu.shares"), read(&tier, "cpu.weight"));
    let idle_file = tier.join("cpu.idle").exists();

    for i in 0..HOGS {
        node.pod(
            &format!("hog{i}"),
            "{}",
            &["sh", "-c", "while :; do :; done"],
        );
    }
    let engaged_at = Instant::now();
    let mut seen = Vec::new();
    let deadline = engaged_at + Duration::from_secs(60);
    while level(addr).is_none_or(|l| l < 1) {
        assert!(
            Instant::now() < deadline,
            "the controller did not engage; Guaranteed p99 meanwhile {seen:?} ms\n{}",
            node.log()
        );
        next_window();
        seen.extend(guaranteed_p99_ms(addr));
    }
    eprintln!(
        "engaged after {:.1} s; p99 seen meanwhile {seen:?} ms",
        engaged_at.elapsed().as_secs_f64()
    );
    // The tier's files hold the lever of the level the metrics show.
    wait_until(
        "the tier's files to show the lever",
        Duration::from_secs(20),
        || {
            let before = level(addr)?;
            let (idle, quota) = (read(&tier, "cpu.idle"), quota(&tier));
            (level(addr)? == before).then_some(())?;
            let idle_ok = !idle_file || before < 1 || idle.as_deref() == Some("1");
            let quota_ok = (before >= 2) == quota.is_some();
            (idle_ok && quota_ok).then_some(())
        },
    );
    // With the lever on, the Guaranteed pod's p99 falls under the target while the hogs run:
    // two windows in a row at level 1 or more (one window alone can be a lucky one).
    let mut seen = Vec::new();
    let mut in_a_row = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    while in_a_row < 2 {
        assert!(
            Instant::now() < deadline,
            "the Guaranteed p99 did not stay under the {TARGET_MS} ms target with the lever on: {seen:?} (ms, level)"
        );
        next_window();
        let (Some(p), Some(l)) = (guaranteed_p99_ms(addr), level(addr)) else {
            continue;
        };
        seen.push((p, l));
        in_a_row = if l >= 1 && p <= TARGET_MS {
            in_a_row + 1
        } else {
            0
        };
    }
    eprintln!("p99 with the lever: {seen:?} (ms, level)");

    for i in 0..HOGS {
        fs::remove_file(node.pod_file(&format!("hog{i}"))).unwrap();
    }
    wait_until(
        "the controller to release",
        Duration::from_secs(120),
        || (level(addr)? == 0).then_some(()),
    );
    wait_until("the tier's kubelet values", Duration::from_secs(20), || {
        let idle_ok = !idle_file || read(&tier, "cpu.idle").as_deref() == Some("0");
        let shares = (read(&tier, "cpu.shares"), read(&tier, "cpu.weight"));
        (idle_ok && quota(&tier).is_none() && shares == kubelet_shares).then_some(())
    });
    let log = node.log();
    assert!(
        log.contains("constraining the BestEffort tier")
            && log.contains("releasing the BestEffort tier"),
        "{log}"
    );
    let (_, status) = get(addr, "/status").unwrap();
    assert!(
        status.contains("cpu pressure: engage BestEffort tier"),
        "{status}"
    );
    assert!(
        status.contains("cpu pressure: release BestEffort tier"),
        "{status}"
    );
}
