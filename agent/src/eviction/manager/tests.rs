//! The manager's pass on fake cgroup files (v2 layout in a temp directory) with a recording
//! action that "frees" the pod's memory the way a kill would.

use std::{fs, path::Path, path::PathBuf, sync::Mutex};

use super::*;
use crate::{
    cgroup::CgroupBeneath,
    eviction::{
        action::{EvictedStatus, Outcome, PodCgroups, SeenPod},
        inventory::ManagedContainer,
        signals::MemoryCgroup,
    },
    policy::eviction::{EvictionInput, ThresholdValue, parse_thresholds},
    policy::qos::QosClass,
};

const MI: i64 = 1 << 20;

struct Fake {
    node: PathBuf,
    calls: Mutex<Vec<(String, Duration)>>,
    requests: Mutex<Vec<EvictionRequest>>,
}

impl Fake {
    /// Frees from the node at `node`.
    fn new(node: &Path) -> Self {
        Self {
            node: node.to_path_buf(),
            calls: Mutex::default(),
            requests: Mutex::default(),
        }
    }
}

/// An action whose last Eviction API request is still refused (by a PodDisruptionBudget).
struct Refused<'a>(&'a Fake, PodKey);

impl EvictionAction for Refused<'_> {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        self.0.evict(req).await
    }

    fn awaiting(&self) -> Option<PodKey> {
        Some(self.1.clone())
    }
}

