//! The node with a fake source, a fake executor and fake sensors over a cgroup tree in a
//! temporary directory: no root, no kernel. The same pass, housekeeping and eviction handling
//! the modes run.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use super::*;
use crate::{
    cgroup::{CgroupBeneath, CgroupPath, ContainerRuntime, LayoutKind, Mounts, Tree},
    eviction::{
        Decision, EvictedStatus, EvictionAction, EvictionRequest, ManagedPod, Manager,
        ManagerConfig, MemoryCgroup, NodeCondition, NodeSignals, Order, Outcome, Pipeline,
        action::ActionError,
    },
    hub::AgentState,
    policy::{
        cpuset::CpuSet,
        eviction::{EvictionInput, parse_thresholds},
        qos::QosClass,
        settings::{Capacity, CgroupDriver},
    },
    sensors::{CgroupOwner, CpuUsage, WatchedCgroup, kmaps::ProgramCost},
    source::{Diff, PodSet, pod_set},
};

const MI: i64 = 1 << 20;

fn pod_yaml(name: &str, uid: &str, memory_request: Option<&str>) -> String {
    let resources = memory_request.map_or(String::new(), |m| {
        format!(", resources: {{requests: {{memory: {m}}}}}")
    });
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: {uid}}}\nspec:\n  containers: [{{name: main, command: [sleep, '60']{resources}}}]\n---\n"
    )
}

const UID_A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const UID_B: &str = "aaaaaaaa-0000-4000-8000-000000000002";

/// A source that yields prepared states one change at a time.
struct FakeSource {
    now: PodSet,
    next: VecDeque<PodSet>,
}

#[derive(Debug, thiserror::Error)]
#[error("no more changes")]
struct NoMore;

impl PodSource for FakeSource {
    type Error = NoMore;

    fn pods(&self) -> &PodSet {
        &self.now
    }

    async fn changed(&mut self) -> Result<Diff, NoMore> {
        let next = self.next.pop_front().ok_or(NoMore)?;
        let diff = crate::source::diff(&self.now, &next);
        self.now = next;
        Ok(diff)
    }
}

/// What the fake executor was asked, pod by pod, on the last apply.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    startable: bool,
    containers: BTreeMap<String, Vec<PathBuf>>,
}

/// An executor of either shape: standalone-shaped ([`Runner::Qoslet`], the default: container
/// cgroups created, an evicted pod signalled by the executor) or cluster-shaped
/// ([`FakeExecutor::kubelet`]: cgroups found, the kill is the action's).
struct FakeExecutor {
    runner: Runner,
    /// A pod name this executor cannot run.
    refuse: Option<&'static str>,
    applied: Mutex<BTreeMap<String, Applied>>,
    applies: Mutex<usize>,
    evicted: Mutex<Vec<PodKey>>,
    stopped: Mutex<Option<Duration>>,
}

impl Default for FakeExecutor {
    fn default() -> Self {
        Self {
            runner: Runner::Qoslet,
            refuse: None,
            applied: Mutex::default(),
            applies: Mutex::default(),
            evicted: Mutex::default(),
            stopped: Mutex::default(),
        }
    }
}

impl FakeExecutor {
    fn kubelet() -> Self {
        Self {
            runner: Runner::Kubelet,
            ..Self::default()
        }
    }
}

impl PodExecutor for FakeExecutor {
    fn runner(&self) -> Runner {
        self.runner
    }

    fn accepts(&self, pod: &crate::source::ManifestPod) -> Result<(), String> {
        match (self.refuse, pod.pod.metadata.name.as_deref()) {
            (Some(r), Some(n)) if r == n => Err(format!("Pod/default/{n}: cannot run it")),
            _ => Ok(()),
        }
    }

    /// Standalone-shaped: named by container name. Cluster-shaped: none, as before the kubelet
    /// reports the containers' ids.
    fn container_ids(&self, pods: &PodSet) -> crate::cgroup::ContainerIds {
        if self.runner == Runner::Kubelet {
            return Default::default();
        }
        pods.pods
            .iter()
            .flat_map(|(k, p)| {
                p.pod
                    .spec
                    .iter()
                    .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
                    .map(|c| ((k.uid.clone(), c.name.clone()), c.name.clone()))
            })
            .collect()
    }

    fn apply(&self, pods: Vec<PlannedPod<'_>>, _: &[NodeCondition]) -> Vec<String> {
        *self.applies.lock().unwrap() += 1;
        *self.applied.lock().unwrap() = pods
            .into_iter()
            .map(|p| {
                (
                    p.key.name.clone(),
                    Applied {
                        startable: p.held.is_none(),
                        containers: p
                            .container_cgroups
                            .into_iter()
                            .map(|(name, dirs)| {
                                (name, dirs.iter().map(CgroupBeneath::display).collect())
                            })
                            .collect(),
                    },
                )
            })
            .collect();
        Vec::new()
    }

    fn status(&self) -> Vec<PodStatus> {
        Vec::new()
    }

    async fn changed(&self) {
        std::future::pending::<()>().await;
    }

    fn mark_evicted(&self, key: &PodKey, _: &str, _: Duration) {
        self.evicted.lock().unwrap().push(key.clone());
    }

    async fn stop_all(&self, grace: Duration) {
        *self.stopped.lock().unwrap() = Some(grace);
    }
}

#[derive(Default)]
struct FakeSensors {
    watched: Mutex<BTreeSet<u64>>,
    /// The cumulative run-queue histogram every watched container reports (eBPF).
    runq: Mutex<Option<crate::policy::cpu_pressure::Histogram>>,
}

