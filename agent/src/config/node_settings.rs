//! The policy's settings from the two files, with errors that name the file, the field and the
//! value.

use std::{collections::BTreeMap, fmt, path::Path};

use crate::policy::{
    cpu::QUOTA_PERIOD_US,
    cpuset::CpuSet,
    duration::{parse_duration, parse_duration_nanos},
    eviction::{EvictionInput, parse_thresholds},
    quantity::Quantity,
    settings::{
        Capacity, CgroupDriver, Enforcement, MemoryQos, MemoryReservationPolicy, NodeSettings,
        Reservation,
    },
};

use super::{ConfigError, KubeletConfig, QosletConfiguration};

/// A value that failed, before the file name is attached.
struct FieldError {
    field: String,
    message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn field_err(field: impl Into<String>, value: &str, message: impl fmt::Display) -> FieldError {
    FieldError {
        field: field.into(),
        message: format!("{value:?}: {message}"),
    }
}

/// Builds the policy settings. `kubelet_file` names the file in errors.
pub fn node_settings(
    kubelet_file: &Path,
    kc: &KubeletConfig,
    qc: &QosletConfiguration,
    capacity: Capacity,
) -> Result<NodeSettings, ConfigError> {
    settings_inner(kc, qc, capacity).map_err(|errors| {
        let all = errors
            .into_iter()
            .map(|e| ConfigError::Invalid {
                file: kubelet_file.into(),
                kind: "KubeletConfiguration",
                field: e.field,
                message: e.message,
                line: None,
            })
            .collect();
        match ConfigError::all(all) {
            Err(e) => e,
            // settings_inner gives no empty error list.
            Ok(()) => ConfigError::Several(Vec::new()),
        }
    })
}

fn reservation(
    field: &str,
    map: Option<&BTreeMap<String, String>>,
) -> Result<Reservation, FieldError> {
    let mut r = Reservation::default();
    for (k, v) in map.into_iter().flatten() {
        let q: Quantity = v
            .parse()
            .map_err(|e| field_err(format!("{field}.{k}"), v, e))?;
        if q.signum() < 0 {
            return Err(field_err(format!("{field}.{k}"), v, "must not be negative"));
        }
        match k.as_str() {
            "cpu" => r.cpu = Some(q),
            "memory" => r.memory = Some(q),
            "pid" | "pids" => r.pids = Some(q),
            // ephemeral-storage and hugepages are accepted and not enforced by qoslet.
            _ => {}
        }
    }
    Ok(r)
}

fn enforcement(kc: &KubeletConfig) -> Result<Enforcement, FieldError> {
    let default = vec!["pods".to_string()];
    let list = kc.enforce_node_allocatable.as_ref().unwrap_or(&default);
    let field = "enforceNodeAllocatable";
    let sys_cg = kc.system_reserved_cgroup.as_deref().unwrap_or("");
    let kube_cg = kc.kube_reserved_cgroup.as_deref().unwrap_or("");
    let need = |cgroup: &str, flag: &str, key: &str| -> Result<(), FieldError> {
        if cgroup.is_empty() {
            return Err(field_err(
                field,
                key,
                format!(
                    "invalid configuration: {flag} must be specified when {key:?} contained in enforceNodeAllocatable (--enforce-node-allocatable)"
                ),
            ));
        }
        Ok(())
    };
    let mut e = Enforcement::default();
    for key in list {
        match key.as_str() {
            "pods" => e.pods = true,
            "system-reserved" => {
                need(
                    sys_cg,
                    "systemReservedCgroup (--system-reserved-cgroup)",
                    key,
                )?;
                e.system_reserved = true;
            }
            "kube-reserved" => {
                need(kube_cg, "kubeReservedCgroup (--kube-reserved-cgroup)", key)?;
                e.kube_reserved = true;
            }
            "system-reserved-compressible" => {
                need(
                    sys_cg,
                    "systemReservedCgroup (--system-reserved-cgroup)",
                    key,
                )?;
                e.system_reserved_compressible = true;
            }
            "kube-reserved-compressible" => {
                need(kube_cg, "kubeReservedCgroup (--kube-reserved-cgroup)", key)?;
                e.kube_reserved_compressible = true;
            }
            "none" if list.len() > 1 => {
                return Err(field_err(
                    field,
                    key,
                    "invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified",
                ));
            }
            "none" => {}
            _ => {
                return Err(field_err(
                    field,
                    key,
                    "invalid configuration: option specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid options are \"pods\", \"system-reserved\", \"kube-reserved\", \"system-reserved-compressible\", \"kube-reserved-compressible\" or \"none\"",
                ));
            }
        }
    }
    if e.system_reserved && e.system_reserved_compressible
        || e.kube_reserved && e.kube_reserved_compressible
    {
        return Err(field_err(
            field,
            &list.join(","),
            "a reservation cannot be enforced both fully and as -compressible",
        ));
    }
    Ok(e)
}

/// `r`'s value, or `None` with its error noted.
fn noted<T>(r: Result<T, FieldError>, errors: &mut Vec<FieldError>) -> Option<T> {
    r.map_err(|e| errors.push(e)).ok()
}

fn settings_inner(
    kc: &KubeletConfig,
    qc: &QosletConfiguration,
    capacity: Capacity,
) -> Result<NodeSettings, Vec<FieldError>> {
    let mut s = NodeSettings::defaults(capacity);
    // Every field is checked: a value that fails is noted and its default kept, so that the
    // fields after it are checked too and every error is reported at once.
    let mut errors: Vec<FieldError> = Vec::new();
    if let Some(r) = noted(
        reservation("systemReserved", kc.system_reserved.as_ref()),
        &mut errors,
    ) {
        s.system_reserved = r;
    }
    if let Some(r) = noted(
        reservation("kubeReserved", kc.kube_reserved.as_ref()),
        &mut errors,
    ) {
        s.kube_reserved = r;
    }
    if let Some(e) = noted(enforcement(kc), &mut errors) {
        s.enforcement = e;
    }
    s.system_reserved_cgroup = kc.system_reserved_cgroup.clone().unwrap_or_default();
    s.kube_reserved_cgroup = kc.kube_reserved_cgroup.clone().unwrap_or_default();
    s.cgroups_per_qos = kc.cgroups_per_qos.unwrap_or(true);
    if !s.cgroups_per_qos && s.enforcement.pods {
        errors.push(field_err(
            "enforceNodeAllocatable",
            "pods",
            "invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) is not supported unless cgroupsPerQOS (--cgroups-per-qos) feature is turned on",
        ));
    }
    let thresholds = parse_thresholds(&EvictionInput {
        hard: kc.eviction_hard.as_ref(),
        soft: kc.eviction_soft.as_ref(),
        soft_grace: kc.eviction_soft_grace_period.as_ref(),
        min_reclaim: kc.eviction_minimum_reclaim.as_ref(),
        merge_defaults: kc.merge_default_eviction_settings.unwrap_or(false),
        pods_enforced: s.enforcement.pods,
    })
    .map_err(|e| FieldError {
        field: e.field(),
        message: e.to_string(),
    });
    if let Some((hard, soft)) = noted(thresholds, &mut errors) {
        s.hard_eviction = hard;
        s.soft_eviction = soft;
    }
    if let Some(p) = &kc.eviction_pressure_transition_period
        && let Some(secs) = noted(
            parse_duration(p).map_err(|e| field_err("evictionPressureTransitionPeriod", p, e)),
            &mut errors,
        )
    {
        s.eviction_pressure_transition_secs = secs;
    }
    if let Some(text) = kc
        .reserved_system_cpus
        .as_deref()
        .filter(|t| !t.trim().is_empty())
    {
        let set = text.parse::<CpuSet>().map_err(|e| {
            field_err("reservedSystemCPUs", text, format!("invalid configuration: unable to parse reservedSystemCPUs (--reserved-cpus), error: {e}"))
        });
        if let Some(set) = noted(set, &mut errors) {
            s.reserved_system_cpus = Some(set);
        }
    }
    s.reserved_cpus_conflict = qc.reserved_cpus_conflict;
    s.cgroup_driver = match kc.cgroup_driver.as_deref() {
        None | Some("cgroupfs") => CgroupDriver::Cgroupfs,
        Some("systemd") => CgroupDriver::Systemd,
        Some(other) => {
            errors.push(field_err(
                "cgroupDriver",
                other,
                "expected cgroupfs or systemd",
            ));
            CgroupDriver::Cgroupfs
        }
    };
    s.cgroup_root = kc
        .cgroup_root
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "/".into());
    s.cpu_cfs_quota = kc.cpu_cfs_quota.unwrap_or(true);
    let period = |p: &str| {
        let ns = parse_duration_nanos(p).map_err(|e| field_err("cpuCFSQuotaPeriod", p, e))?;
        let us = (ns / 1000) as u64;
        if !(1000..=1_000_000).contains(&us) {
            return Err(field_err(
                "cpuCFSQuotaPeriod",
                p,
                "must be between 1ms and 1s",
            ));
        }
        Ok(us)
    };
    if let Some(p) = &kc.cpu_cfs_quota_period
        && let Some(us) = noted(period(p), &mut errors)
    {
        // Upstream honours a custom period only with CustomCPUCFSQuotaPeriod; we honour it
        // unless that gate is explicitly off.
        s.cpu_cfs_quota_period_us = if kc.gate("CustomCPUCFSQuotaPeriod") == Some(false) {
            QUOTA_PERIOD_US
        } else {
            us
        };
    }
    if kc.gate("QOSReserved") == Some(true)
        && let Some(v) = kc.qos_reserved.as_ref().and_then(|m| m.get("memory"))
    {
        let pct = v
            .strip_suffix('%')
            .and_then(|n| n.parse::<i64>().ok())
            .filter(|p| (0..=100).contains(p))
            .ok_or_else(|| {
                field_err(
                    "qosReserved.memory",
                    v,
                    "expected a percentage between 0% and 100%",
                )
            });
        if let Some(pct) = noted(pct, &mut errors) {
            s.qos_reserved_memory_pct = Some(pct);
        }
    }
    let version = qc.kubernetes_version();
    s.kubernetes_version = version;
    if kc.memory_reservation_policy.is_some() && !version.has_memory_reservation_policy() {
        errors.push(field_err(
            "memoryReservationPolicy",
            kc.memory_reservation_policy.as_deref().unwrap_or_default(),
            format!("not a field of the Kubernetes {version} KubeletConfiguration (added in 1.36)"),
        ));
    }
    // MemoryQoS is alpha (off) up to 1.36 and beta (on) from 1.37.
    if kc.gate("MemoryQoS").unwrap_or(version.memory_qos_default()) {
        let factor = match kc.memory_throttling_factor {
            Some(f) if !(f > 0.0 && f <= 1.0) => {
                errors.push(field_err(
                    "memoryThrottlingFactor",
                    &f.to_string(),
                    "must be greater than 0 and less than or equal to 1.0",
                ));
                version.default_throttling_factor_ppm()
            }
            Some(f) => Some((f * 1_000_000.0).round() as u32),
            None => version.default_throttling_factor_ppm(),
        };
        let policy = match kc.memory_reservation_policy.as_deref() {
            None | Some("None" | "") => MemoryReservationPolicy::None,
            Some("TieredReservation") => MemoryReservationPolicy::TieredReservation,
            Some(other) => {
                errors.push(field_err(
                    "memoryReservationPolicy",
                    other,
                    "expected None or TieredReservation",
                ));
                MemoryReservationPolicy::None
            }
        };
        s.memory_qos = Some(MemoryQos {
            throttling_factor_ppm: factor,
            policy,
        });
    }
    s.oom_score_adj_tie_break = kc.gate("KubeletOOMScoreAdjTieBreak").unwrap_or(false);
    s.single_process_oom_kill = kc.single_process_oom_kill.unwrap_or(false);
    s.eviction_max_pod_grace_secs = kc.eviction_max_pod_grace_period.unwrap_or(0).into();
    s.pod_pids_limit = kc.pod_pids_limit.filter(|l| *l > 0);
    s.pod_level_resources = kc.gate("PodLevelResources").unwrap_or(true);
    // A node root cgroup is where the "node" lives: kubepods and the rest go beneath it.
    if let Some(root) = qc.node_root_cgroup.as_ref().filter(|r| !r.is_empty()) {
        s.cgroup_root = root.clone();
    }
    s.weight_formula = qc.weight_formula;
    s.container_weight_formula = qc.container_weight_formula;
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}
