//! The table logic against a fake kernel: which programs are tried, in which order, what is
//! detached again, and the status line each sensor gets.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::sensors::{SensorMode, SensorStatus, facade::decide};

/// Accepts every program except those refused, and records what it was asked.
#[derive(Default)]
struct FakeKernel {
    refused: BTreeSet<&'static str>,
    tried: Vec<&'static str>,
    detached: Vec<&'static str>,
}

impl FakeKernel {
    fn refusing(programs: &[&'static str]) -> Self {
        Self {
            refused: programs.iter().copied().collect(),
            ..Self::default()
        }
    }
}

impl Attach for FakeKernel {
    fn attach(&mut self, program: &Program) -> Result<(), String> {
        self.tried.push(program.name);
        if self.refused.contains(program.name) {
            Err(format!("{}: refused", program.hook))
        } else {
            Ok(())
        }
    }

    fn detach(&mut self, program: &Program) {
        self.detached.push(program.name);
    }
}

fn switches(settings: &[(&str, bool)]) -> SensorSwitches {
    let map: BTreeMap<String, bool> = settings
        .iter()
        .map(|(name, on)| (name.to_string(), *on))
        .collect();
    SensorSwitches::new(&map).expect("known sensor names")
}

fn status<'a>(statuses: &'a [SensorStatus], name: &str) -> &'a SensorStatus {
    statuses
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no status line for {name}: {statuses:?}"))
}

fn all_programs() -> Vec<&'static str> {
    SENSORS
        .iter()
        .flat_map(|s| s.choices.iter().flat_map(|c| c.iter().map(|p| p.name)))
        .collect()
}

#[test]
fn every_program_is_in_the_table_once_and_every_sensor_has_a_choice() {
    let programs = all_programs();
    let unique: BTreeSet<&str> = programs.iter().copied().collect();
    assert_eq!(unique.len(), programs.len(), "{programs:?}");
    // The functions of agent-ebpf, each a program of the object.
    assert_eq!(
        unique,
        BTreeSet::from([
            "oom_mark_victim_btf",
            "oom_mark_victim_tp",
            "memcg_memory_event",
            "memcg_reclaim_begin",
            "memcg_reclaim_end",
            "direct_reclaim_begin",
            "direct_reclaim_end",
            "kswapd_wakeup",
            "sched_switch",
            "oom_score_adj_update",
            "process_fork",
            "process_exec",
            "cgroup_mkdir",
            "cgroup_rmdir",
        ])
    );
    assert!(SENSORS.iter().all(|s| !s.choices.is_empty()));
}

#[test]
fn with_every_hook_accepted_each_sensor_runs_on_its_first_choice() {
    let mut kernel = FakeKernel::default();
    let attached = attach_sensors(&SensorSwitches::default(), &mut kernel).expect("attached");
    // The classic OOM tracepoint is not tried once the BTF one attached.
    assert!(!kernel.tried.contains(&"oom_mark_victim_tp"));
    assert_eq!(attached.programs.len(), all_programs().len() - 1);
    assert!(attached.skipped.is_empty());
    let statuses = decide(&attached.outcomes, true);
    let oom = status(&statuses, "oom_victim");
    assert_eq!(
        (oom.mode, oom.source.as_str(), &oom.reason),
        (SensorMode::Active, "tp_btf/mark_victim", &None)
    );
    let reclaim = status(&statuses, "reclaim_stall");
    assert_eq!(reclaim.mode, SensorMode::Active);
    assert_eq!(
        reclaim.source,
        "tracepoint/vmscan/mm_vmscan_memcg_reclaim_begin,tracepoint/vmscan/mm_vmscan_memcg_reclaim_end,tracepoint/vmscan/mm_vmscan_direct_reclaim_begin,tracepoint/vmscan/mm_vmscan_direct_reclaim_end"
    );
    assert_eq!(
        status(&statuses, "cpu_runqueue").source,
        "tp_btf/sched_switch"
    );
    assert_eq!(
        status(&statuses, "memcg_events").source,
        "fentry/__memcg_memory_event"
    );
    assert_eq!(
        status(&statuses, "memory_pressure").mode,
        SensorMode::Active
    );
}

#[test]
fn a_refused_hook_moves_to_the_next_preference_then_to_the_fallback() {
    let mut kernel = FakeKernel::refusing(&["oom_mark_victim_btf", "sched_switch"]);
    let attached = attach_sensors(&SensorSwitches::default(), &mut kernel).expect("attached");
    let statuses = decide(&attached.outcomes, true);
    let oom = status(&statuses, "oom_victim");
    assert_eq!(
        (oom.mode, oom.source.as_str()),
        (SensorMode::Active, "tracepoint/oom/mark_victim")
    );
    let cpu = status(&statuses, "cpu_runqueue");
    assert_eq!(cpu.mode, SensorMode::Fallback);
    assert!(cpu.source.starts_with("cgroup CPU files"), "{cpu:?}");
    assert_eq!(cpu.reason.as_deref(), Some("tp_btf/sched_switch: refused"));
    assert_eq!(
        attached.skipped,
        [
            "tp_btf/mark_victim: refused",
            "tp_btf/sched_switch: refused"
        ]
    );
    assert!(
        !attached
            .programs
            .iter()
            .any(|p| p.program == "sched_switch")
    );
}