impl SensorControl for FakeSensors {
    fn watch(&self, cgroup: WatchedCgroup) {
        self.watched.lock().unwrap().insert(cgroup.id);
    }
    fn unwatch(&self, id: u64) {
        self.watched.lock().unwrap().remove(&id);
    }
    fn set_owner(&self, _: u64, _: CgroupOwner) {}
    fn cpu_stats(&self, _: u64) -> Option<CpuUsage> {
        let hist = (*self.runq.lock().unwrap())?;
        Some(CpuUsage {
            source: crate::sensors::CpuSource::Ebpf,
            usage_ns: 0,
            runq: Some(crate::sensors::cpu_usage::RunQueueWaits {
                count: hist.iter().sum(),
                total_ns: 0,
                hist,
            }),
            throttled: None,
            pressure_some_us: None,
        })
    }
    fn program_costs(&self) -> Vec<ProgramCost> {
        Vec::new()
    }
    fn events_lost(&self) -> u64 {
        0
    }
}

/// A temporary directory standing for a cgroup v2 mount, removed on drop.
struct Tree0(PathBuf);

impl Tree0 {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "qoslet-node-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn state_dir(&self) -> PathBuf {
        self.0.with_extension("state")
    }
}

impl Drop for Tree0 {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_dir_all(self.state_dir());
    }
}

impl Tree0 {
    /// The directory as the one cgroup v2 mount.
    fn mounts(&self) -> Mounts {
        Mounts {
            kind: LayoutKind::Unified,
            trees: BTreeMap::from([(Tree::V2, self.0.clone())]),
        }
    }
}

/// A 4-CPU, 8 GiB node, cgroupfs driver, the node root as cgroupRoot.
fn node_settings() -> NodeSettings {
    let mut settings = NodeSettings::defaults(Capacity {
        cpu_millis: 4000,
        memory_bytes: 8 << 30,
        pids: 4096,
        cpus: CpuSet::first(4),
    });
    settings.cgroup_driver = CgroupDriver::Cgroupfs;
    settings.cgroup_root = "/".into();
    settings
}

fn build_node(tree: &Tree0) -> (Node, watch::Receiver<Arc<Inventory>>, Arc<AgentState>) {
    build_node_with(tree, None, Mode::Enforce)
}

fn build_node_with(
    tree: &Tree0,
    cpu_pressure: Option<CpuPressureConfig>,
    mode: Mode,
) -> (Node, watch::Receiver<Arc<Inventory>>, Arc<AgentState>) {
    let fs = CgroupFs::open(tree.mounts(), CgroupPath::root()).unwrap();
    let settings = node_settings();
    let state = Arc::new(AgentState::new(
        Box::new(CgroupSummary::new(Default::default(), None)),
        None,
    ));
    let (node, inventory) = Node::new(NodeParts {
        settings,
        naming: Naming {
            driver: CgroupDriver::Cgroupfs,
            runtime: ContainerRuntime::Standalone,
            node_root: CgroupPath::root(),
            runner: Runner::Qoslet,
            enforce: Default::default(),
        },
        fs: fs.into(),
        mode,
        validation: ValidationOptions::default(),
        state: state.clone(),
        summary: CgroupSummary::new(Default::default(), None),
        persisted: StateFile::load(Some(&tree.state_dir()), &CgroupPath::root()),
        stats_interval: Duration::from_secs(10),
        cpu_pressure,
    });
    (node, inventory, state)
}

fn pod_dir(tree: &Tree0, tier: &str, uid: &str) -> PathBuf {
    let mut p = tree.0.join("kubepods");
    if !tier.is_empty() {
        p.push(tier);
    }
    p.join(format!("pod{uid}"))
}

fn status_events(state: &AgentState) -> Vec<String> {
    state
        .status
        .snapshot()
        .events
        .into_iter()
        .map(|e| e.message)
        .collect()
}

#[tokio::test]
async fn pods_added_changed_and_removed() {
    let tree = Tree0::new("lifecycle");
    let (mut node, inventory, _) = build_node(&tree);
    let (exec, sensors) = (FakeExecutor::default(), FakeSensors::default());
    let both = pod_set(
        &(pod_yaml("a", UID_A, None) + &pod_yaml("b", UID_B, Some("64Mi"))),
        &PodSet::default(),
    );
    let b_changed = pod_set(
        &(pod_yaml("a", UID_A, None) + &pod_yaml("b", UID_B, Some("128Mi"))),
        &both,
    );
    let b_only = pod_set(&pod_yaml("b", UID_B, Some("128Mi")), &b_changed);
    let mut source = FakeSource {
        now: both,
        next: VecDeque::from([b_changed, b_only]),
    };

    node.pass(source.pods(), &exec, &[], &sensors);
    let applied = exec.applied.lock().unwrap().clone();
    assert_eq!(applied.keys().collect::<Vec<_>>(), ["a", "b"]);
    // Each container is handed its own cgroup, which the reconciler created.
    let a_main = pod_dir(&tree, "besteffort", UID_A).join("main");
    assert_eq!(applied["a"].containers["main"], vec![a_main.clone()]);
    assert!(a_main.is_dir());
    assert!(pod_dir(&tree, "burstable", UID_B).join("main").is_dir());
    assert_eq!(inventory.borrow().pods.len(), 2);
    assert!(!sensors.watched.lock().unwrap().is_empty());

    let diff = source.changed().await.unwrap();
    assert_eq!(diff.pods_changed.len(), 1);
    node.pass(source.pods(), &exec, &[], &sensors);
    let b_request = inventory
        .borrow()
        .pods
        .iter()
        .find(|p| p.key.name == "b")
        .map(|p| p.request_bytes);
    assert_eq!(b_request, Some(128 * MI));

    let diff = source.changed().await.unwrap();
    assert_eq!(diff.pods_removed.len(), 1);
    let watched_before = sensors.watched.lock().unwrap().len();
    node.pass(source.pods(), &exec, &[], &sensors);
    assert_eq!(
        exec.applied.lock().unwrap().keys().collect::<Vec<_>>(),
        ["b"]
    );
    assert_eq!(inventory.borrow().pods.len(), 1);
    assert!(sensors.watched.lock().unwrap().len() < watched_before);
    // The removed pod's cgroups are stale: housekeeping removes them once empty.
    assert!(pod_dir(&tree, "besteffort", UID_A).is_dir());
    node.housekeeping(&sensors);
    assert!(!pod_dir(&tree, "besteffort", UID_A).exists());
    assert!(pod_dir(&tree, "burstable", UID_B).is_dir());
}

