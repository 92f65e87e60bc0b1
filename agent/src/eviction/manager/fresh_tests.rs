//! What a pass reads fresh: a reader in memory that counts its reads, `inactive_file` held as
//! the node's statistics sampling leaves it, node signals from fake cgroup files.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::Mutex,
};

use super::*;
use crate::{
    cgroup::Tree,
    eviction::{
        action::{EvictedStatus, Outcome, PodCgroups, SeenPod},
        signals::{MemoryCgroup, MemoryReading},
    },
    policy::qos::QosClass,
};

const MI: i64 = 1 << 20;

/// Usage, `inactive_file` and process counts by pod name, now; every read recorded.
#[derive(Clone, Default)]
struct Reader {
    memory: Arc<Mutex<BTreeMap<String, (i64, i64)>>>,
    processes: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Whole readings (`memory.stat` too), usage alone.
    memory_reads: Arc<Mutex<Vec<String>>>,
    usage_reads: Arc<Mutex<Vec<String>>>,
    process_reads: Arc<Mutex<Vec<String>>>,
}

impl Reader {
    /// `mib` of usage, no page cache.
    fn set(&self, name: &str, mib: i64) {
        self.set_cached(name, mib, 0);
    }

    fn set_cached(&self, name: &str, mib: i64, inactive_mib: i64) {
        self.memory
            .lock()
            .unwrap()
            .insert(name.into(), (mib * MI, inactive_mib * MI));
    }

    /// The pods read whole since the last call.
    fn memory_reads(&self) -> Vec<String> {
        std::mem::take(&mut *self.memory_reads.lock().unwrap())
    }

    fn usage_reads(&self) -> Vec<String> {
        std::mem::take(&mut *self.usage_reads.lock().unwrap())
    }

    fn get(&self, name: &String) -> Result<(i64, i64), SignalError> {
        self.memory
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .ok_or_else(|| SignalError::Read {
                path: name.into(),
                source: std::io::ErrorKind::NotFound.into(),
            })
    }
}

impl PodReader for Reader {
    fn reading(&self, pod: &ManagedPod) -> Result<MemoryReading, SignalError> {
        let name = &pod.key.name;
        self.memory_reads.lock().unwrap().push(name.clone());
        let (usage_bytes, inactive_file_bytes) = self.get(name)?;
        Ok(MemoryReading {
            usage_bytes,
            inactive_file_bytes,
            limit_bytes: None,
        })
    }

    fn usage(&self, pod: &ManagedPod) -> Result<i64, SignalError> {
        let name = &pod.key.name;
        self.usage_reads.lock().unwrap().push(name.clone());
        self.get(name).map(|(usage, _)| usage)
    }

    fn processes(&self, pod: &ManagedPod) -> Option<u64> {
        let name = &pod.key.name;
        self.process_reads.lock().unwrap().push(name.clone());
        self.processes.lock().unwrap().get(name).copied()
    }
}

/// Records the requests; kills nothing (the pods' files say their memory is gone already).
#[derive(Default)]
struct Record(Mutex<Vec<EvictionRequest>>);

impl EvictionAction for &Record {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        self.0.lock().unwrap().push(req.clone());
        Ok(Outcome {
            first_signal_at: Some(Instant::now()),
            signalled: 1,
            status: EvictedStatus::new(req.message.clone(), &req.seen),
        })
    }
}

struct Node {
    root: PathBuf,
    signals: NodeSignals,
    /// Every pod's cgroup: empty, so that an eviction is released at once.
    pod_memory: MemoryCgroup,
}

fn write(dir: &Path, file: &str, v: &str) {
    fs::write(dir.join(file), v).unwrap();
}

