use proptest::prelude::*;

use super::*;
use crate::workload::{
    Kind, ObjRef, Object,
    types::{Disruption, Group, Meta, Origin, Pod, Policy, Scheduling, WorkloadRef},
};

const MI: i64 = 1 << 20;
const NS: &str = "ns";

fn meta(name: &str) -> Meta {
    Meta {
        name: name.into(),
        namespace: NS.into(),
        uid: None,
        owners: Vec::new(),
        origin: Origin::default(),
    }
}

fn group(kind: Kind, name: &str, parent: Option<&str>, gang_min: Option<i32>, all: bool) -> Object {
    Object::Group(Group {
        meta: meta(name),
        kind,
        parent: parent.map(str::to_owned),
        workload_ref: Some(WorkloadRef {
            workload_name: "w".into(),
            template_name: name.into(),
        }),
        scheduling: Scheduling {
            policy: gang_min.map_or(Policy::Basic, |min| Policy::Gang { min }),
            disruption: if all {
                Disruption::All
            } else {
                Disruption::Single
            },
            priority: None,
            priority_class_name: None,
            preemption_policy: None,
        },
    })
}

fn member(name: &str, group: &str, phase: &str) -> Object {
    Object::Pod(Pod {
        meta: meta(name),
        pod_group: Some(group.into()),
        scheduler_name: None,
        priority: None,
        priority_class_name: None,
        preemption_policy: None,
        phase: Some(phase.into()),
    })
}

fn forests(objects: Vec<Object>) -> BTreeMap<String, Forest> {
    [(NS.to_owned(), Forest::new(objects))].into()
}

