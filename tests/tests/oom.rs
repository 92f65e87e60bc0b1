//! The first sensor end to end: a real process overruns a real memory cgroup, the kernel
//! OOM-kills it, and the eBPF programs report the victim through the ring buffer.

use std::time::Duration;

use qoslet::sensors::{
    EbpfSensors, SensorEvent,
    ebpf::EbpfOptions,
    event::{MemcgEventKind, OomSource, OomVictim},
};
use qoslet_tests::{Hog, Layout, TestCgroup, layout, require_root, unique_name};
use tokio::sync::mpsc;

const LIMIT: &str = "33554432"; // 32 MiB
const HOG_CAP_MIB: u64 = 256;

/// The memory cgroup (with the limit) and, on hybrid hosts, the unified-tree cgroup that gives
/// the process its cgroup v2 id.
struct Cgroups {
    memory: TestCgroup,
    unified: Option<TestCgroup>,
}

impl Cgroups {
    fn create() -> Option<Self> {
        let name = unique_name();
        match layout() {
            Layout::Hybrid | Layout::Legacy => {
                let memory = TestCgroup::create("/sys/fs/cgroup/memory", &name);
                memory.write("memory.limit_in_bytes", LIMIT);
                let unified = (layout() == Layout::Hybrid)
                    .then(|| TestCgroup::create("/sys/fs/cgroup/unified", &name));
                Some(Self { memory, unified })
            }
            Layout::Unified => {
                let controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
                    .unwrap_or_default();
                if !controllers.split_whitespace().any(|c| c == "memory") {
                    eprintln!(
                        "skipped: the memory controller is not enabled for children of /sys/fs/cgroup, and this test does not change cgroups it did not create"
                    );
                    return None;
                }
                let memory = TestCgroup::create("/sys/fs/cgroup", &name);
                memory.write("memory.max", LIMIT);
                memory.write("memory.swap.max", "0");
                Some(Self {
                    memory,
                    unified: None,
                })
            }
        }
    }

    fn add(&self, pid: u32) {
        self.memory.add_pid(pid);
        if let Some(u) = &self.unified {
            u.add_pid(pid);
        }
    }

    /// The cgroup v2 id the process has.
    fn v2_id(&self) -> u64 {
        self.unified.as_ref().unwrap_or(&self.memory).id()
    }
}

fn start_intake(sensors: &mut EbpfSensors) -> mpsc::UnboundedReceiver<SensorEvent> {
    let mut reader = sensors
        .event_reader()
        .expect("taking the event ring buffer");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut events = Vec::new();
        let mut bad = Vec::new();
        while reader.read_batch(&mut events, &mut bad).await.is_ok() {
            assert!(bad.is_empty(), "undecodable records: {bad:?}");
            for e in events.drain(..) {
                if tx.send(e).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Runs a hog into the OOM killer and returns the victim record and the memcg OOM-kill count
/// event for it, asserting that the process died of SIGKILL.
async fn oom_one(options: EbpfOptions) -> Option<(OomVictim, Option<u64>, Cgroups, u32)> {
    require_root();
    let mut sensors = EbpfSensors::load(options).expect("loading the eBPF sensors");
    let mut rx = start_intake(&mut sensors);
    let cgroups = Cgroups::create()?;
    let mut hog = Hog::spawn(HOG_CAP_MIB);
    let pid = hog.pid();
    cgroups.add(pid);
    hog.release();

    let signal = tokio::task::block_in_place(|| hog.wait_signal(Duration::from_secs(30)));
    assert_eq!(signal, Some(libc::SIGKILL), "the hog should die of SIGKILL");

    // The victim record must arrive within 1 s of the kill being observed.
    let mut victim = None;
    let mut memcg_kill = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    // fentry/__memcg_memory_event reports the memcg's own OOM-kill count where the kernel allows
    // it (6.15+ with BPF trampolines); otherwise only the victim record is expected.
    let memcg_program = sensors
        .attached()
        .iter()
        .any(|a| a.hook == "fentry/__memcg_memory_event");
    while victim.is_none() || (memcg_program && memcg_kill.is_none()) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(SensorEvent::OomVictim(v))) if v.pid == pid => victim = Some(v),
            Ok(Some(SensorEvent::Memcg {
                memcg_id,
                kind: MemcgEventKind::OomKill,
                ..
            })) if memcg_id == cgroups.memory.id() => memcg_kill = Some(memcg_id),
            Ok(Some(_)) => {}
            Ok(None) => panic!("the event intake stopped"),
            Err(_) => break,
        }
    }
    let victim = victim.unwrap_or_else(|| {
        panic!(
            "no OOM victim event for pid {pid} within 1 s (attached: {:?}, skipped: {:?})",
            sensors.attached(),
            sensors.skipped()
        )
    });
    assert_eq!(sensors.events_lost().expect("reading EVENTS_LOST"), 0);
    Some((victim, memcg_kill, cgroups, pid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_kill_in_a_memory_cgroup_reports_the_victim_pid_and_cgroup() {
    let Some((victim, memcg_kill, cgroups, pid)) = oom_one(EbpfOptions::default()).await else {
        return;
    };
    assert_eq!(
        victim.source,
        OomSource::BtfTracepoint,
        "this kernel has BTF"
    );
    assert_eq!(victim.pid, pid);
    assert_eq!(victim.tgid, pid);
    assert_eq!(victim.comm, "qoslet-test-hog");
    assert_eq!(
        victim.cgroup_id,
        cgroups.v2_id(),
        "cgroup v2 id of the victim"
    );
    assert_eq!(
        victim.memcg_id,
        Some(cgroups.memory.id()),
        "memory cgroup of the victim"
    );
    let rss = victim.rss_bytes.expect("rss from the victim's mm");
    // The victim filled most of its 32 MiB limit with touched pages.
    assert!(rss > 16 << 20 && rss <= 40 << 20, "rss {rss} bytes");
    assert_eq!(victim.oom_score_adj, Some(0));
    if memcg_kill.is_none() {
        eprintln!("note: no memcg OOM-kill record (no attachable memcg event hook on this kernel)");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_classic_tracepoint_fallback_reports_the_same_oom() {
    let options = EbpfOptions {
        prefer_btf: false,
        ..EbpfOptions::default()
    };
    let Some((victim, _, cgroups, pid)) = oom_one(options).await else {
        return;
    };
    assert_eq!(victim.source, OomSource::Tracepoint);
    assert_eq!(victim.pid, pid);
    // The hog is the allocating task, so the cgroup of current is its own.
    assert_eq!(victim.cgroup_id, cgroups.v2_id());
}
