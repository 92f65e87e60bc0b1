use std::{path::Path, time::Duration};

use super::*;
use crate::cgroup::Mode;
use crate::policy::{
    cpu::WeightFormula,
    cpu_pressure::CpuPressureConfig,
    cpuset::CpuSet,
    settings::{
        Capacity, CgroupDriver, MemoryQos, MemoryReservationPolicy, NodeSettings,
        ReservedCpusConflict,
    },
};

fn capacity() -> Capacity {
    Capacity {
        cpu_millis: 8000,
        memory_bytes: 32 << 30,
        pids: 4_194_304,
        cpus: CpuSet::first(8),
    }
}

fn kubelet(yaml: &str) -> KubeletConfig {
    let text =
        format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}");
    KubeletConfig::parse(Path::new("kc.yaml"), &text).expect("parses")
}

fn settings(yaml: &str) -> Result<NodeSettings, String> {
    node_settings(
        Path::new("kc.yaml"),
        &kubelet(yaml),
        &QosletConfiguration::default(),
        capacity(),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn reads_the_fields_and_ignores_unknown_ones() {
    let s = settings(
        "systemReserved: {cpu: 500m, memory: 3Gi}\nkubeReserved: {memory: 1Gi, pid: '1000'}\nenforceNodeAllocatable: [pods, system-reserved-compressible]\nsystemReservedCgroup: /system.slice\ncgroupDriver: systemd\ncgroupRoot: /\ncpuCFSQuotaPeriod: 50ms\nstaticPodPath: /etc/kubernetes/manifests\nfeatureGates: {QOSReserved: true, MemoryQoS: true}\nqosReserved: {memory: 50%}\nmemoryThrottlingFactor: 0.8\nmemoryReservationPolicy: TieredReservation\n",
    )
    .unwrap();
    assert_eq!(s.system_reserved.cpu.map(|q| q.milli_value()), Some(500));
    assert_eq!(s.kube_reserved.pids.map(|q| q.value()), Some(1000));
    assert!(s.enforcement.pods && s.enforcement.system_reserved_compressible);
    assert_eq!(s.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(s.cpu_cfs_quota_period_us, 50_000);
    assert_eq!(s.qos_reserved_memory_pct, Some(50));
    let mq = s.memory_qos.unwrap();
    assert_eq!(
        (mq.throttling_factor_ppm, mq.policy),
        (Some(800_000), MemoryReservationPolicy::TieredReservation)
    );
    // evictionHard unset: the four defaults plus the allocatableMemory copy.
    assert_eq!(s.hard_eviction.len(), 5);
}

#[test]
fn defaults_without_any_field() {
    let s = settings("").unwrap();
    assert!(s.enforcement.pods);
    assert!(s.cgroups_per_qos && s.cpu_cfs_quota);
    assert_eq!(s.cgroup_root, "/");
    assert_eq!(s.cpu_cfs_quota_period_us, 100_000);
    assert!(!s.oom_score_adj_tie_break && !s.single_process_oom_kill);
    // 1.37 (the default): MemoryQoS is beta and on, no memoryThrottlingFactor default, policy
    // None.
    assert_eq!(s.kubernetes_version.to_string(), "1.37");
    assert_eq!(
        s.memory_qos,
        Some(MemoryQos {
            throttling_factor_ppm: None,
            policy: MemoryReservationPolicy::None
        })
    );
    let s = settings("featureGates: {MemoryQoS: false}").unwrap();
    assert_eq!(s.memory_qos, None);
}

fn versioned(version: &str, yaml: &str) -> Result<NodeSettings, String> {
    let qc = QosletConfiguration::parse(
        Path::new("q.yaml"),
        &format!("kind: QosletConfiguration\nkubernetesVersion: '{version}'\n"),
    )
    .map_err(|e| e.to_string())?;
    node_settings(Path::new("kc.yaml"), &kubelet(yaml), &qc, capacity()).map_err(|e| e.to_string())
}

#[test]
fn kubernetes_version_keys_the_memory_qos_defaults() {
    // 1.36: MemoryQoS alpha (off unless gated on), memoryThrottlingFactor 0.9 by default.
    assert_eq!(versioned("1.36", "").unwrap().memory_qos, None);
    let s = versioned("1.36", "featureGates: {MemoryQoS: true}").unwrap();
    assert_eq!(s.memory_qos.unwrap().throttling_factor_ppm, Some(900_000));
    assert_eq!(s.kubernetes_version.to_string(), "1.36");
    // 1.35 has no memoryReservationPolicy: the field is an error naming it.
    let e = versioned("1.35", "memoryReservationPolicy: TieredReservation").unwrap_err();
    assert!(
        e.contains("memoryReservationPolicy") && e.contains("1.35"),
        "{e}"
    );
    let s = versioned("1.34", "featureGates: {MemoryQoS: true}").unwrap();
    assert_eq!(s.memory_qos.unwrap().throttling_factor_ppm, Some(900_000));
    // 1.37 with an explicit factor keeps it.
    let s = versioned("v1.37.1", "memoryThrottlingFactor: 0.7").unwrap();
    assert_eq!(s.memory_qos.unwrap().throttling_factor_ppm, Some(700_000));
    // An unknown version is an error naming the field.
    let e = versioned("1.30", "").unwrap_err();
    assert!(
        e.starts_with("q.yaml:2: QosletConfiguration: kubernetesVersion: \"1.30\""),
        "{e}"
    );
}

#[test]
fn tie_break_gate_and_single_process_oom_kill_are_read() {
    let s =
        settings("featureGates: {KubeletOOMScoreAdjTieBreak: true}\nsingleProcessOOMKill: true")
            .unwrap();
    assert!(s.oom_score_adj_tie_break && s.single_process_oom_kill);
}

#[test]
fn malformed_values_name_file_field_and_value() {
    let cases = [
        (
            "systemReserved: {memory: 3GB}",
            "kc.yaml: KubeletConfiguration: systemReserved.memory: \"3GB\"",
        ),
        (
            "enforceNodeAllocatable: [none, pods]",
            "kc.yaml: KubeletConfiguration: enforceNodeAllocatable: \"none\": invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified",
        ),
        (
            "enforceNodeAllocatable: [system-reserved]",
            "systemReservedCgroup (--system-reserved-cgroup) must be specified",
        ),
        (
            "enforceNodeAllocatable: [bogus]",
            "\"bogus\": invalid configuration: option specified",
        ),
        ("reservedSystemCPUs: 0-x", "reservedSystemCPUs: \"0-x\""),
        ("cgroupDriver: docker", "cgroupDriver: \"docker\""),
        (
            "evictionSoft: {memory.available: 1Gi}",
            "evictionSoftGracePeriod: grace period must be specified for the soft eviction threshold memory.available",
        ),
        ("cpuCFSQuotaPeriod: 5x", "cpuCFSQuotaPeriod: \"5x\""),
        (
            "evictionMinimumReclaim: {nodefs.available: -1Gi}",
            "evictionMinimumReclaim.nodefs.available: negative eviction minimum reclaim specified for nodefs.available",
        ),
        (
            "evictionSoftGracePeriod: {memory.available: -30s}",
            "evictionSoftGracePeriod.memory.available: invalid eviction grace period specified: -30s, must be a positive value",
        ),
        (
            "evictionHard: {memory.available: 150%}",
            "evictionHard.memory.available: eviction percentage threshold memory.available must be <= 100%: 150%",
        ),
        (
            "evictionSoft: {mem.available: 1Gi}",
            "evictionSoft: unsupported eviction signal mem.available",
        ),
        (
            "featureGates: {MemoryQoS: true}\nmemoryThrottlingFactor: 1.5",
            "memoryThrottlingFactor: \"1.5\"",
        ),
    ];
    for (yaml, expected) in cases {
        let err = settings(yaml).unwrap_err();
        assert!(
            err.contains(expected),
            "{yaml}\n  got: {err}\n  want: {expected}"
        );
    }
    let err =
        KubeletConfig::parse(Path::new("kc.yaml"), "apiVersion: v1\nkind: Pod\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "kc.yaml: KubeletConfiguration: kind: expected KubeletConfiguration, got \"Pod\""
    );
    let err = KubeletConfig::parse(Path::new("kc.yaml"), "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\ncgroupsPerQOS: maybe\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("kc.yaml: KubeletConfiguration: "),
        "{err}"
    );
}

#[test]
fn qoslet_configuration_defaults_and_strictness() {
    let parsed = QosletConfiguration::parse(Path::new("q.yaml"), "{}").unwrap();
    assert_eq!(parsed, QosletConfiguration::default());
    assert_eq!(parsed.metrics_address, None);
    assert_eq!(parsed.endpoint_auth, None);
    assert_eq!(parsed.weight_formula, WeightFormula::KubeletLinear);
    assert_eq!(
        parsed.container_weight_formula,
        WeightFormula::RuncQuadratic
    );
    assert!(parsed.gang_eviction == GangEviction::Node && parsed.ebpf.enabled);
    assert!(!parsed.ebpf.kernel_diagnostics);
    assert_eq!(parsed.housekeeping_interval, Duration::from_secs(1));
    assert_eq!(parsed.eviction_wakeups, EvictionWakeups::Events);
    let q = QosletConfiguration::parse(
        Path::new("q.yaml"),
        "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: observe\nweightFormula: runc-quadratic\nhousekeepingInterval: 250ms\nevictionWakeups: housekeeping\nreservedCpusConflict: openshift\nebpf: {sensors: {oom_victim: false}, kernelDiagnostics: true}\ncapacity: {memory: 8Gi}\n",
    )
    .unwrap();
    assert_eq!(q.mode, Mode::Observe);
    assert_eq!(q.housekeeping_interval, Duration::from_millis(250));
    assert_eq!(q.eviction_wakeups, EvictionWakeups::Housekeeping);
    assert_eq!(q.reserved_cpus_conflict, ReservedCpusConflict::Openshift);
    assert_eq!(q.ebpf.sensors.get("oom_victim"), Some(&false));
    assert!(
        parsed.enforce.is_empty(),
        "cluster mode writes nothing the kubelet writes"
    );
    assert_eq!(parsed.gang_eviction, GangEviction::Node);
    assert_eq!(parsed.eviction_method, EvictionMethod::Kubelet);
    assert!(!parsed.taint_on_pressure);
    assert_eq!(parsed.lease_namespace, "kube-node-lease");
    let c = QosletConfiguration::parse(
        Path::new("q.yaml"),
        "enforce: [memoryQoS, oomScoreAdj, reservedCPUs, qosTierWeights]\ngangEviction: unit\nevictionMethod: api\ntaintOnPressure: true\nleaseNamespace: qoslet\n",
    )
    .unwrap();
    assert_eq!(
        c.enforce,
        [
            EnforceArea::MemoryQos,
            EnforceArea::OomScoreAdj,
            EnforceArea::ReservedCpus,
            EnforceArea::QosTierWeights
        ]
    );
    assert_eq!(c.gang_eviction, GangEviction::Unit);
    assert_eq!(c.eviction_method, EvictionMethod::Api);
    assert!(c.taint_on_pressure);
    assert!(QosletConfiguration::parse(Path::new("q.yaml"), "enforce: [memory]\n").is_err());
    assert!(QosletConfiguration::parse(Path::new("q.yaml"), "evictionMethod: delete\n").is_err());
    assert!(q.ebpf.kernel_diagnostics);
    let sensors = crate::sensors::SensorsConfig::from(&q.ebpf);
    assert!(sensors.ebpf && sensors.kernel_diagnostics);
    let err = QosletConfiguration::parse(Path::new("q.yaml"), "metricAddress: x\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "q.yaml:1: QosletConfiguration: metricAddress: unknown field (did you mean `metricsAddress`?)"
    );
}

#[test]
fn an_unknown_sensor_name_is_an_error_naming_the_field_and_the_sensors() {
    let err = QosletConfiguration::parse(Path::new("q.yaml"), "ebpf: {sensors: {oom: false}}\n")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "q.yaml:1: QosletConfiguration: ebpf.sensors: unknown sensor \"oom\" (the eBPF sensors are oom_victim, memcg_events, reclaim_stall, reclaim_wake, cpu_runqueue, oom_score_adj, process_lifecycle, cgroup_lifecycle)"
    );
}

#[test]
fn reserved_cpus_conflict_mode_reaches_the_settings() {
    let kc = kubelet(
        "reservedSystemCPUs: 0-1\nsystemReservedCgroup: /system.slice\nenforceNodeAllocatable: [pods, system-reserved-compressible]\n",
    );
    let qc = QosletConfiguration {
        reserved_cpus_conflict: ReservedCpusConflict::Openshift,
        ..QosletConfiguration::default()
    };
    let s = node_settings(Path::new("kc.yaml"), &kc, &qc, capacity()).unwrap();
    assert_eq!(s.reserved_cpus_conflict, ReservedCpusConflict::Openshift);
    assert_eq!(
        s.reserved_system_cpus.map(|c| c.to_string()).as_deref(),
        Some("0-1")
    );
}

#[test]
fn eviction_periods_gates_and_node_root() {
    let s = settings(
        "evictionPressureTransitionPeriod: 1m30s\nevictionMaxPodGracePeriod: 20\nfeatureGates: {PodLevelResources: false}\n",
    )
    .unwrap();
    assert_eq!(s.eviction_pressure_transition_secs, 90);
    assert_eq!(s.eviction_max_pod_grace_secs, 20);
    assert!(!s.pod_level_resources);
    let qc = QosletConfiguration {
        node_root_cgroup: Some("/qoslet-node".into()),
        ..QosletConfiguration::default()
    };
    let s = node_settings(Path::new("kc.yaml"), &kubelet(""), &qc, capacity()).unwrap();
    assert_eq!(s.cgroup_root, "/qoslet-node");
}

#[test]
fn cpu_pressure_configuration_defaults_and_validation() {
    let parsed = QosletConfiguration::parse(Path::new("q.yaml"), "{}").unwrap();
    assert_eq!(parsed.cpu_pressure.enabled, None);
    assert_eq!(
        parsed.cpu_pressure.policy().unwrap(),
        CpuPressureConfig::default()
    );
    let q = QosletConfiguration::parse(
        Path::new("q.yaml"),
        "cpuPressure: {enabled: true, latencyTarget: 20ms, protectBurstable: true, psiSomeTargetPercent: 40, calmWindows: 3, maxCalmWindows: 3, capPercent: 30, floorPercent: 30}\n",
    )
    .unwrap();
    let p = q.cpu_pressure.policy().unwrap();
    assert_eq!(q.cpu_pressure.enabled, Some(true));
    assert_eq!(p.latency_target, Duration::from_millis(20));
    assert!(p.protect_burstable);
    assert_eq!(p.psi_some_target, Some(0.4));
    assert_eq!(
        (p.calm_windows, p.cap_percent, p.floor_percent),
        (3, 30, 30)
    );
    for (text, field) in [
        (
            "cpuPressure: {latencyTarget: 0}\n",
            "cpuPressure.latencyTarget",
        ),
        (
            "cpuPressure: {psiSomeTargetPercent: 0}\n",
            "cpuPressure.psiSomeTargetPercent",
        ),
        ("cpuPressure: {calmWindows: 0}\n", "cpuPressure.calmWindows"),
        (
            "cpuPressure: {calmWindows: 9, maxCalmWindows: 8}\n",
            "cpuPressure.maxCalmWindows",
        ),
        (
            "cpuPressure: {floorPercent: 0}\n",
            "cpuPressure.floorPercent",
        ),
        ("cpuPressure: {capPercent: 5}\n", "cpuPressure.capPercent"),
    ] {
        let err = QosletConfiguration::parse(Path::new("q.yaml"), text).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("q.yaml:1: QosletConfiguration: {field}: ")),
            "{text}: {err}"
        );
    }
}