/// The statistics sampling hands every pod's `inactive_file` to the eviction manager's cache,
/// which ranks on the usage less it.
#[tokio::test]
async fn the_sampled_inactive_file_is_what_the_eviction_manager_ranks_on() {
    let tree = Tree0::new("usage");
    let (mut node, inventory, _) = build_node(&tree);
    let (exec, sensors) = (FakeExecutor::default(), FakeSensors::default());
    let both = pod_set(
        &(pod_yaml("a", UID_A, None) + &pod_yaml("b", UID_B, Some("64Mi"))),
        &PodSet::default(),
    );
    node.pass(&both, &exec, &[], &sensors);
    for (tier, uid, mib) in [("besteffort", UID_A, 30), ("burstable", UID_B, 70)] {
        let dir = pod_dir(&tree, tier, uid);
        std::fs::write(dir.join("memory.current"), (mib * MI).to_string()).unwrap();
        let stat = format!("anon 0\ninactive_file {}\n", mib / 10 * MI);
        std::fs::write(dir.join("memory.stat"), stat).unwrap();
        std::fs::write(dir.join("memory.max"), "max").unwrap();
    }
    let usage = UsageCache::new(Duration::from_secs(20));
    node.share_usage(usage.clone());
    node.housekeeping(&sensors);
    let keys: Vec<PodKey> = inventory
        .borrow()
        .pods
        .iter()
        .map(|p| p.key.clone())
        .collect();
    let held = usage.held(&keys, Instant::now());
    let by_name: BTreeMap<&str, Option<i64>> =
        keys.iter().map(|k| k.name.as_str()).zip(held).collect();
    assert_eq!(
        by_name,
        BTreeMap::from([("a", Some(3 * MI)), ("b", Some(7 * MI))])
    );
}

/// The pass hands the eviction manager what the kubelet's eviction message and evicted status
/// read: the pod's containers in its stats' order (init first, as the Summary API lists them)
/// with their memory requests (a limit alone sets it; none is `None`), the pod-level memory
/// request as set, the generation and the status's conditions.
#[tokio::test]
async fn the_inventory_carries_what_the_eviction_message_reads() {
    let tree = Tree0::new("message-inputs");
    let (mut node, inventory, _) = build_node(&tree);
    let (exec, sensors) = (FakeExecutor::default(), FakeSensors::default());
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: default, uid: {UID_A}, generation: 5}}\n\
         spec:\n  resources: {{requests: {{memory: 256Mi}}}}\n\
         \x20 initContainers: [{{name: init, command: ['true'], resources: {{limits: {{memory: 32Mi}}}}}}]\n\
         \x20 containers: [{{name: main, command: [sleep, '60'], resources: {{requests: {{memory: 64Mi}}}}}}, {{name: bare, command: [sleep, '60']}}]\n\
         status: {{conditions: [{{type: Ready, status: 'False'}}, {{type: PodScheduled, status: 'True'}}]}}\n"
    );
    node.pass(&pod_set(&yaml, &PodSet::default()), &exec, &[], &sensors);
    let inv = inventory.borrow().clone();
    let p = &inv.pods[0];
    let containers: Vec<(&str, Option<String>)> = p
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.memory_request.map(|q| q.canonical())))
        .collect();
    assert_eq!(
        containers,
        [
            ("init", Some("32Mi".to_owned())),
            ("main", Some("64Mi".to_owned())),
            ("bare", None)
        ]
    );
    assert_eq!(
        p.pod_memory_request.map(|q| q.canonical()),
        Some("256Mi".into())
    );
    assert_eq!(p.seen.generation, 5);
    assert_eq!(
        p.seen.conditions,
        BTreeMap::from([
            ("PodScheduled".to_owned(), "True".to_owned()),
            ("Ready".to_owned(), "False".to_owned())
        ])
    );
}

#[tokio::test]
async fn a_pod_the_executor_refuses_is_reported_once_and_never_planned() {
    let tree = Tree0::new("refused");
    let (mut node, _, state) = build_node(&tree);
    let exec = FakeExecutor {
        refuse: Some("bad"),
        ..Default::default()
    };
    let sensors = FakeSensors::default();
    let mut set = pod_set(
        &(pod_yaml("good", UID_A, None) + &pod_yaml("bad", UID_B, None)),
        &PodSet::default(),
    );
    // A manifest problem the source found: noted once as well.
    set.problems
        .insert("test.yaml: Pod/default/x: Schema: broken".into());
    for _ in 0..3 {
        node.note_problems(&set.problems);
        node.pass(&set, &exec, &[], &sensors);
    }
    let events = status_events(&state);
    assert_eq!(
        events
            .iter()
            .filter(|e| e.contains("cannot run it"))
            .count(),
        1
    );
    assert_eq!(events.iter().filter(|e| e.contains("broken")).count(), 1);
    assert_eq!(
        exec.applied.lock().unwrap().keys().collect::<Vec<_>>(),
        ["good"]
    );
    assert!(!pod_dir(&tree, "besteffort", UID_B).exists());
    assert!(node.plan().unwrap().pods.iter().all(|p| p.name != "bad"));
}

