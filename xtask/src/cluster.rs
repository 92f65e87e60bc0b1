//! `cargo xtask cluster up|down|test`: a real one-node Kubernetes cluster on this machine, and
//! qoslet installed on it as the README says.
//!
//! Every part is real and built here (see `parts`): etcd, kube-apiserver (authorization
//! Node,RBAC), kube-controller-manager, kube-scheduler, containerd with runc, the CNI bridge, the
//! kubelet, and the CNCF distribution registry, to which qoslet's image is pushed and from which
//! the kubelet pulls it (the pause and test images are imported). What keeps it off the shared
//! machine's own state:
//! - a network namespace of its own (`qoslet-cluster-<id>`): the node IP (192.0.2.1) and the
//!   `kubernetes` Service's ClusterIP (198.51.100.1, where the API server listens on 443, so pods
//!   reach it without kube-proxy) are addresses of its loopback; the pods' bridge and routes are
//!   in it too;
//! - a mount namespace of its own for containerd and the kubelet, in which `/var/lib`, `/var/log`
//!   and `/run` are directories of the cluster's (so `/var/lib/kubelet/config.yaml`, the path
//!   the kubelet's `--config` names and qoslet reads beneath the DaemonSet's host-root mount of
//!   this namespace's `/`, is the cluster's kubelet configuration, and nothing lands in the
//!   host's), and the three kernel tunables the kubelet would otherwise set machine-wide
//!   (`vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`) read as the values it
//!   wants;
//! - a cgroup of its own in every hierarchy: `/<name>/node` is the node, with a memory limit,
//!   `/<name>/system` holds the daemons; `down` kills every process in `/<name>` and removes it.
//!   In the mount namespace, `/<name>/node` is bound over the root of every hierarchy, as a
//!   container's cgroup is: the kubelet's cgroupRoot and qoslet's `nodeRootCgroup` are their
//!   defaults (`/`), and the kubelet's node-level stats (its `memory.available`) are the node
//!   cgroup's, not the shared machine's, whose page cache and other tenants the tests cannot
//!   control (a CI run saw the kubelet evict on the machine's memory.available of 99 MiB).
//!
//! The state lives in `target/cluster/<id>`; `target/cluster/current` names the cluster that is
//! up, and `cluster.json` in its directory tells the tests (`tests/tests/real_cluster.rs`) where
//! everything is.

mod images;
mod parts;
mod pki;
mod vm_node;

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::{apt, cargo, container, deploy, image, toolchain};

/// The node's name and IP (a documentation range: nothing real is behind it).
pub const NODE: &str = "qoslet-node";
const NODE_IP: &str = "192.0.2.1";
const SERVICE_RANGE: &str = "198.51.100.0/24";
/// The `kubernetes` Service's ClusterIP: the first address of the service range.
const API_IP: &str = "198.51.100.1";
const POD_SUBNET: &str = "203.0.113.0/24";
/// The cluster's registry: the node IP, port 5000, plain HTTP (containerd is told so in
/// `containerd/certs.d`, skopeo with `--dest-tls-verify=false`).
const REGISTRY: &str = "192.0.2.1:5000";
/// qoslet's repository in it.
const REGISTRY_REPOSITORY: &str = "192.0.2.1:5000/qoslet";
/// The node's memory as qoslet sees it (the limit of the node's cgroup).
const NODE_MEMORY: u64 = 2 << 30;
const CA_FILE: &str = "pki/ca.crt";

#[derive(clap::Subcommand)]
pub enum ClusterCmd {
    /// Build the parts (once), start the cluster and install qoslet as the README says.
    Up {
        /// Add a second node: a VM with systemd as PID 1 on pure cgroup v2, containerd and the
        /// kubelet on the systemd cgroup driver (`cluster/vm_node.rs`).
        #[arg(long)]
        vm_node: bool,
    },
    /// Stop everything and remove the cluster's processes, cgroups, namespaces and files.
    Down,
    /// The tests of tests/tests/real_cluster.rs against the cluster (brought up and down
    /// around them unless one is up).
    Test {
        /// Leave a cluster this command brought up running.
        #[arg(long)]
        keep: bool,
        /// Bring the cluster up with the VM node (as `up --vm-node`); the tests that the issue
        /// names for every node (cgroups found, the kubelet's values, eviction, no 403) run on
        /// it too.
        #[arg(long)]
        vm_node: bool,
    },
}

/// What the tests read (`cluster.json`).
#[derive(Serialize, Deserialize)]
struct Info {
    name: String,
    dir: PathBuf,
    netns: String,
    kubeconfig: PathBuf,
    node: String,
    /// The kubelet's configuration file as the host sees it.
    kubelet_config: PathBuf,
    /// What qoslet's `/readyz` must name as the kubelet's configuration it read: kubeadm's
    /// layout, the one file `--config` names (no flag qoslet reads).
    #[serde(default)]
    kubelet_layout: Vec<String>,
    /// The node's cgroup as the host sees it (in the cluster's mount namespace, the root of
    /// every hierarchy: the kubelet's cgroupRoot `/`).
    cgroup_root: String,
    /// The agent binary inside the image (for `qoslet plan`).
    qoslet: PathBuf,
    /// The VM node of `up --vm-node`; the tests run on it too.
    #[serde(default)]
    vm_node: Option<vm_node::Info>,
    /// The API server's audit log (JSON lines, [`AUDIT_POLICY`]'s level): the requests of
    /// qoslet's service account as the server received them.
    #[serde(default)]
    audit_log: Option<PathBuf>,
    /// qoslet's image as pushed to the cluster's registry, once it is.
    #[serde(default)]
    image: Option<RegistryImage>,
}

/// qoslet's image in the cluster's registry: what both install paths name, and what the tests
/// expect as the running container's `imageID` (a pulled image's repository digest).
#[derive(Clone, Serialize, Deserialize)]
struct RegistryImage {
    /// `192.0.2.1:5000/qoslet`.
    repository: String,
    /// `sha256:...`, the manifest's digest as the registry stored it.
    digest: String,
}

impl RegistryImage {
    /// `repository@digest`, as the DaemonSet names it.
    fn reference(&self) -> String {
        format!("{}@{}", self.repository, self.digest)
    }
}

pub fn run(cmd: &ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Up { vm_node } => up(*vm_node).map(drop),
        ClusterCmd::Down => down(),
        ClusterCmd::Test { keep, vm_node } => {
            // Built before the cluster comes up, so that a cold build does not hold it up.
            prometheus_operator()?;
            prometheus()?;
            let brought_up = if current()?.is_some() {
                false
            } else {
                if let Err(e) = up(*vm_node) {
                    // `cluster up` leaves a failed cluster for a look; a test run cleans up.
                    if !keep && let Err(d) = down() {
                        eprintln!("xtask: cluster down after the failed up: {d:#}");
                    }
                    return Err(e);
                }
                true
            };
            let r = test();
            if brought_up
                && !keep
                && let Err(e) = down()
            {
                eprintln!("xtask: cluster down after the test: {e:#}");
            }
            r
        }
    }
}

