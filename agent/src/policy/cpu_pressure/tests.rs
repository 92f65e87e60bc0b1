use std::time::Duration;

use super::*;

const MS: Duration = Duration::from_millis(1);
/// `cpu.idle` only (a v1 node without a cpuset lever, or one CPU).
const IDLE: Available = Available {
    idle: true,
    cpuset: false,
};
const NONE: Available = Available {
    idle: false,
    cpuset: false,
};
const ALL: Available = Available {
    idle: true,
    cpuset: true,
};

fn hot() -> Window {
    Window {
        latency_p99: Some(20 * MS),
        ..Window::default()
    }
}

fn calm() -> Window {
    Window {
        latency_p99: Some(MS),
        ..Window::default()
    }
}

fn cfg(calm_windows: u32) -> CpuPressureConfig {
    CpuPressureConfig {
        calm_windows,
        max_calm_windows: 8,
        ..CpuPressureConfig::default()
    }
}

fn run(c: &mut LevelStepper, windows: &[Window], idle: Available) -> Vec<Level> {
    windows
        .iter()
        .map(|w| {
            c.observe(w, idle);
            c.level()
        })
        .collect()
}

#[test]
fn pressure_steps_up_one_level_per_window_and_stops_at_the_floor() {
    let mut c = LevelStepper::new(cfg(3));
    let levels = run(&mut c, &[hot(); 5], IDLE);
    assert_eq!(
        levels,
        [
            Level::Idle,
            Level::Cap,
            Level::Floor,
            Level::Floor,
            Level::Floor
        ]
    );
}

#[test]
fn without_cpu_idle_the_first_step_is_the_cap() {
    let mut c = LevelStepper::new(cfg(1));
    assert_eq!(
        c.observe(&hot(), NONE),
        Some(Step::Engage {
            from: Level::None,
            to: Level::Cap
        })
    );
    assert_eq!(
        c.observe(&calm(), NONE),
        Some(Step::Release {
            from: Level::Cap,
            to: Level::None
        })
    );
}

#[test]
fn the_floor_does_not_engage_again() {
    let mut c = LevelStepper::new(cfg(3));
    run(&mut c, &[hot(); 3], IDLE);
    assert_eq!(c.observe(&hot(), IDLE), None);
}

#[test]
fn release_needs_calm_windows_in_a_row_and_goes_one_level_at_a_time() {
    let mut c = LevelStepper::new(cfg(3));
    run(&mut c, &[hot(); 3], IDLE);
    // Two calm, one hot (stays at the floor), then three calm: one release.
    let levels = run(
        &mut c,
        &[calm(), calm(), hot(), calm(), calm(), calm()],
        IDLE,
    );
    assert_eq!(
        levels,
        [
            Level::Floor,
            Level::Floor,
            Level::Floor,
            Level::Floor,
            Level::Floor,
            Level::Cap
        ]
    );
    // The release held for a whole calm run: the next needs the base run again.
    let levels = run(&mut c, &[calm(); 6], IDLE);
    assert_eq!(
        levels,
        [
            Level::Cap,
            Level::Cap,
            Level::Idle,
            Level::Idle,
            Level::Idle,
            Level::None
        ]
    );
    assert_eq!(c.observe(&calm(), IDLE), None);
    assert_eq!(c.level(), Level::None);
}

#[test]
fn pressure_soon_after_a_release_doubles_the_calm_run_up_to_the_maximum() {
    let mut c = LevelStepper::new(cfg(2));
    assert_eq!(c.required_calm(), 2);
    c.observe(&hot(), IDLE);
    run(&mut c, &[calm(), calm()], IDLE);
    assert_eq!(c.level(), Level::None);
    c.observe(&hot(), IDLE);
    assert_eq!(c.required_calm(), 4);
    run(&mut c, &[calm(); 4], IDLE);
    assert_eq!(c.level(), Level::None);
    c.observe(&hot(), IDLE);
    assert_eq!(c.required_calm(), 8);
    run(&mut c, &[calm(); 8], IDLE);
    c.observe(&hot(), IDLE);
    assert_eq!(c.required_calm(), 8, "capped at max_calm_windows");
    // Held for a full run after the release: back to the base.
    run(&mut c, &[calm(); 8], IDLE);
    assert_eq!(c.level(), Level::None);
    run(&mut c, &[calm(); 8], IDLE);
    assert_eq!(c.required_calm(), 2);
}

#[test]
fn late_pressure_after_a_release_does_not_back_off() {
    let mut c = LevelStepper::new(cfg(2));
    c.observe(&hot(), IDLE);
    run(&mut c, &[calm(), calm()], IDLE);
    run(&mut c, &[calm(), calm()], IDLE);
    c.observe(&hot(), IDLE);
    assert_eq!(c.required_calm(), 2);
}