#[test]
fn gang_aware_eviction_is_the_deprecated_spelling_of_gang_eviction() {
    let parse = |t: &str| QosletConfiguration::parse(Path::new("q.yaml"), t);
    let off = parse("gangAwareEviction: false\n").unwrap();
    assert_eq!(off.gang_eviction, GangEviction::None);
    assert_eq!(off, parse("gangEviction: none\n").unwrap());
    let on = parse("gangAwareEviction: true\ngangEviction: unit\n").unwrap();
    assert_eq!(on.gang_eviction, GangEviction::Unit);
    assert_eq!(on.deprecated_gang_aware_eviction, None);
    let written = serde_yaml_ng::to_string(&on).unwrap();
    assert!(
        written.contains("gangEviction: unit") && !written.contains("gangAwareEviction"),
        "{written}"
    );
    let err = parse("gangAwareEviction: false\ngangEviction: unit\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "q.yaml:1: QosletConfiguration: gangAwareEviction: false contradicts gangEviction: unit"
    );
}

/// `endpointAuth` defaults by mode (standalone has no API server, so `tokenReview` is refused
/// there), and the default address follows it: every address (IPv6 and IPv4) when the
/// endpoints are authorized, loopback when open; an explicit `metricsAddress` wins.
#[test]
fn endpoint_auth_and_the_default_address_follow_the_mode() {
    let q = |text: &str| QosletConfiguration::parse(Path::new("q.yaml"), text).unwrap();
    let defaults = q("{}");
    assert_eq!(defaults.endpoint_auth(true), Ok(EndpointAuth::TokenReview));
    assert_eq!(defaults.endpoint_auth(false), Ok(EndpointAuth::None));
    assert_eq!(
        defaults
            .listen_address(EndpointAuth::TokenReview)
            .unwrap()
            .to_string(),
        "[::]:9479"
    );
    assert_eq!(
        defaults
            .listen_address(EndpointAuth::None)
            .unwrap()
            .to_string(),
        "127.0.0.1:9479"
    );
    let review = q("endpointAuth: tokenReview\nmetricsAddress: 10.0.0.1:9500\n");
    assert!(
        review
            .endpoint_auth(false)
            .unwrap_err()
            .contains("standalone")
    );
    assert_eq!(
        review
            .listen_address(EndpointAuth::TokenReview)
            .unwrap()
            .to_string(),
        "10.0.0.1:9500"
    );
    assert_eq!(
        q("endpointAuth: none\n").endpoint_auth(true),
        Ok(EndpointAuth::None)
    );
    assert!(QosletConfiguration::parse(Path::new("q.yaml"), "endpointAuth: basic\n").is_err());
}

