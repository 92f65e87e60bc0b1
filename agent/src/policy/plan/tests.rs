use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::policy::{
    cpuset::CpuSet,
    eviction::{EvictionInput, parse_thresholds},
    settings::{Capacity, CgroupDriver, MemoryQos},
};

const GIB: i64 = 1 << 30;

fn settings() -> NodeSettings {
    let mut s = NodeSettings::defaults(Capacity {
        cpu_millis: 4000,
        memory_bytes: 32 * GIB,
        pids: 4_194_304,
        cpus: CpuSet::first(4),
    });
    s.system_reserved.memory = Some("3Gi".parse().unwrap());
    s.hard_eviction = parse_thresholds(&EvictionInput {
        pods_enforced: true,
        ..EvictionInput::default()
    })
    .unwrap()
    .0;
    s
}

fn pod(yaml: &str) -> PodSpecView {
    let pod: Pod = serde_yaml_ng::from_str(yaml).expect("pod YAML");
    PodSpecView::from_pod(&pod).expect("pod")
}

fn pods() -> Vec<PodSpecView> {
    vec![
        pod(
            "metadata: {name: g, uid: 1234-abcd}\nspec: {containers: [{name: a, resources: {limits: {cpu: 2, memory: 4Gi}}}]}",
        ),
        pod(
            "metadata: {name: b, uid: b-1}\nspec: {containers: [{name: a, resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {cpu: 1}}}, {name: c, resources: {requests: {cpu: 250m}, limits: {cpu: 500m}}}]}",
        ),
        pod("metadata: {name: e, uid: e-1}\nspec: {containers: [{name: a}]}"),
    ]
}

#[test]
fn node_cgroups_follow_allocatable_and_the_qos_sums() {
    let plan = plan_node(&settings(), &pods()).unwrap();
    let n = &plan.node;
    assert_eq!(n.allocatable.memory_bytes, 31_033_655_296);
    assert_eq!(n.kubepods.memory_limit_bytes, Some(31_138_512_896));
    assert_eq!(n.kubepods.cgroup.as_deref(), Some("/kubepods"));
    assert_eq!(n.kubepods.cpu_shares, Some(4096));
    assert_eq!(n.kubepods.cpuset.as_deref(), Some("0-3"));
    // Burstable: 500m + 250m requested.
    assert_eq!(n.burstable.cpu_shares, Some(768));
    assert_eq!(n.burstable.cpu_weight, Some(1 + (768 - 2) * 9999 / 262_142));
    assert_eq!(n.besteffort.cpu_shares, Some(2));
    assert_eq!(n.burstable.memory_limit_bytes, None);
    assert_eq!(n.system_reserved.cgroup, None);
}

#[test]
fn without_pods_enforced_kubepods_gets_capacity() {
    let mut s = settings();
    s.enforcement.pods = false;
    let plan = plan_node(&s, &[]).unwrap();
    assert_eq!(plan.node.kubepods.memory_limit_bytes, Some(32 * GIB));
    assert_eq!(plan.node.kubepods.cpu_shares, Some(4096));
}

#[test]
fn pod_cgroups_by_class() {
    let plan = plan_node(&settings(), &pods()).unwrap();
    let [g, b, e] = &plan.pods[..] else {
        panic!("three pods")
    };
    assert_eq!(g.cgroup.as_deref(), Some("/kubepods/pod1234-abcd"));
    assert_eq!(
        (g.cpu_shares, g.cpu_quota_us, g.cpu_period_us),
        (Some(2048), Some(200_000), Some(100_000))
    );
    assert_eq!(g.memory_limit_bytes, Some(4 * GIB));
    assert_eq!(g.containers[0].oom_score_adj, -997);
    // Burstable: both containers have cpu limits -> quota; not both memory limits -> none.
    assert_eq!(b.cgroup.as_deref(), Some("/kubepods/burstable/podb-1"));
    assert_eq!((b.cpu_shares, b.cpu_quota_us), (Some(768), Some(150_000)));
    assert_eq!(b.memory_limit_bytes, None);
    assert_eq!(b.containers[0].cpu_quota_us, Some(100_000));
    assert_eq!(b.containers[0].cpu_weight, 59); // 512 shares, runc quadratic
    assert_eq!(e.cgroup.as_deref(), Some("/kubepods/besteffort/pode-1"));
    assert_eq!(
        (e.cpu_shares, e.cpu_quota_us, e.memory_limit_bytes),
        (Some(2), None, None)
    );
    assert_eq!(e.containers[0].oom_score_adj, 1000);
}

