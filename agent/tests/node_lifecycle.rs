//! The node's life as root on the real kernel: one instance per node root, SIGHUP with the
//! daemon's stdout and stderr gone, and a restart after SIGKILL. Each test runs `qoslet run
//! --standalone` in its own node root cgroup (1Gi) and work directory.

use std::{
    fs,
    net::SocketAddr,
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

mod common;
use common::{free_port, get, root_or_skip, wait_until};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/standalone")
}

fn phase(addr: SocketAddr, name: &str) -> Option<String> {
    let (code, body) = get(addr, "/status")?;
    if code != 200 {
        return None;
    }
    let s: Value = serde_json::from_str(&body).ok()?;
    s["pods"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["phase"].as_str().map(str::to_owned))
}

fn alive(pid: i32) -> bool {
    // A zombie is not alive: it holds nothing and runs nothing.
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// Pids a pod's command wrote, one per line, each time it started.
fn pids(file: &Path) -> Vec<i32> {
    fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The memory hierarchy's directory of the node root (v2, or v1's memory controller).
fn node_root_dir(node_root: &str) -> PathBuf {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        PathBuf::from(format!("/sys/fs/cgroup/{node_root}"))
    } else {
        PathBuf::from(format!("/sys/fs/cgroup/memory/{node_root}"))
    }
}

/// A test node: its work directory, node root name and port. Removes what the test left
/// however it ends (after the daemons stopped).
struct TestNode {
    work: PathBuf,
    node_root: String,
    port: u16,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl TestNode {
    fn new(tag: &str) -> Self {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let id = format!("qoslet-test-{}-{n}-{tag}", std::process::id());
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

    fn config(&self, port: u16) -> PathBuf {
        let path = self.work.join(format!("qoslet-{port}.yaml"));
        fs::write(
            &path,
            format!(
                "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /{}\ncapacity:\n  memory: 1Gi\nhousekeepingInterval: 1s\nstateDir: {}\n",
                self.node_root,
                self.work.join("state").display()
            ),
        )
        .unwrap();
        path
    }

    /// A pod whose container appends its shell's pid to `<work>/<name>.pids` and then runs `then`.
    fn pod(&self, name: &str, restart: &str, then: &str) {
        let pids = self.work.join(format!("{name}.pids"));
        fs::write(
            self.work.join("pods").join(format!("{name}.yaml")),
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  restartPolicy: {restart}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    command: [\"sh\", \"-c\", \"echo $$ >> {}; {then}\"]\n",
                pids.display()
            ),
        )
        .unwrap();
    }

    fn pids(&self, name: &str) -> Vec<i32> {
        pids(&self.work.join(format!("{name}.pids")))
    }

    /// Waits until pod `name` is Running and its container's shell has written its pid, the
    /// `starts`th time: the phase turns Running when the process is started, before its shell
    /// has run a line (on a loaded machine the file was still empty when the phase was read).
    fn wait_started(&self, name: &str, starts: usize, timeout: Duration) {
        wait_until(
            &format!("{name} Running, started {starts} times"),
            timeout,
            || {
                (phase(self.addr(), name).as_deref() == Some("Running")
                    && self.pids(name).len() >= starts)
                    .then_some(())
            },
        );
    }

    fn command(&self, port: u16) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_qoslet"));
        c.arg("run")
            .arg("--kubelet-config")
            .arg(examples().join("kubelet-config.yaml"))
            .arg("--config")
            .arg(self.config(port))
            .arg("--standalone")
            .arg(self.work.join("pods"))
            .arg("--log-dir")
            .arg(self.work.join("logs"))
            .arg("--shutdown-grace-seconds")
            .arg("5")
            .env("NO_COLOR", "1");
        c
    }

    fn start(&self, log: &str) -> Daemon {
        let child = self
            .command(self.port)
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.work.join(log)).unwrap())
            .spawn()
            .expect("starting qoslet");
        let d = Daemon(child);
        wait_until("/readyz 200", Duration::from_secs(30), || {
            get(self.addr(), "/readyz").filter(|(c, _)| *c == 200)
        });
        d
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.work);
    }
}