#[tokio::test]
async fn gating_holds_a_gang_until_it_is_complete() {
    let tree = Tree0::new("gating");
    let (mut node, _, _) = build_node(&tree);
    let (exec, sensors) = (FakeExecutor::default(), FakeSensors::default());
    let group = "apiVersion: scheduling.k8s.io/v1beta1\nkind: Workload\nmetadata: {name: w, namespace: default}\nspec:\n  controllerRef: {apiGroup: batch, kind: Job, name: w}\n  podGroupTemplates:\n  - {name: g, schedulingPolicy: {gang: {minCount: 2}}}\n---\napiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: w-g, namespace: default}\nspec: {workloadRef: {workloadName: w, templateName: g}, schedulingPolicy: {gang: {minCount: 2}}}\n---\n";
    let member = |name: &str, uid: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: {uid}}}\nspec:\n  schedulingGroup: {{podGroupName: w-g}}\n  containers: [{{name: main, command: [sleep, '60']}}]\n---\n"
        )
    };
    let one = pod_set(
        &format!("{group}{}", member("m0", UID_A)),
        &PodSet::default(),
    );
    node.pass(&one, &exec, &[], &sensors);
    assert!(!exec.applied.lock().unwrap()["m0"].startable);
    let two = pod_set(
        &format!("{group}{}{}", member("m0", UID_A), member("m1", UID_B)),
        &one,
    );
    node.pass(&two, &exec, &[], &sensors);
    let applied = exec.applied.lock().unwrap().clone();
    assert!(applied["m0"].startable && applied["m1"].startable);
}

/// A decision as the manager makes it: each pod with the QoS class it was ranked with.
fn decision(pods: &[(&str, &str)]) -> Decision {
    let pods: Vec<PodKey> = pods
        .iter()
        .map(|(name, uid)| PodKey {
            namespace: "default".into(),
            name: (*name).into(),
            uid: (*uid).into(),
        })
        .collect();
    Decision {
        signal: "memory.available".into(),
        observed: 10 * MI,
        threshold: 100 * MI,
        qos: pods
            .iter()
            .map(|k| (k.clone(), QosClass::BestEffort))
            .collect(),
        pods,
        unit: None,
        reason: "usage above request".into(),
        latency: Some(Duration::from_millis(1)),
        stages: Some(crate::eviction::Stages {
            wake: Duration::from_micros(200),
            decide: Duration::from_micros(300),
            kill: Duration::from_micros(500),
        }),
        first_signal_at: None,
        statuses: Vec::new(),
    }
}

fn metric(state: &AgentState, series: &str) -> f64 {
    let text = state.metrics.encode().unwrap();
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The decision carries the evicted pod's QoS class: recorded after the pod left the plan (in
/// cluster mode its Failed status can come first), the eviction is still counted under its
/// class, not `unknown`.
#[tokio::test]
async fn an_eviction_recorded_after_its_pod_left_the_plan_keeps_its_qos_class() {
    let tree = Tree0::new("left-plan");
    let (mut node, _inventory, state) = build_node(&tree);
    let (exec, sensors) = (FakeExecutor::default(), FakeSensors::default());
    node.pass(
        &pod_set(&pod_yaml("b", UID_B, None), &PodSet::default()),
        &exec,
        &[],
        &sensors,
    );
    let before = SystemTime::now();
    node.on_eviction(&decision(&[("a", UID_A)]));
    assert_eq!(
        metric(
            &state,
            "qoslet_evictions_total{signal=\"memory.available\",qos_class=\"BestEffort\"}"
        ),
        1.0
    );
    // The victim by name, with the time of its eviction.
    let at = metric(
        &state,
        "qoslet_pod_eviction_timestamp_seconds{namespace=\"default\",pod=\"a\",signal=\"memory.available\",qos_class=\"BestEffort\"}",
    );
    let since_epoch = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    assert!(
        (since_epoch(before).as_secs_f64()..=since_epoch(SystemTime::now()).as_secs_f64())
            .contains(&at),
        "{at}"
    );
}

#[tokio::test]
async fn an_eviction_is_reported_once_and_survives_a_restart() {
    let tree = Tree0::new("evicted");
    let (mut node, inventory, state) = build_node(&tree);
    let (exec, sensors) = (Arc::new(FakeExecutor::default()), FakeSensors::default());
    let set = pod_set(
        &(pod_yaml("a", UID_A, None) + &pod_yaml("b", UID_B, None)),
        &PodSet::default(),
    );
    node.pass(&set, &*exec, &[], &sensors);
    // The pipeline records the eviction in the node's state file; the node reports it.
    struct Stops;
    impl EvictionAction for Stops {
        async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
            Ok(Outcome {
                first_signal_at: Some(Instant::now()),
                signalled: 1,
                status: EvictedStatus::new(req.message.clone(), &req.seen),
            })
        }
    }
    let a = decision(&[("a", UID_A)]);
    let req = EvictionRequest {
        pod: a.pods[0].clone(),
        cgroups: Default::default(),
        grace: Duration::ZERO,
        message: "The node was low on resource: memory. ".into(),
        annotations: Default::default(),
        seen: Default::default(),
        signal: a.signal.clone(),
        hard: true,
        unit: None,
        revision: set.pods[&a.pods[0]].spec_hash,
    };
    Pipeline::new(Stops, exec.clone(), node.state_file())
        .evict(&req)
        .await
        .unwrap();
    node.on_eviction(&a);
    let exec = FakeExecutor::default();
    node.pass(&set, &exec, &[], &sensors);
    node.pass(&set, &exec, &[], &sensors);
    assert_eq!(metric(&state, "qoslet_evictions_total"), 1.0);
    assert_eq!(
        status_events(&state)
            .iter()
            .filter(|e| e.starts_with("evicted"))
            .count(),
        1
    );
    // Not handed to the executor again, and no longer an eviction candidate.
    assert_eq!(
        exec.applied.lock().unwrap().keys().collect::<Vec<_>>(),
        ["b"]
    );
    assert!(inventory.borrow().pods.iter().all(|p| p.key.name != "a"));
    drop(node);

    // A restart on the same state directory: still evicted.
    let (mut again, inventory, _) = build_node_keeping(&tree);
    let exec = FakeExecutor::default();
    again.pass(&set, &exec, &[], &sensors);
    assert_eq!(
        exec.applied.lock().unwrap().keys().collect::<Vec<_>>(),
        ["b"]
    );
    assert!(inventory.borrow().pods.iter().all(|p| p.key.name != "a"));
    // The manifest changes: a new pod, started again.
    let changed = pod_set(
        &(pod_yaml("a", UID_A, Some("32Mi")) + &pod_yaml("b", UID_B, None)),
        &set,
    );
    again.pass(&changed, &exec, &[], &sensors);
    again.pass(&changed, &exec, &[], &sensors);
    assert_eq!(
        exec.applied.lock().unwrap().keys().collect::<Vec<_>>(),
        ["a", "b"]
    );
}