impl EvictionAction for &Fake {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        self.calls
            .lock()
            .unwrap()
            .push((req.pod.name.clone(), req.grace));
        self.requests.lock().unwrap().push(req.clone());
        let dir = &req.cgroups.procs[0].display();
        let held: i64 = fs::read_to_string(dir.join("memory.current"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let node: i64 = fs::read_to_string(self.node.join("memory.current"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        write(&self.node, "memory.current", &(node - held).to_string());
        write(dir, "memory.current", "0");
        write(dir, "cgroup.procs", "");
        Ok(Outcome {
            first_signal_at: Some(Instant::now()),
            signalled: 1,
            status: EvictedStatus::new(req.message.clone(), &req.seen),
        })
    }
}

/// A soft memory.available threshold of 500Mi with a 1 s grace period (a grace of 0s would make
/// it hard, as upstream: `isHardEvictionThreshold`).
fn soft_memory_500mi_1s() -> Vec<Threshold> {
    let soft = BTreeMap::from([("memory.available".to_owned(), "500Mi".to_owned())]);
    let grace = BTreeMap::from([("memory.available".to_owned(), "1s".to_owned())]);
    parse_thresholds(&EvictionInput {
        hard: Some(&BTreeMap::new()),
        soft: Some(&soft),
        soft_grace: Some(&grace),
        ..Default::default()
    })
    .unwrap()
    .1
}

fn write(dir: &Path, file: &str, v: &str) {
    fs::write(dir.join(file), v).unwrap();
}

fn cgroup(dir: &Path, current_mib: i64, max: &str) {
    fs::create_dir_all(dir).unwrap();
    write(dir, "memory.current", &(current_mib * MI).to_string());
    write(dir, "memory.stat", "anon 0\ninactive_file 0\n");
    write(dir, "memory.max", max);
    write(dir, "cgroup.procs", "1\n");
}

pub(super) fn config(hard: &[(&str, &str)], min_reclaim: &[(&str, &str)]) -> ManagerConfig {
    let m = |v: &[(&str, &str)]| -> BTreeMap<String, String> {
        v.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
    };
    let (hard_m, mr) = (m(hard), m(min_reclaim));
    let (hard, soft) = parse_thresholds(&EvictionInput {
        hard: Some(&hard_m),
        min_reclaim: Some(&mr),
        ..Default::default()
    })
    .unwrap();
    ManagerConfig {
        hard,
        soft,
        pressure_transition: Duration::from_secs(300),
        max_pod_grace_secs: 0,
        housekeeping: Duration::from_secs(1),
        order: Order::GangAware,
        release_timeout: Duration::from_secs(2),
    }
}

fn pod(root: &Path, name: &str, mib: i64, request_mib: i64) -> ManagedPod {
    let dir = root.join(name);
    cgroup(&dir, mib, "max");
    ManagedPod {
        key: PodKey {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        },
        qos: QosClass::Burstable,
        request_bytes: request_mib * MI,
        priority: 0,
        critical: false,
        start_time: 0,
        grace_secs: 30,
        revision: 0,
        memory: MemoryCgroup::own(&dir, crate::cgroup::Tree::V2).unwrap(),
        cgroups: PodCgroups {
            procs: vec![CgroupBeneath::own(&dir, crate::cgroup::Tree::V2).unwrap()],
            unified: None,
        },
        containers: Vec::new(),
        pod_memory_request: None,
        seen: SeenPod::default(),
    }
}

/// A 1000 MiB node with pods a (300 MiB, request 0), b (200, request 0), c (100, request 500).
fn setup(tag: &str) -> (PathBuf, NodeSignals, Arc<Inventory>) {
    let root = std::env::temp_dir().join(format!("qoslet-manager-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    cgroup(&root, 600, &(1000 * MI).to_string());
    let pods = vec![
        pod(&root, "a", 300, 0),
        pod(&root, "b", 200, 0),
        pod(&root, "c", 100, 500),
    ];
    let signals = NodeSignals {
        node_root: MemoryCgroup::own(&root, crate::cgroup::Tree::V2).unwrap(),
        capacity_bytes: None,
        kubepods: None,
        pids: None,
    };
    (
        root,
        signals,
        Arc::new(Inventory {
            pods,
            forests: BTreeMap::new(),
        }),
    )
}

#[tokio::test]
async fn nothing_happens_above_the_threshold() {
    let (root, signals, inv) = setup("idle");
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(inv);
    let mut m = Manager::new(
        config(&[("memory.available", "300Mi")], &[]),
        signals,
        &fake,
        rx,
    );
    assert_eq!(m.pass(None).await.unwrap(), None);
    assert!(m.conditions().borrow().is_empty());
    assert!(fake.calls.lock().unwrap().is_empty());
    fs::remove_dir_all(root).unwrap();
}

/// `allocatableMemory.available` (the kubelet's copy of the hard `memory.available` threshold)
/// reads the pods' cgroup: its limit less its working set. Met there while the node has room,
/// it evicts as the kubelet does; without a limit on the pods' cgroup, or with no pods' cgroup
/// at all, it is not observed.
#[tokio::test]
async fn the_pods_cgroup_meets_the_allocatable_threshold_while_the_node_has_room() {
    let (root, mut signals, inv) = setup("allocatable");
    let kubepods = root.join("kubepods");
    // 600 MiB used of a 650 MiB limit: 50Mi available to pods; the node has 400Mi.
    cgroup(&kubepods, 600, &(650 * MI).to_string());
    signals.kubepods = Some(MemoryCgroup::own(&kubepods, crate::cgroup::Tree::V2).unwrap());
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(inv);
    let cfg = config(
        &[
            ("memory.available", "100Mi"),
            ("allocatableMemory.available", "100Mi"),
        ],
        &[],
    );
    let observed = signals.observe().unwrap();
    assert_eq!(observed["allocatableMemory.available"].available, 50 * MI);
    let mut m = Manager::new(cfg.clone(), signals, &fake, rx);
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.signal, "allocatableMemory.available");
    assert_eq!((d.observed, d.threshold), (50 * MI, 100 * MI));
    assert_eq!(d.pods[0].name, "a");

    // No limit on the pods' cgroup: not observed, as the kubelet's is absent then.
    write(&kubepods, "memory.max", "max");
    let (root2, mut no_limit, _) = setup("allocatable-none");
    no_limit.kubepods = Some(MemoryCgroup::own(&kubepods, crate::cgroup::Tree::V2).unwrap());
    assert!(
        !no_limit
            .observe()
            .unwrap()
            .contains_key("allocatableMemory.available")
    );
    fs::remove_dir_all(root).unwrap();
    fs::remove_dir_all(root2).unwrap();
}

#[tokio::test]
async fn one_unit_per_pass_then_minimum_reclaim_until_resolved() {
    let (root, signals, inv) = setup("reclaim");
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(inv);
    // Available 400Mi < 500Mi: met. Minimum reclaim 250Mi keeps it met until 750Mi available.
    let cfg = config(
        &[("memory.available", "500Mi")],
        &[("memory.available", "250Mi")],
    );
    let mut m = Manager::new(cfg, signals, &fake, rx);
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods[0].name, "a");
    assert_eq!((d.observed, d.threshold), (400 * MI, 500 * MI));
    assert_eq!(d.statuses[0].1.reason, "Evicted");
    assert!(d.latency.is_some());
    assert_eq!(*m.conditions().borrow(), [NodeCondition::MemoryPressure]);
    // 700Mi available: above the threshold, below threshold + minimum reclaim.
    let d = m
        .pass(None)
        .await
        .unwrap()
        .expect("minimum reclaim goes on");
    assert_eq!(d.pods[0].name, "b");
    // 900Mi available: resolved; c (under its request) stays.
    assert_eq!(m.pass(None).await.unwrap(), None);
    let calls = fake.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            ("a".to_owned(), Duration::ZERO),
            ("b".to_owned(), Duration::ZERO)
        ]
    );
    let stats = m.stats().lock().unwrap().clone();
    assert_eq!(stats.evictions["memory.available"], 2);
    assert_eq!(stats.passes, 3);
    assert_eq!(
        *m.conditions().borrow(),
        [NodeCondition::MemoryPressure],
        "transition period"
    );
    fs::remove_dir_all(root).unwrap();
}

#[tokio::test]
async fn a_soft_threshold_waits_for_its_grace_and_uses_the_pod_grace_period() {
    let (root, signals, inv) = setup("soft");
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(inv);
    let mut cfg = config(&[("memory.available", "100Mi")], &[]);
    cfg.soft = soft_memory_500mi_1s();
    cfg.max_pod_grace_secs = 10;
    let mut m = Manager::new(cfg, signals, &fake, rx);
    assert_eq!(
        m.pass(None).await.unwrap(),
        None,
        "within the soft grace period"
    );
    assert_eq!(*m.conditions().borrow(), [NodeCondition::MemoryPressure]);
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let d = m.pass(None).await.unwrap().expect("a soft eviction");
    assert_eq!(d.pods[0].name, "a");
    assert_eq!(
        fake.calls.lock().unwrap()[0].1,
        Duration::from_secs(10),
        "min(30, 10)"
    );
    fs::remove_dir_all(root).unwrap();
}

/// The Eviction API as `evictionMethod: api` uses it: a request kills nothing here and waits
/// (a PodDisruptionBudget refuses it) until `refused` is cleared, then is taken.
struct TakenLater<'a> {
    fake: &'a Fake,
    pending: Mutex<Option<PodKey>>,
    refused: std::sync::atomic::AtomicBool,
}