/// A node of 1000 MiB with 900 MiB used (100 MiB available), and 950 of 1000 pids.
fn node(tag: &str) -> Node {
    let root = std::env::temp_dir().join(format!("qoslet-fresh-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let pod = root.join("pod");
    fs::create_dir_all(&pod).unwrap();
    for (dir, mib) in [(&root, 900), (&pod, 0)] {
        write(dir, "memory.current", &(mib * MI).to_string());
        write(dir, "memory.stat", "anon 0\ninactive_file 0\n");
        write(dir, "memory.max", &(1000 * MI).to_string());
    }
    write(&root, "pids.current", "950\n");
    write(&root, "pids.max", "1000\n");
    Node {
        signals: NodeSignals {
            node_root: MemoryCgroup::own(&root, Tree::V2).unwrap(),
            capacity_bytes: None,
            kubepods: None,
            pids: Some(CgroupBeneath::own(&root, Tree::V2).unwrap()),
        },
        pod_memory: MemoryCgroup::own(&pod, Tree::V2).unwrap(),
        root,
    }
}

/// A hard threshold of `signal` at `value`, the kubelet's order.
fn config(signal: &str, value: &str) -> ManagerConfig {
    let mut cfg = tests::config(&[(signal, value)], &[]);
    cfg.order = Order::Kubelet;
    cfg.release_timeout = Duration::from_millis(100);
    cfg
}

fn key(name: &str) -> PodKey {
    PodKey {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

/// A pod without a request (its whole usage is over it), with a pod-level request so that the
/// message gives its working set.
fn pod(n: &Node, name: &str) -> ManagedPod {
    ManagedPod {
        key: key(name),
        qos: QosClass::Burstable,
        request_bytes: 0,
        priority: 0,
        critical: false,
        start_time: 0,
        grace_secs: 30,
        revision: 0,
        memory: n.pod_memory.clone(),
        cgroups: PodCgroups {
            procs: Vec::new(),
            unified: None,
        },
        containers: Vec::new(),
        pod_memory_request: Some(Quantity::from_int(0, Format::BinarySI)),
        seen: SeenPod::default(),
    }
}

fn manager<'a>(
    n: &Node,
    cfg: ManagerConfig,
    pods: Vec<ManagedPod>,
    action: &'a Record,
    reader: &Reader,
) -> (Manager<&'a Record>, watch::Sender<Arc<Inventory>>) {
    let (tx, rx) = watch::channel(Arc::new(Inventory {
        pods,
        forests: BTreeMap::new(),
    }));
    let m = Manager::new(cfg, n.signals.clone(), action, rx).with_reader(reader.clone());
    (m, tx)
}

/// A manager of `pods` under a hard `memory.available` threshold of 500Mi (100Mi available).
fn memory_manager<'a>(
    n: &Node,
    pods: Vec<ManagedPod>,
    action: &'a Record,
    reader: &Reader,
) -> (Manager<&'a Record>, watch::Sender<Arc<Inventory>>) {
    manager(n, config("memory.available", "500Mi"), pods, action, reader)
}

/// The `inactive_file` (MiB) the node's statistics sampling last read.
fn sampled(m: &Manager<&Record>, values: &[(&str, i64)]) {
    let keys: Vec<(PodKey, i64)> = values.iter().map(|(n, v)| (key(n), v * MI)).collect();
    m.usage()
        .record_all(keys.iter().map(|(k, v)| (k, *v)), Instant::now(), |_| true);
}

#[tokio::test]
async fn a_pass_over_500_pods_reads_few_of_them_whole_once_their_page_cache_is_held() {
    let n = node("500");
    let reader = Reader::default();
    let pods: Vec<ManagedPod> = (0..500).map(|i| pod(&n, &format!("p{i:03}"))).collect();
    let values: Vec<(String, i64)> = (0..500)
        .map(|i| (format!("p{i:03}"), 1 + (i * 7919) % 500))
        .collect();
    for (name, mib) in &values {
        reader.set(name, *mib);
    }
    let largest = values.iter().max_by_key(|(_, v)| *v).unwrap().0.clone();
    let action = Record::default();
    let (mut m, _tx) = memory_manager(&n, pods, &action, &reader);

    // Nothing held yet: every pod is read once, as before.
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods, [key(&largest)]);
    let reads = reader.memory_reads();
    assert_eq!(reads.len(), 500, "every pod once");
    assert!(
        reader.process_reads.lock().unwrap().is_empty(),
        "memory ranks without processes"
    );

    // Held now (by the first pass; the node's sampling would hold them too): the next pass
    // reads every pod's usage, and whole only the new head: the candidate after it has no page
    // cache to lose, so its usage, the most its working set can be, ranks it after the head.
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(reader.usage_reads().len(), 499, "all but the evicted");
    let reads = reader.memory_reads();
    assert!(reads.len() <= FRESH_READS, "{reads:?}");
    assert_eq!(reads.len(), 1, "the head alone: {reads:?}");
    assert_eq!(reads.first(), d.pods.first().map(|k| &k.name));
    let second = values
        .iter()
        .filter(|(name, _)| *name != largest)
        .max_by_key(|(_, v)| *v)
        .unwrap();
    assert_eq!(d.pods, [key(&second.0)]);
    fs::remove_dir_all(&n.root).unwrap();
}

/// A pod that grew (its usage, read for every pod, shows it) is chosen, also when another's
/// usage grew further on page cache since its `inactive_file` was held: that one ranks first on
/// its usage less the old value, and its whole reading puts it back.
#[tokio::test]
async fn a_pod_that_grew_since_it_was_sampled_is_chosen_when_the_fresh_reads_show_it() {
    let n = node("grew");
    let reader = Reader::default();
    let names = ["a", "b", "c", "d"];
    let pods: Vec<ManagedPod> = names.iter().map(|p| pod(&n, p)).collect();
    let action = Record::default();
    let (mut m, _tx) = memory_manager(&n, pods, &action, &reader);
    sampled(&m, &[("a", 0), ("b", 0), ("c", 0), ("d", 0)]);
    // a read a 450 MiB file since; b grew to 400 MiB of its own.
    reader.set_cached("a", 500, 450);
    for (p, mib) in [("b", 400), ("c", 100), ("d", 50)] {
        reader.set(p, mib);
    }
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods, [key("b")]);
    // c is not read: its usage, 100 MiB, is the most its working set can be, below b's.
    assert_eq!(reader.memory_reads(), ["a", "b"]);
    let message = action.0.lock().unwrap()[0].message.clone();
    assert!(
        message.contains("Pod b was using 400Mi"),
        "the victim's fresh working set: {message}"
    );
    fs::remove_dir_all(&n.root).unwrap();
}

