//! Helpers of the eviction tests and bench: a node root with a memory limit, pod cgroups, hogs
//! at a chosen rate, managed pods and an in-process eviction run.

use super::*;

/// A memory cgroup directory as a node root of its own (v1's memory controller or v2).
fn own_memory(dir: &Path, v1: bool) -> qoslet::eviction::MemoryCgroup {
    let tree = if v1 {
        qoslet::cgroup::Tree::V1(qoslet::cgroup::layout::Controller::Memory)
    } else {
        qoslet::cgroup::Tree::V2
    };
    qoslet::eviction::MemoryCgroup::own(dir, tree).expect("opening a test memory cgroup")
}

impl Hog {
    /// A hog that allocates at `rate_mib_s` MiB per second once released (`None`: at once).
    pub fn spawn_rate(cap_mib: u64, rate_mib_s: Option<f64>) -> Self {
        let mut cmd = Command::new(hog_path());
        cmd.arg(cap_mib.to_string());
        if let Some(r) = rate_mib_s {
            cmd.arg(r.to_string());
        }
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting qoslet-test-hog");
        Self { child }
    }

    /// Whether the hog is still running (reaps it if not).
    pub fn alive(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("waiting for the hog")
            .is_none()
    }
}

/// A node root cgroup with a memory limit, for eviction tests: on v2 one directory with
/// `memory.max` (memory and pids enabled for its children); on hybrid hosts a v1 memory cgroup
/// with `memory.limit_in_bytes` plus a unified-tree twin that gives pods `cgroup.kill`.
pub struct EvictionNodeRoot {
    pub memory: TestCgroup,
    pub unified: Option<TestCgroup>,
    pub v1: bool,
}

/// One pod's cgroups under a [`EvictionNodeRoot`].
pub struct PodCgroup {
    pub memory: TestCgroup,
    pub unified: Option<TestCgroup>,
}

impl EvictionNodeRoot {
    /// `None` (with a line saying why) when the memory controller is not available to children
    /// of the v2 root: the test does not change cgroups it did not create.
    pub fn create(limit_bytes: u64) -> Option<Self> {
        let name = unique_name();
        match layout() {
            Layout::Hybrid | Layout::Legacy => {
                let memory = TestCgroup::create(Path::new(CGROUP_ROOT).join("memory"), &name);
                memory.write("memory.limit_in_bytes", &limit_bytes.to_string());
                let unified = (layout() == Layout::Hybrid)
                    .then(|| TestCgroup::create(Path::new(CGROUP_ROOT).join("unified"), &name));
                Some(Self {
                    memory,
                    unified,
                    v1: true,
                })
            }
            Layout::Unified => {
                let controllers =
                    fs::read_to_string(Path::new(CGROUP_ROOT).join("cgroup.subtree_control"))
                        .unwrap_or_default();
                if !controllers.split_whitespace().any(|c| c == "memory") {
                    eprintln!(
                        "skipped: the memory controller is not enabled for children of /sys/fs/cgroup"
                    );
                    return None;
                }
                let memory = TestCgroup::create(CGROUP_ROOT, &name);
                memory.write("memory.max", &limit_bytes.to_string());
                if memory.path.join("memory.swap.max").exists() {
                    memory.write("memory.swap.max", "0");
                }
                memory.write("cgroup.subtree_control", "+memory");
                Some(Self {
                    memory,
                    unified: None,
                    v1: false,
                })
            }
        }
    }

    /// The node root's memory cgroup, a node root of its own as the agent opens it.
    pub fn memory_cgroup(&self) -> qoslet::eviction::MemoryCgroup {
        own_memory(&self.memory.path, self.v1)
    }

    /// The kernel's OOM kills in the node root and below. v2 `memory.events` counts the
    /// subtree; v1 `memory.oom_control` counts only the victim's own memcg, so on v1 every
    /// descendant is summed.
    pub fn oom_kills(&self) -> u64 {
        fn v1_tree(dir: &Path) -> u64 {
            let own = own_memory(dir, true)
                .oom_kills()
                .expect("reading memory.oom_control");
            let children: u64 = fs::read_dir(dir)
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| v1_tree(&e.path()))
                        .sum()
                })
                .unwrap_or(0);
            own + children
        }
        if self.v1 {
            v1_tree(&self.memory.path)
        } else {
            self.memory_cgroup()
                .oom_kills()
                .expect("reading the node root's oom_kill")
        }
    }

    pub fn pod(&self, name: &str) -> PodCgroup {
        PodCgroup {
            memory: TestCgroup::create(&self.memory.path, name),
            unified: self
                .unified
                .as_ref()
                .map(|u| TestCgroup::create(&u.path, name)),
        }
    }
}

impl PodCgroup {
    pub fn add(&self, pid: u32) {
        self.memory.add_pid(pid);
        if let Some(u) = &self.unified {
            u.add_pid(pid);
        }
    }

    pub fn memory_cgroup(&self, v1: bool) -> qoslet::eviction::MemoryCgroup {
        own_memory(&self.memory.path, v1)
    }