fn key(name: &str) -> PodKey {
    PodKey {
        namespace: NS.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

/// usage and request in MiB.
fn s(name: &str, usage: i64, request: i64, priority: i32) -> Sample {
    Sample {
        key: key(name),
        candidate: Candidate {
            usage_bytes: usage * MI,
            request_bytes: request * MI,
            priority,
            critical: priority >= 2_000_000_000,
            start_time: 0,
            processes: 1,
        },
    }
}

fn names(c: &Choice) -> Vec<&str> {
    c.pods.iter().map(|k| k.name.as_str()).collect()
}

fn classes() -> Vec<Sample> {
    vec![
        s("guaranteed", 200, 200, 0),
        s("burstable-under", 50, 100, 0),
        s("burstable-over", 150, 100, 0),
        s("best-effort", 30, 0, 0),
    ]
}

#[test]
fn kubelet_order_goes_best_effort_then_burstable_over_request() {
    let none = BTreeMap::new();
    for order in [Order::Kubelet, Order::GangAware] {
        let mut pods = classes();
        let c = choose(&pods, &none, Resource::Memory, MI, order).unwrap();
        // BestEffort exceeds its zero request by 30Mi, less than burstable-over's 50Mi: both
        // exceed, so the larger excess goes first, as upstream.
        assert_eq!(names(&c), ["burstable-over"], "{order:?}");
        pods.retain(|p| p.key.name != "burstable-over");
        let c = choose(&pods, &none, Resource::Memory, MI, order).unwrap();
        assert_eq!(names(&c), ["best-effort"]);
        pods.retain(|p| p.key.name != "best-effort");
        let c = choose(&pods, &none, Resource::Memory, MI, order).unwrap();
        assert_eq!(
            names(&c),
            ["guaranteed"],
            "equal tier: the larger usage - request"
        );
    }
}

#[test]
fn lower_priority_goes_first_among_pods_over_request() {
    let pods = vec![s("high", 500, 0, 1000), s("low", 10, 0, -5)];
    let c = choose(
        &pods,
        &BTreeMap::new(),
        Resource::Memory,
        MI,
        Order::Kubelet,
    )
    .unwrap();
    assert_eq!(names(&c), ["low"]);
    assert_eq!(c.reason, Reason::KubeletRank);
}

#[test]
fn critical_pods_are_never_chosen() {
    let pods = vec![s("critical", 900, 0, 2_000_000_000)];
    for order in [Order::Kubelet, Order::GangAware] {
        assert!(choose(&pods, &BTreeMap::new(), Resource::Memory, MI, order).is_none());
    }
    let mut pods = pods;
    pods.push(s("guaranteed", 10, 10, 0));
    let c = choose(
        &pods,
        &BTreeMap::new(),
        Resource::Memory,
        MI,
        Order::GangAware,
    )
    .unwrap();
    assert_eq!(names(&c), ["guaranteed"]);
}

#[test]
fn a_disruption_mode_all_hierarchy_goes_whole() {
    let f = forests(vec![
        group(Kind::CompositePodGroup, "root", None, Some(2), true),
        group(Kind::PodGroup, "a", Some("root"), Some(1), true),
        group(Kind::PodGroup, "b", Some("root"), Some(1), true),
        member("a0", "a", "Running"),
        member("b0", "b", "Running"),
        member("b1", "b", "Running"),
    ]);
    // `lone` is under its request: a later tier than the hierarchy's BestEffort pods.
    let mut pods = vec![
        s("a0", 40, 0, 0),
        s("b0", 10, 0, 0),
        s("b1", 10, 0, 0),
        s("lone", 5, 10, 0),
    ];
    let c = choose(&pods, &f, Resource::Memory, MI, Order::GangAware).unwrap();
    assert_eq!(names(&c), ["a0", "b0", "b1"]);
    assert_eq!(c.frees, 60 * MI);
    assert_eq!(
        c.unit,
        Some((
            NS.into(),
            UnitRoot::Group(ObjRef::new(Kind::CompositePodGroup, "root"))
        ))
    );
    // The kubelet order takes the single pod.
    let k = choose(&pods, &f, Resource::Memory, MI, Order::Kubelet).unwrap();
    assert_eq!(names(&k), ["a0"]);
    // A lone pod of the same tier keeps the gangs: it goes first.
    pods[3] = s("lone", 20, 10, 0);
    let c = choose(&pods, &f, Resource::Memory, MI, Order::GangAware).unwrap();
    assert_eq!(names(&c), ["lone"]);
}

#[test]
fn a_unit_holding_a_critical_pod_is_never_chosen() {
    let f = forests(vec![
        group(Kind::PodGroup, "g", None, Some(1), true),
        member("g0", "g", "Running"),
        member("g1", "g", "Running"),
    ]);
    let pods = vec![
        s("g0", 400, 0, 0),
        s("g1", 1, 0, 2_000_000_000),
        s("other", 5, 10, 0),
    ];
    let c = choose(&pods, &f, Resource::Memory, MI, Order::GangAware).unwrap();
    assert_eq!(names(&c), ["other"]);
}

fn surplus_forest(a0_phase: &str) -> BTreeMap<String, Forest> {
    forests(vec![
        group(Kind::PodGroup, "gang", None, Some(2), false),
        member("a0", "gang", a0_phase),
        member("a1", "gang", "Running"),
        member("a2", "gang", "Running"),
    ])
}

#[test]
fn surplus_members_go_before_a_gang_is_broken() {
    let mut pods = vec![
        s("a0", 60, 0, 0),
        s("a1", 59, 0, 0),
        s("a2", 58, 0, 0),
        s("lone", 20, 0, 0),
    ];
    let c = choose(
        &pods,
        &surplus_forest("Running"),
        Resource::Memory,
        MI,
        Order::GangAware,
    )
    .unwrap();
    assert_eq!(
        names(&c),
        ["a0"],
        "a surplus member, first in the kubelet order"
    );
    assert!(c.breaks.is_empty());
    pods.remove(0);
    let c = choose(
        &pods,
        &surplus_forest("Failed"),
        Resource::Memory,
        MI,
        Order::GangAware,
    )
    .unwrap();
    assert_eq!(names(&c), ["lone"], "the gang is at its minimum now");
    assert_eq!(
        c.reason,
        Reason::GangAware {
            passed_over: 2,
            whole_unit: false,
            keeps_gangs: true,
            frees_enough: true
        }
    );
    let k = choose(
        &pods,
        &surplus_forest("Failed"),
        Resource::Memory,
        MI,
        Order::Kubelet,
    )
    .unwrap();
    assert_eq!(names(&k), ["a1"], "the kubelet would break the gang");
}

#[test]
fn a_gang_is_broken_rather_than_a_pod_of_a_better_tier_evicted() {
    let f = surplus_forest("Failed");
    let pods = vec![
        s("a1", 60, 0, 0),
        s("a2", 58, 0, 0),
        s("guaranteed", 300, 300, 0),
    ];
    let c = choose(&pods, &f, Resource::Memory, MI, Order::GangAware).unwrap();
    assert_eq!(names(&c), ["a1"]);
    assert_eq!(c.breaks.len(), 1);
    assert!(c.reason.to_string().contains("breaks a gang"));
}

#[test]
fn a_unit_that_frees_enough_goes_before_a_smaller_one_of_its_tier() {
    let pods = vec![s("small-excess", 100, 90, 0), s("large-excess", 50, 0, 0)];
    let none = BTreeMap::new();
    let k = choose(&pods, &none, Resource::Memory, 80 * MI, Order::Kubelet).unwrap();
    assert_eq!(names(&k), ["large-excess"]);
    let c = choose(&pods, &none, Resource::Memory, 80 * MI, Order::GangAware).unwrap();
    assert_eq!(names(&c), ["small-excess"]);
    let c = choose(&pods, &none, Resource::Memory, 40 * MI, Order::GangAware).unwrap();
    assert_eq!(
        names(&c),
        ["large-excess"],
        "both free enough: kubelet order"
    );
}

#[test]
fn pid_pressure_ranks_by_priority_and_counts_processes() {
    let mut pods = vec![s("many", 10, 0, 5), s("few", 10, 0, 1)];
    pods[0].candidate.processes = 50;
    pods[1].candidate.processes = 3;
    let c = choose(&pods, &BTreeMap::new(), Resource::Pids, 1, Order::GangAware).unwrap();
    assert_eq!((names(&c), c.frees), (vec!["few"], 3));
}

#[test]
fn pods_outside_any_forest_are_units_of_their_own() {
    let f = surplus_forest("Running");
    let mut pods = vec![s("a0", 60, 0, 0)];
    pods[0].key.namespace = "elsewhere".into();
    let c = choose(&pods, &f, Resource::Memory, MI, Order::GangAware).unwrap();
    assert_eq!((c.pods.len(), c.unit.clone()), (1, None));
}

fn arb_sample(i: usize) -> impl Strategy<Value = Sample> {
    (
        0i64..400,
        0i64..400,
        prop_oneof![Just(0), Just(100), Just(2_000_000_000)],
        1u64..20,
    )
        .prop_map(move |(u, r, p, n)| {
            let mut x = s(&format!("p{i}"), u, r, p);
            x.candidate.processes = n;
            x
        })
}

fn arb_pods() -> impl Strategy<Value = Vec<Sample>> {
    (1usize..8).prop_flat_map(|n| (0..n).map(arb_sample).collect::<Vec<_>>())
}

proptest! {
    #[test]
    fn the_choice_is_never_critical_and_never_of_a_worse_tier(
        pods in arb_pods(),
        gang_min in 1i32..4,
        all in any::<bool>(),
        need in 0i64..400,
    ) {
        // p0..p2 form a gang; the rest are lone pods.
        let mut objects = vec![group(Kind::PodGroup, "g", None, Some(gang_min), all)];
        objects.extend(pods.iter().take(3).map(|p| member(&p.key.name, "g", "Running")));
        let f = forests(objects);
        for resource in [Resource::Memory, Resource::Pids] {
            let cands: Vec<Candidate> = pods.iter().map(|p| p.candidate.clone()).collect();
            let ranked = match resource {
                Resource::Memory => rank_memory(&cands),
                Resource::Pids => rank_pids(&cands),
            };
            let k = choose(&pods, &f, resource, need * MI, Order::Kubelet);
            prop_assert_eq!(k.map(|c| c.pods), ranked.first().map(|&i| vec![pods[i].key.clone()]));
            let Some(c) = choose(&pods, &f, resource, need * MI, Order::GangAware) else {
                continue;
            };
            let by_key = |k: &PodKey| pods.iter().find(|p| &p.key == k).unwrap();
            prop_assert!(c.pods.iter().all(|k| !by_key(k).candidate.critical));
            if resource == Resource::Memory {
                let tier = |c: &Candidate| (c.usage_bytes <= c.request_bytes, c.priority);
                let first = tier(&pods[ranked[0]].candidate);
                prop_assert!(c.pods.iter().any(|k| tier(&by_key(k).candidate) == first) || all);
            }
        }
    }
}
