//! The manager's pass on fake cgroup files (v2 layout in a temp directory) with a recording
//! action that "frees" the pod's memory the way a kill would.

use std::{fs, path::Path, path::PathBuf, sync::Mutex};

use super::*;
use crate::{
    cgroup::CgroupBeneath,
    eviction::action::{EvictedStatus, Outcome},
    policy::eviction::{EvictionInput, parse_thresholds},
};

const MI: i64 = 1 << 20;

struct Fake {
    node: PathBuf,
    calls: Mutex<Vec<(String, Duration)>>,
}

impl EvictionAction for &Fake {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        self.calls
            .lock()
            .unwrap()
            .push((req.pod.name.clone(), req.grace));
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
            status: EvictedStatus::new(req.message.clone()),
        })
    }
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

fn config(hard: &[(&str, &str)], min_reclaim: &[(&str, &str)]) -> ManagerConfig {
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
    let fake = Fake {
        node: root.clone(),
        calls: Mutex::default(),
    };
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

#[tokio::test]
async fn one_unit_per_pass_then_minimum_reclaim_until_resolved() {
    let (root, signals, inv) = setup("reclaim");
    let fake = Fake {
        node: root.clone(),
        calls: Mutex::default(),
    };
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
    let fake = Fake {
        node: root.clone(),
        calls: Mutex::default(),
    };
    let (_tx, rx) = watch::channel(inv);
    let mut cfg = config(&[("memory.available", "100Mi")], &[]);
    let soft = BTreeMap::from([("memory.available".to_owned(), "500Mi".to_owned())]);
    // A soft grace of 0s would make it hard, as upstream (`isHardEvictionThreshold`).
    let grace = BTreeMap::from([("memory.available".to_owned(), "1s".to_owned())]);
    cfg.soft = parse_thresholds(&EvictionInput {
        hard: Some(&BTreeMap::new()),
        soft: Some(&soft),
        soft_grace: Some(&grace),
        ..Default::default()
    })
    .unwrap()
    .1;
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

#[tokio::test]
async fn nothing_evictable_is_counted() {
    let (root, signals, _) = setup("none");
    let fake = Fake {
        node: root.clone(),
        calls: Mutex::default(),
    };
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
/// `Quantity.String()` prints it.
#[test]
fn the_message_prints_quantities_as_the_kubelet_does() {
    use crate::policy::eviction::ThresholdValue;
    let t = |signal: &str, value| Threshold {
        signal: signal.into(),
        value,
        grace_period_secs: 0,
        min_reclaim: None,
    };
    let q = |s: &str| ThresholdValue::Quantity(s.parse().unwrap());
    let mem = "memory.available";
    assert_eq!(
        eviction_message(
            Resource::Memory,
            &t(mem, q("100Mi")),
            104_857_600,
            52_428_800
        ),
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
    );
    assert_eq!(
        eviction_message(
            Resource::Memory,
            &t(mem, ThresholdValue::Percentage(0.1)),
            107_374_182,
            12_345_678
        ),
        "The node was low on resource: memory. Threshold quantity: 107374182, available: 12345678. "
    );
    assert_eq!(
        eviction_message(Resource::Memory, &t(mem, q("0.5Gi")), 536_870_912, 1000),
        // Under 1024 a BinarySI quantity prints as DecimalSI: 1000 is "1k", as in Go.
        "The node was low on resource: memory. Threshold quantity: 512Mi, available: 1k. "
    );
    assert_eq!(
        eviction_message(Resource::Pids, &t("pid.available", q("1000")), 1000, 32_000),
        "The node was low on resource: pids. Threshold quantity: 1k, available: 32k. "
    );
}
