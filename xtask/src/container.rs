//! The container test: the image of `cargo xtask image` run by podman exactly as the DaemonSet
//! in deploy/kubernetes/daemonset.yaml describes its container (security context, host PID
//! namespace, mounts, environment, memory limit, image), read from that manifest; only what a
//! host without a cluster cannot provide is swapped, each swap said where it is made. Inside it
//! qoslet must become ready, load its eBPF sensors, write the host's cgroups and serve metrics.
//!
//! Host facts (Debian 12's podman 4.3 on a hybrid cgroup host, in a sandbox): crun refuses hybrid
//! layouts, so runc runs it; vfs storage and the cgroupfs manager need no overlay or systemd; the
//! sandbox's root lacks CAP_SYS_RESOURCE, so podman must not raise ulimits (a containers.conf
//! with `default_ulimits = []`) and cannot grant that capability.

mod podman;

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use crate::{cargo::workspace_root, deploy, image};
use anyhow::{Context as _, Result, bail, ensure};
pub use podman::{HostSwaps, podman_run_args};

const CONTAINER: &str = "qoslet-container-test";
/// The node of the standalone run inside the container: above the example kubelet configuration's
/// 384Mi of reservations and threshold, small beside the machine.
const NODE_MEMORY: &str = "512Mi";
const NODE_MEMORY_BYTES: u64 = 512 << 20;

/// Removes what the test made (the container, its cgroups, its work directory), also on failure.
struct Cleanup {
    work: PathBuf,
    node_root: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "5", CONTAINER])
            .output();
        for dir in cgroup_dirs(&self.node_root).into_iter().rev() {
            // Deepest first: rmdir only removes empty cgroups.
            remove_cgroup_tree(&dir);
        }
        let _ = fs::remove_dir_all(&self.work);
    }
}

pub fn run() -> Result<()> {
    let t = Instant::now();
    let daemonset = deploy::kustomize_build(
        &deploy::kustomize()?,
        &workspace_root().join("deploy/kubernetes"),
    )?
    .into_iter()
    .find(|o| o["kind"] == "DaemonSet")
    .context("deploy/kubernetes has no DaemonSet")?;
    let work = std::env::temp_dir().join(format!("qoslet-container-test-{}", std::process::id()));
    let node_root = format!("qoslet-test-{}-container", std::process::id());
    let _cleanup = Cleanup {
        work: work.clone(),
        node_root: node_root.clone(),
    };
    let _ = podman().args(["rm", "--force", CONTAINER]).output();
    let _ = fs::remove_dir_all(&work);

    // What the cluster would provide, made on this host.
    let state = work.join("state");
    let config_dir = work.join("configmap");
    fs::create_dir_all(state.join("pods"))?;
    fs::create_dir_all(&config_dir)?;
    let kubelet_config = work.join("kubelet-config.yaml");
    fs::copy(
        workspace_root().join("deploy/examples/standalone/kubelet-config.yaml"),
        &kubelet_config,
    )?;
    let port = free_port()?;
    // A pod for the node to run: the image has no shell, so its one binary, watching the agent.
    fs::write(
        state.join("pods/status.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: status, namespace: container-test}}\nspec:\n  containers:\n  - name: status\n    command: [\"/usr/bin/qoslet\", \"status\", \"--addr\", \"127.0.0.1:{port}\"]\n    resources:\n      requests: {{memory: 16Mi}}\n"
        ),
    )?;
    // The ConfigMap's own settings, with the node under a test cgroup with a small memory
    // limit, and on a free loopback port: the container shares the host's network here
    // (see `HostSwaps::host_network`).
    fs::write(
        config_dir.join("config.yaml"),
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: enforce\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /{node_root}\ncapacity:\n  memory: {NODE_MEMORY}\nhousekeepingInterval: 1s\n"
        ),
    )?;
    // The host's / of the DaemonSet's host-root volume: a small tree holding the kubelet's
    // file, not this machine's / (which the container would otherwise see whole).
    let host_root = work.join("host-root");
    fs::create_dir_all(host_root.join("var/lib/kubelet"))?;
    fs::copy(
        &kubelet_config,
        host_root.join("var/lib/kubelet/config.yaml"),
    )?;
    let swaps = HostSwaps {
        host_paths: vec![
            ("/".into(), host_root),
            ("/var/lib/qoslet".into(), state.clone()),
        ],
        config_maps: vec![("qoslet-config".into(), config_dir)],
        node_name: "container-test-node".into(),
        drop_caps: if has_bounding_cap(CAP_SYS_RESOURCE) {
            vec![]
        } else {
            // Not in this sandbox's bounding set (so runc cannot grant it); the agent then keeps
            // oom_score_adj >= 0 and 2 s PSI windows, and says so.
            vec!["SYS_RESOURCE".into()]
        },
        host_network: true,
        // Until cluster mode exists, a standalone node on an empty manifest directory in the
        // DaemonSet's state volume; the manifest's own flags otherwise.
        args: Some(vec![
            "run".into(),
            "--standalone".into(),
            "/var/lib/qoslet/pods".into(),
            "--kubelet-config".into(),
            "/host/var/lib/kubelet/config.yaml".into(),
            "--config".into(),
            "/etc/qoslet/config.yaml".into(),
            "--log-dir".into(),
            "/var/lib/qoslet/logs".into(),
        ]),
    };
    let spec = podman_run_args(&daemonset, &swaps)?;
    ensure!(
        spec.image == image::IMAGE,
        "the DaemonSet runs {}, `cargo xtask image` builds {}",
        spec.image,
        image::IMAGE
    );
    let mut cmd = podman();
    cmd.args(["run", "--detach", "--name", CONTAINER])
        .args(&spec.args);
    println!("container: {cmd:?}");
    let out = cmd.output().context("running podman")?;
    if !out.status.success() {
        bail!(
            "podman run failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let ready = wait_until("/readyz 200", Duration::from_secs(60), || {
        get(addr, &spec.readiness_path).filter(|(c, _)| *c == 200)
    })
    .map_err(|e| e.context(logs()))?;
    let (live, _) = get(addr, &spec.liveness_path).context("liveness probe")?;
    ensure!(live == 200, "liveness probe answered {live}");
    ensure!(
        ready.1.contains("tp_btf/") || ready.1.contains("tracepoint/"),
        "no eBPF sensor in /readyz: {}",
        ready.1
    );
    let capacity = format!("qoslet_node_capacity{{resource=\"memory\"}} {NODE_MEMORY_BYTES}");
    let pod = "qoslet_pod_info{namespace=\"container-test\",pod=\"status\",";
    let metrics = wait_until(
        "the node's plan in /metrics",
        Duration::from_secs(30),
        || {
            let (_, m) = get(addr, "/metrics")?;
            (m.lines().any(|l| l == capacity) && m.lines().any(|l| l.starts_with(pod))).then_some(m)
        },
    )
    .map_err(|e| e.context(logs()))?;
    let ebpf_sensors = metrics
        .lines()
        .filter(|l| l.starts_with("qoslet_sensor_active{") && l.contains("/") && l.ends_with(" 1"))
        .count();
    ensure!(
        ebpf_sensors > 0,
        "no sensor on an eBPF hook in /metrics:\n{metrics}"
    );
    // The host's cgroups, written from inside: the node root with its memory limit, and the
    // pod's process in a cgroup below it.
    let limit = node_memory_limit(&node_root)?;
    ensure!(
        limit == NODE_MEMORY_BYTES,
        "the node root's memory limit on the host is {limit}, not {NODE_MEMORY_BYTES}"
    );
    let pod_procs = wait_until(
        "the pod's process in a host cgroup",
        Duration::from_secs(30),
        || {
            let dirs = cgroup_dirs(&node_root);
            let n = dirs.iter().map(|d| procs_below(d)).max()?;
            (n > 0).then_some(n)
        },
    )?;

    // SIGTERM, as the kubelet stops it: qoslet removes the cgroups it created.
    let out = podman()
        .args(["stop", "--time", "30", CONTAINER])
        .output()?;
    ensure!(out.status.success(), "podman stop failed");
    let code = podman()
        .args(["inspect", "--format", "{{.State.ExitCode}}", CONTAINER])
        .output()?;
    let code = String::from_utf8_lossy(&code.stdout).trim().to_owned();
    ensure!(code == "0", "qoslet exited with {code}: {}", logs());
    for dir in cgroup_dirs(&node_root) {
        ensure!(!dir.exists(), "{} left behind", dir.display());
    }
    println!(
        "container: passed in {:.1?}: ready, {ebpf_sensors} sensors on eBPF hooks, the host's node root cgroup written ({} bytes) with {pod_procs} pod process(es) below it, metrics served, clean stop{}",
        t.elapsed(),
        limit,
        if swaps.drop_caps.is_empty() {
            String::new()
        } else {
            format!(" (without {:?}: not grantable here)", swaps.drop_caps)
        }
    );
    Ok(())
}