/// The candidate after the head is read whole only when the most its working set can be (its
/// usage read now) would rank it ahead: then its page cache of now decides.
#[tokio::test]
async fn the_next_candidate_is_read_only_when_its_usage_could_rank_it_ahead() {
    let n = node("most");
    let reader = Reader::default();
    let pods: Vec<ManagedPod> = ["head", "next", "small"]
        .iter()
        .map(|p| pod(&n, p))
        .collect();
    let action = Record::default();
    let (mut m, _tx) = memory_manager(&n, pods, &action, &reader);
    sampled(&m, &[("head", 0), ("next", 100), ("small", 0)]);
    reader.set("head", 400);
    // 450 MiB of usage, of which 100 MiB page cache, as held: 350 MiB ranks it second, and
    // 450 MiB of working set would rank it first.
    reader.set_cached("next", 450, 100);
    reader.set("small", 10);
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods, [key("head")]);
    assert_eq!(reader.memory_reads(), ["head", "next"]);

    // Its page cache went since it was held: read whole, it is the head.
    m.evicted.clear();
    sampled(&m, &[("head", 0), ("next", 100), ("small", 0)]);
    reader.set_cached("next", 450, 0);
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods, [key("next")]);
    assert_eq!(reader.memory_reads(), ["head", "next"]);
    fs::remove_dir_all(&n.root).unwrap();
}

/// A pod whose cgroup went since it was sampled is no candidate; one without a value held is
/// read whole, as is one whose value is older than the cache keeps.
#[tokio::test]
async fn a_gone_pod_is_passed_over_and_missing_or_old_values_are_read() {
    let n = node("gone");
    let reader = Reader::default();
    let pods: Vec<ManagedPod> = ["a", "b", "c"].iter().map(|p| pod(&n, p)).collect();
    let action = Record::default();
    let (m, _tx) = memory_manager(&n, pods, &action, &reader);
    let usage = UsageCache::new(Duration::from_secs(5));
    let mut m = m.with_usage(usage.clone());
    usage.record(&key("a"), 0, Instant::now());
    usage.record(&key("b"), 10 * MI, Instant::now() - Duration::from_secs(6));
    reader.set("b", 200);
    reader.set("c", 100);
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods, [key("b")]);
    assert_eq!(reader.usage_reads(), ["a"], "gone");
    assert_eq!(
        reader.memory_reads(),
        ["b", "c"],
        "b (too old) and c (none held)"
    );
    fs::remove_dir_all(&n.root).unwrap();
}