fn state_dir() -> PathBuf {
    cargo::target_dir().join("cluster")
}

/// The directory of the cluster that is up (or half up), if any.
fn current() -> Result<Option<PathBuf>> {
    match fs::read_to_string(state_dir().join("current")) {
        Ok(s) => Ok(Some(PathBuf::from(s.trim()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

struct Cluster {
    name: String,
    dir: PathBuf,
    bins: parts::Bins,
}

impl Cluster {
    fn netns(&self) -> String {
        self.name.clone()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    fn p(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }

    /// `program` in the cluster's network namespace (and, with `mount`, its mount namespace).
    fn inside(&self, mount: bool, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.netns()));
        if mount {
            cmd.arg(format!("--mount={}", self.p("mnt.ns")));
        }
        cmd.arg("--").arg(program);
        cmd
    }

    /// Whether the Node `name` reports Ready.
    fn node_ready(&self, name: &str) -> bool {
        self.kubectl()
            .args([
                "get",
                "node",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .output()
            .is_ok_and(|o| o.stdout == b"True")
    }

    fn kubectl(&self) -> Command {
        let mut cmd = self.inside(false, &self.bins.kubectl());
        cmd.arg("--kubeconfig")
            .arg(self.path("pki/admin.kubeconfig"));
        cmd
    }

    /// Starts a daemon in the namespaces, in `/<name>/system`, logging to `logs/<name>.log`.
    fn start(&self, name: &str, program: &Path, args: &[String]) -> Result<()> {
        self.start_with(name, program, args, &[])
    }

    /// [`Self::start`] with environment variables.
    fn start_with(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
    ) -> Result<()> {
        // Appended: a restarted daemon (the kubelet, for one test) keeps its earlier lines.
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("logs/{name}.log")))?;
        let mut cmd = self.inside(true, program);
        cmd.args(args)
            .env(
                "PATH",
                format!(
                    "{}:{}:/usr/sbin:/usr/bin:/sbin:/bin",
                    self.bins.containerd.display(),
                    self.bins.kubernetes.display()
                ),
            )
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        // nsenter execs the program: this pid is the daemon's.
        let pid = child.id();
        fs::write(self.path(&format!("{name}.pid")), pid.to_string())?;
        for h in hierarchies()? {
            fs::write(
                h.join(&self.name).join("system/cgroup.procs"),
                pid.to_string(),
            )
            .with_context(|| format!("moving {name} into {}", h.display()))?;
        }
        println!("cluster: started {name} (pid {pid})");
        Ok(())
    }

    fn log_tail(&self, name: &str) -> String {
        let text = fs::read_to_string(self.path(&format!("logs/{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

/// Mount points of the cgroup hierarchies (each v1 one and the v2 one).
fn hierarchies() -> Result<Vec<PathBuf>> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            let point = pre.split_whitespace().nth(4)?;
            (matches!(fstype, "cgroup" | "cgroup2") && point.starts_with("/sys/fs/cgroup"))
                .then(|| PathBuf::from(point))
        })
        .collect())
}

fn wait(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !ok() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn up(with_vm_node: bool) -> Result<Info> {
    if current()?.is_some() {
        println!("cluster: a cluster is up; taking it down first");
        down()?;
    }
    let t0 = Instant::now();
    let bins = parts::ensure()?;
    let tc = toolchain::ensure()?;
    let qoslet_image = image::build(&tc)?;
    let images_dir = state_dir().join("images");
    // Imported into containerd; qoslet's own goes through the registry.
    let archives = images::build(&tc, &images_dir)?;
    println!("cluster: parts and images ready in {:.0?}", t0.elapsed());

    let t = Instant::now();
    let secs = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let id = format!("{secs:x}");
    let name = format!("qoslet-cluster-{id}");
    let dir = state_dir().join(&id);
    fs::create_dir_all(&dir)?;
    fs::write(state_dir().join("current"), dir.display().to_string())?;
    let c = Cluster {
        name: name.clone(),
        dir: dir.clone(),
        bins,
    };
    let mut info = Info {
        name: name.clone(),
        dir: dir.clone(),
        netns: c.netns(),
        kubeconfig: c.path("pki/admin.kubeconfig"),
        node: NODE.into(),
        kubelet_config: c.path("var-lib/kubelet/config.yaml"),
        kubelet_layout: vec![KUBELET_CONFIG.into()],
        cgroup_root: format!("/{name}/node"),
        qoslet: cargo::target_dir()
            .join(crate::vm::MUSL_TARGET)
            .join("release/qoslet"),
        vm_node: with_vm_node.then(|| vm_node::info(&c)),
        audit_log: Some(c.path(AUDIT_LOG)),
        image: None,
    };
    fs::write(c.path("cluster.json"), serde_json::to_string_pretty(&info)?)?;
    for d in [
        "logs",
        "pki",
        "etcd",
        "var-lib/kubelet",
        "var-lib/qoslet",
        "var-lib/cni",
        "var-log",
        "run",
        "sysctl",
        "containerd/root",
        "containerd/state",
        "cni/net.d",
        "registry",
    ] {
        fs::create_dir_all(c.path(d))?;
    }
    cgroups(&name)?;
    namespaces(&c)?;
    certificates(&c)?;
    write_configs(&c)?;
    // Booted first: under TCG it is the slowest part, and its kubelet waits for the API server.
    let vm = with_vm_node
        .then(|| vm_node::start(&c, &archives))
        .transpose()?;
    start_control_plane(&c)?;
    start_registry(&c)?;
    let image = push_qoslet(&c, &qoslet_image.archive)?;
    info.image = Some(image.clone());
    fs::write(c.path("cluster.json"), serde_json::to_string_pretty(&info)?)?;
    start_node(&c, &archives)?;
    println!("cluster: {name} up in {:.0?}", t.elapsed());
    install_qoslet(&c, &image)?;
    if let Some(vm) = &vm {
        vm_node::wait_ready(&c, vm)?;
    }
    println!(
        "cluster: up in {:.0?} in all; kubectl: nsenter --net=/run/netns/{} {} --kubeconfig {}",
        t0.elapsed(),
        c.netns(),
        c.bins.kubectl().display(),
        info.kubeconfig.display()
    );
    Ok(info)
}

/// `/<name>/{node,system}` in every hierarchy; the node's memory limit.
fn cgroups(name: &str) -> Result<()> {
    for h in hierarchies()? {
        let v2 = h.join("cgroup.controllers").exists();
        for rel in ["", "/node", "/system"] {
            let dir = h.join(format!("{name}{rel}"));
            fs::create_dir_all(&dir)?;
            // A new v1 cpuset has no CPUs or memory nodes: a task cannot join it until they
            // are copied from the parent.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if !v2 && dir.join(f).exists() {
                    let parent = fs::read_to_string(dir.parent().unwrap_or(&h).join(f))?;
                    fs::write(dir.join(f), parent.trim())?;
                }
            }
            if v2 && rel.is_empty() {
                // The node's subtree needs its controllers (the root's are enabled or not
                // ours to change).
                for ctl in ["cpu", "cpuset", "memory", "pids", "io", "hugetlb"] {
                    let _ = fs::write(dir.join("cgroup.subtree_control"), format!("+{ctl}"));
                }
            }
        }
        let node = h.join(format!("{name}/node"));
        if node.join("memory.limit_in_bytes").exists() {
            fs::write(node.join("memory.limit_in_bytes"), NODE_MEMORY.to_string())?;
        } else if v2 && node.join("memory.max").exists() {
            fs::write(node.join("memory.max"), NODE_MEMORY.to_string())?;
        }
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    apt::run(Command::new("ip").args(args))
}

fn namespaces(c: &Cluster) -> Result<()> {
    let ns = c.netns();
    ip(&["netns", "add", &ns])?;
    for args in [
        vec!["link", "set", "lo", "up"],
        vec!["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"],
        vec!["addr", "add", &format!("{API_IP}/32"), "dev", "lo"],
    ] {
        let mut a = vec!["-n", &ns];
        a.extend(args);
        ip(&a)?;
    }
    // The kubelet sets these machine-wide unless they already hold its values (and stops if
    // it cannot): in its mount namespace they are files with those values.
    let mut script = String::from("set -e\n");
    for (tunable, want) in [
        ("vm/overcommit_memory", "1"),
        ("kernel/panic", "10"),
        ("kernel/panic_on_oops", "1"),
    ] {
        let file = c.path(&format!("sysctl/{}", tunable.replace('/', ".")));
        fs::write(&file, format!("{want}\n"))?;
        script.push_str(&format!(
            "mount --bind {} /proc/sys/{tunable}\n",
            file.display()
        ));
    }
    for (host, ours) in [
        ("/var/lib", "var-lib"),
        ("/var/log", "var-log"),
        ("/run", "run"),
    ] {
        script.push_str(&format!("mount --bind {} {host}\n", c.p(ours)));
    }
    // The node's cgroup in place of each hierarchy's root (made by `cgroups` first): every
    // process of the namespace, and every pod through the DaemonSet's hostPath, sees the node as
    // `/`. In place, not on top: runc takes the first mount of a hierarchy in mountinfo and
    // places a container's cgroup mount relative to that mount's root.
    for (i, h) in hierarchies()?.iter().enumerate() {
        let stage = c.path(&format!("cgroup-stage/{i}"));
        fs::create_dir_all(&stage)?;
        script.push_str(&format!(
            "mount --bind {node} {stage}\numount {h}\nmount --move {stage} {h}\n",
            node = h.join(&c.name).join("node").display(),
            stage = stage.display(),
            h = h.display()
        ));
    }
    fs::write(c.path("mnt.ns"), "")?;
    apt::run(
        Command::new("unshare")
            .arg(format!("--mount={}", c.p("mnt.ns")))
            .args(["--propagation", "private", "--", "sh", "-c", &script]),
    )
}

fn certificates(c: &Cluster) -> Result<()> {
    let dir = c.path("pki");
    pki::ca(&dir)?;
    let sans: Vec<String> = [
        format!("IP:{NODE_IP}"),
        format!("IP:{API_IP}"),
        "IP:127.0.0.1".into(),
        "DNS:kubernetes".into(),
        "DNS:kubernetes.default".into(),
        "DNS:kubernetes.default.svc".into(),
        "DNS:kubernetes.default.svc.cluster.local".into(),
        "DNS:localhost".into(),
    ]
    .into();
    pki::leaf(
        &dir,
        &pki::Identity {
            file: "apiserver",
            user: "kube-apiserver",
            group: None,
        },
        &sans,
    )?;
    for (file, user, group) in [
        (
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
        ),
        ("admin", "qoslet-admin", Some("system:masters")),
        ("controller-manager", "system:kube-controller-manager", None),
        ("scheduler", "system:kube-scheduler", None),
        (
            "kubelet",
            &format!("system:node:{NODE}"),
            Some("system:nodes"),
        ),
    ] {
        pki::leaf(&dir, &pki::Identity { file, user, group }, &[])?;
        if file != "apiserver-kubelet-client" {
            kubeconfig(c, file)?;
        }
    }
    pki::service_account_key(&dir)
}

/// `pki/<who>.kubeconfig`: the API server through the node IP, `who`'s certificate.
fn kubeconfig(c: &Cluster, who: &str) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: qoslet\n  cluster:\n    server: https://{NODE_IP}:443\n    certificate-authority: {ca}\nusers:\n- name: {who}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\ncontexts:\n- name: qoslet\n  context:\n    cluster: qoslet\n    user: {who}\ncurrent-context: qoslet\n",
        ca = c.p(CA_FILE),
        crt = c.p(&format!("pki/{who}.crt")),
        key = c.p(&format!("pki/{who}.key")),
    );
    fs::write(c.path(&format!("pki/{who}.kubeconfig")), text)?;
    Ok(())
}

fn write_configs(c: &Cluster) -> Result<()> {
    let sock = c.p("containerd/containerd.sock");
    fs::write(
        c.path("containerd/config.toml"),
        format!(
            r#"version = 3
root = "{root}"
state = "{state}"

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

# ctr's imports unpack through the transfer service, for the snapshotter the CRI uses.
[plugins."io.containerd.transfer.v1.local"]
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "linux/{arch}"
    snapshotter = "native"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
  # certs.d/{registry}/hosts.toml: the cluster's registry speaks plain HTTP.
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{certs_d}"

[plugins."io.containerd.cri.v1.runtime"]
  # Root here may lack CAP_SYS_RESOURCE: no oom_score_adj below containerd's own (the
  # sandbox's -998, Guaranteed containers' -997), which runc could not set.
  restrict_oom_score_adj = {restrict_oom}
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni}"]
    conf_dir = "{net_d}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
"#,
            root = c.p("containerd/root"),
            state = c.p("containerd/state"),
            opt = c.p("containerd/opt"),
            pause = images::PAUSE,
            registry = REGISTRY,
            certs_d = c.p("containerd/certs.d"),
            restrict_oom = !container::has_bounding_cap(container::CAP_SYS_RESOURCE),
            arch = match std::env::consts::ARCH {
                "aarch64" => "arm64",
                _ => "amd64",
            },
            cni = c.bins.cni.display(),
            net_d = c.p("cni/net.d"),
        ),
    )?;
    let hosts = c.path(&format!("containerd/certs.d/{REGISTRY}"));
    fs::create_dir_all(&hosts)?;
    fs::write(hosts.join("hosts.toml"), registry_hosts_toml())?;
    fs::write(
        c.path("registry/config.yml"),
        format!(
            r#"version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: {root}
http:
  addr: {REGISTRY}
"#,
            root = c.p("registry/storage"),
        ),
    )?;
    fs::write(
        c.path("cni/net.d/10-qoslet.conflist"),
        serde_json::to_string_pretty(&serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "qoslet-cluster",
            "plugins": [{
                "type": "bridge",
                "bridge": "qcbr0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": c.p("var-lib/cni/networks"),
                },
            }],
        }))?,
    )?;
    fs::write(c.path("run/resolv.conf"), "nameserver 127.0.0.1\n")?;
    fs::write(c.path("audit-policy.yaml"), AUDIT_POLICY)?;
    write_kubelet_config(c, KUBELET_MEMORY_AVAILABLE)
}