#[test]
fn a_set_that_attaches_in_part_is_detached_and_the_sensor_falls_back() {
    let mut kernel = FakeKernel::refusing(&["memcg_reclaim_end"]);
    let attached = attach_sensors(&SensorSwitches::default(), &mut kernel).expect("attached");
    // Every program of the set was tried; those that attached were detached again.
    for p in [
        "memcg_reclaim_begin",
        "memcg_reclaim_end",
        "direct_reclaim_begin",
        "direct_reclaim_end",
    ] {
        assert!(kernel.tried.contains(&p), "{p} tried");
        assert!(!attached.programs.iter().any(|a| a.program == p), "{p}");
    }
    assert_eq!(
        kernel.detached,
        [
            "memcg_reclaim_begin",
            "direct_reclaim_begin",
            "direct_reclaim_end"
        ]
    );
    let with_psi = decide(&attached.outcomes, true);
    let reclaim = status(&with_psi, "reclaim_stall");
    assert_eq!(
        (reclaim.mode, reclaim.source.as_str()),
        (SensorMode::Fallback, "PSI memory triggers")
    );
    // Without PSI the fallback is not there: the sensor is off, and so is memory_pressure.
    let without_psi = decide(&attached.outcomes, false);
    let reclaim = status(&without_psi, "reclaim_stall");
    assert_eq!(
        (reclaim.mode, reclaim.source.as_str()),
        (SensorMode::Off, "none")
    );
    assert_eq!(
        reclaim.reason.as_deref(),
        Some("tracepoint/vmscan/mm_vmscan_memcg_reclaim_end: refused")
    );
    assert_eq!(
        status(&without_psi, "memory_pressure").mode,
        SensorMode::Off
    );
}

#[test]
fn a_switched_off_sensor_attaches_nothing_and_runs_its_fallback() {
    let mut kernel = FakeKernel::default();
    let off = switches(&[
        ("cpu_runqueue", false),
        ("cgroup_lifecycle", false),
        ("oom_score_adj", true),
    ]);
    let attached = attach_sensors(&off, &mut kernel).expect("attached");
    for p in ["sched_switch", "cgroup_mkdir", "cgroup_rmdir"] {
        assert!(!kernel.tried.contains(&p), "{p} was not tried");
    }
    assert!(kernel.tried.contains(&"oom_score_adj_update"));
    let statuses = decide(&attached.outcomes, true);
    for name in ["cpu_runqueue", "cgroup_lifecycle"] {
        let s = status(&statuses, name);
        assert_eq!(s.mode, SensorMode::Fallback, "{s:?}");
        assert_eq!(s.reason.as_deref(), Some(SWITCHED_OFF));
    }
    assert_eq!(status(&statuses, "oom_score_adj").mode, SensorMode::Active);
}

#[test]
fn a_switched_off_sensor_without_a_fallback_is_off() {
    let mut kernel = FakeKernel::default();
    let attached =
        attach_sensors(&switches(&[("reclaim_stall", false)]), &mut kernel).expect("attached");
    let statuses = decide(&attached.outcomes, false);
    let s = status(&statuses, "reclaim_stall");
    assert_eq!((s.mode, s.source.as_str()), (SensorMode::Off, "none"));
    assert_eq!(s.reason.as_deref(), Some(SWITCHED_OFF));
}

#[test]
fn the_oom_victim_is_essential_unless_switched_off() {
    let mut kernel = FakeKernel::refusing(&["oom_mark_victim_btf", "oom_mark_victim_tp"]);
    let err = attach_sensors(&SensorSwitches::default(), &mut kernel)
        .expect_err("no OOM program is an error");
    assert_eq!(err.sensor, "oom_victim");
    assert_eq!(
        err.reason,
        "tp_btf/mark_victim: refused; tracepoint/oom/mark_victim: refused"
    );

    let mut kernel = FakeKernel::refusing(&["oom_mark_victim_btf", "oom_mark_victim_tp"]);
    let attached = attach_sensors(&switches(&[("oom_victim", false)]), &mut kernel)
        .expect("a switched-off essential sensor is not required");
    assert!(
        !kernel
            .tried
            .iter()
            .any(|p| p.starts_with("oom_mark_victim"))
    );
    let statuses = decide(&attached.outcomes, true);
    let oom = status(&statuses, "oom_victim");
    assert_eq!(oom.mode, SensorMode::Fallback);
    assert_eq!(oom.reason.as_deref(), Some(SWITCHED_OFF));
}

#[test]
fn unknown_sensor_names_are_rejected_with_the_known_ones() {
    let map = BTreeMap::from([("oom".to_string(), false)]);
    let err = SensorSwitches::new(&map).expect_err("oom is not a sensor");
    assert_eq!(
        err.to_string(),
        "unknown sensor \"oom\" (the eBPF sensors are oom_victim, memcg_events, reclaim_stall, reclaim_wake, cpu_runqueue, oom_score_adj, process_lifecycle, cgroup_lifecycle)"
    );
    let all_off: BTreeMap<String, bool> = SENSORS
        .iter()
        .map(|s| (s.name.to_string(), false))
        .collect();
    assert!(!SensorSwitches::new(&all_off).expect("known").any_on());
    assert!(SensorSwitches::default().any_on());
}

#[test]
fn the_configuration_switches_reach_the_sensors_config() {
    let ebpf = crate::config::EbpfConfig {
        enabled: true,
        sensors: BTreeMap::from([
            ("cpu_runqueue".to_string(), false),
            ("oom_score_adj".to_string(), true),
        ]),
        kernel_diagnostics: true,
    };
    let config = crate::sensors::SensorsConfig::from(&ebpf);
    assert!(config.ebpf);
    assert!(config.kernel_diagnostics);
    assert!(!config.switches.is_on("cpu_runqueue"));
    assert!(config.switches.is_on("oom_score_adj"));
    assert!(config.switches.is_on("oom_victim"));
    assert_eq!(
        config.switches,
        SensorSwitches::new(&ebpf.sensors).expect("known")
    );
}