    /// What the eviction action may signal: only these cgroups' processes.
    /// Each directory is a node root of its own, opened beneath as the agent opens pods'.
    pub fn eviction_cgroups(&self, v1: bool) -> qoslet::eviction::PodCgroups {
        use qoslet::cgroup::{CgroupBeneath, Tree};
        let memory = own_memory(&self.memory.path, v1).dir().clone();
        let unified = if v1 {
            self.unified
                .as_ref()
                .map(|u| CgroupBeneath::own(&u.path, Tree::Unified).expect("opening a test cgroup"))
        } else {
            Some(memory.clone())
        };
        qoslet::eviction::PodCgroups {
            procs: vec![memory],
            unified,
        }
    }

    /// Starts a hog in this pod, released at once.
    pub fn start_hog(&self, cap_mib: u64, rate_mib_s: Option<f64>) -> Hog {
        let mut h = Hog::spawn_rate(cap_mib, rate_mib_s);
        self.add(h.pid());
        h.release();
        h
    }
}

/// The eviction manager of a test, running in-process on a [`EvictionNodeRoot`].
pub struct EvictionRun {
    pub stats: std::sync::Arc<std::sync::Mutex<qoslet::eviction::EvictionStats>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A pod for the manager: `request_mib` 0 and no limit make BestEffort.
pub fn managed_pod(
    name: &str,
    pod: &PodCgroup,
    v1: bool,
    qos: qoslet::policy::qos::QosClass,
    request_mib: i64,
    priority: i32,
) -> qoslet::eviction::ManagedPod {
    qoslet::eviction::ManagedPod {
        key: qoslet::policy::pod::PodKey {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        },
        qos,
        request_bytes: request_mib << 20,
        priority,
        critical: priority >= qoslet::policy::pod::SYSTEM_CRITICAL_PRIORITY,
        start_time: 0,
        grace_secs: 30,
        revision: 0,
        memory: pod.memory_cgroup(v1),
        cgroups: pod.eviction_cgroups(v1),
        containers: Vec::new(),
        pod_memory_request: None,
        seen: Default::default(),
    }
}

/// A hard `memory.available<threshold` configuration with 1 s housekeeping.
pub fn hard_memory_config(
    threshold: &str,
    order: qoslet::eviction::Order,
    housekeeping: Duration,
) -> qoslet::eviction::ManagerConfig {
    let hard =
        std::collections::BTreeMap::from([("memory.available".to_owned(), threshold.to_owned())]);
    let (hard, soft) =
        qoslet::policy::eviction::parse_thresholds(&qoslet::policy::eviction::EvictionInput {
            hard: Some(&hard),
            ..Default::default()
        })
        .expect("valid thresholds");
    qoslet::eviction::ManagerConfig {
        hard,
        soft,
        pressure_transition: Duration::from_secs(300),
        max_pod_grace_secs: 0,
        housekeeping,
        order,
        release_timeout: Duration::from_secs(30),
    }
}

impl EvictionRun {
    /// Starts the manager with the standalone action, and (with `poll`) the node root watcher.
    pub fn start(
        node: &EvictionNodeRoot,
        cfg: qoslet::eviction::ManagerConfig,
        inventory: qoslet::eviction::Inventory,
        watch: bool,
        poll: Option<Duration>,
    ) -> Self {
        use qoslet::eviction::{CgroupKill, Manager, NodeSignals, WatchConfig, spawn_watcher};
        let signals = NodeSignals {
            node_root: node.memory_cgroup(),
            capacity_bytes: None,
            kubepods: None,
            pids: None,
        };
        let capacity = node
            .memory_cgroup()
            .read()
            .expect("reading the node root")
            .limit_bytes
            .expect("the node root has a limit");
        let level = cfg.watch_level("memory.available", capacity);
        let (_inv_tx, inv_rx) = tokio::sync::watch::channel(std::sync::Arc::new(inventory));
        let manager = Manager::new(cfg, signals, CgroupKill, inv_rx);
        let stats = manager.stats();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        // Stopped by aborting the task on drop; the stop channel stays open until then.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut tasks = vec![tokio::spawn(async move {
            let _stop_tx = stop_tx;
            manager.run(rx, stop_rx).await;
        })];
        if watch {
            let w = spawn_watcher(
                WatchConfig {
                    node_root: node.memory_cgroup(),
                    level_bytes: level,
                    poll,
                },
                tx,
            )
            .expect("starting the watcher");
            tasks.push(w);
        } else {
            // Housekeeping only: keep the channel open but silent.
            tasks.push(tokio::spawn(async move {
                let _tx = tx;
                std::future::pending::<()>().await;
            }));
        }
        Self { stats, tasks }
    }

    /// Evicted pod names, decision by decision.
    pub fn decisions(&self) -> Vec<Vec<String>> {
        self.stats
            .lock()
            .expect("stats")
            .recent
            .iter()
            .map(|d| d.pods.iter().map(|k| k.name.clone()).collect())
            .collect()
    }

    /// Waits until `n` decisions were made or `timeout` passed.
    pub async fn wait_decisions(&self, n: usize, timeout: Duration) -> Vec<Vec<String>> {
        let deadline = Instant::now() + timeout;
        while self.decisions().len() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.decisions()
    }
}

impl Drop for EvictionRun {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