impl EvictionAction for &TakenLater<'_> {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        self.fake
            .calls
            .lock()
            .unwrap()
            .push((req.pod.name.clone(), req.grace));
        *self.pending.lock().unwrap() = Some(req.pod.clone());
        Ok(Outcome {
            first_signal_at: None,
            signalled: 0,
            status: EvictedStatus::new(req.message.clone(), &req.seen),
        })
    }

    fn awaiting(&self) -> Option<PodKey> {
        if self.refused.load(std::sync::atomic::Ordering::Relaxed) {
            self.pending.lock().unwrap().clone()
        } else {
            None
        }
    }
}

/// Once the Eviction API takes the request that waited, its pod terminates: the next pass waits
/// for it to release its memory and evicts no other, so one shortfall costs one pod, not every
/// pod that could have been chosen while the budget refused (seen on the real cluster: both of a
/// ReplicaSet's hogs went when the budget was deleted). The node drops the decided pod from the
/// inventory at once, so the manager keeps the cgroups it decided on.
#[tokio::test]
async fn an_eviction_taken_after_waiting_is_released_before_another_is_chosen() {
    let (root, signals, inv) = setup("taken");
    let fake = Fake::new(&root);
    let (tx, rx) = watch::channel(inv.clone());
    let mut cfg = config(&[], &[]);
    cfg.soft = soft_memory_500mi_1s();
    let action = TakenLater {
        fake: &fake,
        pending: Mutex::default(),
        refused: true.into(),
    };
    let mut m = Manager::new(cfg, signals, &action, rx);
    assert_eq!(m.pass(None).await.unwrap(), None, "within the soft grace");
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let d = m.pass(None).await.unwrap().expect("the request for a");
    assert_eq!(d.pods[0].name, "a");
    // Decided, the pod leaves the node's inventory; its processes run on.
    tx.send_replace(Arc::new(Inventory {
        pods: inv.pods[1..].to_vec(),
        forests: BTreeMap::new(),
    }));
    assert_eq!(m.pass(None).await.unwrap(), None, "the budget refuses");
    action
        .refused
        .store(false, std::sync::atomic::Ordering::Relaxed);
    // The pod's processes end and its memory leaves the node a moment after the API took it.
    let (dir, node) = (root.join("a"), root.clone());
    let terminating = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        write(&dir, "cgroup.procs", "");
        write(&dir, "memory.current", "0");
        write(&node, "memory.current", &(300 * MI).to_string());
    });
    let t = Instant::now();
    assert_eq!(m.pass(None).await.unwrap(), None, "no other pod chosen");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "the pass waited for the pod's release: {:?}",
        t.elapsed()
    );
    terminating.join().unwrap();
    assert_eq!(m.pass(None).await.unwrap(), None, "relieved");
    assert_eq!(fake.calls.lock().unwrap().len(), 1, "another pod evicted");
    fs::remove_dir_all(root).unwrap();
}

