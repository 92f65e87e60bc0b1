//! A memory cgroup pushed over its limit (v1 memory.limit_in_bytes, v2 memory.max) produces memcg events from
//! whichever sensor is active, a reclaim stall recorded for the cgroup, and a reclaim wake-up
//! record that would wake the eviction manager of a node whose cgroup this is.

mod sensors_common;

use std::time::Duration;

use qoslet::{
    eviction::watch::{Wake, WakeSource},
    sensors::{
        SensorEvent, SensorMode, SensorsConfig,
        event::{MemcgEventKind, ReclaimKind},
    },
};
use qoslet_tests::{Hog, require_root};
use sensors_common::{Cgroups, start, status, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memcg_over_its_limit_reports_events_and_reclaim_stalls() {
    require_root();
    let (sensors, mut rx) = start(SensorsConfig::default());
    let Some(cgroups) = Cgroups::create(&["memory"]) else {
        return;
    };
    let memory = cgroups.of("memory");
    let expected_kind = if cgroups.is_v1() {
        memory.write("memory.limit_in_bytes", "33554432");
        MemcgEventKind::Max
    } else {
        // memory.max rather than memory.high: under emulation a task throttled at memory.high
        // crawls for minutes; hitting max counts the `max` event and ends in a quick OOM kill.
        memory.write("memory.max", "33554432");
        memory.write("memory.swap.max", "0");
        MemcgEventKind::Max
    };
    let memcg_id = memory.id();
    sensors.watch(cgroups.watched());
    let mut hog = Hog::spawn(256);
    cgroups.add(hog.pid());
    hog.release();

    let node_ids = [cgroups.id()];
    let mut reclaim_wakes = Vec::new();
    let mut collect_wake = |e: &SensorEvent| {
        if let SensorEvent::ReclaimWake {
            kind: ReclaimKind::Memcg,
            cgroup_id,
            ..
        } = e
            && *cgroup_id == node_ids[0]
        {
            reclaim_wakes.push(Wake::from_sensor(e, &node_ids).map(|w| w.source));
        }
    };
    let seen = wait_for(&mut rx, Duration::from_secs(10), |e| {
        collect_wake(e);
        match e {
            SensorEvent::Memcg {
                memcg_id: id, kind, ..
            } if *id == memcg_id && *kind == expected_kind => Some(*kind),
            _ => None,
        }
    })
    .await;
    let memcg_sensor = status(&sensors, "memcg_events");
    assert_eq!(
        seen,
        Some(expected_kind),
        "a {expected_kind:?} event for memcg {memcg_id} (sensor {memcg_sensor:?})"
    );
    // Over its limit the hog reclaims until the OOM killer ends it.
    let _ = tokio::task::block_in_place(|| hog.wait_signal(Duration::from_secs(60)));

    let reclaim = status(&sensors, "reclaim_stall");
    assert_eq!(reclaim.mode, SensorMode::Active, "{reclaim:?}");
    let stats = sensors
        .reclaim_stats(cgroups.id())
        .expect("reading RECLAIM_STATS")
        .expect("reclaim stalls recorded for the cgroup");
    eprintln!("reclaim: {stats:?}");
    assert!(stats.memcg_count > 0 && stats.memcg_ns > 0, "{stats:?}");

    // The hog's memcg reclaim sent wake-up records (at most one per 10 ms), each a wake-up for
    // a node whose cgroup is the hog's.
    while let Ok(e) = rx.try_recv() {
        collect_wake(&e);
    }
    let wake = status(&sensors, "reclaim_wake");
    eprintln!("reclaim wake-ups: {} ({wake:?})", reclaim_wakes.len());
    assert_eq!(wake.mode, SensorMode::Active, "{wake:?}");
    assert!(
        !reclaim_wakes.is_empty(),
        "a memcg reclaim wake-up record for cgroup {}",
        node_ids[0]
    );
    assert!(
        reclaim_wakes
            .iter()
            .all(|w| *w == Some(WakeSource::Reclaim)),
        "{reclaim_wakes:?}"
    );
}
