//! Helpers for qoslet's root integration tests: unique cgroups that clean up after themselves,
//! and a memory hog process the tests start (and only ever kill processes they started).

use std::{
    fs,
    io::Write as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How the host mounts cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// cgroup2 at /sys/fs/cgroup with controllers (production nodes, the VM matrix).
    Unified,
    /// v1 controllers under /sys/fs/cgroup/<controller> and a controller-less v2 tree at
    /// /sys/fs/cgroup/unified (the development machines).
    Hybrid,
    /// v1 only.
    Legacy,
}

pub fn layout() -> Layout {
    if Path::new(CGROUP_ROOT).join("cgroup.controllers").exists() {
        Layout::Unified
    } else if Path::new(CGROUP_ROOT).join("unified/cgroup.procs").exists() {
        Layout::Hybrid
    } else {
        Layout::Legacy
    }
}

/// Panics with one clear sentence unless the test runs as root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!(
            "this integration test needs root (real cgroups and eBPF); run it with `cargo xtask test` as root"
        );
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A name unique to this test process and call: `qoslet-test-<pid>-<n>`.
pub fn unique_name() -> String {
    format!(
        "qoslet-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A cgroup directory this test created; on drop its processes are killed (they are ours) and
/// it is removed, children first, also when the test fails.
#[derive(Debug)]
pub struct TestCgroup {
    pub path: PathBuf,
}

impl TestCgroup {
    /// Creates `<hierarchy>/<name>`; the hierarchy directory must exist.
    pub fn create(hierarchy: impl AsRef<Path>, name: &str) -> Self {
        let path = hierarchy.as_ref().join(name);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self { path }
    }

    /// The cgroup id: the kernfs inode number of the directory.
    pub fn id(&self) -> u64 {
        fs::metadata(&self.path)
            .unwrap_or_else(|e| panic!("stat {}: {e}", self.path.display()))
            .ino()
    }

    pub fn write(&self, file: &str, value: &str) {
        let p = self.path.join(file);
        fs::write(&p, value)
            .unwrap_or_else(|e| panic!("writing {value:?} to {}: {e}", p.display()));
    }

    pub fn read(&self, file: &str) -> String {
        let p = self.path.join(file);
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
    }

    pub fn add_pid(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    /// The cgroup as the agent names one ([`cgroup_beneath`]).
    pub fn beneath(&self) -> qoslet::cgroup::CgroupBeneath {
        cgroup_beneath(&self.path)
    }

    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

/// `dir` named beneath its parent as the node root, the way the agent names a pod's cgroup:
/// its files are opened beneath the parent, and its removal is seen (a directory that is its
/// own root would still open as `.`).
pub fn cgroup_beneath(dir: &Path) -> qoslet::cgroup::CgroupBeneath {
    use qoslet::cgroup::{CgroupBeneath, CgroupPath, Tree};
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
    else {
        panic!("{} has no parent or no name", dir.display());
    };
    let root = CgroupBeneath::own(parent, Tree::V2)
        .unwrap_or_else(|e| panic!("opening {}: {e}", parent.display()));
    CgroupBeneath {
        path: CgroupPath::parse(&format!("/{name}"))
            .unwrap_or_else(|e| panic!("naming {}: {e}", dir.display())),
        ..root
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        remove_tree(&self.path);
    }
}

/// Kills the processes of a cgroup tree we created and removes it bottom-up.
fn remove_tree(path: &Path) {
    if let Ok(entries) = fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids: Vec<i32> = fs::read_to_string(path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        for pid in &pids {
            // SAFETY: plain kill(2); these processes live in a cgroup this test created.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        if fs::remove_dir(path).is_ok() || !path.exists() || Instant::now() > deadline {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Where the `qoslet-test-hog` binary is: `$QOSLET_TEST_HOG` (the VM matrix sets it), else
/// beside the test binary's directory (`target/<profile>/deps/..`), else beside the test binary.
pub fn hog_path() -> PathBuf {
    if let Some(p) = std::env::var_os("QOSLET_TEST_HOG") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("test binary directory");
    for candidate in [dir.join("../qoslet-test-hog"), dir.join("qoslet-test-hog")] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "qoslet-test-hog not found beside {}; build it with `cargo build -p qoslet-tests --bins` or set QOSLET_TEST_HOG",
        exe.display()
    );
}

/// Where the `qoslet-test-wake` binary is (a latency-sensitive pod's process): beside
/// `qoslet-test-hog`, wherever that is.
pub fn wake_path() -> PathBuf {
    hog_path().with_file_name("qoslet-test-wake")
}

/// A node's whole run (`qoslet::standalone::run`, `qoslet::cluster::run`) in this process on
/// its own tokio runtime, with two workers as `qoslet run` builds it. Dropping it, or
/// [`InProcessAgent::crash`], drops every task at once and returns once they are gone, as a
/// killed process leaves nothing holding its files: the node lock's descriptor is closed before
/// a restart takes it (`shutdown_background` returned before the workers had dropped their
/// tasks, and a restarted node found the lock still held). A plain thread does the waiting,
/// since a runtime cannot be shut down with a timeout from async context.
pub struct InProcessAgent(Option<tokio::runtime::Runtime>);

impl InProcessAgent {
    pub fn start(run: impl Future<Output = ()> + Send + 'static) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for qoslet");
        rt.spawn(run);
        Self(Some(rt))
    }

    /// Stops it as a kill would: every task dropped, nothing stopped gracefully.
    pub fn crash(self) {
        drop(self);
    }
}

impl Drop for InProcessAgent {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            thread::spawn(move || rt.shutdown_timeout(Duration::from_secs(10)))
                .join()
                .expect("the runtime shuts down");
        }
    }
}

/// The memory hog: waits for a line on stdin, then allocates and touches memory in 1 MiB steps
/// up to a cap, and sleeps. Tests start it, move it into their cgroups, then release it.
pub struct Hog {
    pub child: Child,
}

impl Hog {
    /// `cap_mib` bounds the allocation so a hog outside a limited cgroup can never hurt the host.
    pub fn spawn(cap_mib: u64) -> Self {
        let child = Command::new(hog_path())
            .arg(cap_mib.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting qoslet-test-hog");
        Self { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets the hog start allocating.
    pub fn release(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("hog stdin");
        stdin.write_all(b"go\n").expect("releasing the hog");
        stdin.flush().expect("releasing the hog");
    }

    /// Waits up to `timeout` until the hog has touched `mib` MiB of anonymous memory (its
    /// `RssAnon`): a hog still allocating grows between a test's read of the usage and its write.
    pub fn wait_resident(&mut self, mib: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let status = format!("/proc/{}/status", self.pid());
        loop {
            let kib = fs::read_to_string(&status)
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("RssAnon:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                })
                .unwrap_or(0);
            if kib >= mib * 1024 {
                return;
            }
            assert!(
                self.child
                    .try_wait()
                    .expect("waiting for the hog")
                    .is_none(),
                "the hog exited at {kib} KiB resident, before {mib} MiB"
            );
            assert!(
                Instant::now() < deadline,
                "the hog reached {kib} KiB resident, not {mib} MiB, within {timeout:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `timeout` for the hog to exit; returns the signal that killed it, if any.
    pub fn wait_signal(&mut self, timeout: Duration) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt as _;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the hog") {
                return status.signal();
            }
            if Instant::now() > deadline {
                panic!(
                    "the hog (pid {}) did not exit within {timeout:?}",
                    self.pid()
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cgroups one container joins, created by the test in every hierarchy the host has: the
/// cpu, cpuset, memory and pids v1 controllers plus the unified tree on a hybrid host, one
/// directory on pure v2. Removed (their processes killed) on drop.
pub fn container_cgroups(name: &str) -> Vec<TestCgroup> {
    let root = Path::new(CGROUP_ROOT);
    match layout() {
        Layout::Unified => vec![TestCgroup::create(root, name)],
        Layout::Hybrid | Layout::Legacy => {
            let mut out = Vec::new();
            for controller in ["cpu", "memory", "pids", "cpuset"] {
                let cg = TestCgroup::create(root.join(controller), name);
                if controller == "cpuset" {
                    // A v1 cpuset child takes no task until it has cpus and mems.
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        let parent = fs::read_to_string(root.join("cpuset").join(file))
                            .unwrap_or_else(|e| panic!("reading the root {file}: {e}"));
                        cg.write(file, parent.trim());
                    }
                }
                out.push(cg);
            }
            if layout() == Layout::Hybrid {
                out.push(TestCgroup::create(root.join("unified"), name));
            }
            out
        }
    }
}

/// A directory under the temporary directory, unique to the test, removed on drop.
#[derive(Debug)]
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(unique_name());
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self { path }
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A unique test cgroup in every hierarchy the cgroup engine uses, to be the engine's node root:
/// v1 cpusets get the machine's CPUs and memory nodes (a v1 cpuset takes no child until set),
/// v2 enables the controllers for the children. Removed with everything below it on drop.
pub struct NodeRoot {
    pub name: String,
    pub mounts: qoslet::cgroup::Mounts,
    dirs: Vec<(qoslet::cgroup::Tree, TestCgroup)>,
}

impl NodeRoot {
    pub fn create() -> Self {
        use qoslet::cgroup::{Tree, layout::Controller};
        let mounts = qoslet::cgroup::Mounts::detect().expect("detecting the cgroup layout");
        let name = unique_name();
        let mut dirs = Vec::new();
        for (tree, mount) in &mounts.trees {
            let cg = TestCgroup::create(mount, &name);
            match tree {
                Tree::V1(Controller::Cpuset) => {
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        let v = fs::read_to_string(mount.join(f)).expect("reading the root cpuset");
                        cg.write(f, v.trim());
                    }
                }
                Tree::V2 => {
                    let available = cg.read("cgroup.controllers");
                    let wanted: Vec<String> = ["cpu", "cpuset", "memory", "pids"]
                        .iter()
                        .filter(|c| available.split_whitespace().any(|a| a == **c))
                        .map(|c| format!("+{c}"))
                        .collect();
                    cg.write("cgroup.subtree_control", &wanted.join(" "));
                }
                _ => {}
            }
            dirs.push((*tree, cg));
        }
        Self { name, mounts, dirs }
    }

    /// The engine's view of this root.
    pub fn open(&self) -> qoslet::cgroup::CgroupFs {
        let root = qoslet::cgroup::CgroupPath::parse(&self.name).expect("a valid test root");
        qoslet::cgroup::CgroupFs::open(self.mounts.clone(), root).expect("opening the test root")
    }

    /// `<mount>/<root>/<rel>` in `tree`.
    pub fn path(&self, tree: qoslet::cgroup::Tree, rel: &str) -> PathBuf {
        let (_, cg) = self
            .dirs
            .iter()
            .find(|(t, _)| *t == tree)
            .unwrap_or_else(|| panic!("no {tree:?} hierarchy on this host"));
        cg.path.join(rel.trim_start_matches('/'))
    }

    /// Trimmed contents of a file of the cgroup `rel` below the root.
    pub fn read(&self, tree: qoslet::cgroup::Tree, rel: &str, file: &str) -> String {
        let p = self.path(tree, rel).join(file);
        fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
            .trim()
            .to_string()
    }

    /// Creates a cgroup below the root in every hierarchy but the controller-less unified tree
    /// (as a reserved cgroup like system.slice would exist), giving v1 cpusets their parent's.
    pub fn make_existing(&self, rel: &str) {
        use qoslet::cgroup::{Tree, layout::Controller};
        for (tree, _) in &self.dirs {
            if *tree == Tree::Unified {
                continue;
            }
            let p = self.path(*tree, rel);
            fs::create_dir(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
            if *tree == Tree::V1(Controller::Cpuset) {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = p.parent().expect("parent").join(f);
                    let v = fs::read_to_string(&parent).expect("reading the parent cpuset");
                    fs::write(p.join(f), v.trim()).expect("setting the cpuset");
                }
            }
        }
    }

    /// Every file of every cgroup below the root, with contents, for "nothing changed" checks.
    pub fn snapshot(&self) -> Vec<(PathBuf, String)> {
        fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
            let Ok(entries) = fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                let p = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push((p.clone(), String::new()));
                    walk(&p, out);
                } else if let Ok(text) = fs::read_to_string(&p) {
                    // Statistics move on their own; settings do not.
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    let settings = [
                        ".shares",
                        ".weight",
                        ".max",
                        ".min",
                        ".low",
                        ".high",
                        "_us",
                        "limit_in_bytes",
                        ".cpus",
                        ".mems",
                        "subtree_control",
                    ];
                    if settings.iter().any(|s| name.ends_with(s)) {
                        out.push((p, text));
                    }
                }
            }
        }
        let mut out = Vec::new();
        for (_, cg) in &self.dirs {
            walk(&cg.path, &mut out);
        }
        out.sort();
        out
    }
}

/// A pod for the policy: containers as (name, cpu request, memory request, cpu limit, memory
/// limit), quantities in Kubernetes notation, "" for none.
pub fn pod_view(
    name: &str,
    uid: &str,
    containers: &[(&str, &str, &str, &str, &str)],
) -> qoslet::policy::pod::PodSpecView {
    use qoslet::policy::{
        pod::{Amounts, ContainerKind, ContainerView, PodSpecView, Resources},
        quantity::Quantity,
    };
    let q = |s: &str| (!s.is_empty()).then(|| s.parse::<Quantity>().expect("a quantity"));
    PodSpecView {
        namespace: "default".into(),
        name: name.into(),
        uid: uid.into(),
        containers: containers
            .iter()
            .map(|(n, rc, rm, lc, lm)| ContainerView {
                name: (*n).into(),
                kind: ContainerKind::App,
                resources: Resources {
                    requests: Amounts {
                        cpu: q(rc),
                        memory: q(rm),
                    },
                    limits: Amounts {
                        cpu: q(lc),
                        memory: q(lm),
                    },
                },
            })
            .collect(),
        pod_resources: None,
        overhead: Amounts::default(),
        hugepages: Default::default(),
        priority: None,
        priority_class_name: None,
        static_or_mirror: false,
        status_qos_class: None,
    }
}

/// Node settings from KubeletConfiguration YAML (the fields after `kind`), on a node with this
/// machine's CPUs, 8 GiB and 4096 pids.
pub fn node_settings(kubelet_yaml: &str) -> qoslet::policy::settings::NodeSettings {
    use qoslet::{
        config::{KubeletConfig, QosletConfiguration, node_settings},
        policy::settings::Capacity,
    };
    let text = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{kubelet_yaml}"
    );
    let file = Path::new("test-kubelet.yaml");
    let kc = KubeletConfig::parse(file, &text).expect("a valid KubeletConfiguration");
    let qc = QosletConfiguration {
        reserved_cpus_conflict: qoslet::policy::settings::ReservedCpusConflict::Openshift,
        ..QosletConfiguration::default()
    };
    let n = online_cpus();
    let capacity = Capacity {
        cpu_millis: i64::from(n) * 1000,
        memory_bytes: 8 << 30,
        pids: 4096,
        cpus: qoslet::policy::cpuset::CpuSet::first(n),
    };
    node_settings(file, &kc, &qc, capacity).expect("valid node settings")
}

/// CPUs this test process may run on.
/// CPU time of this process, all threads (user + system): on a loaded shared machine, wall time
/// measures the other tenants too; the CPU time is what the measured code itself costs.
pub fn process_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return Duration::ZERO;
    };
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(ru.user_time()) + tv(ru.system_time())
}

/// Calls `f` every `every` until it gives a value or `timeout` has passed (then `None`).
pub fn poll_until<T>(
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(every);
    }
}

/// A free loopback port (free when asked; another process may take it before it is used).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}

/// The body of `GET path` from a plain HTTP/1.1 server; `None` on any failure.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    http_get_as(addr, path, None).map(|(_, body)| body)
}

/// `GET path` with `Authorization: Bearer token` when given: the status code and the body.
pub fn http_get_as(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Option<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.get(9..12)?.parse().ok()?;
    out.split_once("\r\n\r\n")
        .map(|(_, b)| (code, b.to_owned()))
}

/// The `qoslet` cargo built beside the running bench, in the same target directory
/// (`CARGO_TARGET_DIR` or `target/`), not a stale one under the workspace's `target/`.
pub fn release_qoslet() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("qoslet")))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/qoslet"))
}