/// Pids rank on process counts read now, and on no `memory.stat`; a pod whose cgroup went since
/// it was sampled is passed over, first in the order as it would be.
#[tokio::test]
async fn the_pids_signal_ranks_on_processes_read_fresh() {
    let n = node("pids");
    let reader = Reader::default();
    let mut pods: Vec<ManagedPod> = ["a", "b", "c", "gone"].iter().map(|p| pod(&n, p)).collect();
    pods[3].priority = -1;
    for (p, mib, procs) in [("a", 500, 10), ("b", 10, 400), ("c", 100, 30)] {
        reader.set(p, mib);
        reader.processes.lock().unwrap().insert(p.into(), procs);
    }
    let action = Record::default();
    let (mut m, _tx) = manager(&n, config("pid.available", "100"), pods, &action, &reader);
    sampled(&m, &[("a", 500), ("b", 10), ("c", 100), ("gone", 5)]);
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.signal, "pid.available");
    assert_eq!(d.pods, [key("b")], "the most processes");
    assert_eq!(*reader.process_reads.lock().unwrap(), ["a", "b", "c"]);
    assert!(reader.memory_reads().is_empty(), "no memory.stat");
    assert_eq!(reader.usage_reads(), ["a", "b", "c", "gone"]);
    fs::remove_dir_all(&n.root).unwrap();
}

/// Empties the victim's fake cgroup, so that the pass does not wait for its memory.
struct Empties(PathBuf);

impl EvictionAction for &Empties {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        write(&self.0.join(&req.pod.name), "memory.current", "0");
        Ok(Outcome {
            first_signal_at: Some(Instant::now()),
            signalled: 1,
            status: EvictedStatus::new(req.message.clone(), &req.seen),
        })
    }
}

/// A measurement, not a test (speed is measured, never asserted): the decide stage of passes
/// over 500 pods whose files are on a tmpfs, with nothing held (every pod read, as every pass
/// read before) and then on what the earlier passes hold.
/// `cargo test -p qoslet --lib -- --ignored --nocapture decide_stage` (a debug build, as the
/// figures in docs/benchmarks.md were taken; `--release` for the shipped build's).
#[tokio::test]
#[ignore = "a measurement; run it by name with --ignored --nocapture"]
async fn decide_stage_over_500_pods() {
    const PODS: usize = 500;
    const PASSES: usize = 20;
    let base = Path::new("/dev/shm").join(format!("qoslet-decide-{}", std::process::id()));
    let _ = fs::remove_dir_all(&base);
    let n = node("measure");
    let root = n.root.clone();
    let pods: Vec<ManagedPod> = (0..PODS)
        .map(|i| {
            let name = format!("p{i:03}");
            let dir = base.join(&name);
            fs::create_dir_all(&dir).unwrap();
            let mib = 1 + (i as i64 * 7919) % PODS as i64;
            write(&dir, "memory.current", &(mib * MI).to_string());
            write(&dir, "memory.stat", "anon 0\ninactive_file 0\n");
            write(&dir, "memory.max", "max");
            write(&dir, "cgroup.procs", "1\n");
            let memory = MemoryCgroup::own(&dir, Tree::V2).unwrap();
            let mut p = pod(&n, &name);
            p.memory = memory;
            p.cgroups.unified = Some(CgroupBeneath::own(&dir, Tree::V2).unwrap());
            p
        })
        .collect();
    let action = Empties(base.clone());
    let decide = |d: Decision| d.stages.expect("stages").decide;
    let (tx, rx) = watch::channel(Arc::new(Inventory {
        pods,
        forests: BTreeMap::new(),
    }));
    let mut cold = Vec::new();
    for _ in 0..PASSES {
        // A manager of its own each time: nothing held.
        let mut m = Manager::new(
            config("memory.available", "500Mi"),
            n.signals.clone(),
            &action,
            rx.clone(),
        );
        cold.push(decide(m.pass(None).await.unwrap().unwrap()));
    }
    let mut m = Manager::new(
        config("memory.available", "500Mi"),
        n.signals.clone(),
        &action,
        rx,
    );
    m.pass(None).await.unwrap().unwrap();
    let mut warm = Vec::new();
    for _ in 0..PASSES {
        warm.push(decide(m.pass(None).await.unwrap().unwrap()));
    }
    drop(tx);
    for (what, v) in [("nothing held", &mut cold), ("held", &mut warm)] {
        v.sort();
        println!(
            "decide over {PODS} pods, {what}: p50 {:?}, max {:?} ({PASSES} passes)",
            v[PASSES / 2],
            v[PASSES - 1]
        );
    }
    fs::remove_dir_all(&base).unwrap();
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn the_cgroup_files_count_processes() {
    let n = node("procs");
    let mut p = pod(&n, "a");
    assert_eq!(
        CgroupFiles.processes(&p),
        Some(0),
        "no cgroup.procs to read"
    );
    p.cgroups.procs = vec![CgroupBeneath::own(&n.root, Tree::V2).unwrap()];
    assert_eq!(CgroupFiles.processes(&p), Some(0), "gone: no process");
    write(&n.root, "cgroup.procs", "1\n2\n");
    assert_eq!(CgroupFiles.processes(&p), Some(2));
    fs::remove_dir_all(&n.root).unwrap();
}

/// What the action sees when it is called, of what only reports.
#[derive(Default)]
struct Probe {
    logs: crate::test_log::LogBuffer,
    observations: Mutex<Option<watch::Receiver<Observations>>>,
    conditions: Mutex<Option<watch::Receiver<Vec<NodeCondition>>>>,
    /// At each call: "Evicting" lines logged, observations sent, conditions sent.
    calls: Mutex<Vec<(usize, bool, bool)>>,
}

/// Whether a value was sent since the receiver was made.
fn changed<T>(rx: &Mutex<Option<watch::Receiver<T>>>) -> bool {
    rx.lock()
        .unwrap()
        .as_ref()
        .is_some_and(|rx| rx.has_changed().unwrap())
}

impl EvictionAction for &Probe {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        self.calls.lock().unwrap().push((
            self.logs.count("Evicting to relieve"),
            changed(&self.observations),
            changed(&self.conditions),
        ));
        Ok(Outcome {
            first_signal_at: Some(Instant::now()),
            signalled: 1,
            status: EvictedStatus::new(req.message.clone(), &req.seen),
        })
    }
}