#[test]
fn systemd_driver_and_cfs_quota_off() {
    let mut s = settings();
    s.cgroup_driver = CgroupDriver::Systemd;
    s.cpu_cfs_quota = false;
    let plan = plan_node(&s, &pods()).unwrap();
    let g = &plan.pods[0];
    assert_eq!(
        g.cgroup.as_deref(),
        Some("/kubepods.slice/kubepods-pod1234_abcd.slice")
    );
    assert_eq!(g.cpu_quota_us, Some(-1));
    assert_eq!(g.containers[0].cpu_quota_us, None);
    assert_eq!(
        plan.pods[1].cgroup.as_deref(),
        Some("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb_1.slice")
    );
}

#[test]
fn qos_reserved_limits_the_lower_tiers() {
    let mut s = settings();
    s.qos_reserved_memory_pct = Some(50);
    let plan = plan_node(&s, &pods()).unwrap();
    let absolute = 31_138_512_896;
    let burstable = absolute - 4 * GIB / 2;
    assert_eq!(plan.node.burstable.memory_limit_bytes, Some(burstable));
    assert_eq!(
        plan.node.besteffort.memory_limit_bytes,
        Some(burstable - GIB / 2)
    );
}

#[test]
fn memory_qos_sets_min_low_and_high() {
    let mut s = settings();
    s.memory_qos = Some(MemoryQos {
        throttling_factor_ppm: Some(900_000),
        policy: MemoryReservationPolicy::None,
    });
    let plan = plan_node(&s, &pods()).unwrap();
    assert_eq!(plan.node.kubepods.memory_min_bytes, Some(5 * GIB));
    assert_eq!(plan.node.burstable.memory_min_bytes, Some(GIB));
    assert_eq!(plan.pods[0].memory_min_bytes, Some(4 * GIB));
    assert_eq!(plan.pods[0].containers[0].memory_high_bytes, None); // request == limit
    let b = &plan.pods[1].containers[0];
    let expected = (GIB + (31_138_512_896 - GIB) * 9 / 10) / 4096 * 4096;
    assert_eq!(b.memory_high_bytes, Some(expected));

    s.memory_qos = Some(MemoryQos {
        throttling_factor_ppm: None,
        policy: MemoryReservationPolicy::TieredReservation,
    });
    let plan = plan_node(&s, &pods()).unwrap();
    assert_eq!(plan.pods[1].containers[0].memory_high_bytes, None);
    assert_eq!(plan.pods[1].memory_low_bytes, Some(GIB));
    assert_eq!(plan.pods[1].memory_min_bytes, None);
    assert_eq!(plan.pods[0].memory_min_bytes, Some(4 * GIB));
    assert_eq!(plan.node.burstable.memory_low_bytes, Some(GIB));
    assert_eq!(plan.node.kubepods.memory_min_bytes, Some(4 * GIB));
    assert!(
        plan.node
            .warnings
            .iter()
            .any(|w| w.contains("memoryThrottlingFactor"))
    );
}

#[test]
fn reserved_cgroups_get_what_is_enforced() {
    let mut s = settings();
    s.system_reserved.cpu = Some("500m".parse().unwrap());
    s.system_reserved_cgroup = "/system.slice".into();
    s.enforcement.system_reserved_compressible = true;
    let plan = plan_node(&s, &[]).unwrap();
    let sys = &plan.node.system_reserved;
    assert_eq!(sys.cgroup.as_deref(), Some("/system.slice"));
    assert_eq!(sys.cpu_shares, Some(512));
    assert_eq!(sys.memory_limit_bytes, None);
    assert_eq!(plan.node.kubepods.cpu_shares, Some(3584));
    s.enforcement.system_reserved_compressible = false;
    s.enforcement.system_reserved = true;
    let plan = plan_node(&s, &[]).unwrap();
    assert_eq!(plan.node.system_reserved.memory_limit_bytes, Some(3 * GIB));
}

#[test]
fn without_cgroups_per_qos_nothing_is_named() {
    let mut s = settings();
    s.cgroups_per_qos = false;
    s.enforcement.pods = false;
    let plan = plan_node(&s, &pods()).unwrap();
    assert_eq!(plan.node.kubepods, CgroupPlan::default());
    assert_eq!(plan.pods[0].cgroup, None);
    assert_eq!(plan.pods[0].cpu_shares, None);
    assert_eq!(plan.pods[0].containers[0].cpu_shares, 2048);
}