/// While an evicted unit's processes remain, the release wait reads their `cgroup.procs` alone:
/// reading the pods' memory or the node's signals (the root's `memory.stat` flushes every
/// cgroup's statistics) then would only take CPU from the kernel freeing it. Once they are gone,
/// one read of the pod's memory, back under a tenth of what it was to free, ends the wait.
#[tokio::test]
async fn the_release_wait_reads_no_memory_while_the_processes_remain() {
    let (root, signals, inv) = setup("release-procs");
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(inv.clone());
    let m = Manager::new(
        config(&[("memory.available", "500Mi")], &[]),
        signals,
        &fake,
        rx,
    );
    let threshold = m.cfg.hard[0].clone();
    let (dir, node) = (root.join("a"), root.clone());
    let exiting = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        write(&dir, "memory.current", "0");
        write(&node, "memory.current", &(300 * MI).to_string());
        write(&dir, "cgroup.procs", "");
    });
    let t = Instant::now();
    let polls = m
        .wait_released(&threshold, &[&inv.pods[0]], 300 * MI, Resource::Memory)
        .await;
    exiting.join().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "the wait ended with the processes: {:?}",
        t.elapsed()
    );
    assert!(polls > 2, "{polls} polls of cgroup.procs");
    assert_eq!(
        m.stats().lock().unwrap().release_reads,
        1,
        "memory read only once the processes were gone"
    );
    fs::remove_dir_all(root).unwrap();
}

/// While the last Eviction API request waits (a PodDisruptionBudget refuses it), a soft
/// threshold evicts no other pod, so refused requests do not pile up; a hard one still does.
#[tokio::test]
async fn a_refused_eviction_holds_back_soft_evictions_but_not_hard_ones() {
    let (root, signals, inv) = setup("refused");
    let fake = Fake::new(&root);
    let waiting = PodKey {
        namespace: "ns".into(),
        name: "refused".into(),
        uid: "00000000-0000-0000-0000-0000000000ee".into(),
    };
    let (_tx, rx) = watch::channel(inv.clone());
    let mut cfg = config(&[], &[]);
    cfg.soft = soft_memory_500mi_1s();
    let mut m = Manager::new(cfg, signals, Refused(&fake, waiting), rx);
    assert_eq!(m.pass(None).await.unwrap(), None, "within the soft grace");
    tokio::time::sleep(Duration::from_millis(1050)).await;
    for _ in 0..3 {
        assert_eq!(m.pass(None).await.unwrap(), None);
    }
    assert!(fake.calls.lock().unwrap().is_empty(), "another pod evicted");
    assert_eq!(m.stats().lock().unwrap().awaiting_handover, 3);
    assert_eq!(*m.conditions().borrow(), [NodeCondition::MemoryPressure]);
    fs::remove_dir_all(root).unwrap();

    let (root, signals, inv) = setup("refused-hard");
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(inv);
    let waiting = PodKey {
        namespace: "ns".into(),
        name: "refused".into(),
        uid: "00000000-0000-0000-0000-0000000000ee".into(),
    };
    let mut m = Manager::new(
        config(&[("memory.available", "500Mi")], &[]),
        signals,
        Refused(&fake, waiting),
        rx,
    );
    assert!(
        m.pass(None).await.unwrap().is_some(),
        "a hard threshold acts"
    );
    fs::remove_dir_all(root).unwrap();
}