/// A second node on the same tree and state directory (the first one dropped), as after a
/// restart.
fn build_node_keeping(tree: &Tree0) -> (Node, watch::Receiver<Arc<Inventory>>, Arc<AgentState>) {
    build_node(tree)
}

/// The eviction manager's decisions reach the node as events: every one of 100 evictions is
/// counted (the bounded log the node read before stopped at 64).
#[tokio::test]
async fn a_hundred_evictions_are_all_counted() {
    const PODS: usize = 100;
    let tree = Tree0::new("hundred");
    let (node, _, state) = build_node(&tree);
    // The node root's memory: 100 pods of 1 MiB on a 1000 MiB node, with a threshold that
    // only freeing all of them relieves.
    let memory = tree.0.join("memory");
    let write = |dir: &Path, file: &str, v: &str| std::fs::write(dir.join(file), v).unwrap();
    let cgroup = |dir: &Path, mib: i64| {
        std::fs::create_dir_all(dir).unwrap();
        write(dir, "memory.current", &(mib * MI).to_string());
        write(dir, "memory.stat", "anon 0\ninactive_file 0\n");
        write(dir, "memory.max", "max");
    };
    cgroup(&memory, 900);
    write(&memory, "memory.max", &(1000 * MI).to_string());
    let pods: Vec<ManagedPod> = (0..PODS)
        .map(|i| {
            let dir = memory.join(format!("p{i}"));
            cgroup(&dir, 1);
            ManagedPod {
                key: PodKey {
                    namespace: "default".into(),
                    name: format!("p{i}"),
                    uid: format!("uid-{i}"),
                },
                qos: QosClass::BestEffort,
                request_bytes: 0,
                priority: 0,
                critical: false,
                start_time: i as i64,
                grace_secs: 0,
                revision: 0,
                memory: MemoryCgroup::own(&dir, Tree::V2).unwrap(),
                cgroups: crate::eviction::PodCgroups {
                    procs: vec![CgroupBeneath::own(&dir, Tree::V2).unwrap()],
                    unified: None,
                },
                containers: Vec::new(),
                pod_memory_request: None,
                seen: Default::default(),
            }
        })
        .collect();
    struct Frees(PathBuf);
    impl EvictionAction for Frees {
        async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
            let dir = &req.cgroups.procs[0].display();
            let read = |p: &Path| -> i64 {
                std::fs::read_to_string(p.join("memory.current"))
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap()
            };
            let (held, node) = (read(dir), read(&self.0));
            std::fs::write(self.0.join("memory.current"), (node - held).to_string()).unwrap();
            std::fs::write(dir.join("memory.current"), "0").unwrap();
            Ok(Outcome {
                first_signal_at: Some(Instant::now()),
                signalled: 1,
                status: EvictedStatus::new(req.message.clone(), &req.seen),
            })
        }
    }
    let hard = BTreeMap::from([("memory.available".to_owned(), "200Mi".to_owned())]);
    let min_reclaim = BTreeMap::from([("memory.available".to_owned(), "1000Mi".to_owned())]);
    let (hard, soft) = parse_thresholds(&EvictionInput {
        hard: Some(&hard),
        min_reclaim: Some(&min_reclaim),
        ..Default::default()
    })
    .unwrap();
    let cfg = ManagerConfig {
        hard,
        soft,
        pressure_transition: Duration::from_secs(300),
        max_pod_grace_secs: 0,
        housekeeping: Duration::from_secs(1),
        order: Order::Kubelet,
        release_timeout: Duration::from_millis(100),
    };
    let (_inv_tx, inv_rx) = watch::channel(Arc::new(Inventory {
        pods,
        forests: BTreeMap::new(),
    }));
    let signals = NodeSignals {
        node_root: MemoryCgroup::own(&memory, Tree::V2).unwrap(),
        capacity_bytes: None,
        kubepods: None,
        pids: None,
    };
    let mut manager = Manager::new(cfg, signals, Frees(memory.clone()), inv_rx);
    let mut decisions = manager.decisions();
    for _ in 0..PODS {
        manager
            .pass(None)
            .await
            .unwrap()
            .expect("an eviction each pass");
    }
    let mut seen = 0;
    while let Ok(d) = decisions.try_recv() {
        node.on_eviction(&d);
        seen += 1;
    }
    assert_eq!(seen, PODS);
    assert_eq!(metric(&state, "qoslet_evictions_total"), PODS as f64);
    assert_eq!(
        metric(&state, "qoslet_eviction_decision_latency_seconds_count"),
        PODS as f64
    );
    // Each of the latency's stages once per decision, adding up to it.
    let stage = |s: &str, part: &str| {
        metric(
            &state,
            &format!("qoslet_eviction_stage_latency_seconds_{part}{{stage=\"{s}\"}}"),
        )
    };
    let mut sum = 0.0;
    for s in ["wake", "decide", "kill"] {
        assert_eq!(stage(s, "count"), PODS as f64, "{s}");
        sum += stage(s, "sum");
    }
    let total = metric(&state, "qoslet_eviction_decision_latency_seconds_sum");
    assert!(
        (sum - total).abs() < 1e-6,
        "stages {sum} s, total {total} s"
    );
}

