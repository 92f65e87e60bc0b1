//! The cgroup v2 interface files qoslet relies on, on a pure cgroup v2 kernel with controllers
//! (the `cargo xtask vm-test` matrix). On the hybrid development hosts it skips with the reason.

use std::{
    fs,
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

const ROOT: &str = "/sys/fs/cgroup";

/// A cgroup this test created; on drop (also after a failed assertion) its processes are killed
/// and it is removed with its children. Nothing outside it is ever written.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn create(parent: &Path, name: &str) -> Self {
        let path = parent.join(name);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {path:?}: {e}"));
        Self(path)
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.0.join(file);
        fs::write(&path, value).unwrap_or_else(|e| panic!("writing {value:?} to {path:?}: {e}"));
    }

    fn read(&self, file: &str) -> String {
        let path = self.0.join(file);
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path:?}: {e}"))
    }

    /// Waits until `cgroup.events` says no process is left, which rmdir requires.
    fn wait_unpopulated(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match fs::read_to_string(self.0.join("cgroup.events")) {
                Ok(events) if events.lines().any(|l| l == "populated 0") => return true,
                Err(_) => return true,
                Ok(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
        false
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if fs::write(self.0.join("cgroup.kill"), "1").is_err() {
            sigkill_procs(&self.0);
        }
        self.wait_unpopulated(Duration::from_secs(5));
        remove_tree(&self.0);
    }
}

/// SIGKILL to every pid of `dir`'s and its children's `cgroup.procs`: what qoslet does where
/// the kernel has no `cgroup.kill` (before Linux 5.14).
fn sigkill_procs(dir: &Path) {
    let pids = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            sigkill_procs(&e.path());
        }
    }
}

/// Children first: a cgroup directory can only be removed once it has no child cgroups.
fn remove_tree(path: &Path) {
    if let Ok(entries) = fs::read_dir(path) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    if let Err(e) = fs::remove_dir(path) {
        eprintln!("cgroup_v2_smoke: cannot remove {path:?}: {e}");
    }
}

/// Why this host cannot run the test, if it cannot.
fn skip_reason() -> Option<String> {
    let controllers = match fs::read_to_string(Path::new(ROOT).join("cgroup.controllers")) {
        Ok(c) => c,
        Err(e) => {
            return Some(format!(
                "{ROOT} is not a cgroup v2 root ({ROOT}/cgroup.controllers: {e}); \
                 hybrid or v1 host, run `cargo xtask vm-test`"
            ));
        }
    };
    let has = |list: &str, c: &str| list.split_whitespace().any(|x| x == c);
    if !has(&controllers, "cpu") || !has(&controllers, "memory") {
        return Some(format!(
            "the cgroup v2 root lists controllers [{}] without cpu and memory; \
             run `cargo xtask vm-test`",
            controllers.trim()
        ));
    }
    // The root is not ours to change: it must already hand cpu and memory to its children.
    let delegated =
        fs::read_to_string(Path::new(ROOT).join("cgroup.subtree_control")).unwrap_or_default();
    if !has(&delegated, "cpu") || !has(&delegated, "memory") {
        return Some(format!(
            "{ROOT}/cgroup.subtree_control [{}] does not enable cpu and memory for children",
            delegated.trim()
        ));
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("creating cgroups needs root".to_owned());
    }
    None
}

fn unique_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "qoslet-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits for `child` with a deadline so a broken `cgroup.kill` fails the test instead of hanging.
fn wait_with_deadline(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child survived cgroup.kill for {timeout:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn cgroup_v2_limits_events_and_kill() {
    if let Some(reason) = skip_reason() {
        eprintln!("cgroup_v2_smoke: skipped: {reason}");
        return;
    }
    let root = TestCgroup::create(Path::new(ROOT), &unique_name());
    // Our own test root delegates to the pod cgroup below it.
    root.write("cgroup.subtree_control", "+cpu +memory");
    let pod = TestCgroup::create(&root.0, "pod");

    for (file, value) in [
        ("cpu.weight", "250"),
        ("cpu.max", "50000 100000"),
        ("memory.max", "268435456"),
        ("memory.high", "201326592"),
    ] {
        pod.write(file, value);
        assert_eq!(pod.read(file).trim(), value, "{file} read back");
    }
    let events = pod.read("memory.events");
    for key in ["low", "high", "max", "oom", "oom_kill"] {
        assert!(
            events
                .lines()
                .any(|l| l.split_whitespace().next() == Some(key)),
            "memory.events has no {key} line: {events:?}"
        );
    }
    for file in ["cpu.pressure", "memory.pressure"] {
        let psi = pod.read(file);
        assert!(psi.starts_with("some avg10="), "{file}: {psi:?}");
    }

    let mut child = Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("spawning sleep");
    // The child briefly runs in our cgroup before the move; harmless for a sleep.
    pod.write("cgroup.procs", &child.id().to_string());
    let procs = pod.read("cgroup.procs");
    assert!(
        procs.lines().any(|l| l == child.id().to_string()),
        "child {} not in cgroup.procs: {procs:?}",
        child.id()
    );

    // cgroup.kill came with Linux 5.14; before it qoslet kills pid by pid.
    let has_kill = pod.0.join("cgroup.kill").exists();
    let version = qoslet_tests::kernel_version();
    assert_eq!(
        has_kill,
        version >= (5, 14),
        "cgroup.kill on Linux {version:?}"
    );
    if has_kill {
        pod.write("cgroup.kill", "1");
    } else {
        sigkill_procs(&pod.0);
    }
    let status = wait_with_deadline(&mut child, Duration::from_secs(10));
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the child ended with {status:?}, not SIGKILL"
    );
    assert!(
        pod.wait_unpopulated(Duration::from_secs(5)),
        "cgroup.events still populated after cgroup.kill"
    );
}
