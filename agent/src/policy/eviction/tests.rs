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
    // A hard threshold: qoslet kills at once (the kubelet gives 1 s, raised to 2 s).
    assert_eq!(eviction_grace_secs(true, 30, 10), 0);
    assert_eq!(eviction_grace_secs(false, 30, 10), 10);
    assert_eq!(eviction_grace_secs(false, 5, 10), 5);
    // The kubelet's default evictionMaxPodGracePeriod (0): the runtime's floor, not the pod's.
    assert_eq!(eviction_grace_secs(false, 30, 0), MIN_GRACE_SECS);
    assert_eq!(eviction_grace_secs(false, 0, 10), MIN_GRACE_SECS);
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

/// (signal, value, grace seconds, minimum reclaim) as the test writes them.
type Row<'a> = (&'a str, &'a str, u64, Option<&'a str>);

fn expect(rows: &[Row<'_>]) -> Vec<Threshold> {
    let value = |t: &str| {
        if let Some(p) = t.strip_suffix('%') {
            ThresholdValue::Percentage(p.parse::<f32>().unwrap() / 100.0)
        } else {
            ThresholdValue::Quantity(t.parse().unwrap())
        }
    };
    rows.iter()
        .map(|(signal, v, grace, reclaim)| Threshold {
            signal: (*signal).into(),
            value: value(v),
            grace_period_secs: *grace,
            min_reclaim: reclaim.map(value),
        })
        .collect()
}

/// pkg/kubelet/eviction/helpers_test.go `TestParseThresholdConfig`, every row (the same in
/// 1.34 to 1.37). Upstream compares as sets; ours come hard then soft, each in signal order,
/// allocatableMemory copies last.
#[test]
fn parse_threshold_config_reproduces_the_kubelet_rows() {
    type Input<'a> = (
        &'a [(&'a str, &'a str)],
        &'a [(&'a str, &'a str)],
        &'a [(&'a str, &'a str)],
        &'a [(&'a str, &'a str)],
    );
    let rows: Vec<(&str, bool, Input<'_>, Option<Vec<Threshold>>)> = vec![
        ("no values", false, (&[], &[], &[], &[]), Some(vec![])),
        (
            "all memory eviction values",
            true,
            (
                &[("memory.available", "150Mi")],
                &[("memory.available", "300Mi")],
                &[("memory.available", "30s")],
                &[("memory.available", "0")],
            ),
            Some(expect(&[
                ("memory.available", "150Mi", 0, Some("0")),
                ("allocatableMemory.available", "150Mi", 0, Some("0")),
                ("memory.available", "300Mi", 30, Some("0")),
            ])),
        ),
        (
            "all memory eviction values in percentages",
            false,
            (
                &[("memory.available", "10%")],
                &[("memory.available", "30%")],
                &[("memory.available", "30s")],
                &[("memory.available", "5%")],
            ),
            Some(expect(&[
                ("memory.available", "10%", 0, Some("5%")),
                ("memory.available", "30%", 30, Some("5%")),
            ])),
        ),
        (
            "disk eviction values",
            false,
            (
                &[
                    ("imagefs.available", "150Mi"),
                    ("nodefs.available", "100Mi"),
                ],
                &[
                    ("imagefs.available", "300Mi"),
                    ("nodefs.available", "200Mi"),
                ],
                &[("imagefs.available", "30s"), ("nodefs.available", "30s")],
                &[("imagefs.available", "2Gi"), ("nodefs.available", "1Gi")],
            ),
            Some(expect(&[
                ("imagefs.available", "150Mi", 0, Some("2Gi")),
                ("nodefs.available", "100Mi", 0, Some("1Gi")),
                ("imagefs.available", "300Mi", 30, Some("2Gi")),
                ("nodefs.available", "200Mi", 30, Some("1Gi")),
            ])),
        ),
        (
            "disk eviction values in percentages",
            false,
            (
                &[("imagefs.available", "15%"), ("nodefs.available", "10.5%")],
                &[("imagefs.available", "30%"), ("nodefs.available", "20.5%")],
                &[("imagefs.available", "30s"), ("nodefs.available", "30s")],
                &[("imagefs.available", "10%"), ("nodefs.available", "5%")],
            ),
            Some(expect(&[
                ("imagefs.available", "15%", 0, Some("10%")),
                ("nodefs.available", "10.5%", 0, Some("5%")),
                ("imagefs.available", "30%", 30, Some("10%")),
                ("nodefs.available", "20.5%", 30, Some("5%")),
            ])),
        ),
        (
            "inode eviction values",
            false,
            (
                &[
                    ("imagefs.inodesFree", "150Mi"),
                    ("nodefs.inodesFree", "100Mi"),
                ],
                &[
                    ("imagefs.inodesFree", "300Mi"),
                    ("nodefs.inodesFree", "200Mi"),
                ],
                &[("imagefs.inodesFree", "30s"), ("nodefs.inodesFree", "30s")],
                &[("imagefs.inodesFree", "2Gi"), ("nodefs.inodesFree", "1Gi")],
            ),
            Some(expect(&[
                ("imagefs.inodesFree", "150Mi", 0, Some("2Gi")),
                ("nodefs.inodesFree", "100Mi", 0, Some("1Gi")),
                ("imagefs.inodesFree", "300Mi", 30, Some("2Gi")),
                ("nodefs.inodesFree", "200Mi", 30, Some("1Gi")),
            ])),
        ),
        // A soft threshold disabled by 0% / 100% needs no grace period.
        (
            "disable via 0%",
            false,
            (
                &[("memory.available", "0%")],
                &[("memory.available", "0%")],
                &[],
                &[],
            ),
            Some(vec![]),
        ),
        (
            "disable via 100%",
            false,
            (
                &[("memory.available", "100%")],
                &[("memory.available", "100%")],
                &[],
                &[],
            ),
            Some(vec![]),
        ),
        (
            "invalid-signal",
            false,
            (&[("mem.available", "150Mi")], &[], &[], &[]),
            None,
        ),
        (
            "hard-signal-negative",
            false,
            (&[("memory.available", "-150Mi")], &[], &[], &[]),
            None,
        ),
        (
            "hard-signal-negative-percentage",
            false,
            (&[("memory.available", "-15%")], &[], &[], &[]),
            None,
        ),
        (
            "hard-signal-percentage-greater-than-100%",
            false,
            (&[("memory.available", "150%")], &[], &[], &[]),
            None,
        ),
        (
            "soft-signal-negative",
            false,
            (&[], &[("memory.available", "-150Mi")], &[], &[]),
            None,
        ),
        (
            "valid-and-invalid-signal",
            false,
            (
                &[("memory.available", "150Mi"), ("invalid.foo", "150Mi")],
                &[],
                &[],
                &[],
            ),
            None,
        ),
        (
            "soft-no-grace-period",
            false,
            (&[], &[("memory.available", "150Mi")], &[], &[]),
            None,
        ),
        (
            "soft-negative-grace-period",
            false,
            (
                &[],
                &[("memory.available", "150Mi")],
                &[("memory.available", "-30s")],
                &[],
            ),
            None,
        ),
        // A negative minimum reclaim is an error even when no threshold uses it.
        (
            "negative-reclaim",
            false,
            (&[], &[], &[], &[("memory.available", "-300Mi")]),
            None,
        ),
    ];
    for (name, pods_enforced, (hard, soft, grace, reclaim), want) in rows {
        let (hard, soft, grace, reclaim) = (map(hard), map(soft), map(grace), map(reclaim));
        let got = parse_thresholds(&EvictionInput {
            hard: Some(&hard),
            soft: Some(&soft),
            soft_grace: Some(&grace),
            min_reclaim: Some(&reclaim),
            merge_defaults: false,
            pods_enforced,
        });
        match want {
            Some(want) => {
                let (h, s) = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!([h, s].concat(), want, "{name}");
            }
            None => assert!(got.is_err(), "{name}: {got:?}"),
        }
    }
}