#[test]
fn windows_without_enough_wakeups_are_calm_and_never_engage() {
    let mut c = LevelStepper::new(cfg(1));
    assert_eq!(c.observe(&Window::default(), IDLE), None);
    c.observe(&hot(), IDLE);
    assert_eq!(
        c.observe(&Window::default(), IDLE),
        Some(Step::Release {
            from: Level::Idle,
            to: Level::None
        })
    );
}

#[test]
fn the_target_itself_is_calm() {
    let c = LevelStepper::new(cfg(1));
    let at = Window {
        latency_p99: Some(5 * MS),
        ..Window::default()
    };
    assert!(!c.pressured(&at));
    assert!(c.pressured(&Window {
        latency_p99: Some(5 * MS + Duration::from_micros(1)),
        ..Window::default()
    }));
}

#[test]
fn psi_counts_only_with_a_target() {
    let busy = Window {
        latency_p99: None,
        psi_some: Some(0.9),
        ..Window::default()
    };
    assert!(!LevelStepper::new(cfg(1)).pressured(&busy));
    let c = LevelStepper::new(CpuPressureConfig {
        psi_some_target: Some(0.5),
        ..cfg(1)
    });
    assert!(c.pressured(&busy));
    assert!(!c.pressured(&Window {
        latency_p99: None,
        psi_some: Some(0.5),
        ..Window::default()
    }));
}

#[test]
fn levers_are_cumulative_with_a_floor() {
    let cfg = CpuPressureConfig::default();
    let at = |level| lever(&cfg, level, 2000, &CpuSet::first(2), 100_000, IDLE);
    assert_eq!(
        at(Level::None),
        Lever {
            idle: Some(false),
            quota_us: None,
            period_us: 100_000,
            cpus: None,
        }
    );
    assert_eq!(at(Level::Idle).idle, Some(true));
    assert_eq!(at(Level::Idle).quota_us, None);
    // 50% of 2 CPUs over 100 ms is 100 ms; 10% is 20 ms.
    assert_eq!(at(Level::Cap).quota_us, Some(100_000));
    assert_eq!(at(Level::Cap).idle, Some(true));
    assert_eq!(at(Level::Floor).quota_us, Some(20_000));
    assert_eq!(
        lever(&cfg, Level::Cap, 2000, &CpuSet::first(2), 100_000, NONE).idle,
        None
    );
}

#[test]
fn the_cap_never_goes_below_the_kernel_minimum_or_the_floor() {
    let tiny = CpuPressureConfig {
        cap_percent: 1,
        floor_percent: 5,
        ..CpuPressureConfig::default()
    };
    assert_eq!(
        lever(&tiny, Level::Cap, 100, &CpuSet::first(2), 100_000, IDLE).quota_us,
        Some(1000)
    );
    assert_eq!(
        lever(&tiny, Level::Floor, 10, &CpuSet::first(2), 100_000, IDLE).quota_us,
        Some(1000)
    );
    assert_eq!(
        lever(&tiny, Level::Cap, 4000, &CpuSet::first(2), 100_000, IDLE).quota_us,
        lever(&tiny, Level::Floor, 4000, &CpuSet::first(2), 100_000, IDLE).quota_us
    );
}

#[test]
fn granted_cpu_follows_the_cap() {
    let cfg = CpuPressureConfig::default();
    let g = |level| {
        granted_millis(
            &lever(&cfg, level, 2000, &CpuSet::first(2), 100_000, IDLE),
            2000,
        )
    };
    assert_eq!(
        [
            g(Level::None),
            g(Level::Idle),
            g(Level::Cap),
            g(Level::Floor)
        ],
        [2000, 2000, 1000, 200]
    );
}

#[test]
fn deltas_subtract_bucket_by_bucket_and_survive_a_reset() {
    let mut before = [0; RUNQ_HIST_BUCKETS];
    let mut now = [0; RUNQ_HIST_BUCKETS];
    before[3] = 10;
    now[3] = 15;
    now[4] = 2;
    before[5] = 7;
    now[5] = 1;
    let d = histogram_delta(&before, &now);
    assert_eq!((d[3], d[4], d[5]), (5, 2, 1));
    assert_eq!(d.iter().sum::<u64>(), 8);
}

#[test]
fn quantile_interpolates_inside_the_bucket() {
    let mut h = [0; RUNQ_HIST_BUCKETS];
    // 99 waits in [8, 16) µs, 1 in [4096, 8192) µs.
    h[3] = 99;
    h[12] = 1;
    assert_eq!(quantile(&h, 0.99, 1), Some(Duration::from_micros(16)));
    let p100 = quantile(&h, 1.0, 1).unwrap();
    assert_eq!(p100, Duration::from_micros(8192));
    h[12] = 10;
    // rank ceil(0.99*109)=108: the 9th of 10 in [4096, 8192) µs.
    let p99 = quantile(&h, 0.99, 1).unwrap();
    assert!(
        p99.abs_diff(Duration::from_nanos(7_782_400)) < Duration::from_nanos(10),
        "{p99:?}"
    );
}

