//! `qoslet recommend-reserved --from` against a live standalone node, as root: the daemon runs
//! in its own node root cgroup with systemReservedCgroup and kubeReservedCgroup beneath it; the
//! test puts a process holding 48 MiB in the first and one holding 24 MiB in the second, polls
//! the node's /stats/summary for 3 s and checks what is recommended.

use std::{
    fs,
    net::SocketAddr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

mod common;
use common::{Daemon, WorkDir, free_port, get, root_or_skip, wait_until};

const MI: u64 = 1 << 20;

/// A cgroup the test made under the daemon's node root, with one process group the test
/// started holding memory in it; on drop the group is killed and the cgroup removed, before the
/// daemon stops (declared after it).
struct Holder {
    dir: PathBuf,
    child: Child,
}

impl Holder {
    /// `sh` joins `dir`, then `tail` keeps one `mib` MiB line of zeros from `head` in memory
    /// while `sleep` holds the pipe open.
    fn start(dir: &Path, mib: u64) -> Self {
        fs::create_dir(dir).expect("creating the reserved cgroup");
        let script = format!(
            "echo $$ > {}/cgroup.procs && {{ head -c {} /dev/zero; exec sleep 600; }} | tail",
            dir.display(),
            mib * MI
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .process_group(0)
            .stdout(Stdio::null())
            .spawn()
            .expect("starting sh");
        Holder {
            dir: dir.to_owned(),
            child,
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the process group of the child this test started.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
        }
    }
}

fn system_container<'a>(summary: &'a Value, name: &str) -> Option<&'a Value> {
    summary["node"]["systemContainers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

fn working_set(summary: &Value, name: &str) -> Option<u64> {
    system_container(summary, name)?["memory"]["workingSetBytes"].as_u64()
}

#[test]
fn recommend_reserved_polls_a_live_node() {
    if !root_or_skip() {
        return;
    }
    let work_dir = WorkDir::create("recommend");
    let work = work_dir.0.clone();
    let pods = work.join("pods");
    let node_root = format!("qoslet-test-{}-recommend", std::process::id());
    let port = free_port();
    let config = work.join("qoslet.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /{node_root}\ncapacity:\n  memory: 1Gi\nhousekeepingInterval: 1s\nstateDir: {}\n",
            work.join("state").display()
        ),
    )
    .unwrap();
    let kubelet = work.join("kubelet.yaml");
    fs::write(
        &kubelet,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\nsystemReservedCgroup: /system.slice\nkubeReservedCgroup: /kube.slice\nenforceNodeAllocatable: [pods]\n",
    )
    .unwrap();
    let _daemon = Daemon::start(&kubelet, &config, &work, &[]);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until("/readyz 200", Duration::from_secs(30), || {
        get(addr, "/readyz").filter(|(c, _)| *c == 200)
    });

    // The memory hierarchy the Summary API reads: v1 memory on a hybrid host, else unified.
    let v1 = Path::new("/sys/fs/cgroup/memory").join(&node_root);
    let root = if v1.is_dir() {
        v1
    } else {
        Path::new("/sys/fs/cgroup").join(&node_root)
    };
    assert!(
        root.is_dir(),
        "the daemon made no node root at {}",
        root.display()
    );
    let _system = Holder::start(&root.join("system.slice"), 48);
    let _kube = Holder::start(&root.join("kube.slice"), 24);
    // The node looks for its system containers when it syncs its pods: a pod arriving makes
    // it sync.
    fs::write(
        pods.join("idle.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: idle}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: idle, command: [sleep, '600']}\n",
    )
    .unwrap();
    wait_until(
        "misc and kubelet in /stats/summary",
        Duration::from_secs(30),
        || {
            let (_, body) = get(addr, "/stats/summary")?;
            let s: Value = serde_json::from_str(&body).ok()?;
            (working_set(&s, "misc")? >= 48 * MI && working_set(&s, "kubelet")? >= 24 * MI)
                .then_some(())
        },
    );

    let out = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .args(["recommend-reserved", "--from"])
        .arg(format!("http://127.0.0.1:{port}"))
        .args(["--window", "3s", "--interval", "500ms"])
        .args(["--capacity", "cpu=2,memory=8Gi", "--output", "json"])
        .output()
        .expect("qoslet recommend-reserved runs");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Samples at 0, 0.5, ... 3.0 s.
    assert_eq!(r["samples"], 7, "{r}");
    let window = r["window_secs"].as_f64().unwrap();
    assert!(window >= 3.0, "{window}");
    assert_eq!(r["system_derived"], false);
    let system = &r["system_reserved"]["memory_bytes"];
    let kube = &r["kube_reserved"]["memory_bytes"];
    let (sys_p99, kube_p99) = (
        system["p99"].as_u64().unwrap(),
        kube["p99"].as_u64().unwrap(),
    );
    assert!((48 * MI..96 * MI).contains(&sys_p99), "{system}");
    assert!(kube_p99 >= 24 * MI && kube_p99 < sys_p99, "{kube}");
    // p99 + 10%, rounded up to a MiB.
    assert_eq!(
        system["recommended"].as_u64().unwrap(),
        (sys_p99 * 110).div_ceil(100).div_ceil(MI) * MI
    );
    assert_eq!(r["openshift_auto_sizing"]["memory"], "1.8Gi");

    // The table form ends with the fragment, the figures the JSON gave.
    let out = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .args(["recommend-reserved", "--from"])
        .arg(format!("http://127.0.0.1:{port}/stats/summary"))
        .args(["--window", "1s", "--interval", "500ms"])
        .args(["--capacity", "cpu=2,memory=8Gi"])
        .output()
        .expect("qoslet recommend-reserved runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with("3 samples over "), "{text}");
    assert!(
        text.contains("\nKubeletConfiguration:\nsystemReserved:\n"),
        "{text}"
    );
    assert!(text.contains("\nkubeReserved:\n"), "{text}");
}