struct Daemon(Child);

impl Daemon {
    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) of the child this test started.
        unsafe { libc::kill(self.0.id() as i32, sig) };
    }

    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        wait_until("qoslet to exit", timeout, || {
            self.0.try_wait().ok().flatten()
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            self.signal(libc::SIGINT);
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

#[test]
fn a_second_instance_on_the_same_node_root_exits_with_a_clear_line() {
    if !root_or_skip() {
        return;
    }
    let node = TestNode::new("second");
    node.pod("sleeper", "Always", "exec sleep 3600");
    let _first = node.start("first.log");
    node.wait_started("sleeper", 1, Duration::from_secs(20));
    let out = node
        .command(free_port())
        .output()
        .expect("running a second qoslet");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("another qoslet already runs on the node root"),
        "{stderr}"
    );
    // The first instance and its pod are untouched: same process, still running.
    assert_eq!(node.pids("sleeper").len(), 1);
    assert!(alive(node.pids("sleeper")[0]));
    assert_eq!(phase(node.addr(), "sleeper").as_deref(), Some("Running"));
    assert!(node_root_dir(&node.node_root).is_dir());
}

#[test]
fn sighup_with_stdout_and_stderr_closed_stops_every_pod() {
    if !root_or_skip() {
        return;
    }
    let node = TestNode::new("hup");
    node.pod("sleeper", "Always", "exec sleep 3600");
    node.pod("looper", "Always", "while true; do sleep 1; done");
    let mut child = node
        .command(node.port)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting qoslet");
    for pod in ["sleeper", "looper"] {
        node.wait_started(pod, 1, Duration::from_secs(30));
    }
    // Nobody reads qoslet's output any more: every log line now fails with EPIPE.
    drop(child.stdout.take());
    drop(child.stderr.take());
    let mut daemon = Daemon(child);
    let pods: Vec<i32> = ["sleeper", "looper"]
        .iter()
        .flat_map(|p| node.pids(p))
        .collect();
    assert_eq!(pods.len(), 2);
    daemon.signal(libc::SIGHUP);
    let status = daemon.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "{status:?} (signal {:?})",
        status.signal()
    );
    for pid in pods {
        assert!(!alive(pid), "pod process {pid} outlived qoslet");
    }
    assert!(
        !node_root_dir(&node.node_root).exists(),
        "the node root qoslet created is removed"
    );
}

#[test]
fn after_sigkill_a_restart_stops_the_orphans_and_never_restarts_an_evicted_pod() {
    crash_and_restart("crash", false);
}

/// The eviction's kill goes out before the state file is written (and the mark on the pod's
/// cgroup v2 directory just before it): a crash between the two leaves the state file without
/// the eviction. Emptying its evictions after the crash makes that state, and the restart must
/// still find the eviction (on the pod's cgroup) and never start the pod again.
#[test]
fn a_crash_between_the_kill_and_the_state_file_loses_no_eviction() {
    crash_and_restart("lost-state", true);
}

