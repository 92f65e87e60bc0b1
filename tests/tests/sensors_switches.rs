//! `ebpf.sensors`: a sensor switched off attaches none of its programs and runs its fallback
//! while the others stay on their hooks; with every sensor off nothing is loaded.

mod sensors_common;

use qoslet::{
    config::EbpfConfig,
    sensors::{
        CpuSource, SensorMode, SensorSwitches, SensorsConfig,
        table::{SENSORS, SWITCHED_OFF},
    },
};
use qoslet_tests::require_root;
use sensors_common::{Cgroups, remove_and_wait_unwatched, start, status};

/// The configuration `ebpf: {sensors: {<name>: false, ...}}` gives the node.
fn switched_off(names: &[&str]) -> SensorsConfig {
    let settings = EbpfConfig {
        enabled: true,
        sensors: names.iter().map(|n| (n.to_string(), false)).collect(),
        ..EbpfConfig::default()
    };
    SensorSwitches::new(&settings.sensors).expect("known sensor names");
    SensorsConfig::from(&settings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switched_off_sensor_runs_its_fallback_and_the_others_their_hooks() {
    require_root();
    let (sensors, _rx) = start(switched_off(&["cpu_runqueue", "cgroup_lifecycle"]));
    for name in ["cpu_runqueue", "cgroup_lifecycle"] {
        let s = status(&sensors, name);
        assert_eq!(s.mode, SensorMode::Fallback, "{s:?}");
        assert_eq!(s.reason.as_deref(), Some(SWITCHED_OFF));
    }
    let score = status(&sensors, "oom_score_adj");
    assert_eq!(score.mode, SensorMode::Active, "{score:?}");
    let attached: Vec<&str> = sensors
        .with_ebpf(|e| e.attached().iter().map(|a| a.program).collect())
        .expect("the eBPF sensors are loaded");
    for program in ["sched_switch", "cgroup_mkdir", "cgroup_rmdir"] {
        assert!(!attached.contains(&program), "{program} in {attached:?}");
    }
    assert!(attached.contains(&"oom_score_adj_update"), "{attached:?}");
    assert!(
        !sensors
            .program_costs()
            .iter()
            .any(|c| c.program == "sched_switch"),
        "no cost is reported for a program that is not attached"
    );

    // The CPU figures come from the cgroup files, and a removed cgroup is found by the scan.
    let (Some(kept), Some(removed)) = (Cgroups::create(&[]), Cgroups::create(&[])) else {
        return;
    };
    sensors.watch(kept.watched());
    sensors.watch(removed.watched());
    let usage = sensors
        .cpu_stats(kept.id())
        .expect("reading the cgroup's CPU files")
        .expect("usage of a watched cgroup");
    assert_eq!(usage.source, CpuSource::CgroupFiles);
    let id = remove_and_wait_unwatched(&sensors, removed).await;
    assert!(!sensors.is_watched(id), "the removed cgroup is unwatched");
    assert!(sensors.is_watched(kept.id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_sensor_switched_off_nothing_is_loaded() {
    require_root();
    let all: Vec<&str> = SENSORS.iter().map(|s| s.name).collect();
    let config = switched_off(&all);
    let (sensors, _rx) = start(config);
    assert!(sensors.with_ebpf(|_| ()).is_none(), "no eBPF object loaded");
    for s in sensors.statuses() {
        if s.name != "memory_pressure" {
            assert_eq!(s.reason.as_deref(), Some(SWITCHED_OFF), "{s:?}");
        }
    }
}
