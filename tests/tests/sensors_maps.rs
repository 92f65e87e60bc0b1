//! Per-cgroup kernel maps return to their base size after 1,000 watched cgroups are created,
//! used and removed: the `cgroup_rmdir` program deletes their hash entries, the agent frees their
//! filter bits and statistics slots.

mod sensors_common;

use std::{collections::HashSet, time::Duration};

use qoslet::sensors::{
    SensorEvent, SensorsConfig, WatchedCgroup, event::CgroupOp, kmaps::PER_CGROUP_MAPS,
};
use qoslet_tests::{Layout, TestCgroup, layout, require_root, unique_name};
use sensors_common::{Script, start};

const CGROUPS: usize = 1000;
/// Cgroups that also run a process, so the scheduler programs update their entries too.
const WITH_PROCESS: usize = 50;

fn sizes(sensors: &qoslet::sensors::Sensors) -> Vec<(&'static str, usize)> {
    PER_CGROUP_MAPS
        .iter()
        .map(|m| {
            let n = sensors
                .with_ebpf(|e| e.map_len(m))
                .expect("eBPF loaded")
                .expect("reading a map");
            (*m, n)
        })
        .collect()
}

/// Bits set in the scheduler program's `WATCH_FILTER`.
fn filter_bits(sensors: &qoslet::sensors::Sensors) -> u32 {
    sensors
        .with_ebpf(|e| e.watch_filter_bits())
        .expect("eBPF loaded")
        .expect("reading WATCH_FILTER")
}

/// Entries in use in the scheduler program's `SLOT_INDEX`.
fn slot_entries(sensors: &qoslet::sensors::Sensors) -> usize {
    sensors
        .with_ebpf(|e| e.slot_index_entries())
        .expect("eBPF loaded")
        .expect("reading SLOT_INDEX")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maps_return_to_their_base_size_after_a_thousand_cgroups() {
    require_root();
    let (sensors, mut rx) = start(SensorsConfig::default());
    assert!(
        sensors.with_ebpf(|e| e.is_attached("cgroup_rmdir")) == Some(true),
        "cgroup_rmdir attached"
    );
    let base = sizes(&sensors);
    let base_filter_bits = filter_bits(&sensors);
    let base_slots = slot_entries(&sensors);
    let root_dir = match layout() {
        Layout::Hybrid => "/sys/fs/cgroup/unified",
        _ => "/sys/fs/cgroup",
    };
    let root = TestCgroup::create(root_dir, &unique_name());
    let mut ids = HashSet::new();
    let mut children = Vec::new();
    for i in 0..CGROUPS {
        let cg = TestCgroup::create(&root.path, &format!("c{i}"));
        sensors.watch(WatchedCgroup {
            id: cg.id(),
            v2_dir: None,
            memory_dir: None,
            cpu_dir: None,
        });
        ids.insert(cg.id());
        children.push(cg);
    }
    for cg in children.iter().take(WITH_PROCESS) {
        let mut s = Script::spawn("exit 0");
        cg.add_pid(s.pid());
        s.release();
        let _ = s.child.wait();
    }
    let grown = sizes(&sensors);
    eprintln!("base {base:?}, with {CGROUPS} cgroups {grown:?}");
    assert_eq!(grown[0].1, base[0].1 + CGROUPS, "every cgroup watched");
    assert_eq!(
        grown[1].1 + slot_entries(&sensors),
        base[1].1 + base_slots + CGROUPS,
        "a CPU statistics home per watched cgroup: a slot, or a CPU_STATS entry"
    );
    assert!(
        slot_entries(&sensors) > base_slots,
        "the first cgroups get slots"
    );
    let grown_bits = filter_bits(&sensors);
    assert!(
        grown_bits > base_filter_bits,
        "watching sets filter bits ({base_filter_bits} -> {grown_bits})"
    );
    drop(children);

    let mut removed = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while removed.len() < ids.len() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(SensorEvent::Cgroup {
                op: CgroupOp::Removed,
                id,
                hierarchy,
                path,
                ..
            })) if ids.contains(&id) => {
                assert_eq!(hierarchy, 0, "v2 hierarchy");
                assert!(path.contains("/c"), "path {path}");
                removed.insert(id);
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let lost = sensors.events_lost();
    assert!(
        removed.len() as u64 + lost >= ids.len() as u64,
        "{} of {} removals seen, {lost} records lost",
        removed.len(),
        ids.len()
    );
    assert_eq!(sizes(&sensors), base, "maps back to their base size");
    // The agent clears a bit once it has handled the removal event.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while (filter_bits(&sensors), slot_entries(&sensors)) != (base_filter_bits, base_slots)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        filter_bits(&sensors),
        base_filter_bits,
        "the scheduler program's watch filter is back to its base"
    );
    assert_eq!(
        slot_entries(&sensors),
        base_slots,
        "every slot of a removed cgroup is free again"
    );
    assert_eq!(
        sensors
            .counters()
            .map_update_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "unwatching what the kernel program already deleted is no error"
    );
}
