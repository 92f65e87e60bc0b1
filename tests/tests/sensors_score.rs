//! A process of a managed cgroup that writes its own oom_score_adj is detected and reset.

mod sensors_common;

use std::time::{Duration, Instant};

use qoslet::sensors::{ScoreKey, SensorEvent, SensorMode, SensorsConfig};
use qoslet_tests::require_root;
use sensors_common::{Cgroups, Script, start, status, wait_for};

const EXPECTED: i32 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_changes_its_oom_score_adj_is_reset_within_a_second() {
    require_root();
    let (sensors, mut rx) = start(SensorsConfig::default());
    let Some(cgroups) = Cgroups::create(&[]) else {
        return;
    };
    sensors.watch(cgroups.watched());
    sensors.expect_score(ScoreKey::Cgroup(cgroups.id()), EXPECTED);
    let mut script = Script::spawn("echo 500 > /proc/self/oom_score_adj; exec sleep 30");
    let pid = script.pid();
    cgroups.add(pid);
    std::fs::write(format!("/proc/{pid}/oom_score_adj"), EXPECTED.to_string())
        .expect("setting the starting score");
    let mode = status(&sensors, "oom_score_adj").mode;
    if mode == SensorMode::Fallback {
        // The fallback polls the expected score of known pids.
        sensors.expect_score(ScoreKey::Pid(pid), EXPECTED);
    }
    script.release();
    let written = Instant::now();

    if mode == SensorMode::Active {
        let seen = wait_for(&mut rx, Duration::from_secs(1), |e| match e {
            SensorEvent::OomScoreAdj {
                pid: p,
                oom_score_adj,
                cgroup_id,
                ..
            } if *p == pid => Some((*oom_score_adj, *cgroup_id)),
            _ => None,
        })
        .await;
        assert_eq!(
            seen,
            Some((500, cgroups.id())),
            "an oom_score_adj event for pid {pid} in its cgroup within 1 s"
        );
    }
    // The reset lands within 1 s of the write.
    let mut score = None;
    while written.elapsed() < Duration::from_secs(1) {
        score = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if score == Some(EXPECTED)
            && sensors
                .counters()
                .score_tampering
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(score, Some(EXPECTED), "score reset within 1 s");
    assert_eq!(
        sensors
            .counters()
            .score_tampering
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "one tampering counted"
    );
}