/// One housekeeping window in which every protected container waited 100 more times in
/// `bucket`; whether the node asks for a pass.
fn window(
    node: &mut Node,
    sensors: &FakeSensors,
    hist: &mut crate::policy::cpu_pressure::Histogram,
    bucket: usize,
) -> bool {
    hist[bucket] += 100;
    *sensors.runq.lock().unwrap() = Some(*hist);
    node.housekeeping(sensors)
}

/// A node with the CPU-pressure controller, a BestEffort pod and a Guaranteed one, after its
/// first pass.
fn cpu_pressure_node(
    tree: &Tree0,
    cfg: CpuPressureConfig,
) -> (Node, Arc<AgentState>, FakeExecutor, FakeSensors, PodSet) {
    let (mut node, _, state) = build_node_with(tree, Some(cfg), Mode::Enforce);
    let (exec, sensors) = (FakeExecutor::default(), FakeSensors::default());
    let guaranteed = "apiVersion: v1\nkind: Pod\nmetadata: {name: g, namespace: default, uid: aaaaaaaa-0000-4000-8000-000000000003}\nspec:\n  containers: [{name: main, command: [sleep, '60'], resources: {limits: {cpu: '1', memory: 64Mi}}}]\n---\n";
    let pods = pod_set(
        &(pod_yaml("be", UID_A, None) + guaranteed),
        &PodSet::default(),
    );
    node.pass(&pods, &exec, &[], &sensors);
    (node, state, exec, sensors, pods)
}

/// A Guaranteed pod's run-queue latency over the target raises the controller one level per
/// housekeeping tick; each level reaches the BestEffort tier's files through a pass; calm
/// windows release it level by level back to the kubelet's values.
#[tokio::test]
async fn cpu_pressure_constrains_and_releases_the_besteffort_tier() {
    use crate::policy::cpu_pressure::{CpuPressureConfig, Level};
    let tree = Tree0::new("cpu-pressure");
    let cfg = CpuPressureConfig {
        calm_windows: 2,
        min_wakeups: 1,
        ..CpuPressureConfig::default()
    };
    let (mut node, state, exec, sensors, pods) = cpu_pressure_node(&tree, cfg);
    let tier = tree.0.join("kubepods/besteffort");
    assert!(tier.is_dir());
    // The files a kernel with cpu.idle and the cpuset controller has, at their defaults (an
    // empty cpuset.cpus inherits the parent's). The fake tree is plain files: `expect` checks
    // what was written and truncates it as a kernel would hold it.
    for (f, v) in [
        ("cpu.idle", "0"),
        ("cpu.max", "max 100000"),
        ("cpu.weight", "1"),
        ("cpuset.cpus", ""),
    ] {
        std::fs::write(tier.join(f), v).unwrap();
    }
    let expect = |file: &str, want: &str| {
        let got = std::fs::read_to_string(tier.join(file)).unwrap();
        assert!(got.starts_with(want), "{file}: {got:?}, want {want:?}");
        std::fs::write(tier.join(file), want).unwrap();
    };
    let mut hist = [0u64; qoslet_common::sched::RUNQ_HIST_BUCKETS];
    *sensors.runq.lock().unwrap() = Some(hist);
    // The first window sets the baseline: no pressure yet. (It asks for a pass anyway: the
    // change feed saw the files written above.)
    node.housekeeping(&sensors);
    node.pass(&pods, &exec, &[], &sensors);
    assert_eq!(node.cpu_pressure_level(), Some(Level::None));

    // 100 waits in [16, 32) ms: over the 5 ms target.
    for want in [Level::Idle, Level::Cpuset, Level::Cap, Level::Floor] {
        assert!(
            window(&mut node, &sensors, &mut hist, 14),
            "every level change asks for a pass"
        );
        assert_eq!(node.cpu_pressure_level(), Some(want));
        node.pass(&pods, &exec, &[], &sensors);
        match want {
            Level::Idle => {
                expect("cpu.idle", "1");
                expect("cpu.max", "max 100000");
                // Below the cpuset level the tier has every pod CPU.
                expect("cpuset.cpus", "0-3");
            }
            // Half of the 4 pod CPUs, the highest, and no cap yet.
            Level::Cpuset => {
                expect("cpuset.cpus", "2-3");
                expect("cpu.max", "max 100000");
            }
            // 50% and 10% of 4000m over a 100 ms period.
            Level::Cap => expect("cpu.max", "200000 100000"),
            _ => expect("cpu.max", "40000 100000"),
        }
    }
    // At the floor: nothing more to do.
    window(&mut node, &sensors, &mut hist, 14);
    assert_eq!(node.cpu_pressure_level(), Some(Level::Floor));
    assert_eq!(metric(&state, "qoslet_cpu_pressure_level"), 4.0);
    assert_eq!(
        metric(&state, "qoslet_besteffort_cpu_granted_millicores"),
        400.0
    );
    assert!(
        metric(
            &state,
            "qoslet_qos_runqueue_latency_p99_seconds{qos_class=\"Guaranteed\"}"
        ) > 0.016
    );
    assert_eq!(
        metric(
            &state,
            "qoslet_cpu_pressure_steps_total{direction=\"engage\""
        ),
        4.0
    );

    // Calm: waits in [4, 8) µs. Two calm windows per released level.
    let mut levels = Vec::new();
    for _ in 0..9 {
        let before = node.cpu_pressure_level();
        let pass = window(&mut node, &sensors, &mut hist, 2);
        let now = node.cpu_pressure_level();
        assert!(pass || now == before, "a release asks for a pass");
        if pass {
            node.pass(&pods, &exec, &[], &sensors);
        }
        levels.push(now.unwrap());
    }
    assert_eq!(
        levels,
        [
            Level::Floor,
            Level::Cap,
            Level::Cap,
            Level::Cpuset,
            Level::Cpuset,
            Level::Idle,
            Level::Idle,
            Level::None,
            Level::None
        ]
    );
    expect("cpu.idle", "0");
    expect("cpu.max", "max 100000");
    expect("cpuset.cpus", "0-3");
    assert_eq!(metric(&state, "qoslet_cpu_pressure_level"), 0.0);
    assert_eq!(
        metric(&state, "qoslet_besteffort_cpu_granted_millicores"),
        4000.0
    );
    let events = status_events(&state);
    assert_eq!(
        events
            .iter()
            .filter(|e| e.starts_with("cpu pressure: engage"))
            .count(),
        4,
        "{events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e.starts_with("cpu pressure: release"))
            .count(),
        4,
        "{events:?}"
    );
}