#[tokio::test]
async fn nothing_evictable_is_counted() {
    let (root, signals, _) = setup("none");
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(Arc::new(Inventory::default()));
    let mut m = Manager::new(
        config(&[("memory.available", "500Mi")], &[]),
        signals,
        &fake,
        rx,
    );
    assert_eq!(m.pass(None).await.unwrap(), None);
    assert_eq!(m.stats().lock().unwrap().nothing_to_evict, 1);
    fs::remove_dir_all(root).unwrap();
}

/// The kubelet's `evictionMessage` quantities: the threshold as configured (a percentage as its
/// amount, BinarySI), memory available in BinarySI, pids available in DecimalSI, each as Go's
/// `Quantity.String()` prints it. A pod whose stats name no container over its request adds no
/// sentence.
#[test]
fn the_message_prints_quantities_as_the_kubelet_does() {
    let mem = "memory.available";
    let message = |resource, t: &Threshold, amount, available| {
        eviction_message(resource, t, amount, available, &stats(None, Vec::new())).0
    };
    assert_eq!(
        message(
            Resource::Memory,
            &t(mem, q("100Mi")),
            104_857_600,
            52_428_800
        ),
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
    );
    assert_eq!(
        message(
            Resource::Memory,
            &t(mem, ThresholdValue::Percentage(0.1)),
            107_374_182,
            12_345_678
        ),
        "The node was low on resource: memory. Threshold quantity: 107374182, available: 12345678. "
    );
    assert_eq!(
        message(Resource::Memory, &t(mem, q("0.5Gi")), 536_870_912, 1000),
        // Under 1024 a BinarySI quantity prints as DecimalSI: 1000 is "1k", as in Go.
        "The node was low on resource: memory. Threshold quantity: 512Mi, available: 1k. "
    );
    assert_eq!(
        message(Resource::Pids, &t("pid.available", q("1000")), 1000, 32_000),
        "The node was low on resource: pids. Threshold quantity: 1k, available: 32k. "
    );
}

fn t(signal: &str, value: ThresholdValue) -> Threshold {
    Threshold {
        signal: signal.into(),
        value,
        grace_period_secs: 0,
        min_reclaim: None,
    }
}

fn q(s: &str) -> ThresholdValue {
    ThresholdValue::Quantity(s.parse().unwrap())
}

/// The stats of pod `hog`: its working set and pod-level request, its containers'.
fn stats(
    pod: Option<(i64, &str)>,
    containers: Vec<(&'static str, i64, Option<&str>)>,
) -> PodUsage<'static> {
    PodUsage {
        name: "hog",
        pod: pod.map(|(usage, request)| (usage, request.parse().unwrap())),
        containers: containers
            .into_iter()
            .map(|(name, working_set, request)| ContainerUsage {
                name,
                working_set,
                request: request.map(|r| r.parse().unwrap()),
            })
            .collect(),
    }
}

/// A memory eviction at `memory.available<100Mi` with 50Mi available.
fn memory_message(s: &PodUsage<'_>) -> (String, BTreeMap<String, String>) {
    eviction_message(
        Resource::Memory,
        &t("memory.available", q("100Mi")),
        100 * MI,
        50 * MI,
        s,
    )
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect()
}

const LOW: &str =
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. ";

/// helpers.go `evictionMessage`: a container above its memory request is named with its usage
/// and request; one under it is not. The Event's annotations list the offenders.
#[test]
fn a_container_over_its_request_is_named_and_one_under_it_is_not() {
    let (message, ann) = memory_message(&stats(
        None,
        vec![
            ("app", 300 * MI, Some("100Mi")),
            ("sidecar", 50 * MI, Some("64Mi")),
        ],
    ));
    assert_eq!(
        message,
        format!(
            "{LOW}Container app was using 300Mi, request is 100Mi, has larger consumption of memory. "
        )
    );
    assert_eq!(
        ann,
        annotations(&[
            ("offending_containers", "app"),
            ("offending_containers_usage", "300Mi"),
            ("starved_resource", "memory"),
        ])
    );
    // Nobody over: the keys are there, empty.
    let (message, ann) = memory_message(&stats(None, vec![("sidecar", 64 * MI, Some("64Mi"))]));
    assert_eq!(message, LOW);
    assert_eq!(
        ann,
        annotations(&[
            ("offending_containers", ""),
            ("offending_containers_usage", ""),
            ("starved_resource", "memory"),
        ])
    );
}

