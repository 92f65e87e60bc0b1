//! `ebpf.sensors`: a sensor switched off attaches none of its programs and runs its fallback
//! while the others stay on their hooks; with every sensor off nothing is loaded. With every
//! sensor on, each runs on a hook of `agent/src/sensors/table.rs` or on that table's fallback, as
//! this kernel allows; the test prints one `QOSLET-SENSOR` line per sensor, from which
//! `cargo xtask test` and `cargo xtask vm-test` write the kernel table of docs/kernels.md.

mod sensors_common;

use std::io::Write as _;

use qoslet::{
    config::EbpfConfig,
    sensors::{
        CpuSource, SensorMode, SensorSwitches, SensorsConfig,
        table::{Fallback, SENSORS, SWITCHED_OFF},
    },
};
use qoslet_tests::{Layout, kernel_version, layout, require_root};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sensor_runs_on_a_hook_of_the_table_or_its_fallback() {
    require_root();
    let (sensors, _rx) = start(SensorsConfig::default());
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let cgroup = match layout() {
        Layout::Unified => "v2",
        Layout::Hybrid => "hybrid",
        Layout::Legacy => "v1",
    };
    // Its own line even where libtest has printed `test ... ` without a newline yet.
    let mut lines = String::from("\n");
    for s in sensors.statuses() {
        let mode = match s.mode {
            SensorMode::Active => "active",
            SensorMode::Fallback => "fallback",
            SensorMode::Off => "off",
        };
        // Straight to the process's stdout, past libtest's capture: the VM's console and
        // `cargo xtask test` read these lines.
        lines.push_str(&format!(
            "QOSLET-SENSOR kernel={} arch={} cgroup={cgroup} sensor={} mode={mode} source={}\n",
            release.trim(),
            std::env::consts::ARCH,
            s.name,
            s.source
        ));
    }
    std::io::stdout()
        .write_all(lines.as_bytes())
        .expect("writing the sensor lines");

    for s in sensors.statuses() {
        let Some(sensor) = SENSORS.iter().find(|t| t.name == s.name) else {
            // memory_pressure: PSI, no program.
            assert_eq!(s.name, "memory_pressure");
            assert_eq!(
                s.mode,
                SensorMode::Active,
                "every kernel of the matrix has PSI"
            );
            continue;
        };
        match s.mode {
            SensorMode::Active => {
                let hooks: Vec<String> = sensor
                    .choices
                    .iter()
                    .map(|c| {
                        let h: Vec<String> = c.iter().map(|p| p.hook.to_string()).collect();
                        h.join(",")
                    })
                    .collect();
                assert!(hooks.contains(&s.source), "{s:?} not on {hooks:?}");
            }
            SensorMode::Fallback | SensorMode::Off => {
                let fallback = match sensor.fallback {
                    Fallback::Always(text) | Fallback::Psi(text) => text,
                };
                assert_eq!(s.mode, SensorMode::Fallback, "{s:?}");
                assert_eq!(s.source, fallback, "{s:?}");
                assert!(s.reason.as_deref().is_some_and(|r| !r.is_empty()), "{s:?}");
            }
        }
    }
    // What docs/kernels.md's sensor table promises per kernel.
    let version = kernel_version();
    // Before 6.15 there is no such function; from it on, fentry still needs the kernel's BPF
    // trampolines (the development host's 6.18 refuses it).
    let memcg = status(&sensors, "memcg_events");
    if version < (6, 15) {
        assert_eq!(
            memcg.mode,
            SensorMode::Fallback,
            "__memcg_memory_event exists from Linux 6.15: {memcg:?}"
        );
    }
}