/// A protected pod that waits while the BestEffort tier's `cpu.stat` does not move is waiting
/// behind something else: the tier is left alone. Once the tier uses CPU, the same windows
/// engage.
#[tokio::test]
async fn cpu_pressure_blames_no_wait_on_an_idle_besteffort_tier() {
    use crate::policy::cpu_pressure::{CpuPressureConfig, Level};
    let tree = Tree0::new("cpu-pressure-idle");
    let cfg = CpuPressureConfig {
        min_wakeups: 1,
        ..CpuPressureConfig::default()
    };
    let (mut node, state, _, sensors, _) = cpu_pressure_node(&tree, cfg);
    let tier = tree.0.join("kubepods/besteffort");
    let usage =
        |usec: u64| std::fs::write(tier.join("cpu.stat"), format!("usage_usec {usec}\n")).unwrap();
    usage(1000);
    let mut hist = [0u64; qoslet_common::sched::RUNQ_HIST_BUCKETS];
    *sensors.runq.lock().unwrap() = Some(hist);
    node.housekeeping(&sensors);
    // Waits in [16, 32) ms, far over the 5 ms target, while the tier's counter stands still.
    for _ in 0..3 {
        window(&mut node, &sensors, &mut hist, 14);
        assert_eq!(node.cpu_pressure_level(), Some(Level::None));
    }
    assert_eq!(metric(&state, "qoslet_besteffort_cpu_used_millicores"), 0.0);
    // The tier runs (a second of CPU between two ticks a moment apart): the same wait engages.
    usage(1_001_000);
    // (The fake tier has neither cpu.idle nor cpuset.cpus: its first lever is the cap.)
    window(&mut node, &sensors, &mut hist, 14);
    assert_eq!(node.cpu_pressure_level(), Some(Level::Cap));
    assert!(metric(&state, "qoslet_besteffort_cpu_used_millicores") > 0.0);
}

/// Without the controller the BestEffort tier's cpu.idle and cpu.max are not qoslet's.
#[tokio::test]
async fn without_the_controller_the_besteffort_tier_keeps_its_cpu_files() {
    let tree = Tree0::new("cpu-pressure-off");
    let (mut node, _, _) = build_node(&tree);
    let (exec, sensors) = (FakeExecutor::default(), FakeSensors::default());
    let pods = pod_set(&pod_yaml("be", UID_A, None), &PodSet::default());
    node.pass(&pods, &exec, &[], &sensors);
    let tier = tree.0.join("kubepods/besteffort");
    for (f, v) in [("cpu.idle", "1"), ("cpu.max", "5000 100000")] {
        std::fs::write(tier.join(f), v).unwrap();
    }
    node.pass(&pods, &exec, &[], &sensors);
    assert_eq!(std::fs::read_to_string(tier.join("cpu.idle")).unwrap(), "1");
    assert_eq!(
        std::fs::read_to_string(tier.join("cpu.max")).unwrap(),
        "5000 100000"
    );
}

#[test]
fn a_difference_is_logged_and_counted_once_when_first_seen() {
    let tree = Tree0::new("drift");
    // The "kubelet's" kubepods, whose CPU weight differs from the plan's (4 CPUs: 4096 shares).
    let weight = tree.0.join("kubepods/cpu.weight");
    std::fs::create_dir_all(weight.parent().unwrap()).unwrap();
    std::fs::write(&weight, "100\n").unwrap();
    let (mut node, _, state) = build_node_with(&tree, None, Mode::Observe);
    let (exec, sensors) = (FakeExecutor::default(), FakeSensors::default());
    let logs = crate::test_log::LogBuffer::default();
    let subscriber = logs.subscriber();
    let line = |current: &str| format!("file=\"cpu.weight\" current=Some(\"{current}\")");
    // Every difference logged is counted, and nothing else (the passes find other differences
    // too: the tiers this test did not make).
    let logged_is_counted = || {
        assert_eq!(
            metric(&state, "qoslet_cgroup_drift_total"),
            logs.count("Cgroup drift") as f64,
            "{}",
            logs.text()
        );
    };
    tracing::subscriber::with_default(subscriber, || {
        node.pass(&PodSet::default(), &exec, &[], &sensors);
        assert_eq!(logs.count(&line("100")), 1, "the first pass logs the drift");
        logged_is_counted();
        let first = logs.count("Cgroup drift");
        // The "kubelet" writes the same value again: read again, drifting as before.
        for _ in 0..2 {
            std::fs::write(&weight, "100\n").unwrap();
            node.pass(&PodSet::default(), &exec, &[], &sensors);
        }
        assert_eq!(
            logs.count("Cgroup drift"),
            first,
            "unchanged differences are not logged again"
        );
        logged_is_counted();
        std::fs::write(&weight, "200\n").unwrap();
        node.pass(&PodSet::default(), &exec, &[], &sensors);
        assert_eq!(logs.count(&line("200")), 1, "a changed drift is logged");
        logged_is_counted();
        // The file holds the plan's value for a pass, then the same difference comes back: news
        // again.
        let wanted = logs
            .text()
            .split("wanted=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .expect("the drift line names the plan's value")
            .to_owned();
        std::fs::write(&weight, format!("{wanted}\n")).unwrap();
        let before = logs.count("Cgroup drift");
        node.pass(&PodSet::default(), &exec, &[], &sensors);
        assert_eq!(
            logs.count("Cgroup drift"),
            before,
            "the plan's value is no difference"
        );
        std::fs::write(&weight, "200\n").unwrap();
        node.pass(&PodSet::default(), &exec, &[], &sensors);
        assert_eq!(
            logs.count(&line("200")),
            2,
            "a difference that came back is logged"
        );
        logged_is_counted();
    });
    assert_eq!(
        std::fs::read_to_string(&weight).unwrap(),
        "200\n",
        "observe mode wrote nothing"
    );
}

/// What the state file and the executor held when the action killed, and whether the pod's cgroup
/// v2 directory was marked by then.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct AtKill {
    recorded: bool,
    executor_told: bool,
    marked: bool,
}

