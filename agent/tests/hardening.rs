//! Hostile input against the real `qoslet run --standalone`, as root on the real kernel, each
//! test with its own node root cgroup and scratch directory: names built to escape the log
//! directory, processes outside the node's cgroups, manifest toggles under a busy loop, and
//! descriptor exhaustion during an eviction. Every container carries a marker in its
//! environment, so the test finds the processes qoslet started (and only those) in /proc.

use std::{
    fs,
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

mod common;
use common::{free_port, get, phase, status, wait_until};

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Pids whose environment holds `QOSLET_MARK=<mark>`.
fn marked(mark: &str) -> Vec<i32> {
    let needle = format!("QOSLET_MARK={mark}\0");
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = fs::read(e.path().join("environ")) else {
            continue;
        };
        let zombie = fs::read_to_string(e.path().join("stat")).is_ok_and(|s| s.contains(") Z "));
        if !zombie && String::from_utf8_lossy(&env).contains(&needle) {
            out.push(pid);
        }
    }
    out
}

/// Every file and directory below `root`, relative to it.
fn tree(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_path_buf());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// A pod manifest whose one container runs `script` with the marker in its environment.
fn pod(
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    container: &str,
    mark: &str,
    script: &str,
) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap();
    let uid = uid.map(|u| format!(", uid: {}", q(u))).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {}, namespace: {}{uid}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: {}\n    command: [\"/bin/sh\", \"-c\", {}]\n    env: [{{name: QOSLET_MARK, value: {}}}]\n",
        q(name),
        q(namespace),
        q(container),
        q(script),
        q(mark)
    )
}

/// One node: a scratch directory (removed at the end) holding the manifests, the log directory
/// four levels down (so `..` climbs land in the scratch, where every file is listed), the
/// daemon's configuration and stderr.
struct Node {
    scratch: PathBuf,
    pods: PathBuf,
    logs: PathBuf,
    stderr: PathBuf,
    node_root: String,
    addr: SocketAddr,
    child: Option<Child>,
}

impl Node {
    fn new(tag: &str) -> Self {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("qoslet-test-{}-{tag}-{n}", std::process::id());
        let scratch = std::env::temp_dir().join(&id);
        let _ = fs::remove_dir_all(&scratch);
        let work = scratch.join("a/b/c/work");
        let pods = work.join("pods");
        fs::create_dir_all(&pods).unwrap();
        let port = free_port();
        Self {
            logs: work.join("logs"),
            stderr: work.join("qoslet.log"),
            pods,
            scratch,
            node_root: id,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            child: None,
        }
    }