/// The host node's kubelet configuration file, as kubeadm names it, in the kubelet's mount
/// namespace (the cluster's `var-lib/kubelet/config.yaml`).
const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";

/// The kubelet's `evictionHard` `memory.available` of the cluster's tests.
const KUBELET_MEMORY_AVAILABLE: &str = "100Mi";

/// The kubelet's configuration, with `memory_available` its hard threshold on memory.
fn write_kubelet_config(c: &Cluster, memory_available: &str) -> Result<()> {
    let sock = c.p("containerd/containerd.sock");
    // Paths as the kubelet sees them in its mount namespace (/var/lib, /var/log and /run are
    // the cluster's) or as the host sees them (pki, containerd: not remounted).
    fs::write(
        c.path("var-lib/kubelet/config.yaml"),
        format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine's cgroups are hybrid (v1 controllers), which the kubelet refuses unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
# cgroupRoot is the default, /: in this mount namespace, the node's cgroup.
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
systemReserved: {{cpu: 100m, memory: 128Mi}}
kubeReserved: {{cpu: 100m, memory: 128Mi}}
podPidsLimit: 1024
evictionHard: {{memory.available: "{memory_available}", nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
# The pause and test images were imported and cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
containerRuntimeEndpoint: unix://{sock}
address: {NODE_IP}
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
failSwapOn: false
resolvConf: /run/resolv.conf
clusterDomain: cluster.local
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
"#,
            ca = c.p(CA_FILE),
        ),
    )?;
    Ok(())
}

/// The gang-aware Workload API (scheduling.k8s.io v1beta1 Workload and PodGroup, v1alpha3
/// CompositePodGroup) that qoslet's gang-aware eviction reads: the API server serves it, and the
/// controller manager runs its controllers (podgroup-protection, which lets a deleted PodGroup
/// go once no running pod references it).
const WORKLOAD_API_GATES: &str = "--feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true,CompositePodGroup=true";

/// The API server's audit log, in the cluster's `logs/` (so `down` keeps it with the daemons'
/// logs).
const AUDIT_LOG: &str = "logs/audit.log";

/// What the API server audits: the requests of qoslet's service account
/// (deploy/kubernetes/rbac.yaml; the Helm release `qoslet` names it the same) at `Metadata`
/// (who, what, when, the answer's code; no bodies), nothing else, so the log stays small beside
/// the controllers' and the kubelet's traffic. The real-cluster API outage test
/// (tests/tests/real_cluster/api_outage.rs) counts qoslet's requests from it.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: Metadata
    users: ["system:serviceaccount:qoslet-system:qoslet"]
  - level: None
"#;

fn start_control_plane(c: &Cluster) -> Result<()> {
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    c.start(
        "etcd",
        &c.bins.etcd(),
        &[
            "--name=default".into(),
            format!("--data-dir={}", c.p("etcd")),
            "--listen-client-urls=http://127.0.0.1:2379".into(),
            "--advertise-client-urls=http://127.0.0.1:2379".into(),
            "--listen-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-cluster=default=http://127.0.0.1:2380".into(),
            // A test cluster's data need not survive a crash of the machine.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ],
    )?;
    let pki = |f: &str| c.p(&format!("pki/{f}"));
    c.start(
        "kube-apiserver",
        &c.bins.kube("kube-apiserver"),
        &[
            "--etcd-servers=http://127.0.0.1:2379".into(),
            "--bind-address=0.0.0.0".into(),
            "--secure-port=443".into(),
            format!("--advertise-address={NODE_IP}"),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--allow-privileged=true".into(),
            format!("--client-ca-file={}", pki("ca.crt")),
            format!("--tls-cert-file={}", pki("apiserver.crt")),
            format!("--tls-private-key-file={}", pki("apiserver.key")),
            format!(
                "--kubelet-client-certificate={}",
                pki("apiserver-kubelet-client.crt")
            ),
            format!(
                "--kubelet-client-key={}",
                pki("apiserver-kubelet-client.key")
            ),
            "--kubelet-preferred-address-types=InternalIP".into(),
            format!("--service-account-key-file={}", pki("sa.pub")),
            format!("--service-account-signing-key-file={}", pki("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            WORKLOAD_API_GATES.into(),
            "--runtime-config=scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=true"
                .into(),
            format!("--cert-dir={}", pki("apiserver-certs")),
            "--profiling=false".into(),
            format!("--audit-policy-file={}", c.p("audit-policy.yaml")),
            format!("--audit-log-path={}", c.p(AUDIT_LOG)),
            "--audit-log-format=json".into(),
            // Written as each request goes (the default for the log backend): a test reads it
            // right after.
            "--audit-log-mode=blocking".into(),
            // MiB: one rotated file beside the log bounds it at 200 MiB.
            "--audit-log-maxsize=100".into(),
            "--audit-log-maxbackup=1".into(),
        ],
    )?;
    wait("the API server's /readyz", Duration::from_secs(180), || {
        succeeds(c.kubectl().args(["get", "--raw", "/readyz"]))
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", c.log_tail("kube-apiserver")))?;
    println!("cluster: API server ready");
    let kc = |who: &str| pki(&format!("{who}.kubeconfig"));
    let mut kcm = s(&[
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        "--controllers=*,-nodeipam",
        WORKLOAD_API_GATES,
    ]);
    kcm.extend([
        format!("--kubeconfig={}", kc("controller-manager")),
        format!("--authentication-kubeconfig={}", kc("controller-manager")),
        format!("--authorization-kubeconfig={}", kc("controller-manager")),
        format!("--service-account-private-key-file={}", pki("sa.key")),
        format!("--root-ca-file={}", pki("ca.crt")),
        format!("--cluster-signing-cert-file={}", pki("ca.crt")),
        format!("--cluster-signing-key-file={}", pki("ca.key")),
    ]);
    c.start(
        "kube-controller-manager",
        &c.bins.kube("kube-controller-manager"),
        &kcm,
    )?;
    let mut sched = s(&["--bind-address=127.0.0.1", "--leader-elect=false"]);
    sched.extend([
        format!("--kubeconfig={}", kc("scheduler")),
        format!("--authentication-kubeconfig={}", kc("scheduler")),
        format!("--authorization-kubeconfig={}", kc("scheduler")),
    ]);
    c.start("kube-scheduler", &c.bins.kube("kube-scheduler"), &sched)
}

/// containerd's `hosts.toml` for the cluster's registry (both nodes'): plain HTTP, pull and
/// resolve (a tag to a digest), nothing else.
fn registry_hosts_toml() -> String {
    format!(
        "server = \"http://{REGISTRY}\"\n\n[host.\"http://{REGISTRY}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

/// The distribution registry on the node IP, its storage in `registry/storage`, and waits until
/// it answers `GET /v2/`.
fn start_registry(c: &Cluster) -> Result<()> {
    c.start_with(
        "registry",
        &c.bins.registry(),
        &["serve".into(), c.p("registry/config.yml")],
        // Its OpenTelemetry exporter would otherwise send traces to localhost:4318 and log each
        // failure.
        &[("OTEL_TRACES_EXPORTER", "none")],
    )?;
    wait("the registry", Duration::from_secs(60), || {
        succeeds(c.inside(false, Path::new("/bin/busybox")).args([
            "wget",
            "-q",
            "-O",
            "/dev/null",
            &format!("http://{REGISTRY}/v2/"),
        ]))
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", c.log_tail("registry")))?;
    println!("cluster: registry serving on http://{REGISTRY}");
    Ok(())
}

/// Pushes qoslet's `archive` to the cluster's registry with skopeo (in the network namespace,
/// where the registry is) and returns the digest it stored the manifest under.
fn push_qoslet(c: &Cluster, archive: &Path) -> Result<RegistryImage> {
    let t = Instant::now();
    let digest_file = c.path("registry/qoslet.digest");
    let tag = image::IMAGE
        .rsplit_once(':')
        .map_or("latest", |(_, tag)| tag);
    apt::run(
        c.inside(false, Path::new("skopeo"))
            .args(["copy", "--quiet", "--dest-tls-verify=false", "--digestfile"])
            .arg(&digest_file)
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(format!("docker://{REGISTRY_REPOSITORY}:{tag}")),
    )?;
    let digest = fs::read_to_string(&digest_file)
        .with_context(|| format!("reading skopeo's {}", digest_file.display()))?
        .trim()
        .to_owned();
    if !digest.starts_with("sha256:") {
        bail!("skopeo wrote {digest:?} as the pushed manifest's digest");
    }
    let image = RegistryImage {
        repository: REGISTRY_REPOSITORY.into(),
        digest,
    };
    println!(
        "cluster: pushed {} to the registry as {} in {:.1?}",
        archive.display(),
        image.reference(),
        t.elapsed()
    );
    Ok(image)
}

fn start_node(c: &Cluster, archives: &[PathBuf]) -> Result<()> {
    let sock = c.p("containerd/containerd.sock");
    c.start(
        "containerd",
        &c.bins.containerd.join("containerd"),
        &["--config".into(), c.p("containerd/config.toml")],
    )?;
    let ctr = |args: &[&str]| {
        let mut cmd = c.inside(true, &c.bins.containerd.join("ctr"));
        cmd.args(["--address", &sock, "--namespace", "k8s.io"])
            .args(args);
        cmd
    };
    wait("containerd", Duration::from_secs(60), || {
        succeeds(&mut ctr(&["version"]))
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", c.log_tail("containerd")))?;
    for a in archives {
        let t = Instant::now();
        apt::run(ctr(&["images", "import", "--snapshotter", "native"]).arg(a))?;
        println!("cluster: imported {} in {:.1?}", a.display(), t.elapsed());
    }
    start_kubelet(c)
}

/// Starts the kubelet and waits for its node to be Ready.
fn start_kubelet(c: &Cluster) -> Result<()> {
    c.start(
        "kubelet",
        &c.bins.kube("kubelet"),
        &[
            format!("--config={KUBELET_CONFIG}"),
            format!("--kubeconfig={}", c.p("pki/kubelet.kubeconfig")),
            format!("--hostname-override={NODE}"),
            format!("--node-ip={NODE_IP}"),
        ],
    )?;
    wait("the node to be Ready", Duration::from_secs(240), || {
        c.node_ready(NODE)
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", c.log_tail("kubelet")))?;
    println!("cluster: node {NODE} Ready");
    Ok(())
}

/// The README's install: `kubectl apply -k deploy/kubernetes` with qoslet's `image` in the
/// cluster's registry (kustomize's `images:`), and the prometheus-operator CRDs its monitoring
/// objects need. The kubelet pulls the image.
fn install_qoslet(c: &Cluster, image: &RegistryImage) -> Result<()> {
    let t = Instant::now();
    let crds = prometheus_operator_crds()?;
    for crd in &crds {
        apt::run(c.kubectl().args(["apply", "--server-side", "-f"]).arg(crd))?;
    }
    for crd in ["servicemonitors", "prometheusrules"] {
        apt::run(c.kubectl().args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            &format!("crd/{crd}.monitoring.coreos.com"),
        ]))?;
    }
    let overlay = install_overlay(c, image)?;
    apt::run(c.kubectl().arg("apply").arg("-k").arg(&overlay))?;
    apt::run(c.kubectl().args([
        "-n",
        "qoslet-system",
        "rollout",
        "status",
        "daemonset/qoslet",
        "--timeout=300s",
    ]))
    .inspect_err(|_| {
        let _ = c
            .kubectl()
            .args(["-n", "qoslet-system", "describe", "pods"])
            .status();
        let _ = c
            .kubectl()
            .args([
                "-n",
                "qoslet-system",
                "logs",
                "daemonset/qoslet",
                "--tail=30",
            ])
            .status();
    })?;
    println!("cluster: qoslet's DaemonSet Ready in {:.0?}", t.elapsed());
    // The kubelet's own measure of the pull (its `Pulled` Event on qoslet's pod).
    let pulled = c
        .kubectl()
        .args([
            "-n",
            "qoslet-system",
            "get",
            "events",
            "--field-selector=reason=Pulled",
            "-o",
            "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
        ])
        .output()?;
    for line in String::from_utf8_lossy(&pulled.stdout).lines() {
        println!("cluster: kubelet: {line}");
    }
    Ok(())
}

/// A kustomization whose base is deploy/kubernetes, unchanged but for the image (`image` in the
/// cluster's registry, by digest: the README's `images:`) and what this machine cannot grant.
/// The node needs no setting: in the cluster's mount namespace its cgroup is the root of every
/// hierarchy, qoslet's default `nodeRootCgroup`.
fn install_overlay(c: &Cluster, image: &RegistryImage) -> Result<PathBuf> {
    let base = cargo::workspace_root().join("deploy/kubernetes");
    let mut patches = Vec::new();
    if !container::has_bounding_cap(container::CAP_SYS_RESOURCE) {
        // Not in this machine's bounding set, so runc cannot grant it (the agent then keeps
        // its own oom_score_adj and 1 s PSI windows need it: it says so in its log).
        let ds: serde_json::Value =
            serde_yaml_ng::from_str(&fs::read_to_string(base.join("daemonset.yaml"))?)?;
        let add = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
            ["add"];
        let i = add
            .as_array()
            .and_then(|a| a.iter().position(|c| c == "SYS_RESOURCE"))
            .context("the DaemonSet adds no SYS_RESOURCE")?;
        let path = format!("/spec/template/spec/containers/0/securityContext/capabilities/add/{i}");
        patches.push(serde_json::json!({
            "target": {"kind": "DaemonSet", "name": ds["metadata"]["name"]},
            "patch": serde_json::to_string(&serde_json::json!([
                {"op": "test", "path": path, "value": "SYS_RESOURCE"},
                {"op": "remove", "path": path},
            ]))?,
        }));
    }
    let kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        // kustomize takes a base by relative path only.
        "resources": [relative(&c.path("deploy"), &base)],
        "images": [{
            "name": image::IMAGE.rsplit_once(':').map_or(image::IMAGE, |(name, _)| name),
            "newName": image.repository,
            "digest": image.digest,
        }],
        "patches": patches,
    });
    let dir = c.path("deploy");
    fs::create_dir_all(&dir)?;
    fs::write(
        dir.join("kustomization.yaml"),
        serde_yaml_ng::to_string(&kustomization)?,
    )?;
    Ok(dir)
}

/// `to` as a path relative to the directory `from` (both absolute).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out: PathBuf = from[common..].iter().map(|_| "..").collect();
    out.extend(&to[common..]);
    out
}

/// The prometheus-operator release whose CRDs the cluster installs.
const PROMETHEUS_OPERATOR: &str = "v0.85.0";

/// ServiceMonitor's and PrometheusRule's CRDs, from the prometheus-operator Go module (the
/// files its releases ship, in the module's `example/prometheus-operator-crd`).
fn prometheus_operator_crds() -> Result<Vec<PathBuf>> {
    prometheus_operator_crd_files(&["servicemonitors", "prometheusrules"])
}

/// The CRD files of the prometheus-operator Go module for `plurals`.
fn prometheus_operator_crd_files(plurals: &[&str]) -> Result<Vec<PathBuf>> {
    let out = crate::gotools::go()?
        .args([
            "mod",
            "download",
            "-json",
            &format!("github.com/prometheus-operator/prometheus-operator@{PROMETHEUS_OPERATOR}"),
        ])
        .env("GOFLAGS", "")
        .output()
        .context("go mod download")?;
    if !out.status.success() {
        bail!(
            "go mod download prometheus-operator: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let dir = PathBuf::from(v["Dir"].as_str().context("no Dir")?);
    Ok(plurals
        .iter()
        .map(|k| {
            dir.join(format!(
                "example/prometheus-operator-crd/monitoring.coreos.com_{k}.yaml"
            ))
        })
        .collect())
}

fn down() -> Result<()> {
    let Some(dir) = current()? else {
        println!("cluster: none is up");
        return Ok(());
    };
    let info: Option<Info> = fs::read_to_string(dir.join("cluster.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok());
    if let Some(info) = &info {
        kill_all(&info.name)?;
        // The mount namespace goes with its last process and this bind of it.
        let ns = dir.join("mnt.ns");
        if is_mount_point(&ns)? {
            apt::run(Command::new("umount").arg("--lazy").arg(&ns))?;
        }
        if Path::new("/run/netns").join(&info.netns).exists() {
            ip(&["netns", "del", &info.netns])?;
        }
        remove_cgroups(&info.name)?;
    }
    for m in mounts_beneath(&dir)? {
        let _ = Command::new("umount").arg("--lazy").arg(&m).status();
    }
    if dir.exists() {
        keep_logs(&dir)?;
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::remove_file(state_dir().join("current"))?;
    println!("cluster: {} down", dir.display());
    Ok(())
}

/// Where `down` keeps the last cluster's logs: a failed `cluster test` names them, and it brings
/// the cluster down right after.
fn kept_logs() -> PathBuf {
    state_dir().join("last-logs")
}

/// The daemons' logs and the pods' container logs of the cluster in `dir`, moved to
/// [`kept_logs`] (replacing the previous cluster's).
fn keep_logs(dir: &Path) -> Result<()> {
    let kept = kept_logs();
    if kept.exists() {
        fs::remove_dir_all(&kept).with_context(|| format!("removing {}", kept.display()))?;
    }
    fs::create_dir_all(&kept)?;
    for (from, to) in [("logs", "daemons"), ("var-log/pods", "pods")] {
        let from = dir.join(from);
        if from.exists() {
            fs::rename(&from, kept.join(to))
                .with_context(|| format!("keeping {}", from.display()))?;
        }
    }
    println!("cluster: its logs kept in {}", kept.display());
    Ok(())
}

/// Every directory of `/<name>` in `h`, children before parents.
fn subtree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = fs::read_dir(root) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(subtree(&e.path()));
            }
        }
    }
    if root.is_dir() {
        out.push(root.to_owned());
    }
    out
}

/// SIGKILL to every process in `/<name>` of every hierarchy until none is left.
fn kill_all(name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut pids = Vec::new();
        for h in hierarchies()? {
            for d in subtree(&h.join(name)) {
                let procs = fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("processes left in /{name}: {pids:?}");
        }
        for pid in pids {
            // SAFETY: kill(2) takes plain integers; the pid was read from the cluster's own
            // cgroups, so nothing outside the cluster is signalled.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
}

fn remove_cgroups(name: &str) -> Result<()> {
    for h in hierarchies()? {
        for d in subtree(&h.join(name)) {
            // A cgroup whose last task just died may be busy for a moment.
            let mut tries = 0;
            while let Err(e) = fs::remove_dir(&d) {
                tries += 1;
                if tries > 50 {
                    return Err(e).with_context(|| format!("removing {}", d.display()));
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(())
}

fn mounts_beneath(dir: &Path) -> Result<Vec<PathBuf>> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with(dir))
        .collect();
    // Deepest first.
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    Ok(out)
}

fn is_mount_point(p: &Path) -> Result<bool> {
    Ok(mounts_beneath(p)?.iter().any(|m| m == p))
}

fn test() -> Result<()> {
    let dir = current()?.context("no cluster is up")?;
    let info: Info = serde_json::from_str(&fs::read_to_string(dir.join("cluster.json"))?)?;
    let tc = toolchain::ensure()?;
    let t = Instant::now();
    // Built outside the namespace (cargo may fetch), run inside (the API server is there).
    cargo::run(
        &tc,
        &[
            "test",
            "-p",
            "qoslet-tests",
            "--test",
            "real_cluster",
            "--no-run",
        ],
    )?;
    let c = Cluster {
        name: info.name.clone(),
        dir: info.dir.clone(),
        bins: parts::ensure()?,
    };
    let env = prometheus_operator_setup(&c)?;
    // Their summaries (the values compared, the log checked) are the run's record.
    let counts = real_cluster_tests(
        &tc,
        &info,
        &["--test-threads=1", "--nocapture", "--skip", SIDE_BY_SIDE],
        &env,
    )?;
    println!("cluster test: {} in {:.0?}", counts.summary(), t.elapsed());
    let failed = || {
        anyhow::anyhow!(
            "the real-cluster tests failed (logs: {} and {}, moved to {} when the cluster goes down)",
            dir.join("logs").display(),
            dir.join("var-log/pods").display(),
            kept_logs().display()
        )
    };
    if !counts.ok || counts.passed == 0 {
        return Err(failed());
    }
    // The kubelet's own eviction beside qoslet's: its threshold moved to where qoslet's is, for
    // that one test, and back for what follows (its pods keep running through both restarts).
    let t = Instant::now();
    restart_kubelet(&c, &side_by_side_threshold(&c)?)?;
    let side = real_cluster_tests(&tc, &info, &["--exact", SIDE_BY_SIDE, "--nocapture"], &env);
    restart_kubelet(&c, KUBELET_MEMORY_AVAILABLE)?;
    if !one_passed("beside the kubelet's own eviction", &side?, t) {
        return Err(failed());
    }
    // The test left qoslet in observe mode with the kubelet's capacity; the Helm install that
    // follows replaces it and its configuration.
    helm_install(&info)?;
    // The chart's ServiceMonitor and PrometheusRule under the real operator, as the kustomize
    // install's were above.
    let t = Instant::now();
    let helm = real_cluster_tests(
        &tc,
        &info,
        &["--exact", PROMETHEUS_OPERATOR_TEST, "--nocapture"],
        &env,
    )?;
    if !one_passed("prometheus-operator on the Helm install", &helm, t) {
        return Err(failed());
    }
    Ok(())
}

/// Prints the summary of one test run by its exact name, begun at `t`, under `what`: whether it
/// ran and passed.
fn one_passed(what: &str, run: &cargo::TestCounts, t: Instant) -> bool {
    println!(
        "cluster test: {what}: {} in {:.0?}",
        run.summary(),
        t.elapsed()
    );
    run.ok && run.passed == 1
}

/// The real-cluster test of prometheus-operator, run again on the Helm install.
const PROMETHEUS_OPERATOR_TEST: &str =
    "prometheus_operator::prometheus_operator_scrapes_qoslet_and_the_alerts_name_the_victim";

/// The ignored tests of `tests/tests/real_cluster.rs` (built) with `filter`, in the cluster's
/// network namespace.
fn real_cluster_tests(
    tc: &toolchain::Toolchain,
    info: &Info,
    filter: &[&str],
    env: &[(String, String)],
) -> Result<cargo::TestCounts> {
    let args: Vec<&str> = [
        "test",
        "-p",
        "qoslet-tests",
        "--test",
        "real_cluster",
        "--",
        "--ignored",
    ]
    .into_iter()
    .chain(filter.iter().copied())
    .collect();
    cargo::test_through(
        tc,
        &[
            "nsenter".into(),
            format!("--net=/run/netns/{}", info.netns),
            "--".into(),
        ],
        &args,
        &[(
            "QOSLET_CLUSTER".to_owned(),
            info.dir.join("cluster.json").display().to_string(),
        )]
        .into_iter()
        .chain(env.iter().cloned())
        .collect::<Vec<_>>(),
    )
}

/// prometheus-operator's `cmd/operator`, built from the Go module proxy at
/// [`PROMETHEUS_OPERATOR`] (once; a second call compares the build's stamp).
fn prometheus_operator() -> Result<PathBuf> {
    let bin = crate::gotools::ensure(&crate::gotools::GoBuild {
        name: "prometheus-operator",
        module: "github.com/prometheus-operator/prometheus-operator",
        version: PROMETHEUS_OPERATOR,
        packages: &["github.com/prometheus-operator/prometheus-operator/cmd/operator"],
        replaces: &[],
        tags: &[],
        cgo: false,
        // As its Makefile stamps it: the version also names the config-reloader image it
        // puts in the StatefulSet it generates.
        link_vars: &[(
            "github.com/prometheus/common/version.Version",
            PROMETHEUS_OPERATOR.trim_start_matches('v'),
        )],
    })?;
    Ok(bin.join("operator"))
}

/// Prometheus's Go module version of Prometheus 3.5.0 (its modules are numbered v0.3xx for 3.x),
/// the default of prometheus-operator v0.85.0 (the last of its compatibility matrix). Not
/// Debian's prometheus: Debian builds it without the Kubernetes service discovery, so it
/// refuses the operator's configuration ("field kubernetes_sd_configs not found").
const PROMETHEUS: &str = "v0.305.0";

/// `cmd/prometheus` of [`PROMETHEUS`], built from the Go module proxy (once). Without the
/// `builtinassets` tag it has no web UI, which the test does not use; its HTTP API is whole.
fn prometheus() -> Result<PathBuf> {
    let bin = crate::gotools::ensure(&crate::gotools::GoBuild {
        name: "prometheus",
        module: "github.com/prometheus/prometheus",
        version: PROMETHEUS,
        packages: &["github.com/prometheus/prometheus/cmd/prometheus"],
        replaces: &[],
        tags: &[],
        cgo: false,
        link_vars: &[("github.com/prometheus/common/version.Version", "3.5.0")],
    })?;
    Ok(bin.join("prometheus"))
}

/// What the test of the real prometheus-operator needs
/// (`tests/tests/real_cluster/prometheus_operator.rs`), as env for the tests: the operator's
/// binary, built from the Go module proxy at [`PROMETHEUS_OPERATOR`] (no image: the cluster has
/// no registry, and the test runs it as a process with the admin's certificate), Prometheus
/// ([`prometheus`]), and the CRDs its Prometheus controller watches besides the two `up` installs
/// (it waits for every watched kind's informer, so a missing one stalls it).
fn prometheus_operator_setup(c: &Cluster) -> Result<Vec<(String, String)>> {
    let t = Instant::now();
    let operator = prometheus_operator()?;
    let prometheus = prometheus()?;
    // Debian's prometheus package makes /etc/prometheus, which the test mounts the operator's
    // files over in a mount namespace of Prometheus's own.
    apt::ensure("cluster", deploy::PROMETHEUS_PACKAGES)?;
    let kinds = ["prometheuses", "podmonitors", "probes"];
    for crd in prometheus_operator_crd_files(&kinds)? {
        apt::run(c.kubectl().args(["apply", "--server-side", "-f"]).arg(&crd))?;
    }
    for crd in kinds {
        apt::run(c.kubectl().args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            &format!("crd/{crd}.monitoring.coreos.com"),
        ]))?;
    }
    println!(
        "cluster test: prometheus-operator {PROMETHEUS_OPERATOR} and its CRDs ready in {:.0?}",
        t.elapsed()
    );
    Ok(vec![
        (
            "QOSLET_PROMETHEUS_OPERATOR".into(),
            operator.display().to_string(),
        ),
        ("QOSLET_PROMETHEUS".into(), prometheus.display().to_string()),
    ])
}

/// The real-cluster test that compares qoslet's eviction with the kubelet's own: run alone, after
/// the others, with the kubelet's threshold moved to where qoslet's is.
const SIDE_BY_SIDE: &str = "an_eviction_by_qoslet_reads_as_the_kubelets_own";

/// Restarts the kubelet with `memory_available` its hard threshold on memory (its pods keep
/// running: they are containerd's), and waits for its node to be Ready.
fn restart_kubelet(c: &Cluster, memory_available: &str) -> Result<()> {
    let pid: i32 = fs::read_to_string(c.path("kubelet.pid"))?.trim().parse()?;
    // SAFETY: kill(2) takes plain integers; the pid is the kubelet's, written when it started.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    wait("the kubelet to stop", Duration::from_secs(30), || {
        // Reaped here when this process started it (`cluster test` bringing the cluster up);
        // else its parent is init, which reaps it.
        // SAFETY: waitpid(2) with WNOHANG and no status pointer only reaps a child of ours.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
        }
        fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z "))
    })?;
    write_kubelet_config(c, memory_available)?;
    start_kubelet(c)?;
    // The node's Ready condition may still be the old kubelet's: ask the new one itself.
    wait("the new kubelet to serve", Duration::from_secs(120), || {
        c.kubectl()
            .args([
                "get",
                "--raw",
                &format!("/api/v1/nodes/{NODE}/proxy/healthz"),
            ])
            .output()
            .is_ok_and(|o| o.stdout == b"ok")
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", c.log_tail("kubelet")))?;
    println!("cluster: kubelet restarted with evictionHard memory.available {memory_available}");
    Ok(())
}

/// The kubelet's threshold at which its `memory.available` (the machine's MemTotal, its node
/// capacity, less the node cgroup's working set) crosses where qoslet's (the node cgroup's limit
/// less the same working set) crosses 100Mi: the capacity less the limit, plus 100Mi.
fn side_by_side_threshold(c: &Cluster) -> Result<String> {
    let out = c
        .kubectl()
        .args([
            "get",
            "node",
            NODE,
            "-o",
            "jsonpath={.status.capacity.memory}",
        ])
        .output()?;
    let capacity = String::from_utf8(out.stdout)?;
    let kib: u64 = capacity
        .trim()
        .strip_suffix("Ki")
        .and_then(|k| k.parse().ok())
        .with_context(|| format!("the node's memory capacity {capacity:?} in Ki"))?;
    let bytes = (kib << 10)
        .checked_sub(NODE_MEMORY)
        .context("a node cgroup limit above the machine's memory")?
        + (100 << 20);
    Ok(bytes.to_string())
}

/// The README's other install path on the same cluster: the kustomize install removed, `helm
/// upgrade --install` of deploy/helm/qoslet (the pinned helm, `--wait`, the image in the
/// cluster's registry by `image.repository` and `image.digest`) must bring qoslet's DaemonSet pod
/// to Ready again.
fn helm_install(info: &Info) -> Result<()> {
    let t = Instant::now();
    let image = info
        .image
        .as_ref()
        .context("cluster.json names no image in the cluster's registry: bring the cluster up again with this xtask")?;
    let bins = parts::ensure()?;
    let kubectl = || {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", info.netns))
            .arg("--")
            .arg(bins.kubectl())
            .arg("--kubeconfig")
            .arg(&info.kubeconfig);
        cmd
    };
    apt::run(
        kubectl()
            .args(["delete", "--wait=true", "--timeout=300s", "-k"])
            .arg(info.dir.join("deploy")),
    )?;
    // The chart creates no namespace: qoslet-system again as the kustomization has it, with the
    // privileged Pod Security label (README's Helm install), before helm finds it.
    apt::run(
        kubectl()
            .args(["apply", "-f"])
            .arg(cargo::workspace_root().join("deploy/kubernetes/namespace.yaml")),
    )?;
    let mut set = vec![
        ("image.repository", image.repository.as_str()),
        ("image.digest", image.digest.as_str()),
    ];
    // As the kustomization's overlay does (`install_overlay`): a capability outside this
    // machine's bounding set cannot be granted.
    let capabilities = "{BPF,PERFMON,SYS_ADMIN,KILL,DAC_OVERRIDE,IPC_LOCK}";
    if !container::has_bounding_cap(container::CAP_SYS_RESOURCE) {
        set.push(("capabilities", capabilities));
    }
    deploy::install(&deploy::Install {
        kubeconfig: &info.kubeconfig,
        set: &set,
        values: &[],
        wait: Some(Duration::from_secs(300)),
        netns: Some(&info.netns),
    })?;
    println!(
        "cluster test: helm install of deploy/helm/qoslet: qoslet's DaemonSet Ready in {:.0?}",
        t.elapsed()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_on_the_node_ip_over_http() {
        assert!(REGISTRY.starts_with(&format!("{NODE_IP}:")));
        assert_eq!(REGISTRY_REPOSITORY, format!("{REGISTRY}/qoslet"));
        let hosts = registry_hosts_toml();
        assert!(
            hosts.contains(&format!("[host.\"http://{REGISTRY}\"]")),
            "{hosts}"
        );
        assert!(
            hosts.contains("capabilities = [\"pull\", \"resolve\"]"),
            "{hosts}"
        );
    }

    #[test]
    fn relative_paths_climb_to_the_common_ancestor() {
        assert_eq!(
            relative(
                Path::new("/w/target/cluster/1/deploy"),
                Path::new("/w/deploy/kubernetes")
            ),
            PathBuf::from("../../../../deploy/kubernetes")
        );
        assert_eq!(
            relative(Path::new("/a"), Path::new("/a/b")),
            PathBuf::from("b")
        );
    }
}