/// An init container is compared as a regular one, in the order of the pod's stats; a usage that
/// is no whole number of KiB prints as a plain number (Go's BinarySI `String()`), a request in
/// its own format ("100M" stays "100M").
#[test]
fn an_init_container_is_named_in_the_order_of_the_stats() {
    let (message, ann) = memory_message(&stats(
        None,
        vec![
            ("init-db", 123_456_789, Some("100M")),
            ("app", 2 * 1024 * MI, Some("1Gi")),
        ],
    ));
    assert_eq!(
        message,
        format!(
            "{LOW}Container init-db was using 123456789, request is 100M, has larger consumption of memory. \
             Container app was using 2Gi, request is 1Gi, has larger consumption of memory. "
        )
    );
    assert_eq!(
        ann,
        annotations(&[
            ("offending_containers", "init-db,app"),
            ("offending_containers_usage", "123456789,2Gi"),
            ("starved_resource", "memory"),
        ])
    );
}

/// A container without a memory request has Go's zero Quantity as its request: any usage is
/// over it, and it prints "0"; a usage of 0 is not over it.
#[test]
fn a_container_without_a_request_is_over_a_request_of_0() {
    let (message, ann) = memory_message(&stats(
        None,
        vec![("idle", 0, None), ("worker", 1536 * 1024, None)],
    ));
    assert_eq!(
        message,
        format!(
            "{LOW}Container worker was using 1536Ki, request is 0, has larger consumption of memory. "
        )
    );
    assert_eq!(ann["offending_containers"], "worker");
    assert_eq!(ann["offending_containers_usage"], "1536Ki");
}

/// The kubelet computes no usage for pids: no container sentence, empty offenders,
/// `starved_resource: pids`; and no container is read for it.
#[test]
fn a_pids_eviction_names_no_container() {
    let s = stats(
        Some((2 * 1024 * MI, "1Gi")),
        vec![("app", 300 * MI, Some("100Mi"))],
    );
    let (message, ann) = eviction_message(
        Resource::Pids,
        &t("pid.available", q("1000")),
        1000,
        32_000,
        &s,
    );
    assert_eq!(
        message,
        "The node was low on resource: pids. Threshold quantity: 1k, available: 32k. "
    );
    assert_eq!(
        ann,
        annotations(&[
            ("offending_containers", ""),
            ("offending_containers_usage", ""),
            ("starved_resource", "pids"),
        ])
    );
    let (root, _, inv) = setup("pids-stats");
    let mut p = inv.pods[0].clone();
    container_cgroup(&root, "a", "app", 300);
    p.containers = vec![container(&root, "a", "app", None)];
    p.pod_memory_request = Some("1Gi".parse().unwrap());
    let s = pod_usage(&p, Some(MI), Resource::Pids);
    assert_eq!((s.pod, s.containers.len()), (None, 0));
    fs::remove_dir_all(root).unwrap();
}

/// With pod-level resources (the `PodLevelResources` gate on, a pod-level memory request set),
/// the pod's usage comes first, whatever it is, with annotations `offending_pod` and
/// `offending_pod_usage` (helpers.go `evictionMessage`, `podMessageFmt`).
#[test]
fn a_pod_level_request_puts_the_pods_usage_first() {
    let (message, ann) = memory_message(&stats(
        Some((1536 * MI, "1Gi")),
        vec![("app", 300 * MI, Some("100Mi"))],
    ));
    assert_eq!(
        message,
        format!(
            "{LOW}Pod hog was using 1536Mi, request is 1Gi, has larger consumption of memory. \
             Container app was using 300Mi, request is 100Mi, has larger consumption of memory. "
        )
    );
    assert_eq!(
        ann,
        annotations(&[
            ("offending_containers", "app"),
            ("offending_containers_usage", "300Mi"),
            ("offending_pod", "hog"),
            ("offending_pod_usage", "1536Mi"),
            ("starved_resource", "memory"),
        ])
    );
}

