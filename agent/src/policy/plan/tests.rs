use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::policy::{
    cpuset::CpuSet,
    eviction::{EvictionInput, parse_thresholds},
    settings::{Capacity, CgroupDriver, MemoryQos},
    version::KubeVersion,
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

const MIB: i64 = 1 << 20;

fn with_memory_qos(
    version: u32,
    factor: Option<u32>,
    policy: MemoryReservationPolicy,
) -> NodeSettings {
    let mut s = settings();
    s.kubernetes_version = KubeVersion::v1(version);
    s.memory_qos = Some(MemoryQos {
        throttling_factor_ppm: factor,
        policy,
    });
    s
}

/// pkg/kubelet/cm/qos_container_manager_linux_test.go `activeTestPods`.
fn active_test_pods() -> Vec<PodSpecView> {
    vec![
        pod(
            "metadata: {name: guaranteed-pod, uid: '12345678'}\nspec: {containers: [{name: foo, resources: {requests: {memory: 128Mi, cpu: 1}, limits: {memory: 128Mi, cpu: 1}}}]}",
        ),
        pod(
            "metadata: {name: burstable-pod-1, uid: '87654321'}\nspec: {containers: [{name: foo, resources: {requests: {memory: 128Mi, cpu: 1}, limits: {memory: 256Mi, cpu: 2}}}]}",
        ),
        pod(
            "metadata: {name: burstable-pod-2, uid: '01234567'}\nspec: {containers: [{name: foo, resources: {requests: {memory: 256Mi, cpu: 2}}}]}",
        ),
    ]
}

#[test]
fn memory_qos_1_35_protects_every_request_with_memory_min() {
    // 1.34/1.35 setMemoryQoS: burstable memory.min = Burstable sum, kubepods = Guaranteed +
    // Burstable, written only above 0; every pod and container request as memory.min; the
    // factor defaults to 0.9 (config applies it).
    let s = with_memory_qos(35, Some(900_000), MemoryReservationPolicy::None);
    let plan = plan_node(&s, &pods()).unwrap();
    assert_eq!(plan.node.kubernetes_version.to_string(), "1.35");
    assert_eq!(plan.node.kubepods.memory_min_bytes, Some(5 * GIB));
    assert_eq!(plan.node.burstable.memory_min_bytes, Some(GIB));
    assert_eq!(plan.node.burstable.memory_low_bytes, None);
    assert_eq!(plan.pods[0].memory_min_bytes, Some(4 * GIB));
    assert_eq!(plan.pods[1].memory_min_bytes, Some(GIB));
    assert_eq!(plan.pods[0].containers[0].memory_high_bytes, None); // request == limit
    let b = &plan.pods[1].containers[0];
    let expected = (GIB + (31_138_512_896 - GIB) * 9 / 10) / 4096 * 4096;
    assert_eq!(b.memory_high_bytes, Some(expected));
    // BestEffort containers: no memory.high before 1.37.
    assert_eq!(plan.pods[2].containers[0].memory_high_bytes, None);
    // Nothing requested: nothing written (no explicit zero before 1.36).
    let plan = plan_node(&s, &[]).unwrap();
    assert_eq!(plan.node.kubepods.memory_min_bytes, None);
    assert_eq!(plan.node.burstable.memory_min_bytes, None);
}

#[test]
fn memory_qos_tiered_reservation_tiers_reproduce_test_qos_container_cgroup() {
    // pkg/kubelet/cm/qos_container_manager_linux_test.go TestQoSContainerCgroup (1.36+).
    let be =
        pod("metadata: {name: besteffort-pod, uid: '99999999'}\nspec: {containers: [{name: foo}]}");
    let burstable_no_memory = pod(
        "metadata: {name: burstable-pod-no-memory-request, uid: '88888888'}\nspec: {containers: [{name: foo, resources: {requests: {cpu: 1}}}]}",
    );
    let pod_level = pod(
        "metadata: {name: burstable-pod-pod-level, uid: '87654321'}\nspec: {resources: {requests: {memory: 512Mi}}, containers: [{name: foo, resources: {requests: {memory: 128Mi, cpu: 1}, limits: {memory: 256Mi, cpu: 2}}}]}",
    );
    let rows: Vec<(&str, Vec<PodSpecView>, i64, i64)> = vec![
        (
            "writes aggregated memory min",
            active_test_pods(),
            512 * MIB,
            384 * MIB,
        ),
        ("writes zero memory min for best effort pod", vec![be], 0, 0),
        (
            "writes zero memory min for burstable pod without memory request",
            vec![burstable_no_memory],
            0,
            0,
        ),
        (
            "clears stale memory min when all pods removed",
            vec![],
            0,
            0,
        ),
        (
            "writes memory min with pod-level resources",
            vec![active_test_pods().remove(0), pod_level],
            640 * MIB,
            512 * MIB,
        ),
    ];
    for version in [36, 37] {
        let s = with_memory_qos(version, None, MemoryReservationPolicy::TieredReservation);
        for (name, pods, guaranteed, burstable) in &rows {
            let plan = plan_node(&s, pods).unwrap();
            assert_eq!(
                (
                    plan.node.kubepods.memory_min_bytes,
                    plan.node.burstable.memory_low_bytes
                ),
                (Some(*guaranteed), Some(*burstable)),
                "1.{version}: {name}"
            );
            assert_eq!(plan.node.burstable.memory_min_bytes, None, "{name}");
        }
    }
}

#[test]
fn memory_qos_policy_none_writes_explicit_zeros() {
    // TestQoSContainerCgroupWithMemoryReservationPolicyNone: kubepods memory.min and burstable
    // memory.low are reset to "0" however much is requested; pods are not protected.
    for version in [36, 37] {
        let s = with_memory_qos(version, None, MemoryReservationPolicy::None);
        let plan = plan_node(&s, &active_test_pods()).unwrap();
        assert_eq!(plan.node.kubepods.memory_min_bytes, Some(0));
        assert_eq!(plan.node.burstable.memory_low_bytes, Some(0));
        assert_eq!(plan.node.burstable.memory_min_bytes, None);
        for p in &plan.pods {
            assert_eq!((p.memory_min_bytes, p.memory_low_bytes), (None, None));
            assert_eq!(p.containers[0].memory_min_bytes, None);
        }
    }
}

#[test]
fn memory_qos_tiered_reservation_pods_reproduce_resource_config_for_pod() {
    // pkg/kubelet/cm/helpers_linux_test.go TestResourceConfigForPodWithEnforceMemoryQoS
    // (TieredReservation): (row, pod containers, memory.min, memory.low).
    let rows = [
        ("besteffort", "[{name: a}]", None, None),
        (
            "burstable-no-limits",
            "[{name: a, resources: {requests: {cpu: 100m, memory: 100Mi}}}]",
            None,
            Some(104_857_600),
        ),
        (
            "burstable-with-limits",
            "[{name: a, resources: {requests: {cpu: 100m, memory: 100Mi}, limits: {cpu: 200m, memory: 200Mi}}}]",
            None,
            Some(104_857_600),
        ),
        (
            "burstable-partial-limits",
            "[{name: a, resources: {requests: {cpu: 100m, memory: 100Mi}, limits: {cpu: 200m, memory: 200Mi}}}, {name: b, resources: {requests: {cpu: 100m, memory: 100Mi}}}]",
            None,
            Some(209_715_200),
        ),
        (
            "guaranteed",
            "[{name: a, resources: {requests: {cpu: 100m, memory: 100Mi}, limits: {cpu: 100m, memory: 100Mi}}}]",
            Some(104_857_600),
            None,
        ),
    ];
    let s = with_memory_qos(37, None, MemoryReservationPolicy::TieredReservation);
    for (name, containers, min, low) in rows {
        let p = pod(&format!(
            "metadata: {{name: p, uid: p-1}}\nspec: {{containers: {containers}}}"
        ));
        let plan = plan_node(&s, &[p]).unwrap();
        let pp = &plan.pods[0];
        assert_eq!(
            (pp.memory_min_bytes, pp.memory_low_bytes),
            (min, low),
            "{name}"
        );
    }
}

#[test]
fn memory_high_follows_the_version_and_the_factor() {
    // 1.37: memoryThrottlingFactor has no default, so no memory.high unless set.
    let s = with_memory_qos(37, None, MemoryReservationPolicy::None);
    let plan = plan_node(&s, &pods()).unwrap();
    assert!(
        plan.pods
            .iter()
            .flat_map(|p| &p.containers)
            .all(|c| c.memory_high_bytes.is_none())
    );
    assert!(
        plan.node
            .warnings
            .iter()
            .any(|w| w.contains("memoryThrottlingFactor"))
    );
    // 1.37 with a factor: BestEffort containers are throttled against allocatable.
    let s = with_memory_qos(37, Some(900_000), MemoryReservationPolicy::None);
    let plan = plan_node(&s, &pods()).unwrap();
    let allocatable = 31_138_512_896_i64;
    assert_eq!(
        plan.pods[2].containers[0].memory_high_bytes,
        Some(allocatable * 9 / 10 / 4096 * 4096)
    );
    assert_eq!(plan.pods[0].containers[0].memory_high_bytes, None);
}

#[test]
fn pod_level_memory_high_reproduces_test_apply_pod_level_memory_high() {
    // pkg/kubelet/cm/helpers_linux_test.go TestApplyPodLevelMemoryHigh (1.37, factor 0.9).
    let s = with_memory_qos(37, Some(900_000), MemoryReservationPolicy::None);
    let high = |yaml: &str| plan_node(&s, &[pod(yaml)]).unwrap().pods[0].memory_high_bytes;
    // "cpu-only pod-level resources does not set memory.high"
    assert_eq!(
        high(
            "metadata: {name: p, uid: p-1}\nspec: {resources: {limits: {cpu: 2}}, containers: [{name: a, resources: {requests: {cpu: 100m, memory: 100Mi}, limits: {cpu: 200m}}}]}"
        ),
        None
    );
    // "mixed declared/undeclared memory limits does not set memory.high"
    assert_eq!(
        high(
            "metadata: {name: p, uid: p-1}\nspec: {resources: {limits: {cpu: 2}}, containers: [{name: a, resources: {requests: {cpu: 100m, memory: 100Mi}, limits: {cpu: 200m, memory: 200Mi}}}, {name: b, resources: {requests: {cpu: 100m, memory: 100Mi}}}]}"
        ),
        None
    );
    // "pod overhead is included in memory.high calculation": more with overhead than without.
    let base = "resources: {requests: {memory: 128Mi, cpu: 1}, limits: {memory: 256Mi, cpu: 1}}, containers: [{name: a, resources: {requests: {cpu: 1, memory: 128Mi}, limits: {cpu: 1, memory: 256Mi}}}]";
    let with = high(&format!(
        "metadata: {{name: p, uid: p-1}}\nspec: {{overhead: {{memory: 64Mi}}, {base}}}"
    ))
    .unwrap();
    let without = high(&format!(
        "metadata: {{name: p, uid: p-1}}\nspec: {{{base}}}"
    ))
    .unwrap();
    assert!(with > without, "{with} <= {without}");
    // 128Mi + 0.9 * 128Mi, and (128+64)Mi + 0.9 * 128Mi with overhead, page aligned.
    assert_eq!(without, (128 * MIB + 128 * MIB * 9 / 10) / 4096 * 4096);
    assert_eq!(with, (192 * MIB + 128 * MIB * 9 / 10) / 4096 * 4096);
    // Before 1.37 there is no pod-level memory.high.
    let s = with_memory_qos(36, Some(900_000), MemoryReservationPolicy::None);
    let p = pod(&format!(
        "metadata: {{name: p, uid: p-1}}\nspec: {{{base}}}"
    ));
    assert_eq!(plan_node(&s, &[p]).unwrap().pods[0].memory_high_bytes, None);
}

#[test]
fn pod_overhead_counts_in_the_pod_cgroup_and_the_tiers() {
    // component-helpers PodRequests adds spec.overhead to every request; PodLimits only to
    // resources that have a limit. The pod cgroup (ResourceConfigForPod) and the QoS tiers
    // (setCPUCgroupConfig, getQoSMemoryRequests) use both.
    let p = pod(
        "metadata: {name: kata, uid: k-1}\nspec: {overhead: {cpu: 250m, memory: 120Mi}, containers: [{name: a, resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {memory: 2Gi}}}]}",
    );
    let plan = plan_node(&settings(), &[p]).unwrap();
    let pp = &plan.pods[0];
    assert_eq!(pp.qos_class, QosClass::Burstable);
    assert_eq!(pp.cpu_shares, Some(milli_cpu_to_shares(750)));
    assert_eq!(pp.memory_limit_bytes, Some(2 * GIB + 120 * MIB));
    assert_eq!(pp.cpu_quota_us, None); // no cpu limit: overhead does not make one
    assert_eq!(
        plan.node.burstable.cpu_shares,
        Some(milli_cpu_to_shares(750))
    );
    // The container's own cgroup is the runtime's: no overhead there.
    assert_eq!(pp.containers[0].cpu_shares, milli_cpu_to_shares(500));
    // Nor in oom_score_adj: policy.go scores container requests, and its pod-level share
    // (remainingPodMemReqPerContainer) subtracts AggregateContainerRequests, no overhead.
    let without = pod(
        "metadata: {name: kata, uid: k-1}\nspec: {containers: [{name: a, resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {memory: 2Gi}}}]}",
    );
    let plain = plan_node(&settings(), &[without]).unwrap();
    assert_eq!(
        pp.containers[0].oom_score_adj,
        plain.pods[0].containers[0].oom_score_adj
    );
    assert_eq!(pp.containers[0].oom_score_adj, 969); // 1000 - 1000 * 1Gi / 32Gi
}

#[test]
fn containers_get_memory_oom_group_unless_single_process_oom_kill() {
    let mut s = settings();
    let plan = plan_node(&s, &pods()).unwrap();
    assert_eq!(plan.pods[0].containers[0].memory_oom_group, Some(true));
    s.single_process_oom_kill = true;
    let plan = plan_node(&s, &pods()).unwrap();
    assert_eq!(plan.pods[0].containers[0].memory_oom_group, None);
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

#[test]
fn the_tie_break_gate_reaches_the_containers_score() {
    // 500Mi request == limit on a 16Gi node: 970, 969 with KubeletOOMScoreAdjTieBreak
    // (TestGetContainerOOMScoreAdjustTieBreak).
    let mut s = settings();
    s.capacity.memory_bytes = 16 * GIB;
    s.system_reserved = Default::default();
    let p = pod(
        "metadata: {name: p, uid: p-1}\nspec: {containers: [{name: c, resources: {requests: {memory: 500Mi, cpu: 100m}, limits: {memory: 500Mi}}}]}",
    );
    let score = |s: &NodeSettings| {
        plan_node(s, std::slice::from_ref(&p)).unwrap().pods[0].containers[0].oom_score_adj
    };
    assert_eq!(score(&s), 970);
    s.oom_score_adj_tie_break = true;
    assert_eq!(score(&s), 969);
}

#[test]
fn hugetlb_limits_reproduce_test_huge_page_limits() {
    // pkg/kubelet/cm/helpers_linux_test.go TestHugePageLimits through ResourceConfigForPod:
    // (requests, expected limits by page size); the host has 2Mi and 1Gi pages.
    let rows = [
        ("no valid hugepages", "{2Mi: '128'}", vec![]),
        ("2Mi only", "{hugepages-2Mi: '128'}", vec![("2MB", 128)]),
        (
            "2Mi and 4Mi",
            "{hugepages-2Mi: '128', hugepages-2097152: '256', hugepages-4Mi: '512', 4Mi: '1024'}",
            vec![("2MB", 384), ("4MB", 512)],
        ),
    ];
    let mut s = settings();
    s.hugepage_sizes = vec![2 << 20, 1 << 30];
    for (name, requests, want) in rows {
        let p = pod(&format!(
            "metadata: {{name: p, uid: p-1}}\nspec: {{containers: [{{name: a, resources: {{requests: {requests}}}}}]}}"
        ));
        let plan = plan_node(&s, &[p]).unwrap();
        let mut expected: BTreeMap<String, i64> =
            [("2MB".to_string(), 0), ("1GB".to_string(), 0)].into();
        expected.extend(want.into_iter().map(|(k, v)| (k.to_string(), v)));
        assert_eq!(plan.pods[0].hugetlb_limits, expected, "{name}");
        // The QoS tiers stay unbounded for every host page size (setHugePagesUnbounded).
        assert_eq!(plan.node.burstable.hugetlb_limits["1GB"], 1 << 62);
        assert_eq!(plan.node.besteffort.hugetlb_limits["2MB"], 1 << 62);
    }
    assert_eq!(hugepage_unit(2 << 20), "2MB");
    assert_eq!(hugepage_unit(1 << 30), "1GB");
    assert_eq!(hugepage_unit(64 << 10), "64KB");
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
        overhead: Default::default(),
        hugepages: Default::default(),
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
    // and sums. The result is asserted, not the time: speed is `cargo xtask bench`'s to measure.
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
