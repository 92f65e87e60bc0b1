//! With eBPF disabled by configuration, the fallback sensors report the same OOM: memory.events
//! `oom_kill` (v2) or memory.oom_control `oom_kill` (v1).

mod sensors_common;

use std::time::Duration;

use qoslet::sensors::{SensorEvent, SensorMode, SensorsConfig, event::MemcgEventKind};
use qoslet_tests::{Hog, require_root};
use sensors_common::{Cgroups, start, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ebpf_the_fallbacks_report_the_oom_kill() {
    require_root();
    let config = SensorsConfig {
        ebpf: false,
        ..SensorsConfig::default()
    };
    let (sensors, mut rx) = start(config);
    for name in ["oom_victim", "memcg_events"] {
        let s = sensors
            .statuses()
            .iter()
            .find(|s| s.name == name)
            .expect("a status per sensor");
        assert_eq!(s.mode, SensorMode::Fallback, "{s:?}");
        assert_eq!(s.reason.as_deref(), Some("eBPF disabled by configuration"));
    }
    let Some(cgroups) = Cgroups::create(&["memory"]) else {
        return;
    };
    let memory = cgroups.of("memory");
    if cgroups.is_v1() {
        memory.write("memory.limit_in_bytes", "33554432");
    } else {
        memory.write("memory.max", "33554432");
        memory.write("memory.swap.max", "0");
    }
    sensors.watch(cgroups.watched());
    let mut hog = Hog::spawn(256);
    cgroups.add(hog.pid());
    hog.release();
    let signal = tokio::task::block_in_place(|| hog.wait_signal(Duration::from_secs(30)));
    assert_eq!(signal, Some(libc::SIGKILL), "the hog should be OOM-killed");

    let kills = wait_for(&mut rx, Duration::from_secs(1), |e| match e {
        SensorEvent::Memcg {
            memcg_id,
            kind: MemcgEventKind::OomKill,
            count,
            ..
        } if *memcg_id == memory.id() => Some(*count),
        _ => None,
    })
    .await;
    assert_eq!(
        kills,
        Some(1),
        "one oom_kill of memcg {} within 1 s",
        memory.id()
    );
}