/// A container cgroup `name` of pod `pod` holding `mib` MiB, for the manager.
fn container_cgroup(root: &Path, pod: &str, name: &str, mib: i64) {
    cgroup(&root.join(pod).join(name), mib, "max");
}

fn container(root: &Path, pod: &str, name: &str, request: Option<&str>) -> ManagedContainer {
    let dir = root.join(pod).join(name);
    ManagedContainer {
        name: name.into(),
        memory_request: request.map(|r| r.parse().unwrap()),
        memory: MemoryCgroup::own(&dir, crate::cgroup::Tree::V2).unwrap(),
    }
}

/// A pass that evicts reads the evicted pod's containers' working sets then, and its request
/// carries the kubelet's message and annotations; a container whose cgroup cannot be read is
/// left out (no memory stats). The status carries the pod's generation.
#[tokio::test]
async fn an_eviction_reads_its_containers_and_names_those_over_their_request() {
    let (root, signals, inv) = setup("containers");
    let fake = Fake::new(&root);
    container_cgroup(&root, "a", "init", 20);
    container_cgroup(&root, "a", "app", 250);
    container_cgroup(&root, "a", "side", 30);
    fs::create_dir_all(root.join("a/empty")).unwrap();
    let mut inv = (*inv).clone();
    inv.pods[0].containers = vec![
        container(&root, "a", "init", None),
        container(&root, "a", "app", Some("100Mi")),
        container(&root, "a", "side", Some("64Mi")),
        container(&root, "a", "empty", None),
    ];
    inv.pods[0].seen.generation = 4;
    let (_tx, rx) = watch::channel(Arc::new(inv));
    let mut m = Manager::new(
        config(&[("memory.available", "500Mi")], &[]),
        signals,
        &fake,
        rx,
    );
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods[0].name, "a");
    let req = fake.requests.lock().unwrap()[0].clone();
    let expected = "The node was low on resource: memory. Threshold quantity: 500Mi, available: 400Mi. \
        Container init was using 20Mi, request is 0, has larger consumption of memory. \
        Container app was using 250Mi, request is 100Mi, has larger consumption of memory. ";
    assert_eq!(req.message, expected);
    assert_eq!(
        req.annotations,
        annotations(&[
            ("offending_containers", "init,app"),
            ("offending_containers_usage", "20Mi,250Mi"),
            ("starved_resource", "memory"),
        ])
    );
    assert_eq!(req.seen.generation, 4);
    let status = &d.statuses[0].1;
    assert_eq!(status.message, expected);
    assert_eq!(status.observed_generation, 4);
    assert!(status.conditions.iter().all(|c| c.observed_generation == 4));
    fs::remove_dir_all(root).unwrap();
}

/// The namespace `ns` of `setup`'s pods with a and b in the PodGroup `gang`, whose
/// `disruptionMode` is `all` or single; c alone.
fn gang_of_a_and_b(all: bool) -> Forest {
    use crate::workload::{
        Kind, Object,
        types::{Disruption, Group, Meta, Origin, Pod, Policy, Scheduling, WorkloadRef},
    };
    let meta = |name: &str| Meta {
        name: name.into(),
        namespace: "ns".into(),
        uid: None,
        owners: Vec::new(),
        origin: Origin::default(),
    };
    let member = |name: &str, group: Option<&str>| {
        Object::Pod(Pod {
            meta: meta(name),
            pod_group: group.map(str::to_owned),
            scheduler_name: None,
            priority: None,
            priority_class_name: None,
            preemption_policy: None,
            phase: Some("Running".into()),
        })
    };
    let group = Object::Group(Group {
        meta: meta("gang"),
        kind: Kind::PodGroup,
        parent: None,
        workload_ref: Some(WorkloadRef {
            workload_name: "w".into(),
            template_name: "gang".into(),
        }),
        scheduling: Scheduling {
            policy: Policy::Basic,
            disruption: if all {
                Disruption::All
            } else {
                Disruption::Single
            },
            priority: None,
            priority_class_name: None,
            preemption_policy: None,
        },
    });
    Forest::new(vec![
        group,
        member("a", Some("gang")),
        member("b", Some("gang")),
        member("c", None),
    ])
}