fn crash_and_restart(tag: &str, forget_state: bool) {
    if !root_or_skip() {
        return;
    }
    let node = TestNode::new(tag);
    node.pod("sleeper", "Always", "exec sleep 3600");
    // A Never pod that allocates until it is evicted (the node: 1Gi, hard threshold 256Mi).
    node.pod("hog", "Never", "sleep 2; exec tail /dev/zero");
    let mut first = node.start("first.log");
    wait_until("the hog evicted", Duration::from_secs(60), || {
        phase(node.addr(), "hog")?.contains("Evicted").then_some(())
    });
    node.wait_started("sleeper", 1, Duration::from_secs(10));
    let orphan = node.pids("sleeper")[0];
    assert!(alive(orphan));
    first.signal(libc::SIGKILL);
    first.wait(Duration::from_secs(10));
    assert!(
        alive(orphan),
        "SIGKILL leaves the pods running, unsupervised"
    );
    if forget_state {
        let file = node
            .work
            .join("state")
            .join(format!("node-{}.json", node.node_root));
        let mut state: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        state["evicted"] = serde_json::json!({});
        fs::write(&file, serde_json::to_vec(&state).unwrap()).unwrap();
    }

    let mut second = node.start("second.log");
    node.wait_started("sleeper", 2, Duration::from_secs(30));
    assert!(!alive(orphan), "the earlier run's process was stopped");
    assert_eq!(
        node.pids("sleeper").len(),
        2,
        "one new sleeper, no duplicate"
    );
    // The evicted Never pod is neither started again nor evicted twice.
    thread::sleep(Duration::from_secs(3));
    assert_eq!(
        node.pids("hog").len(),
        1,
        "the evicted pod did not start again"
    );
    assert_eq!(
        phase(node.addr(), "hog").as_deref(),
        Some("Failed (Evicted)")
    );
    let (_, metrics) = get(node.addr(), "/metrics").unwrap();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("qoslet_evictions_total{") && !l.ends_with(" 0")),
        "no eviction in the second run:\n{metrics}"
    );

    second.signal(libc::SIGTERM);
    assert!(second.wait(Duration::from_secs(30)).success());
    for pid in node.pids("sleeper") {
        assert!(!alive(pid));
    }
    assert!(
        !node_root_dir(&node.node_root).exists(),
        "nothing of either run is left"
    );
}

/// Every cgroup v2 or memory-controller directory of `rel` below the node root.
fn cgroup_dirs(node_root: &str, rel: &str) -> Vec<PathBuf> {
    ["unified", "memory", "cpu", "pids", "cpuset", ""]
        .iter()
        .map(|t| {
            Path::new("/sys/fs/cgroup")
                .join(t)
                .join(node_root)
                .join(rel)
        })
        .filter(|d| d.is_dir())
        .collect()
}

#[test]
fn a_cgroup_removed_behind_qoslets_back_is_made_again() {
    if !root_or_skip() {
        return;
    }
    let node = TestNode::new("remade");
    // A container that exits at once: between its restarts its cgroup is empty and removable.
    node.pod("crasher", "Always", "exit 1");
    let _d = node.start("node.log");
    wait_until("crasher started once", Duration::from_secs(20), || {
        (!node.pids("crasher").is_empty()).then_some(())
    });
    // The pod's container cgroup: <kubepods>/burstable|besteffort/pod<uid>/main.
    let container = wait_until("the container cgroup", Duration::from_secs(10), || {
        let mut found = None;
        for tree in ["unified", "memory", ""] {
            let root = Path::new("/sys/fs/cgroup").join(tree).join(&node.node_root);
            if let Some(d) = find_dir(&root, "main") {
                found = Some(d.strip_prefix(&root).unwrap().to_path_buf());
                break;
            }
        }
        found
    });
    let rel = container.to_str().unwrap().to_owned();
    let before = node.pids("crasher").len();
    // Remove it in every hierarchy while it is empty (the container is in back-off).
    wait_until(
        "the container cgroup removed",
        Duration::from_secs(20),
        || {
            for d in cgroup_dirs(&node.node_root, &rel) {
                let _ = fs::remove_dir(&d);
            }
            cgroup_dirs(&node.node_root, &rel).is_empty().then_some(())
        },
    );
    // qoslet sees the removal and makes it again; the container starts again in it.
    wait_until(
        "the container cgroup made again",
        Duration::from_secs(10),
        || (!cgroup_dirs(&node.node_root, &rel).is_empty()).then_some(()),
    );
    wait_until("the container restarted", Duration::from_secs(60), || {
        (node.pids("crasher").len() > before).then_some(())
    });
}

/// The first directory named `name` below `dir` (depth first).
fn find_dir(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in fs::read_dir(dir).ok()?.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if e.file_name() == name {
                return Some(e.path());
            }
            if let Some(found) = find_dir(&e.path(), name) {
                return Some(found);
            }
        }
    }
    None
}