/// An action that notes what was done before its kill, then waits as a kill waits for the
/// processes to exit.
struct NotingKill {
    state: Arc<Mutex<StateFile>>,
    exec: Arc<FakeExecutor>,
    seen: Arc<Mutex<Option<AtKill>>>,
}

impl EvictionAction for NotingKill {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        let at = AtKill {
            recorded: self.state.lock().unwrap().evicted().any(|k| k == req.pod),
            executor_told: self.exec.evicted.lock().unwrap().contains(&req.pod),
            marked: req
                .cgroups
                .unified
                .as_ref()
                .and_then(|d| d.open().ok())
                .and_then(|d| crate::persist::EvictionMark::read(d.as_fd()))
                .is_some(),
        };
        *self.seen.lock().unwrap() = Some(at);
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(Outcome {
            first_signal_at: Some(Instant::now()),
            signalled: 1,
            status: EvictedStatus::new(req.message.clone(), &req.seen),
        })
    }
}

#[tokio::test]
async fn the_kill_goes_first_and_the_mark_on_the_pods_cgroup_keeps_the_eviction() {
    let tree = Tree0::new("kill-first");
    let pod_dir = tree.0.join("podaaaa");
    std::fs::create_dir_all(&pod_dir).unwrap();
    let key = PodKey {
        namespace: "default".into(),
        name: "a".into(),
        uid: UID_A.into(),
    };
    let pod = CgroupBeneath {
        fs: Arc::new(CgroupFs::open(tree.mounts(), CgroupPath::root()).unwrap()),
        tree: Tree::V2,
        path: CgroupPath::parse("/podaaaa").unwrap(),
    };
    let req = |unified: Option<CgroupBeneath>| EvictionRequest {
        pod: key.clone(),
        cgroups: crate::eviction::PodCgroups {
            procs: vec![pod.clone()],
            unified,
        },
        grace: Duration::ZERO,
        message: "The node was low on resource: memory. ".into(),
        annotations: Default::default(),
        seen: Default::default(),
        signal: "memory.available".into(),
        hard: true,
        unit: None,
        revision: 42,
    };
    let run = |r: EvictionRequest| async move {
        let state = Arc::new(Mutex::new(StateFile::in_memory()));
        let exec = Arc::new(FakeExecutor::default());
        let seen = Arc::new(Mutex::new(None));
        let action = NotingKill {
            state: state.clone(),
            exec: exec.clone(),
            seen: seen.clone(),
        };
        let e = Pipeline::new(action, exec.clone(), state.clone());
        e.evict(&r).await.unwrap();
        let seen = seen.lock().unwrap().expect("the action ran");
        let after = (
            state.lock().unwrap().evicted().any(|k| k == r.pod),
            exec.evicted.lock().unwrap().contains(&r.pod),
        );
        (seen, after)
    };

    // A cgroup v2 directory: marked before the kill, nothing else; after it the executor knows
    // and the state file has it.
    let (seen, after) = run(req(Some(pod.clone()))).await;
    assert_eq!(
        seen,
        AtKill {
            recorded: false,
            executor_told: false,
            marked: true
        }
    );
    assert_eq!(after, (true, true));
    // The mark is what a restart reads if the state file never got it.
    let fd = pod.open().unwrap();
    let mark = crate::persist::EvictionMark::read(fd.as_fd()).expect("the pod's cgroup is marked");
    assert_eq!((mark.key(), mark.spec), (key.clone(), 42));

    // No v2 directory, nothing to mark: the state file has it before the kill.
    let (seen, after) = run(req(None)).await;
    assert_eq!(
        seen,
        AtKill {
            recorded: true,
            executor_told: false,
            marked: false
        }
    );
    assert_eq!(after, (true, true));
}

/// The node publishes its conditions on the agent's state as they change (cluster mode's
/// reporter reacts to them; no metric is polled), and only when they change.
#[tokio::test]
async fn conditions_are_published_as_they_change() {
    let tree = Tree0::new("conditions-published");
    let (node, _inventory, state) = build_node(&tree);
    let mut rx = state.conditions.subscribe();
    node.on_conditions(&[NodeCondition::MemoryPressure]);
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow_and_update(), [NodeCondition::MemoryPressure]);
    node.on_conditions(&[NodeCondition::MemoryPressure]);
    assert!(!rx.has_changed().unwrap(), "the same conditions again");
    node.on_conditions(&[]);
    assert!(rx.borrow_and_update().is_empty());
}

mod run_loop;