/// Each pod evicted with a `disruptionMode: all` unit names the unit in its Event's
/// `qoslet.dev/unit` annotation, beside the kubelet's annotations and with the kubelet's
/// message; a pod of a single-mode group goes alone and carries only the kubelet's.
#[tokio::test]
async fn a_pod_evicted_with_its_unit_names_the_unit_in_an_annotation() {
    for all in [true, false] {
        let (root, signals, inv) = setup(&format!("unit-{all}"));
        let fake = Fake::new(&root);
        let mut inv = (*inv).clone();
        inv.forests = [("ns".to_owned(), gang_of_a_and_b(all))].into();
        let (_tx, rx) = watch::channel(Arc::new(inv));
        let mut m = Manager::new(
            config(&[("memory.available", "500Mi")], &[]),
            signals,
            &fake,
            rx,
        );
        m.pass(None).await.unwrap().expect("an eviction");
        let requests = fake.requests.lock().unwrap().clone();
        let names: Vec<&str> = requests.iter().map(|r| r.pod.name.as_str()).collect();
        let units: Vec<Option<&str>> = requests
            .iter()
            .map(|r| r.annotations.get(UNIT_ANNOTATION).map(String::as_str))
            .collect();
        if all {
            assert_eq!(names, ["a", "b"]);
            assert_eq!(units, [Some("PodGroup/gang"); 2]);
        } else {
            assert_eq!(names, ["a"]);
            assert_eq!(units, [None]);
        }
        for r in &requests {
            assert!(
                r.message
                    .starts_with("The node was low on resource: memory.")
            );
            assert_eq!(r.annotations["starved_resource"], "memory");
        }
        fs::remove_dir_all(root).unwrap();
    }
}

/// A rehearsal, at a threshold met or not, reads as a pass does (every pod's usage, the head of
/// the order whole) but calls no action, reports nothing, changes no threshold or condition
/// state: the pass after it decides as it would have without it.
#[tokio::test]
async fn a_rehearsal_reads_as_a_pass_does_but_acts_reports_and_changes_nothing() {
    let (root, signals, inv) = setup("rehearse");
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(inv);
    let mut m = Manager::new(
        config(&[("memory.available", "300Mi")], &[]),
        signals,
        &fake,
        rx,
    );
    let mut decisions = m.decisions();
    let observations = m.observations();
    let conditions = m.conditions();

    // 400 MiB available: the threshold is not met, and the rehearsal ranks anyway.
    assert_eq!(m.rehearse(), 3);
    assert_eq!(
        m.usage().len(),
        3,
        "every pod read whole, nothing held before"
    );
    // 200 MiB available: met; the rehearsal still does not act.
    write(&root, "memory.current", &(800 * MI).to_string());
    assert_eq!(m.rehearse(), 3);

    assert!(fake.calls.lock().unwrap().is_empty(), "no action called");
    assert!(decisions.try_recv().is_err(), "no decision sent");
    assert!(!observations.has_changed().unwrap(), "no observation sent");
    assert!(!conditions.has_changed().unwrap(), "no condition sent");
    {
        let stats = m.stats();
        let s = stats.lock().unwrap();
        assert_eq!((s.passes, s.evictions.len(), s.errors), (0, 0, 0));
    }

    // The pass after it: MemoryPressure from now, and the head of the order evicted.
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods[0].name, "a");
    assert_eq!(*fake.calls.lock().unwrap(), [("a".into(), Duration::ZERO)]);
    assert!(decisions.try_recv().is_ok());
    assert_eq!(*m.conditions().borrow(), [NodeCondition::MemoryPressure]);
    fs::remove_dir_all(root).unwrap();
}

/// A manager with no memory threshold has nothing to rehearse, and reads nothing.
#[tokio::test]
async fn without_a_memory_threshold_nothing_is_rehearsed() {
    let (root, signals, inv) = setup("rehearse-none");
    let fake = Fake::new(&root);
    let (_tx, rx) = watch::channel(inv);
    let m = Manager::new(config(&[], &[]), signals, &fake, rx);
    assert_eq!(m.rehearse(), 0);
    assert_eq!(m.usage().len(), 0);
    fs::remove_dir_all(root).unwrap();
}