#[test]
fn pod_level_resources_gate_off_ignores_spec_resources() {
    let p = pod(
        "metadata: {name: p, uid: p-1}\nspec: {resources: {limits: {cpu: 1, memory: 1Gi}}, containers: [{name: a}]}",
    );
    let mut s = settings();
    assert_eq!(
        plan_node(&s, std::slice::from_ref(&p)).unwrap().pods[0].qos_class,
        QosClass::Guaranteed
    );
    s.pod_level_resources = false;
    assert_eq!(
        plan_node(&s, &[p]).unwrap().pods[0].qos_class,
        QosClass::BestEffort
    );
}

/// A pod in `default` with these containers and a UID derived from its name.
fn view(name: &str, containers: Vec<crate::policy::pod::ContainerView>) -> PodSpecView {
    PodSpecView {
        namespace: "default".into(),
        name: name.into(),
        uid: crate::policy::pod::derived_uid("default", name),
        containers,
        pod_resources: None,
        priority: None,
        priority_class_name: None,
        static_or_mirror: false,
        status_qos_class: None,
    }
}

/// A pod of `n` Burstable app containers (1m cpu, 1Mi memory requested, 2Mi limit), one sidecar
/// and one init container, as `qoslet plan` saw it when it was quadratic in the containers.
fn wide_pod(n: usize) -> PodSpecView {
    use crate::policy::{
        pod::*,
        quantity::{Format, Quantity},
    };
    let mi = |m: i64| Some(Quantity::from_int(m << 20, Format::BinarySI));
    let r = |req: i64| Resources {
        requests: Amounts {
            cpu: Some(Quantity::from_milli(1)),
            memory: mi(req),
        },
        limits: Amounts {
            cpu: None,
            memory: mi(2),
        },
    };
    let mut containers = vec![
        ContainerView {
            name: "init".into(),
            kind: ContainerKind::Init,
            resources: r(1),
        },
        ContainerView {
            name: "side".into(),
            kind: ContainerKind::Sidecar,
            resources: r(2),
        },
    ];
    containers.extend((0..n).map(|i| ContainerView {
        name: format!("c{i}"),
        kind: ContainerKind::App,
        resources: r(1),
    }));
    view("wide", containers)
}