#[test]
fn quantile_needs_enough_samples() {
    let mut h = [0; RUNQ_HIST_BUCKETS];
    assert_eq!(quantile(&h, 0.99, 1), None);
    h[0] = 19;
    assert_eq!(quantile(&h, 0.99, 20), None);
    h[0] = 20;
    assert!(quantile(&h, 0.99, 20).unwrap() <= Duration::from_micros(2));
}

#[test]
fn psi_share_of_a_window() {
    assert_eq!(psi_share(1_000, 501_000, Duration::from_secs(1)), Some(0.5));
    assert_eq!(psi_share(0, 3_000_000, Duration::from_secs(1)), Some(1.0));
    assert_eq!(psi_share(5, 4, Duration::from_secs(1)), None);
    assert_eq!(psi_share(0, 4, Duration::ZERO), None);
}

#[test]
fn psi_some_total_is_parsed() {
    let text = "some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=42\n";
    assert_eq!(parse_psi_some_total(text), Some(123_456));
    assert_eq!(parse_psi_some_total("full total=1\n"), None);
    assert_eq!(parse_psi_some_total("some avg10=x total=z\n"), None);
}

#[test]
fn with_cpusets_the_tier_leaves_cpus_to_the_protected_pods_before_any_cap() {
    let mut c = LevelStepper::new(cfg(1));
    assert_eq!(
        run(&mut c, &[hot(); 4], ALL),
        [Level::Idle, Level::Cpuset, Level::Cap, Level::Floor]
    );
    assert_eq!(
        run(&mut c, &[calm(); 4], ALL),
        [Level::Cap, Level::Cpuset, Level::Idle, Level::None]
    );
    // Without cpu.idle the cpuset is the first step.
    let mut c = LevelStepper::new(cfg(1));
    let no_idle = Available {
        idle: false,
        cpuset: true,
    };
    assert_eq!(
        c.observe(&hot(), no_idle),
        Some(Step::Engage {
            from: Level::None,
            to: Level::Cpuset
        })
    );
}

#[test]
fn the_cpuset_lever_keeps_the_highest_cpus_and_never_all_or_none() {
    let cfg = CpuPressureConfig::default();
    let cpus = |level, pods: &str| {
        lever(&cfg, level, 4000, &pods.parse().unwrap(), 100_000, ALL)
            .cpus
            .unwrap()
            .to_string()
    };
    // Below the cpuset level the tier has every pod CPU: a release writes them back.
    assert_eq!(cpus(Level::Idle, "2-5"), "2-5");
    // 50% of 4 CPUs, the highest; the cap and floor levels keep it.
    assert_eq!(cpus(Level::Cpuset, "2-5"), "4-5");
    assert_eq!(cpus(Level::Floor, "2-5"), "4-5");
    // Rounded up, at least one, never all.
    assert_eq!(cpus(Level::Cpuset, "0-2"), "1-2");
    assert_eq!(besteffort_cpus(&"0-1".parse().unwrap(), 1).to_string(), "1");
    assert_eq!(
        besteffort_cpus(&"0-1".parse().unwrap(), 100).to_string(),
        "1"
    );
    assert_eq!(besteffort_cpus(&"3".parse().unwrap(), 50).to_string(), "3");
    // No cpuset lever: the tier's CPUs are left alone.
    assert_eq!(
        lever(&cfg, Level::Floor, 4000, &CpuSet::first(4), 100_000, IDLE).cpus,
        None
    );
    // Granted CPU is the least of the quota and the CPUs.
    let l = lever(&cfg, Level::Cpuset, 4000, &CpuSet::first(4), 100_000, ALL);
    assert_eq!(granted_millis(&l, 4000), 2000);
    let l = lever(&cfg, Level::Floor, 4000, &CpuSet::first(4), 100_000, ALL);
    assert_eq!(granted_millis(&l, 4000), 400);
}

#[test]
fn an_idle_besteffort_tier_is_not_what_the_protected_pods_wait_behind() {
    let mut c = LevelStepper::new(cfg(2));
    // The floor is 10%: the tier is idle under 2.5% of the node's CPU.
    let with = |share| Window {
        besteffort_share: Some(share),
        ..hot()
    };
    assert!(!c.pressured(&with(0.02)));
    assert!(c.pressured(&with(0.03)));
    // Hogs held at the floor use all of it: still pressure, the tier stays at the floor.
    assert_eq!(
        run(&mut c, &[with(0.5), with(0.5), with(0.5), with(0.1)], IDLE),
        [Level::Idle, Level::Cap, Level::Floor, Level::Floor]
    );
    // The hogs are gone but the pods still wait (behind something else): released on schedule.
    assert_eq!(
        run(&mut c, &[with(0.0); 6], IDLE),
        [
            Level::Floor,
            Level::Cap,
            Level::Cap,
            Level::Idle,
            Level::Idle,
            Level::None
        ]
    );
    // And never engaged for a wait the tier does not cause.
    assert_eq!(run(&mut c, &[with(0.001); 3], IDLE), [Level::None; 3]);
}