#[test]
fn errors_name_the_field_with_the_upstream_text() {
    let reclaim = map(&[("memory.available", "0%")]);
    let e = parse_thresholds(&EvictionInput {
        min_reclaim: Some(&reclaim),
        ..EvictionInput::default()
    })
    .unwrap_err();
    assert_eq!(e.field(), "evictionMinimumReclaim.memory.available");
    assert_eq!(
        e.to_string(),
        "eviction percentage minimum reclaim memory.available must be positive: 0%"
    );
    let hard = map(&[("memory.available", "0")]);
    let e = parse_thresholds(&EvictionInput {
        hard: Some(&hard),
        ..EvictionInput::default()
    })
    .unwrap_err();
    assert_eq!(e.field(), "evictionHard.memory.available");
    assert_eq!(
        e.to_string(),
        "eviction threshold memory.available must be positive: 0"
    );
    // Only the literal 0% disables: 0.0% is a threshold of 0 (parseThresholdStatement).
    let hard = map(&[("memory.available", "0.0%")]);
    let (h, _) = parse_thresholds(&EvictionInput {
        hard: Some(&hard),
        ..EvictionInput::default()
    })
    .unwrap();
    assert_eq!(h[0].value, ThresholdValue::Percentage(0.0));
}

fn pod(yaml: &str) -> PodSpecView {
    let pod: k8s_openapi::api::core::v1::Pod = serde_yaml_ng::from_str(yaml).unwrap();
    PodSpecView::from_pod(&pod).unwrap()
}

