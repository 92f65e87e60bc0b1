//! The KubeletConfiguration fields qoslet reads.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

use crate::{
    policy::{cpuset::CpuSet, settings::Capacity},
    source::{
        fields::{did_you_mean, shown},
        nesting::check_nesting,
    },
};

use super::{ConfigError, KUBELET_API_VERSION, QosletConfiguration, node_settings, read};

/// The KubeletConfiguration fields qoslet reads; the others are named once as not implemented
/// ([`KUBELET_FIELDS`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfig {
    pub(crate) api_version: Option<String>,
    pub(crate) kind: Option<String>,
    pub(crate) system_reserved: Option<BTreeMap<String, String>>,
    pub(crate) kube_reserved: Option<BTreeMap<String, String>>,
    pub(crate) eviction_hard: Option<BTreeMap<String, String>>,
    pub(crate) eviction_soft: Option<BTreeMap<String, String>>,
    pub(crate) eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    pub(crate) eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    pub(crate) eviction_pressure_transition_period: Option<String>,
    pub(crate) merge_default_eviction_settings: Option<bool>,
    pub(crate) eviction_max_pod_grace_period: Option<i32>,
    pub(crate) enforce_node_allocatable: Option<Vec<String>>,
    pub(crate) system_reserved_cgroup: Option<String>,
    pub(crate) kube_reserved_cgroup: Option<String>,
    #[serde(rename = "reservedSystemCPUs")]
    pub(crate) reserved_system_cpus: Option<String>,
    pub(crate) cgroup_driver: Option<String>,
    pub(crate) cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub(crate) cgroups_per_qos: Option<bool>,
    #[serde(rename = "cpuCFSQuota")]
    pub(crate) cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub(crate) cpu_cfs_quota_period: Option<String>,
    pub(crate) memory_throttling_factor: Option<f64>,
    pub(crate) memory_reservation_policy: Option<String>,
    pub(crate) qos_reserved: Option<BTreeMap<String, String>>,
    #[serde(rename = "singleProcessOOMKill")]
    pub(crate) single_process_oom_kill: Option<bool>,
    pub(crate) feature_gates: Option<BTreeMap<String, bool>>,
    pub(crate) pod_pids_limit: Option<i64>,
    /// Top-level fields of the file that qoslet does not implement, in file order; they are
    /// ignored (reported once by `run`, as a note by `plan` and `validate`).
    #[serde(skip)]
    pub(crate) ignored: Vec<String>,
}

/// The KubeletConfiguration fields [`KubeletConfig`] reads, as spelled in the file.
pub(crate) const KUBELET_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "systemReserved",
    "kubeReserved",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "mergeDefaultEvictionSettings",
    "evictionMaxPodGracePeriod",
    "enforceNodeAllocatable",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "reservedSystemCPUs",
    "cgroupDriver",
    "cgroupRoot",
    "cgroupsPerQOS",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "memoryThrottlingFactor",
    "memoryReservationPolicy",
    "qosReserved",
    "featureGates",
    "podPidsLimit",
];

impl KubeletConfig {
    /// A configuration that sets nothing: the kubelet's defaults, where no kubelet was found.
    pub(crate) fn kubelet_defaults() -> Self {
        Self {
            api_version: Some(KUBELET_API_VERSION.into()),
            kind: Some("KubeletConfiguration".into()),
            ..Self::default()
        }
    }

    /// Reads and checks the kind of a KubeletConfiguration file.
    pub(crate) fn load(file: &Path) -> Result<Self, ConfigError> {
        Self::parse(file, &read(file)?)
    }

    pub fn parse(file: &Path, text: &str) -> Result<Self, ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            file: file.into(),
            kind: "KubeletConfiguration",
            field: field.into(),
            message,
            line: None,
        };
        check_nesting(text).map_err(|e| invalid("", e.to_string()))?;
        let mut kc: Self = serde_yaml_ng::from_str(text).map_err(|e| invalid("", e.to_string()))?;
        if kc.kind.as_deref() != Some("KubeletConfiguration") {
            return Err(invalid(
                "kind",
                format!(
                    "expected KubeletConfiguration, got {:?}",
                    kc.kind.unwrap_or_default()
                ),
            ));
        }
        if kc.api_version.as_deref() != Some(KUBELET_API_VERSION) {
            return Err(invalid(
                "apiVersion",
                format!(
                    "expected {KUBELET_API_VERSION}, got {:?}",
                    kc.api_version.clone().unwrap_or_default()
                ),
            ));
        }
        // The same text decoded as a map has every key; the struct above read the known ones.
        if let Ok(serde_yaml_ng::Value::Mapping(m)) = serde_yaml_ng::from_str(text) {
            kc.ignored = m
                .keys()
                .filter_map(|k| k.as_str())
                .filter(|k| !KUBELET_FIELDS.contains(k))
                .map(str::to_owned)
                .collect();
        }
        Ok(kc)
    }

    /// The note `plan` and `validate` print and `run` logs, when fields are ignored. They are
    /// no error and no warning: the kubelet has many fields qoslet has no use for. A name a
    /// small edit away from one qoslet reads is likely misspelt, and the note says which it
    /// may be (`systemReseved (did you mean `systemReserved`?)`).
    pub(crate) fn ignored_note(&self) -> Option<String> {
        (!self.ignored.is_empty()).then(|| {
            let names: Vec<String> = self
                .ignored
                .iter()
                .map(|k| match did_you_mean(k, KUBELET_FIELDS) {
                    Some(m) => format!("{} (did you mean `{m}`?)", shown(k)),
                    None => shown(k),
                })
                .collect();
            format!(
                "KubeletConfiguration fields qoslet does not implement are ignored: {}",
                names.join(", ")
            )
        })
    }

    /// Every check [`node_settings`] makes that does not depend on the node's capacity, for
    /// `qoslet validate`, with the QosletConfiguration defaults.
    pub(crate) fn check(&self, file: &Path) -> Result<(), ConfigError> {
        let capacity = Capacity {
            cpu_millis: i64::MAX,
            memory_bytes: i64::MAX,
            pids: i64::MAX,
            cpus: CpuSet::first(8192),
        };
        let s = node_settings(file, self, &QosletConfiguration::default(), capacity)?;
        match crate::policy::allocatable::node_allocatable(&s) {
            Err(e @ crate::policy::allocatable::AllocatableError::ReservedCpusWithCgroup) => {
                Err(ConfigError::Invalid {
                    file: file.into(),
                    kind: "KubeletConfiguration",
                    field: "reservedSystemCPUs".into(),
                    message: e.to_string(),
                    line: None,
                })
            }
            // Reservations above capacity depend on the node, which validate does not know.
            _ => Ok(()),
        }
    }

    pub(crate) fn gate(&self, name: &str) -> Option<bool> {
        self.feature_gates
            .as_ref()
            .and_then(|g| g.get(name).copied())
    }
}
