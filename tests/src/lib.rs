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

    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
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