#[test]
fn ten_thousand_containers_are_planned_linearly() {
    // Was 180 s through `qoslet plan` (debug build): every container recomputed the pod's class
    // and sums. The result is asserted, not the time (README: speed belongs in the bench).
    let n = 10_000;
    let plan = plan_node(&settings(), &[wide_pod(n)]).unwrap();
    let p = &plan.pods[0];
    assert_eq!(p.containers.len(), n + 2);
    assert_eq!(p.qos_class, QosClass::Burstable);
    // Requests: 10,000 apps + the sidecar; memory 10,002 Mi, cpu 10,001m.
    assert_eq!(p.cpu_shares, Some(milli_cpu_to_shares(10_001)));
    assert_eq!(p.memory_limit_bytes, Some((2 * (n as i64) + 2) << 20));
    // Memory requests are tiny beside 32Gi: 1000 - 0, which Burstable turns into 999 (below
    // BestEffort's 1000); the sidecar is capped at the smallest app's score.
    assert!(
        p.containers.iter().all(|c| c.oom_score_adj == 999),
        "{:?}",
        p.containers
            .iter()
            .map(|c| c.oom_score_adj)
            .collect::<std::collections::BTreeSet<_>>()
    );
}

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::{
        pod::{Amounts, ContainerKind, ContainerView, Resources},
        quantity::{Format, Quantity},
    };

    /// Any amount, including negatives and the i64 extremes: the policy must not panic on
    /// values admission would refuse.
    fn amount() -> impl Strategy<Value = Option<i64>> {
        prop_oneof![
            Just(None),
            any::<i64>().prop_map(Some),
            (0i64..64_000_000_000).prop_map(Some),
            prop_oneof![Just(i64::MAX), Just(i64::MIN), Just(0)].prop_map(Some),
        ]
    }

    fn container() -> impl Strategy<Value = ContainerView> {
        (amount(), amount(), amount(), amount(), 0u8..3).prop_map(|(cr, cl, mr, ml, k)| {
            let cpu = |v: Option<i64>| v.map(Quantity::from_milli);
            let mem = |v: Option<i64>| v.map(|b| Quantity::from_int(b, Format::BinarySI));
            ContainerView {
                name: "c".into(),
                kind: [
                    ContainerKind::Init,
                    ContainerKind::Sidecar,
                    ContainerKind::App,
                ][usize::from(k)],
                resources: Resources {
                    requests: Amounts {
                        cpu: cpu(cr).or(cpu(cl)),
                        memory: mem(mr).or(mem(ml)),
                    },
                    limits: Amounts {
                        cpu: cpu(cl),
                        memory: mem(ml),
                    },
                },
            }
        })
    }

    fn pod_of(containers: Vec<ContainerView>, i: usize) -> PodSpecView {
        view(&format!("p{i}"), containers)
    }

    fn pods() -> impl Strategy<Value = Vec<PodSpecView>> {
        prop::collection::vec(prop::collection::vec(container(), 0..5), 0..6).prop_map(|ps| {
            ps.into_iter()
                .enumerate()
                .map(|(i, c)| pod_of(c, i))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn plans_never_panic_and_stay_in_range(
            pods in pods(),
            cap_mem in any::<i64>(),
            cap_cpu in any::<i64>(),
            reserved in amount(),
            qos_reserved in prop::option::of(0i64..=100),
        ) {
            let mut s = settings();
            s.capacity.memory_bytes = cap_mem;
            s.capacity.cpu_millis = cap_cpu;
            s.system_reserved.memory = reserved.map(|b| Quantity::from_int(b, Format::BinarySI));
            s.qos_reserved_memory_pct = qos_reserved;
            s.memory_qos = Some(MemoryQos { throttling_factor_ppm: Some(900_000), policy: Default::default() });
            let Ok(plan) = plan_node(&s, &pods) else { return Ok(()) };
            let n = &plan.node;
            // Allocatable is never negative, whatever the capacity and reservations.
            for v in [n.allocatable.cpu_millis, n.allocatable.memory_bytes, n.allocatable.pids] {
                prop_assert!(v >= 0, "{n:?}");
            }
            for c in [&n.kubepods, &n.burstable, &n.besteffort] {
                if let Some(m) = c.memory_limit_bytes { prop_assert!(m >= 0); }
                if let Some(sh) = c.cpu_shares { prop_assert!((2..=262_144).contains(&sh)); }
                if let Some(w) = c.cpu_weight { prop_assert!((1..=10_000).contains(&w)); }
            }
            // Every pod gets exactly one class, and its cgroup sits in that class's tier.
            prop_assert_eq!(plan.pods.len(), pods.len());
            for (pp, pv) in plan.pods.iter().zip(&pods) {
                prop_assert_eq!(pp.qos_class, pod_qos(pv));
                let cg = pp.cgroup.clone().unwrap_or_default();
                let in_tier = |t: &str| cg.contains(&format!("/{t}/"));
                match pp.qos_class {
                    QosClass::Guaranteed => prop_assert!(!in_tier("burstable") && !in_tier("besteffort"), "{}", cg),
                    QosClass::Burstable => prop_assert!(in_tier("burstable"), "{}", cg),
                    QosClass::BestEffort => prop_assert!(in_tier("besteffort"), "{}", cg),
                }
                for c in &pp.containers {
                    prop_assert!((-997..=1000).contains(&c.oom_score_adj), "{}", c.oom_score_adj);
                    prop_assert!((2..=262_144).contains(&c.cpu_shares));
                    if let Some(q) = c.cpu_quota_us { prop_assert!(q >= 1000); }
                }
            }
        }

        #[test]
        fn burstable_shares_grow_with_requests(a in 0i64..i64::MAX, b in 0i64..i64::MAX) {
            let (lo, hi) = (a.min(b), a.max(b));
            let shares = |m: i64| {
                let c = ContainerView {
                    name: "c".into(),
                    kind: ContainerKind::App,
                    resources: Resources {
                        requests: Amounts { cpu: Some(Quantity::from_milli(m)), memory: None },
                        limits: Amounts::default(),
                    },
                };
                // Two pods, so the tier's sum is exercised too.
                let p = [pod_of(vec![c.clone()], 0), pod_of(vec![c], 1)];
                plan_node(&settings(), &p).unwrap().node.burstable.cpu_shares.unwrap()
            };
            prop_assert!(shares(lo) <= shares(hi));
        }
    }
}