#[test]
fn every_problem_of_a_qoslet_configuration_is_reported_with_its_line() {
    let text = "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmetricsAdress: 127.0.0.1:1\nhousekeepingInterval: 5x\ncpuPressure:\n  latencyTarget: soon\n  capPercnt: 10\nkubernetesVersion: '1.33'\nenforce: [memoryQoS, bogus]\n";
    let err = QosletConfiguration::parse(Path::new("q.yaml"), text).unwrap_err();
    let lines: Vec<String> = err.into_list().iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "q.yaml:3: QosletConfiguration: metricsAdress: unknown field (did you mean `metricsAddress`?)",
            "q.yaml:4: QosletConfiguration: housekeepingInterval: invalid duration \"5x\"",
            "q.yaml:6: QosletConfiguration: cpuPressure.latencyTarget: invalid duration \"soon\"",
            "q.yaml:7: QosletConfiguration: cpuPressure.capPercnt: unknown field (did you mean `capPercent`?)",
            "q.yaml:8: QosletConfiguration: kubernetesVersion: \"1.33\": Kubernetes 1.33 is not followed: qoslet knows 1.34 to 1.37",
            "q.yaml:9: QosletConfiguration: enforce[1]: unknown variant `bogus`, expected one of `memoryQoS`, `oomScoreAdj`, `reservedCPUs`, `qosTierWeights`, `cpuPressure`",
        ]
    );
    // A version written unquoted is read as written, as before.
    let qc = QosletConfiguration::parse(Path::new("q.yaml"), "kubernetesVersion: 1.36\n").unwrap();
    assert_eq!(qc.kubernetes_version.as_deref(), Some("1.36"));
}