/// podman with this host's settings (module doc).
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(image::storage_args()).args([
        "--runtime",
        "/usr/sbin/runc",
        "--cgroup-manager",
        "cgroupfs",
    ]);
    if let Ok(conf) = containers_conf() {
        cmd.env("CONTAINERS_CONF", conf);
    }
    cmd
}

fn containers_conf() -> Result<PathBuf> {
    let path = crate::cargo::target_dir().join("image/containers.conf");
    fs::create_dir_all(path.parent().context("no parent")?)?;
    fs::write(
        &path,
        "# Written by xtask: no raised ulimits (root here lacks CAP_SYS_RESOURCE).\n[containers]\ndefault_ulimits = []\n",
    )?;
    Ok(path)
}

fn logs() -> String {
    podman()
        .args(["logs", CONTAINER])
        .output()
        .map(|o| {
            format!(
                "container log:\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_default()
}

pub const CAP_SYS_RESOURCE: u32 = 24;

pub fn has_bounding_cap(bit: u32) -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// The node root in every hierarchy it can be in on this host.
fn cgroup_dirs(node_root: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.join(node_root)];
    }
    let Ok(entries) = fs::read_dir(root) else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path().join(node_root)))
        .filter(|p| p.exists())
        .collect()
}

fn node_memory_limit(node_root: &str) -> Result<u64> {
    let root = Path::new("/sys/fs/cgroup");
    let file = if root.join("cgroup.controllers").exists() {
        root.join(node_root).join("memory.max")
    } else {
        root.join("memory")
            .join(node_root)
            .join("memory.limit_in_bytes")
    };
    let text = fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    Ok(text.trim().parse()?)
}

/// Processes in `dir` and every cgroup below it.
fn procs_below(dir: &Path) -> usize {
    let here = fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().count())
        .unwrap_or(0);
    let below: usize = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| procs_below(&e.path()))
        .sum();
    here + below
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A GET over HTTP/1.0 (no chunked answers): status code and body.
pub fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        thread::sleep(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests;