/// The decide stage ends at the action's call: the "Evicting" line and the observations and
/// conditions sent to the node (whose loop each change wakes) come after it, in the same pass.
#[tokio::test]
async fn what_only_reports_follows_the_action_call() {
    let n = node("report");
    let reader = Reader::default();
    reader.set("a", 300);
    reader.set("b", 100);
    let probe = Probe::default();
    let _log = tracing::subscriber::set_default(probe.logs.subscriber());
    let (_tx, rx) = watch::channel(Arc::new(Inventory {
        pods: vec![pod(&n, "a"), pod(&n, "b")],
        forests: BTreeMap::new(),
    }));
    let mut m = Manager::new(
        config("memory.available", "500Mi"),
        n.signals.clone(),
        &probe,
        rx,
    )
    .with_reader(reader.clone());
    *probe.observations.lock().unwrap() = Some(m.observations());
    *probe.conditions.lock().unwrap() = Some(m.conditions());
    let d = m.pass(None).await.unwrap().expect("an eviction");
    assert_eq!(d.pods, [key("a")]);
    assert_eq!(*probe.calls.lock().unwrap(), [(0, false, false)]);
    assert_eq!(probe.logs.count("Evicting to relieve"), 1);
    let line = probe.logs.text();
    assert!(
        line.contains("signals_ms=") && line.contains("chosen_ms="),
        "{line}"
    );
    assert_eq!(
        m.observations().borrow()["memory.available"].available,
        100 * MI
    );
    assert_eq!(*m.conditions().borrow(), [NodeCondition::MemoryPressure]);
    fs::remove_dir_all(&n.root).unwrap();
}