fn ranked_pod(name: &str, priority: i32, memory_request: &str) -> PodSpecView {
    let requests = if memory_request.is_empty() {
        String::new()
    } else {
        format!(", resources: {{requests: {{memory: {memory_request}}}}}")
    };
    pod(&format!(
        "metadata: {{name: {name}, uid: {name}}}\nspec: {{priority: {priority}, containers: [{{name: c{requests}}}]}}"
    ))
}

fn order(pods: &[PodSpecView], usage: &[(&str, i64)]) -> Vec<String> {
    memory_eviction_order(pods, |p| {
        usage.iter().find(|(n, _)| *n == p.name).map(|(_, u)| *u)
    })
    .into_iter()
    .map(|e| e.name)
    .collect()
}

const MI: i64 = 1 << 20;

/// helpers_test.go `TestOrderedByExceedsRequestMemory`: the pod over its request goes first
/// whatever the priorities.
#[test]
fn eviction_order_puts_pods_over_their_request_first() {
    let pods = [
        ranked_pod("below-requests", -1, "200Mi"),
        ranked_pod("exceeds-requests", 1, "100Mi"),
    ];
    let usage = [("below-requests", 199 * MI), ("exceeds-requests", 101 * MI)];
    assert_eq!(order(&pods, &usage), ["exceeds-requests", "below-requests"]);
    let ranks = memory_eviction_order(&pods, |p| usage.iter().find(|u| u.0 == p.name).map(|u| u.1));
    assert_eq!(ranks[0].rank, Some(1));
    assert_eq!(
        ranks[0].reason,
        "usage 101.0Mi exceeds request 100.0Mi by 1.0Mi; priority 1"
    );
    assert_eq!(
        ranks[1].reason,
        "usage 199.0Mi within request 200.0Mi; priority -1; 1.0Mi below request"
    );
}

/// helpers_test.go `TestOrderedByPriority`: within the same side of the request, lower priority
/// first.
#[test]
fn eviction_order_then_follows_priority() {
    let pods = [
        ranked_pod("high-priority", 12534, "200Mi"),
        ranked_pod("medium-priority", 1, "100Mi"),
        ranked_pod("low-priority", -134, ""),
    ];
    let usage = [
        ("high-priority", 0),
        ("medium-priority", 0),
        ("low-priority", 0),
    ];
    assert_eq!(
        order(&pods, &usage),
        ["low-priority", "medium-priority", "high-priority"]
    );
    // A pod without stats is ranked first (exceedMemoryRequests: "prioritize evicting the pod
    // for which no stats were found"); a critical pod is never ranked.
    let mut with_critical = pods.to_vec();
    with_critical.push(pod(
        "metadata: {name: node-agent, uid: n}\nspec: {priorityClassName: system-node-critical, containers: [{name: c}]}",
    ));
    let ranks = memory_eviction_order(&with_critical, |p| {
        (p.name != "medium-priority").then_some(0)
    });
    let names: Vec<(&str, Option<usize>)> =
        ranks.iter().map(|e| (e.name.as_str(), e.rank)).collect();
    assert_eq!(
        names,
        [
            ("medium-priority", Some(1)),
            ("low-priority", Some(2)),
            ("high-priority", Some(3)),
            ("node-agent", None)
        ]
    );
}

/// pkg/api/v1/resource `GetResourceRequestQuantity`: overhead counts in the request the usage
/// is compared with, but only when the request is not zero.
#[test]
fn eviction_request_counts_overhead_on_a_nonzero_request() {
    let p = pod(
        "metadata: {name: k}\nspec: {overhead: {memory: 64Mi}, containers: [{name: c, resources: {requests: {memory: 100Mi}}}]}",
    );
    assert_eq!(eviction_request_bytes(&p), 164 * MI);
    let p = pod("metadata: {name: k}\nspec: {overhead: {memory: 64Mi}, containers: [{name: c}]}");
    assert_eq!(eviction_request_bytes(&p), 0);
}