    fn start(&mut self) {
        let work = self.pods.parent().unwrap().to_path_buf();
        let config = work.join("qoslet.yaml");
        fs::write(
            &config,
            format!(
                "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: {}\nnodeRootCgroup: /{}\ncapacity:\n  memory: 1Gi\nhousekeepingInterval: 1s\nstateDir: {}\n",
                self.addr,
                self.node_root,
                work.join("state").display()
            ),
        )
        .unwrap();
        let kubelet = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/examples/standalone/kubelet-config.yaml");
        let child = Command::new(env!("CARGO_BIN_EXE_qoslet"))
            .arg("run")
            .arg("--kubelet-config")
            .arg(&kubelet)
            .arg("--config")
            .arg(&config)
            .arg("--standalone")
            .arg(&self.pods)
            .arg("--log-dir")
            .arg(&self.logs)
            .arg("--shutdown-grace-seconds")
            .arg("2")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(fs::File::create(&self.stderr).unwrap())
            .spawn()
            .expect("starting qoslet");
        self.child = Some(child);
        wait_until("/readyz 200", Duration::from_secs(60), || {
            get(self.addr, "/readyz").filter(|(c, _)| *c == 200)
        });
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// SIGINT, then waits for qoslet to stop its pods and exit.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: plain kill(2) of the child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("qoslet did not stop within 30 s of SIGINT");
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The processes of `mark` are inside the node root in the memory and cgroup v2 trees.
    fn assert_inside(&self, mark: &str) -> usize {
        let pids = marked(mark);
        for pid in &pids {
            let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            for line in cgroup.lines() {
                let mut parts = line.splitn(3, ':');
                let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
                let used = controllers == Some("")
                    || controllers.is_some_and(|c| c.split(',').any(|c| c == "memory"));
                if used {
                    assert!(
                        path.is_some_and(|p| p.starts_with(&format!("/{}/", self.node_root))),
                        "pid {pid} ({mark}) is outside the node root: {line}"
                    );
                }
            }
        }
        pids.len()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain kill(2) of the child this test started.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
                thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Names, namespaces, UIDs and container names built to escape the log directory, a duplicate
/// container name, and a well-formed pod beside them: nothing is written outside the log
/// directory, no process runs outside the node root cgroup, the well-formed pod runs, and after
/// the clean shutdown no process qoslet started is alive.
#[test]
fn hostile_manifests_are_contained() {
    if !is_root() {
        eprintln!("skipped: needs root (real cgroups and processes)");
        return;
    }
    let mut node = Node::new("hostile");
    let mark = node.node_root.clone();
    let abs = std::env::temp_dir().join(format!("{}-abs", node.node_root));
    // Removed however the test ends, should a container name have reached it.
    let _abs_guard = RemoveOnDrop(abs.clone());
    let abs = abs.to_str().unwrap();
    let long = "n".repeat(254);
    let script = "echo escaped; exec sleep 300";
    let hostile: Vec<(&str, &str, Option<&str>, &str)> = vec![
        ("demo", "x/../../../../esc", None, "c"),
        ("../../../esc", "p1", None, "c"),
        ("..", "p2", None, "c"),
        ("demo", "p3", Some("../../../../esc"), "c"),
        ("demo", "p4", Some(abs), "c"),
        ("demo", "p5", None, "../../../esc"),
        ("demo", "p6", None, ".."),
        ("demo", "p7", None, abs),
        ("demo", "p8", None, "a\nb"),
        ("demo", "p9", None, "a\0b"),
        ("demo", &long, None, "c"),
        ("demo", "p10", None, &long),
    ];
    for (i, (ns, name, uid, c)) in hostile.iter().enumerate() {
        fs::write(
            node.pods.join(format!("h{i}.yaml")),
            pod(ns, name, *uid, c, &mark, script),
        )
        .unwrap();
    }
    // Two containers of one name in one pod.
    let dup = pod("demo", "dup", None, "c", &mark, script);
    let second = dup.split_once("  containers:\n").unwrap().1.to_owned();
    fs::write(node.pods.join("dup.yaml"), format!("{dup}{second}")).unwrap();
    fs::write(
        node.pods.join("ok.yaml"),
        pod(
            "demo",
            "ok",
            None,
            "app",
            &mark,
            "echo fine; exec sleep 300",
        ),
    )
    .unwrap();
    let before = tree(&node.scratch);
    node.start();
    wait_until("ok Running", Duration::from_secs(30), || {
        (phase(&status(node.addr)?, "ok").as_deref() == Some("Running")).then_some(())
    });
    // Give the hostile pods every chance to start (and back off) before looking.
    thread::sleep(Duration::from_secs(3));
    let running = node.assert_inside(&mark);
    assert!(running >= 1, "the well-formed pod's process was not found");
    let ok_logs: Vec<PathBuf> = tree(&node.logs)
        .into_iter()
        .filter(|p| p.to_string_lossy().starts_with("demo_ok_"))
        .collect();
    assert!(
        ok_logs.iter().any(|p| p.ends_with("app/0.log")),
        "{ok_logs:?}"
    );
    node.stop();
    // Nothing the node started is alive, and nothing was written outside the log directory
    // (or, for the duplicate, beside its first container's log).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !marked(&mark).is_empty() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    assert!(
        marked(&mark).is_empty(),
        "survived the shutdown: {:?}",
        marked(&mark)
    );
    let logs_rel = node.logs.strip_prefix(&node.scratch).unwrap().to_path_buf();
    let stderr_rel = node
        .stderr
        .strip_prefix(&node.scratch)
        .unwrap()
        .to_path_buf();
    let config_rel = stderr_rel.with_file_name("qoslet.yaml");
    // qoslet's own state directory (its configuration's stateDir) is not the pods' doing.
    let state_rel = stderr_rel.with_file_name("state");
    let new: Vec<PathBuf> = tree(&node.scratch)
        .into_iter()
        .filter(|p| !before.contains(p))
        .filter(|p| *p != logs_rel && *p != stderr_rel && *p != config_rel)
        .filter(|p| !p.starts_with(&state_rel))
        .filter(|p| {
            // A pod directory of the log dir must be one whose names are plain.
            let Ok(inside) = p.strip_prefix(&logs_rel) else {
                return true;
            };
            let first = inside
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            !(first.starts_with("demo_ok_") || first.starts_with("demo_dup_"))
        })
        .collect();
    assert!(new.is_empty(), "written outside the log directory: {new:?}");
    assert!(!Path::new(abs).exists(), "{abs} was created");
    let dup_logs: Vec<PathBuf> = tree(&node.logs)
        .into_iter()
        .filter(|p| p.to_string_lossy().starts_with("demo_dup_") && p.ends_with("0.log"))
        .collect();
    assert!(dup_logs.len() <= 1, "{dup_logs:?}");
}

/// A crash-looping container is not shown as plain `Running`.
#[test]
fn status_names_crash_loops() {
    if !is_root() {
        eprintln!("skipped: needs root (real cgroups and processes)");
        return;
    }
    let mut node = Node::new("status");
    let mark = node.node_root.clone();
    fs::write(
        node.pods.join("crash.yaml"),
        pod("demo", "crash", None, "c", &mark, "exit 3"),
    )
    .unwrap();
    node.start();
    let s = wait_until("crash in back-off", Duration::from_secs(30), || {
        let s = status(node.addr)?;
        phase(&s, "crash")?
            .contains("CrashLoopBackOff")
            .then_some(s)
    });
    assert_eq!(
        phase(&s, "crash").as_deref(),
        Some("Running (CrashLoopBackOff)"),
        "the kubelet's phase under restartPolicy Always, with the reason kubectl shows"
    );
}

/// A pod that forks every 20 ms keeps the node's loop busy with sensor events; a manifest
/// added and removed ten times is started and stopped every time.
#[test]
fn manifest_toggles_are_all_processed_beside_a_fork_heavy_pod() {
    if !is_root() {
        eprintln!("skipped: needs root (real cgroups and processes)");
        return;
    }
    let mut node = Node::new("toggle");
    let mark = node.node_root.clone();
    let toggled = format!("{mark}-toggled");
    fs::write(
        node.pods.join("forker.yaml"),
        pod(
            "demo",
            "forker",
            None,
            "c",
            &mark,
            "while :; do /bin/true; sleep 0.02; done",
        ),
    )
    .unwrap();
    node.start();
    wait_until("forker Running", Duration::from_secs(30), || {
        (phase(&status(node.addr)?, "forker").as_deref() == Some("Running")).then_some(())
    });
    let file = node.pods.join("toggle.yaml");
    for i in 0..10 {
        if i % 2 == 0 {
            fs::write(
                &file,
                pod("demo", "toggle", None, "c", &toggled, "exec sleep 300"),
            )
            .unwrap();
            wait_until(
                &format!("toggle {i}: started"),
                Duration::from_secs(30),
                || {
                    let running =
                        phase(&status(node.addr)?, "toggle").as_deref() == Some("Running");
                    (running && !marked(&toggled).is_empty()).then_some(())
                },
            );
        } else {
            fs::remove_file(&file).unwrap();
            wait_until(
                &format!("toggle {i}: stopped"),
                Duration::from_secs(30),
                || {
                    let gone = phase(&status(node.addr)?, "toggle").is_none();
                    (gone && marked(&toggled).is_empty()).then_some(())
                },
            );
        }
    }
    node.assert_inside(&mark);
    node.stop();
    assert!(marked(&mark).is_empty(), "survived the shutdown");
}

/// With its descriptors exhausted by idle HTTP connections (its open-files limit lowered to
/// just above what it holds), the node still evicts the pod that crosses the threshold: the
/// eviction path holds its files from the moment the pod entered the inventory.
#[test]
fn descriptor_exhaustion_does_not_disable_eviction() {
    if !is_root() {
        eprintln!("skipped: needs root (real cgroups and processes)");
        return;
    }
    let mut node = Node::new("nofile");
    let mark = node.node_root.clone();
    let go = node.scratch.join("go");
    fs::write(
        node.pods.join("hog.yaml"),
        pod(
            "demo",
            "hog",
            None,
            "hog",
            &mark,
            &format!(
                "while [ ! -e {} ]; do sleep 0.1; done; exec tail /dev/zero",
                go.display()
            ),
        ),
    )
    .unwrap();
    node.start();
    wait_until("hog Running", Duration::from_secs(30), || {
        (phase(&status(node.addr)?, "hog").as_deref() == Some("Running")).then_some(())
    });
    // Let the eviction manager see the hog in its inventory (one housekeeping pass).
    thread::sleep(Duration::from_secs(2));
    let pid = node.pid();
    let open = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64;
    let limit = libc::rlimit {
        rlim_cur: open + 8,
        rlim_max: open + 8,
    };
    // SAFETY: prlimit on our own child with a valid struct; lowering needs no capability.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    // Idle connections until the agent has no descriptor left.
    let flood: Vec<TcpStream> = (0..40)
        .filter_map(|_| TcpStream::connect_timeout(&node.addr, Duration::from_secs(1)).ok())
        .collect();
    wait_until("descriptors exhausted", Duration::from_secs(10), || {
        let n = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        (n >= open + 8).then_some(())
    });
    fs::write(&go, "").unwrap();
    // The hog's processes are killed while the agent is still out of descriptors.
    let hog_pids = marked(&mark);
    assert!(!hog_pids.is_empty());
    wait_until("the hog killed", Duration::from_secs(60), || {
        marked(&mark).is_empty().then_some(())
    });
    let log = node.log();
    assert!(
        log.contains("Evicting to relieve node pressure."),
        "no eviction in the log:\n{log}"
    );
    drop(flood);
    // Once the idle connections are gone (closed by the client here; the server's header
    // timeout would close them too), the endpoints answer again and show the eviction.
    // Failed once its processes are gone (the phase follows the pod task's end).
    wait_until("the hog shown evicted", Duration::from_secs(30), || {
        let s = status(node.addr)?;
        (phase(&s, "hog")? == "Failed (Evicted)").then_some(())
    });
    node.stop();
}
