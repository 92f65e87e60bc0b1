//! The run loop (`run.rs` `drive`) and the eviction pipeline (`eviction::Pipeline`) with executors of
//! both shapes: standalone-shaped (qoslet runs the pods: it creates their cgroups, recovers what
//! a crashed run left, signals an evicted pod itself) and cluster-shaped (the kubelet runs them:
//! qoslet only finds their cgroups). Over a cgroup tree in a temporary directory, with fake
//! sensors and a stop that the test sends; what is asserted is what the executor was told, what
//! the action received and what the state file on disk holds.

use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::{
    cgroup::ContainerRuntime, config::EvictionWakeups, node::run::drive,
    policy::eviction::ThresholdValue, sensors::SensorEvent,
};

/// A source fed by the test: each PodSet sent is the next change; once the sender is gone it
/// never changes again (as a quiet directory or API server).
struct ChannelSource {
    now: PodSet,
    next: mpsc::UnboundedReceiver<PodSet>,
}

impl PodSource for ChannelSource {
    type Error = NoMore;

    fn pods(&self) -> &PodSet {
        &self.now
    }

    async fn changed(&mut self) -> Result<Diff, NoMore> {
        let Some(next) = self.next.recv().await else {
            return std::future::pending().await;
        };
        let diff = crate::source::diff(&self.now, &next);
        self.now = next;
        Ok(diff)
    }
}

/// An action that records every request, when it was first called and when its first call
/// returned, and signals nothing.
#[derive(Default)]
struct Recording {
    requests: Mutex<Vec<EvictionRequest>>,
    called: std::sync::OnceLock<Instant>,
    returned: std::sync::OnceLock<Instant>,
}

impl EvictionAction for Arc<Recording> {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        self.called.get_or_init(Instant::now);
        self.requests.lock().unwrap().push(req.clone());
        // As a real action waits for its kill: the manager goes on with the pass meanwhile
        // (the release said, the conditions and the decision sent) and returns here after.
        tokio::task::yield_now().await;
        self.returned.get_or_init(Instant::now);
        Ok(Outcome {
            first_signal_at: None,
            signalled: 0,
            status: EvictedStatus::new(req.message.clone(), &req.seen),
        })
    }
}

const GRACE: Duration = Duration::from_millis(1500);

fn run_config(tree: &Tree0, runtime: ContainerRuntime) -> RunConfig {
    let qc = crate::config::QosletConfiguration {
        state_dir: tree.state_dir(),
        housekeeping_interval: Duration::from_millis(100),
        // No memory watcher on a directory that is not a cgroup.
        eviction_wakeups: EvictionWakeups::Housekeeping,
        ..Default::default()
    };
    RunConfig {
        settings: node_settings(),
        qc,
        mode: Mode::Enforce,
        fs: Arc::new(CgroupFs::open(tree.mounts(), CgroupPath::root()).unwrap()),
        runtime,
        validation: ValidationOptions::default(),
        addr: "127.0.0.1:0".parse().unwrap(),
        listener: None,
        auth: None,
        shutdown_grace: GRACE,
        on_start: None,
        node_name: None,
    }
}

/// The node's loop on a task, with the handles the test drives it by.
struct Running {
    changes: mpsc::UnboundedSender<PodSet>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), NodeError>>,
}

fn start(cfg: RunConfig, first: PodSet, exec: Arc<FakeExecutor>) -> Running {
    start_with(cfg, first, exec, Arc::default(), |_: &AgentState| {
        fake_sensors()
    })
}

fn fake_sensors() -> (FakeSensors, mpsc::Receiver<SensorEvent>) {
    let (_tx, rx) = mpsc::channel(1);
    (FakeSensors::default(), rx)
}