/// Waits (at most 10 s) until `f` holds.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The run loop rehearses a decision once after its first pass, and again each time the node
/// says start-up's code is paged out; a pass with no threshold met reads no pod, so every pod
/// read here is a rehearsal's. None acts.
#[tokio::test]
async fn the_run_loop_rehearses_after_its_first_pass_and_when_told() {
    let n = node("rehearse-run");
    let reader = Reader::default();
    reader.set("a", 60);
    reader.set("b", 40);
    let action = Record::default();
    // 100 MiB available against 50Mi: not met.
    let (m, _tx) = manager(
        &n,
        config("memory.available", "50Mi"),
        vec![pod(&n, "a"), pod(&n, "b")],
        &action,
        &reader,
    );
    let told = Arc::new(Notify::new());
    let m = m.with_rehearsal_on(told.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let (_wakes, wake_rx) = mpsc::channel(1);
    let check = async {
        let read =
            || reader.memory_reads.lock().unwrap().len() + reader.usage_reads.lock().unwrap().len();
        eventually("the first rehearsal", || read() >= 2).await;
        // Nothing held before it: both read whole.
        assert_eq!(reader.memory_reads(), ["a", "b"]);
        reader.usage_reads();
        // Passes go on (every second) and read no pod until told.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(read(), 0, "no rehearsal untold");
        told.notify_one();
        eventually("the told rehearsal", || read() >= 2).await;
        stop_tx.send(true).unwrap();
    };
    tokio::join!(m.run(wake_rx, stop_rx), check);
    assert!(action.0.lock().unwrap().is_empty(), "nothing evicted");
    fs::remove_dir_all(&n.root).unwrap();
}

/// A manager that starts before its pods rehearses when the first pods come, and only then.
#[tokio::test]
async fn the_run_loop_rehearses_when_the_first_pods_come() {
    let n = node("rehearse-first-pods");
    let reader = Reader::default();
    reader.set("a", 60);
    let action = Record::default();
    let (m, tx) = manager(
        &n,
        config("memory.available", "50Mi"),
        Vec::new(),
        &action,
        &reader,
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let (_wakes, wake_rx) = mpsc::channel(1);
    let check = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        tx.send(Arc::new(Inventory {
            pods: vec![pod(&n, "a")],
            forests: BTreeMap::new(),
        }))
        .unwrap();
        eventually("the rehearsal with pods", || {
            !reader.memory_reads.lock().unwrap().is_empty()
        })
        .await;
        assert_eq!(reader.memory_reads(), ["a"]);
        // Rehearsed once: the passes after it (every second) read no pod.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(reader.memory_reads().is_empty() && reader.usage_reads().is_empty());
        stop_tx.send(true).unwrap();
    };
    tokio::join!(m.run(wake_rx, stop_rx), check);
    assert!(action.0.lock().unwrap().is_empty(), "nothing evicted");
    fs::remove_dir_all(&n.root).unwrap();
}

/// From the action's call until the evicted pod's processes are gone and its memory back, the
/// manager says which eviction is releasing (the node holds its reaction until then,
/// `node/app.rs`): the conditions and the decision have gone out by then. Each eviction has its
/// own number; none is said once its pass is over.
#[tokio::test]
async fn the_release_is_said_from_the_action_call_until_the_pods_are_gone() {
    let n = node("releasing");
    let reader = Reader::default();
    reader.set("a", 300);
    reader.set("b", 200);
    let procs = n.root.join("pod");
    let listed = CgroupBeneath::own(&procs, Tree::V2).unwrap();
    let with_procs = |name| {
        let mut p = pod(&n, name);
        p.cgroups.procs = vec![listed.clone()];
        p
    };
    let record = Record::default();
    let (mut m, _tx) = memory_manager(&n, vec![with_procs("a"), with_procs("b")], &record, &reader);
    m.cfg.release_timeout = Duration::from_secs(10);
    let mut decisions = m.decisions();
    let (releasing, conditions) = (m.releasing(), m.conditions());
    for (eviction, pod) in [(1, "a"), (2, "b")] {
        write(&procs, "cgroup.procs", "123\n");
        let during = async {
            let mut r = releasing.clone();
            let said = *r.wait_for(Option::is_some).await.unwrap();
            let decided = decisions.try_recv().map(|d| d.pods);
            let pressure = conditions.borrow().clone();
            // Still said while a process is listed.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let still = *releasing.borrow();
            write(&procs, "cgroup.procs", "");
            (said, decided, pressure, still)
        };
        let (d, (said, decided, pressure, still)) = tokio::join!(m.pass(None), during);
        assert_eq!(d.unwrap().unwrap().pods, [key(pod)]);
        assert_eq!((said, still), (Some(eviction), Some(eviction)));
        assert_eq!(decided.unwrap(), [key(pod)], "the decision went out first");
        assert_eq!(pressure, [NodeCondition::MemoryPressure]);
        assert_eq!(*releasing.borrow(), None, "released");
    }
    fs::remove_dir_all(&n.root).unwrap();
}
