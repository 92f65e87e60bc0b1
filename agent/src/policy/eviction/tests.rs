use std::collections::BTreeMap;

use super::*;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect()
}

fn signals(ts: &[Threshold]) -> Vec<&str> {
    ts.iter().map(|t| t.signal.as_str()).collect()
}

#[test]
fn defaults_apply_when_hard_is_unset_and_memory_is_copied_for_allocatable() {
    let (hard, soft) = parse_thresholds(&EvictionInput {
        pods_enforced: true,
        ..EvictionInput::default()
    })
    .unwrap();
    assert_eq!(
        signals(&hard),
        [
            "imagefs.available",
            "memory.available",
            "nodefs.available",
            "nodefs.inodesFree",
            "allocatableMemory.available"
        ]
    );
    assert_eq!(hard[1].value.amount(0), 100 << 20);
    assert_eq!(hard[4].value, hard[1].value);
    assert!(soft.is_empty());
    let (hard, _) = parse_thresholds(&EvictionInput::default()).unwrap();
    assert!(!signals(&hard).contains(&"allocatableMemory.available"));
}

#[test]
fn zero_and_hundred_percent_are_ignored() {
    let hard = map(&[
        ("memory.available", "0%"),
        ("nodefs.available", "100%"),
        ("pid.available", "5%"),
    ]);
    let (hard, _) = parse_thresholds(&EvictionInput {
        hard: Some(&hard),
        ..EvictionInput::default()
    })
    .unwrap();
    assert_eq!(signals(&hard), ["pid.available"]);
    assert_eq!(hard[0].value.amount(1000), 50);
}

#[test]
fn soft_thresholds_need_a_grace_period() {
    let soft = map(&[("memory.available", "500Mi")]);
    let err = parse_thresholds(&EvictionInput {
        soft: Some(&soft),
        ..EvictionInput::default()
    })
    .unwrap_err();
    assert_eq!(
        err,
        ThresholdError::MissingGrace {
            signal: "memory.available".into()
        }
    );
    let grace = map(&[("memory.available", "1m30s")]);
    let reclaim = map(&[("memory.available", "200Mi")]);
    let (_, soft) = parse_thresholds(&EvictionInput {
        soft: Some(&soft),
        soft_grace: Some(&grace),
        min_reclaim: Some(&reclaim),
        ..EvictionInput::default()
    })
    .unwrap();
    assert_eq!(soft[0].grace_period_secs, 90);
    assert_eq!(soft[0].min_reclaim.map(|m| m.amount(0)), Some(200 << 20));
}

#[test]
fn bad_thresholds_are_errors() {
    for (signal, value) in [
        ("memory.available", "-1"),
        ("memory.available", "0"),
        ("memory.available", "101%"),
        ("memory.available", "1Gb"),
    ] {
        let hard = map(&[(signal, value)]);
        assert!(
            matches!(
                parse_thresholds(&EvictionInput {
                    hard: Some(&hard),
                    ..EvictionInput::default()
                }),
                Err(ThresholdError::Value { .. })
            ),
            "{value}"
        );
    }
    let hard = map(&[("memory.free", "1Gi")]);
    assert!(matches!(
        parse_thresholds(&EvictionInput {
            hard: Some(&hard),
            ..EvictionInput::default()
        }),
        Err(ThresholdError::UnknownSignal { .. })
    ));
}

fn cand(usage: i64, request: i64, priority: i32) -> Candidate {
    Candidate {
        usage_bytes: usage,
        request_bytes: request,
        priority,
        critical: false,
        start_time: 0,
        processes: 1,
    }
}

#[test]
fn memory_ranking_puts_over_request_first_then_priority_then_excess() {
    let pods = [
        cand(100, 200, 0),    // 0: Burstable under request
        cand(300, 0, 10),     // 1: BestEffort, higher priority
        cand(50, 0, 0),       // 2: BestEffort
        cand(500, 100, 0),    // 3: Burstable over request by 400
        cand(1000, 1000, -5), // 4: Guaranteed, low priority
        Candidate {
            critical: true,
            ..cand(9999, 0, 0)
        }, // 5: critical, never ranked
    ];
    assert_eq!(rank_memory(&pods), [3, 2, 1, 4, 0]);
}

#[test]
fn pid_ranking_is_by_priority() {
    let pods = [
        cand(0, 0, 5),
        cand(0, 0, -1),
        Candidate {
            critical: true,
            ..cand(0, 0, -9)
        },
        cand(0, 0, 5),
    ];
    assert_eq!(rank_pids(&pods), [1, 0, 3]);
}

#[test]
fn grace_periods() {
    assert_eq!(eviction_grace_secs(true, 30, 10), 0);
    assert_eq!(eviction_grace_secs(false, 30, 10), 10);
    assert_eq!(eviction_grace_secs(false, 5, 10), 5);
    assert_eq!(eviction_grace_secs(false, 30, 0), 30);
}

#[test]
fn partial_hard_drops_or_merges_the_defaults() {
    let hard = map(&[("memory.available", "200Mi")]);
    let (only, _) = parse_thresholds(&EvictionInput {
        hard: Some(&hard),
        ..EvictionInput::default()
    })
    .unwrap();
    assert_eq!(signals(&only), ["memory.available"]);
    let (merged, _) = parse_thresholds(&EvictionInput {
        hard: Some(&hard),
        merge_defaults: true,
        ..EvictionInput::default()
    })
    .unwrap();
    assert_eq!(
        signals(&merged),
        [
            "imagefs.available",
            "memory.available",
            "nodefs.available",
            "nodefs.inodesFree"
        ]
    );
    assert_eq!(merged[1].value.amount(0), 200 << 20);
}