/// [`start`] with the sensors' start given.
fn start_with(
    cfg: RunConfig,
    first: PodSet,
    exec: Arc<FakeExecutor>,
    action: Arc<Recording>,
    sensors: impl FnOnce(&AgentState) -> (FakeSensors, mpsc::Receiver<SensorEvent>) + Send + 'static,
) -> Running {
    let (changes, next) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let source = ChannelSource { now: first, next };
    let task = tokio::spawn(drive(cfg, source, exec, action, sensors, async move {
        let _ = stopped.await;
        "test"
    }));
    Running {
        changes,
        stop,
        task,
    }
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn applied(exec: &FakeExecutor) -> BTreeMap<String, Applied> {
    exec.applied.lock().unwrap().clone()
}

/// The cgroups the state file on disk says qoslet created.
fn created_on_disk(tree: &Tree0) -> Vec<String> {
    StateFile::load(Some(&tree.state_dir()), &CgroupPath::root())
        .created_cgroups()
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The sensors' start blocks (the eBPF programs load for seconds under emulation); the server,
/// started before it, answers the probes meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_answers_while_the_sensors_start() {
    let tree = Tree0::new("loop-sensors-start");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg = run_config(&tree, ContainerRuntime::Containerd);
    cfg.listener = Some(listener);
    let (starting, started) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let sensors = move |_: &AgentState| {
        starting.send(()).unwrap();
        // Until the test has its answer (or gave up on it).
        let _ = released.recv();
        fake_sensors()
    };
    let node = start_with(
        cfg,
        PodSet::default(),
        Arc::new(FakeExecutor::kubelet()),
        Arc::default(),
        sensors,
    );
    tokio::task::spawn_blocking(move || {
        started.recv().unwrap();
        let answer = crate::server::tests::get(addr, "/healthz");
        release.send(()).unwrap();
        assert_eq!(answer.0, 200, "/healthz while the sensors start");
    })
    .await
    .unwrap();
    node.stop.send(()).unwrap();
    node.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_shaped_loop_recovers_creates_applies_and_cleans_up() {
    let tree = Tree0::new("loop-qoslet");
    // An earlier run's pod cgroup, in its state file: removed before the first pass.
    let old =
        CgroupPath::parse("/kubepods/besteffort/podaaaaaaaa-0000-4000-8000-0000000000ff").unwrap();
    let old_dir = tree
        .0
        .join("kubepods/besteffort/podaaaaaaaa-0000-4000-8000-0000000000ff");
    std::fs::create_dir_all(&old_dir).unwrap();
    let mut earlier = StateFile::load(Some(&tree.state_dir()), &CgroupPath::root());
    earlier.set_created_cgroups(&BTreeSet::from([old.clone()]));
    earlier.save(true).unwrap();

    let exec = Arc::new(FakeExecutor::default());
    let a = pod_set(&pod_yaml("a", UID_A, None), &PodSet::default());
    let both = pod_set(
        &(pod_yaml("a", UID_A, None) + &pod_yaml("b", UID_B, Some("64Mi"))),
        &a,
    );
    let node = start(
        run_config(&tree, ContainerRuntime::Standalone),
        a,
        exec.clone(),
    );

    until("the first pass", || applied(&exec).contains_key("a")).await;
    assert!(!old_dir.exists(), "the earlier run's cgroup is removed");
    let a_main = pod_dir(&tree, "besteffort", UID_A).join("main");
    assert!(a_main.is_dir(), "qoslet creates the container cgroup");
    assert_eq!(applied(&exec)["a"].containers["main"], vec![a_main.clone()]);

    node.changes.send(both).unwrap();
    until("the pass of the change", || applied(&exec).len() == 2).await;
    assert!(pod_dir(&tree, "burstable", UID_B).join("main").is_dir());
    // The state file is written after the pass that told the executor.
    until("the state file to list the cgroups qoslet created", || {
        let created = created_on_disk(&tree);
        created.iter().any(|c| c.contains(UID_A)) && created.iter().any(|c| c.contains(UID_B))
    })
    .await;
    assert!(!created_on_disk(&tree).contains(&old.to_string()));

    node.stop.send(()).unwrap();
    node.task.await.unwrap().unwrap();
    assert_eq!(*exec.stopped.lock().unwrap(), Some(GRACE));
    assert!(!a_main.exists() && !pod_dir(&tree, "besteffort", UID_A).exists());
    assert_eq!(created_on_disk(&tree), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_shaped_loop_finds_cgroups_and_creates_none() {
    let tree = Tree0::new("loop-kubelet");
    // The kubelet's pod cgroup for a; b's does not exist yet.
    let a_dir = pod_dir(&tree, "besteffort", UID_A);
    std::fs::create_dir_all(&a_dir).unwrap();

    let exec = Arc::new(FakeExecutor::kubelet());
    let both = pod_set(
        &(pod_yaml("a", UID_A, None) + &pod_yaml("b", UID_B, Some("64Mi"))),
        &PodSet::default(),
    );
    let node = start(
        run_config(&tree, ContainerRuntime::Containerd),
        both,
        exec.clone(),
    );

    until("the first pass", || applied(&exec).len() == 2).await;
    // No container id in the pods' statuses yet: no container cgroup is looked for, none made.
    assert_eq!(applied(&exec)["a"].containers, BTreeMap::new());
    assert!(a_dir.is_dir());
    assert!(
        !pod_dir(&tree, "burstable", UID_B).exists(),
        "qoslet creates no cgroup of the kubelet's"
    );
    assert_eq!(created_on_disk(&tree), Vec::<String>::new());

    node.stop.send(()).unwrap();
    node.task.await.unwrap().unwrap();
    assert_eq!(*exec.stopped.lock().unwrap(), Some(GRACE));
    assert!(a_dir.is_dir(), "the kubelet's cgroups outlive qoslet");
}

/// A stream of changes that change nothing (a Node heartbeat, a pod written back as it was)
/// starts no pass; a real change starts one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_changes_nothing_starts_no_pass() {
    let tree = Tree0::new("loop-heartbeat");
    std::fs::create_dir_all(pod_dir(&tree, "besteffort", UID_A)).unwrap();
    let exec = Arc::new(FakeExecutor::kubelet());
    let a = pod_set(&pod_yaml("a", UID_A, None), &PodSet::default());
    let node = start(
        run_config(&tree, ContainerRuntime::Containerd),
        a.clone(),
        exec.clone(),
    );
    until("the first pass", || applied(&exec).contains_key("a")).await;
    let applies = || *exec.applies.lock().unwrap();
    let first = applies();
    for _ in 0..50 {
        node.changes.send(a.clone()).unwrap();
    }
    // Well past the housekeeping interval (100 ms), so the heartbeats were all taken.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(applies(), first, "50 changes of nothing, no pass");

    let both = pod_set(
        &(pod_yaml("a", UID_A, None) + &pod_yaml("b", UID_B, Some("64Mi"))),
        &a,
    );
    node.changes.send(both).unwrap();
    until("the pass of the change", || applied(&exec).len() == 2).await;
    assert_eq!(applies(), first + 1, "one change, one pass");

    node.stop.send(()).unwrap();
    node.task.await.unwrap().unwrap();
}

/// The eviction pipeline (`eviction/pipeline.rs`) over both shapes: the executor hears of the eviction, the action gets the
/// request, the state file on disk holds the pod; the executor's own signal counts as the first
/// only where it sends one (standalone-shaped).
#[tokio::test]
async fn the_eviction_pipeline_tells_the_executor_the_action_and_the_state_file() {
    for exec in [FakeExecutor::default(), FakeExecutor::kubelet()] {
        let runner = exec.runner;
        let tree = Tree0::new(&format!("eviction-{runner:?}"));
        let pod_dir = tree.0.join(format!("pod{UID_A}"));
        std::fs::create_dir_all(&pod_dir).unwrap();
        let pod = CgroupBeneath {
            fs: Arc::new(CgroupFs::open(tree.mounts(), CgroupPath::root()).unwrap()),
            tree: Tree::V2,
            path: CgroupPath::parse(&format!("/pod{UID_A}")).unwrap(),
        };
        let key = PodKey {
            namespace: "default".into(),
            name: "a".into(),
            uid: UID_A.into(),
        };
        let req = EvictionRequest {
            pod: key.clone(),
            cgroups: crate::eviction::PodCgroups {
                procs: vec![pod.clone()],
                unified: Some(pod),
            },
            grace: Duration::from_secs(3),
            message: "The node was low on resource: memory. ".into(),
            annotations: Default::default(),
            seen: Default::default(),
            signal: "memory.available".into(),
            hard: false,
            unit: None,
            revision: 7,
        };
        let state = Arc::new(Mutex::new(StateFile::load(
            Some(&tree.state_dir()),
            &CgroupPath::root(),
        )));
        let exec = Arc::new(exec);
        let action = Arc::new(Recording::default());
        let seam = Pipeline::new(action.clone(), exec.clone(), state);

        let outcome = seam.evict(&req).await.unwrap();

        assert_eq!(
            *exec.evicted.lock().unwrap(),
            std::slice::from_ref(&key),
            "{runner:?}"
        );
        assert_eq!(
            *action.requests.lock().unwrap(),
            std::slice::from_ref(&req),
            "{runner:?}"
        );
        let on_disk = StateFile::load(Some(&tree.state_dir()), &CgroupPath::root());
        assert_eq!(on_disk.evicted().collect::<Vec<_>>(), [key], "{runner:?}");
        assert_eq!(
            outcome.first_signal_at.is_some(),
            runner == Runner::Qoslet,
            "{runner:?}: the first signal is the executor's only where it signals"
        );
    }
}

/// While an evicted pod still holds its processes, the node holds its reaction to the eviction
/// (the pass MemoryPressure asks for, the decision's report, a change of the source), at most
/// `RELEASE_HOLD` (1 s): the change made meanwhile reaches the executor no earlier than a second
/// after the action's call, and it does reach it though the pod never goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_holds_its_reaction_to_an_eviction_while_the_pod_releases_at_most_a_second() {
    let tree = Tree0::new("loop-release-hold");
    let mib = |n: i64| (n << 20).to_string();
    let a_dir = pod_dir(&tree, "besteffort", UID_A);
    std::fs::create_dir_all(&a_dir).unwrap();
    // The node (8 GiB) has 50 MiB available, under the hard 100Mi threshold; pod a holds 1 GiB
    // and a process that never goes.
    for (dir, used) in [
        (tree.0.clone(), (8 << 10) - 50),
        (tree.0.join("kubepods"), 1024),
        (a_dir.clone(), 1024),
    ] {
        std::fs::write(dir.join("memory.current"), mib(used)).unwrap();
        std::fs::write(dir.join("memory.stat"), "anon 0\ninactive_file 0\n").unwrap();
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
    }
    std::fs::write(a_dir.join("cgroup.procs"), "123\n").unwrap();
    let exec = Arc::new(FakeExecutor::kubelet());
    let action = Arc::new(Recording::default());
    let a = pod_set(&pod_yaml("a", UID_A, None), &PodSet::default());
    let both = pod_set(
        &(pod_yaml("a", UID_A, None) + &pod_yaml("b", UID_B, Some("64Mi"))),
        &a,
    );
    let mut cfg = run_config(&tree, ContainerRuntime::Containerd);
    cfg.settings.hard_eviction = vec![Threshold {
        signal: "memory.available".into(),
        value: ThresholdValue::Quantity("100Mi".parse().unwrap()),
        grace_period_secs: 0,
        min_reclaim: None,
    }];
    let node = start_with(cfg, a, exec.clone(), action.clone(), |_: &AgentState| {
        fake_sensors()
    });
    until("the eviction of a", || action.returned.get().is_some()).await;
    let called = *action.called.get().unwrap();
    node.changes.send(both).unwrap();
    until("the change applied after the hold", || {
        applied(&exec).contains_key("b")
    })
    .await;
    assert!(
        called.elapsed() >= app::RELEASE_HOLD,
        "the change reached the executor {:?} after the eviction",
        called.elapsed()
    );
    assert_eq!(action.requests.lock().unwrap()[0].pod.name, "a");

    node.stop.send(()).unwrap();
    node.task.await.unwrap().unwrap();
}
