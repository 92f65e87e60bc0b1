//! Shared by the `sensors_*` tests: one test cgroup per hierarchy the test needs, the facade
//! started with an event collector, and a busy or score-writing child process.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of these helpers"
)]

use std::{
    io::Write as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use qoslet::sensors::{SensorEvent, SensorStatus, Sensors, SensorsConfig, WatchedCgroup};
use qoslet_tests::{Layout, TestCgroup, layout, unique_name};
use tokio::sync::mpsc;

/// A test cgroup in each hierarchy it needs: on hybrid hosts one per v1 controller plus the
/// unified-tree one that gives the cgroup v2 id; on v2 one cgroup.
pub struct Cgroups {
    /// v1 controller name -> cgroup (hybrid hosts).
    pub v1: Vec<(String, TestCgroup)>,
    pub v2: TestCgroup,
}

impl Cgroups {
    /// `None` (with a note) when the v2 root does not delegate a needed controller to children.
    pub fn create(controllers: &[&str]) -> Option<Self> {
        let name = unique_name();
        match layout() {
            Layout::Unified => {
                let enabled = std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
                    .unwrap_or_default();
                if let Some(c) = controllers
                    .iter()
                    .find(|c| !enabled.split_whitespace().any(|e| e == **c))
                {
                    eprintln!(
                        "skipped: controller {c} is not enabled for children of /sys/fs/cgroup, and this test does not change cgroups it did not create"
                    );
                    return None;
                }
                Some(Self {
                    v1: Vec::new(),
                    v2: TestCgroup::create("/sys/fs/cgroup", &name),
                })
            }
            Layout::Hybrid => {
                let v1 = controllers
                    .iter()
                    .map(|c| {
                        let cg = TestCgroup::create(format!("/sys/fs/cgroup/{c}"), &name);
                        if *c == "cpuset" {
                            cg.write("cpuset.cpus", "0");
                            cg.write("cpuset.mems", "0");
                        }
                        (c.to_string(), cg)
                    })
                    .collect();
                Some(Self {
                    v1,
                    v2: TestCgroup::create("/sys/fs/cgroup/unified", &name),
                })
            }
            Layout::Legacy => {
                eprintln!("skipped: no cgroup v2 tree on this host");
                None
            }
        }
    }

    /// The cgroup whose files configure `controller`.
    pub fn of(&self, controller: &str) -> &TestCgroup {
        self.v1
            .iter()
            .find(|(c, _)| c == controller)
            .map_or(&self.v2, |(_, cg)| cg)
    }

    pub fn is_v1(&self) -> bool {
        !self.v1.is_empty()
    }

    pub fn add(&self, pid: u32) {
        for (_, cg) in &self.v1 {
            cg.add_pid(pid);
        }
        self.v2.add_pid(pid);
    }

    pub fn id(&self) -> u64 {
        self.v2.id()
    }

    pub fn watched(&self) -> WatchedCgroup {
        WatchedCgroup {
            id: self.id(),
            v2_dir: Some(self.v2.beneath()),
            memory_dir: Some(self.of("memory").beneath()),
            cpu_dir: self
                .v1
                .iter()
                .find(|(c, _)| c == "cpu")
                .map(|(_, cg)| cg.beneath()),
        }
    }
}

/// Starts the facade and forwards its events to an unbounded channel the test reads.
pub fn start(config: SensorsConfig) -> (Sensors, mpsc::UnboundedReceiver<SensorEvent>) {
    let (sensors, mut rx) = Sensors::start(config);
    for s in sensors.statuses() {
        eprintln!(
            "sensor {}: {:?} on {} ({})",
            s.name,
            s.mode,
            s.source,
            s.reason.as_deref().unwrap_or("")
        );
    }
    let (tx, out) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            if tx.send(e).is_err() {
                return;
            }
        }
    });
    (sensors, out)
}

/// The start-up decision for one sensor.
pub fn status(sensors: &Sensors, name: &str) -> SensorStatus {
    sensors
        .statuses()
        .iter()
        .find(|s| s.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {name} sensor"))
}

/// The configuration with eBPF disabled: every sensor on its fallback.
pub fn without_ebpf() -> SensorsConfig {
    SensorsConfig {
        ebpf: false,
        ..SensorsConfig::default()
    }
}

/// Drops `removed` and waits up to 3 s for the sensors to stop watching it (the
/// `cgroup_lifecycle` sensor, on its hook or on the directory scan); returns its id.
pub async fn remove_and_wait_unwatched(sensors: &Sensors, removed: Cgroups) -> u64 {
    let id = removed.id();
    drop(removed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while sensors.is_watched(id) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    id
}

/// Waits up to `timeout` for an event `f` accepts.
pub async fn wait_for<T>(
    rx: &mut mpsc::UnboundedReceiver<SensorEvent>,
    timeout: Duration,
    mut f: impl FnMut(&SensorEvent) -> Option<T>,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) => {
                if let Some(t) = f(&e) {
                    return Some(t);
                }
            }
            Ok(None) | Err(_) => return None,
        }
    }
}

/// A `sh -c SCRIPT` child that waits for a line on stdin before it runs `SCRIPT`, so the test
/// can move it into its cgroups first. Killed on drop.
pub struct Script {
    pub child: Child,
}

impl Script {
    pub fn spawn(script: &str) -> Self {
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("read go; {script}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting sh");
        Self { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn release(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("releasing the script");
        stdin.flush().expect("releasing the script");
    }

    /// Pins the child to CPU 0 (it was started by this test).
    pub fn pin_to_cpu0(&self) {
        // SAFETY: a zeroed cpu_set_t is valid; plain syscall on our own child.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            let rc = libc::sched_setaffinity(self.pid() as i32, size_of::<libc::cpu_set_t>(), &set);
            assert_eq!(rc, 0, "sched_setaffinity");
        }
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn hog_path() -> PathBuf {
    qoslet_tests::hog_path()
}