/// The reconcile passes the agent serving `/metrics` at `metrics` has run (its
/// `qoslet_reconcile_duration_seconds` histogram's count).
pub fn reconcile_passes(metrics: std::net::SocketAddr) -> Option<u64> {
    http_get(metrics, "/metrics")?.lines().find_map(|l| {
        l.strip_prefix("qoslet_reconcile_duration_seconds_count ")?
            .trim()
            .parse()
            .ok()
    })
}

/// utime + stime of a process, in clock ticks (USER_HZ, 100 on Linux).
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A `/proc/PID/status` value in KiB (`key` as "VmRSS:").
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    proc_kib(pid, "status", key)
}

/// A value in KiB of a `/proc/PID/<file>` of `key: value kB` lines (`status`, `smaps_rollup`).
pub fn proc_kib(pid: u32, file: &str, key: &str) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

pub fn online_cpus() -> u32 {
    thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The running kernel's major and minor version, from `/proc/sys/kernel/osrelease`
/// (`5.10.0-43-cloud-amd64` -> `(5, 10)`), for assertions that differ by kernel.
pub fn kernel_version() -> (u32, u32) {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").expect("reading osrelease");
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let major = numbers.next().expect("a major version in osrelease");
    (major, numbers.next().unwrap_or(0))
}

pub mod eviction;
pub mod fake_api;
pub mod kubelet_tree;
pub use eviction::*;

/// How long a runtime test waits for a pod to reach a state.
pub const POD_WAIT: Duration = Duration::from_secs(20);

/// The runtime's status of `key`; panics when the runtime does not know the pod.
pub fn find_pod(
    rt: &qoslet::runtime::Runtime,
    key: &qoslet::policy::pod::PodKey,
) -> qoslet::node::PodStatus {
    rt.status()
        .into_iter()
        .find(|p| &p.key == key)
        .unwrap_or_else(|| panic!("pod {key} is not in the status"))
}

/// Polls the pod's status until `f` holds; panics with `what` and the last status after
/// [`POD_WAIT`].
pub async fn wait_for_pod(
    rt: &qoslet::runtime::Runtime,
    key: &qoslet::policy::pod::PodKey,
    what: &str,
    f: impl Fn(&qoslet::node::PodStatus) -> bool,
) -> qoslet::node::PodStatus {
    let deadline = Instant::now() + POD_WAIT;
    loop {
        let s = find_pod(rt, key);
        if f(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {POD_WAIT:?}: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A runtime logging under `logs`, with a fast back-off (100 ms doubling to 400 ms).
pub fn fast_runtime(logs: &Path) -> qoslet::runtime::Runtime {
    qoslet::runtime::Runtime::new(qoslet::runtime::RuntimeConfig {
        log_dir: logs.to_path_buf(),
        backoff: qoslet::runtime::BackoffConfig {
            base: Duration::from_millis(100),
            max: Duration::from_millis(400),
            reset_after: Duration::from_secs(600),
        },
    })
}
