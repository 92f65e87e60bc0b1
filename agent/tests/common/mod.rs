//! Helpers of the tests that run the `qoslet` daemon and talk to it (and to Prometheus) over
//! HTTP: standalone.rs, prometheus.rs.

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

/// The test's work directory, removed however the test ends. Declared before the daemons, so
/// it goes after they have stopped.
pub struct WorkDir(pub PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Stops a daemon the test started (SIGINT, then SIGKILL after 20 s) if the test fails half way;
/// qoslet removes its cgroups on SIGINT.
pub struct Daemon {
    pub child: Child,
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

/// A standalone node as these tests run it: the manifests in `<work>/pods`, the example node's
/// KubeletConfiguration, a node root cgroup `/<node_root>` of 1Gi that qoslet creates and
/// removes, `/metrics` on `127.0.0.1:<port>`, its log in `<work>/qoslet.log`.
pub fn start_node(work: &Path, node_root: &str, port: u16) -> Daemon {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/standalone");
    let config = work.join("qoslet.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /{node_root}\ncapacity:\n  memory: 1Gi\nhousekeepingInterval: 1s\n"
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
