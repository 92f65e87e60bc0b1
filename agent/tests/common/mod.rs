//! What the tests that run the `qoslet` daemon share: a free loopback port, one HTTP GET, a
//! wait with a deadline, the status page's pod phases, a standalone node as most of them start it, and guards that stop the daemon and
//! remove the work directory however the test ends. Each test crate uses part of it.
#![allow(
    dead_code,
    reason = "each test crate that includes this module uses part of it"
)]

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A GET over HTTP/1.0, so that no server answers with chunked encoding: status and body.
pub fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the test runs as root; prints why it is skipped when not.
pub fn root_or_skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: the standalone node needs root (real cgroups and processes)");
    }
    root
}

/// The test's work directory (manifests, logs), removed however the test ends. Declared before
/// the daemon, so it goes after the daemon has stopped.
pub struct WorkDir(pub PathBuf);

impl WorkDir {
    /// `qoslet-<name>-<pid>` under the temporary directory, made afresh with an empty `pods`.
    pub fn create(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("qoslet-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("pods")).unwrap();
        WorkDir(dir)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // A failed test's daemon logs go with the directory: their ends are printed first, so
        // the failure says what the daemon was doing.
        if thread::panicking() {
            for log in fs::read_dir(&self.0).into_iter().flatten().flatten() {
                let path = log.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let text = fs::read_to_string(&path).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
                    eprintln!("--- the last {} lines of {}:", tail.len(), path.display());
                    for line in tail {
                        eprintln!("{line}");
                    }
                }
            }
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// How much of each daemon log a failed test prints.
const LOG_TAIL_LINES: usize = 60;

/// Stops a daemon the test started (SIGINT, then SIGKILL after 20 s) if the test fails half way;
/// qoslet removes its cgroups on SIGINT.
pub struct Daemon {
    pub child: Child,
}

impl Daemon {
    /// `qoslet run --standalone <work>/pods` with these configuration files, logs under
    /// `<work>/logs`, its stderr in `<work>/qoslet.log`, and `extra` arguments.
    pub fn start(kubelet: &Path, config: &Path, work: &Path, extra: &[&str]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_qoslet"))
            .arg("run")
            .arg("--kubelet-config")
            .arg(kubelet)
            .arg("--config")
            .arg(config)
            .arg("--standalone")
            .arg(work.join("pods"))
            .arg("--log-dir")
            .arg(work.join("logs"))
            .args(extra)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(fs::File::create(work.join("qoslet.log")).unwrap())
            .spawn()
            .expect("starting qoslet");
        Daemon { child }
    }
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

pub fn status(addr: SocketAddr) -> Option<serde_json::Value> {
    let (code, body) = get(addr, "/status")?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

pub fn phase(status: &serde_json::Value, name: &str) -> Option<String> {
    status["pods"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["phase"].as_str().map(str::to_owned))
}

/// A standalone node as these tests run it: the manifests in `<work>/pods`, the example node's
/// KubeletConfiguration, a node root cgroup `/<node_root>` of 1Gi that qoslet creates and
/// removes, `/metrics` on `127.0.0.1:<port>`, its log in `<work>/qoslet.log`.
pub fn start_node(work: &Path, node_root: &str, port: u16) -> Daemon {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/standalone");
    let config = work.join("qoslet.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /{node_root}\ncapacity:\n  memory: 1Gi\nhousekeepingInterval: 1s\nstatsInterval: 1s\nstateDir: {}\n",
            work.join("state").display()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .arg("run")
        .arg("--kubelet-config")
        .arg(examples.join("kubelet-config.yaml"))
        .arg("--config")
        .arg(&config)
        .arg("--standalone")
        .arg(work.join("pods"))
        .arg("--log-dir")
        .arg(work.join("logs"))
        .arg("--shutdown-grace-seconds")
        .arg("5")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(fs::File::create(work.join("qoslet.log")).unwrap())
        .spawn()
        .expect("starting qoslet");
    Daemon { child }
}
