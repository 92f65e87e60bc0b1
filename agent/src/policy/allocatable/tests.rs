use proptest::prelude::*;

use super::*;
use crate::policy::{
    cpu::milli_cpu_to_shares,
    eviction::{EvictionInput, parse_thresholds},
    settings::Capacity,
};

const GIB: i64 = 1 << 30;

fn q(s: &str) -> Option<Quantity> {
    Some(s.parse().expect("quantity"))
}

fn node(cpu_millis: i64, memory_bytes: i64) -> NodeSettings {
    NodeSettings::defaults(Capacity {
        cpu_millis,
        memory_bytes,
        pids: 4_194_304,
        cpus: CpuSet::first((cpu_millis / 1000) as u32),
    })
}

fn default_hard() -> Vec<crate::policy::eviction::Threshold> {
    parse_thresholds(&EvictionInput {
        pods_enforced: true,
        ..EvictionInput::default()
    })
    .expect("defaults parse")
    .0
}

#[test]
fn seed_000_memory_example() {
    // 32Gi node, system-reserved 3Gi, memory.available<100Mi.
    let mut s = node(4000, 32 * GIB);
    s.system_reserved.memory = q("3Gi");
    s.hard_eviction = default_hard();
    let na = node_allocatable(&s).expect("valid");
    assert_eq!(na.allocatable.memory_bytes, 31_033_655_296);
    assert_eq!(na.absolute.memory_bytes, 31_138_512_896);
    assert_eq!(
        na.absolute.memory_bytes - na.allocatable.memory_bytes,
        100 << 20
    );
}

#[test]
fn seed_000_cpu_example() {
    // 0.5 CPU reserved on 4 cores: system gets the share of 0.5 CPU, pods the share of 3.5.
    let mut s = node(4000, 8 * GIB);
    s.system_reserved.cpu = q("500m");
    let na = node_allocatable(&s).expect("valid");
    assert_eq!(na.allocatable.cpu_millis, 3500);
    assert_eq!(milli_cpu_to_shares(na.absolute.cpu_millis), 3584);
    assert_eq!(milli_cpu_to_shares(500), 512);
    assert_eq!(3584 / 512, 7); // 3.5 : 0.5
}

#[test]
fn percentage_thresholds_are_of_capacity() {
    let mut s = node(4000, 10 * GIB);
    let hard: std::collections::BTreeMap<String, String> =
        [("memory.available".to_string(), "10%".to_string())].into();
    s.hard_eviction = parse_thresholds(&EvictionInput {
        hard: Some(&hard),
        ..EvictionInput::default()
    })
    .unwrap()
    .0;
    let na = node_allocatable(&s).unwrap();
    // float32(0.1) * 10Gi, truncated, as the kubelet's GetThresholdQuantity.
    let evicted = (10.0 * GIB as f64 * f64::from(0.1f32)) as i64;
    assert_eq!(na.allocatable.memory_bytes, 10 * GIB - evicted);
    assert_eq!(evicted, 1_073_741_840);
}

#[test]
fn reservation_above_capacity_is_the_upstream_error() {
    let mut s = node(4000, 2 * GIB);
    s.system_reserved.memory = q("3Gi");
    s.hard_eviction = default_hard();
    let err = node_allocatable(&s).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid Node Allocatable configuration. Resource \"memory\" has a reservation of 3172Mi but capacity of 2Gi. Expected capacity >= reservation."
    );
}

#[test]
fn reserved_cpus_take_the_cpu_reservation_and_the_cpuset() {
    let mut s = node(8000, 8 * GIB);
    s.system_reserved.cpu = q("3");
    s.kube_reserved.cpu = q("1");
    s.reserved_system_cpus = Some("0-1,4".parse().unwrap());
    let na = node_allocatable(&s).unwrap();
    assert_eq!(na.allocatable.cpu_millis, 5000);
    assert_eq!(na.kube_reserved.cpu, None);
    assert_eq!(na.pods_cpuset.unwrap().to_string(), "2-3,5-7");
    assert_eq!(na.reserved_cpuset.unwrap().to_string(), "0-1,4");
}

#[test]
fn reserved_cpus_conflict_rejects_or_drops_compressible() {
    let mut s = node(8000, 8 * GIB);
    s.reserved_system_cpus = Some("0-1".parse().unwrap());
    s.system_reserved_cgroup = "/system.slice".into();
    s.enforcement.system_reserved_compressible = true;
    let err = node_allocatable(&s).unwrap_err();
    assert!(err.to_string().starts_with("invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup"), "{err}");
    s.reserved_cpus_conflict = ReservedCpusConflict::Openshift;
    let na = node_allocatable(&s).unwrap();
    assert!(!na.enforcement.system_reserved_compressible);
    assert!(na.enforcement.pods);
    assert_eq!(na.warnings.len(), 1);
    s.reserved_system_cpus = Some("9".parse().unwrap());
    assert!(matches!(
        node_allocatable(&s),
        Err(AllocatableError::ReservedCpusOutsideNode { .. })
    ));
}

proptest! {
    #[test]
    fn allocatable_is_never_negative(
        cpu in 1i64..64_000,
        mem_gib in 1i64..256,
        sys_mem_mib in 0i64..300_000,
        kube_cpu in 0i64..70_000,
        pct in 1u8..99,
    ) {
        let mut s = node(cpu, mem_gib * GIB);
        s.system_reserved.memory = Some(Quantity::from_int(sys_mem_mib << 20, Format::BinarySI));
        s.kube_reserved.cpu = Some(Quantity::from_milli(kube_cpu));
        let hard: std::collections::BTreeMap<String, String> =
            [("memory.available".to_string(), format!("{pct}%"))].into();
        s.hard_eviction = parse_thresholds(&EvictionInput { hard: Some(&hard), ..EvictionInput::default() }).unwrap().0;
        match node_allocatable(&s) {
            Ok(na) => {
                for v in [na.allocatable.cpu_millis, na.allocatable.memory_bytes, na.allocatable.pids,
                          na.absolute.cpu_millis, na.absolute.memory_bytes] {
                    prop_assert!(v >= 0);
                }
                prop_assert!(na.allocatable.memory_bytes <= na.absolute.memory_bytes);
                prop_assert!(na.absolute.memory_bytes <= na.capacity.memory_bytes);
            }
            Err(AllocatableError::ReservationAboveCapacity { problems }) => prop_assert!(!problems.is_empty()),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}
