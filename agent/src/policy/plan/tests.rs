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
