//! Configuration files: the node's own `kubelet.config.k8s.io/v1beta1` KubeletConfiguration
//! (the fields qoslet uses; unknown fields are ignored) and qoslet's `QosletConfiguration`
//! (`qoslet.dev/v1alpha1`, unknown fields rejected). [`node_settings`] turns them into the
//! policy's [`NodeSettings`], with errors that name the file, the field and the value.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Deserializer, Serialize};
use thiserror::Error;

use crate::source::{
    file::{DEFAULT_MAX_BYTES, read_bounded},
    nesting::check_nesting,
};

use crate::policy::{
    cpu::{QUOTA_PERIOD_US, WeightFormula},
    cpu_pressure::CpuPressureConfig,
    cpuset::CpuSet,
    duration::{parse_duration, parse_duration_nanos},
    eviction::{EvictionInput, parse_thresholds},
    quantity::Quantity,
    settings::{
        Capacity, CgroupDriver, Enforcement, MemoryQos, MemoryReservationPolicy, NodeSettings,
        Reservation, ReservedCpusConflict,
    },
    version::KubeVersion,
};
use crate::sensors::SensorSwitches;

pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const QOSLET_API_VERSION: &str = "qoslet.dev/v1alpha1";

/// A configuration file could not be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file cannot be read (exit status 2).
    #[error("{file}: cannot read")]
    Unreadable {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file or one of its values is malformed (exit status 1).
    #[error("{file}: {kind}: {field}: {message}")]
    Invalid {
        file: PathBuf,
        kind: &'static str,
        /// camelCase path of the field, e.g. `systemReserved.memory`; empty for the whole file.
        field: String,
        message: String,
    },
}

/// The KubeletConfiguration fields qoslet reads (DESIGN.md "Configuration").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfig {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub system_reserved: Option<BTreeMap<String, String>>,
    pub kube_reserved: Option<BTreeMap<String, String>>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub eviction_soft: Option<BTreeMap<String, String>>,
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    pub eviction_pressure_transition_period: Option<String>,
    pub merge_default_eviction_settings: Option<bool>,
    pub eviction_max_pod_grace_period: Option<i32>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub system_reserved_cgroup: Option<String>,
    pub kube_reserved_cgroup: Option<String>,
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: Option<String>,
    pub memory_throttling_factor: Option<f64>,
    pub memory_reservation_policy: Option<String>,
    pub qos_reserved: Option<BTreeMap<String, String>>,
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: Option<bool>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub pod_pids_limit: Option<i64>,
    /// Top-level fields of the file that qoslet does not implement, in file order; they are
    /// ignored (reported once by `run`, as a note by `plan` and `validate`).
    #[serde(skip)]
    pub ignored: Vec<String>,
}

/// The KubeletConfiguration fields [`KubeletConfig`] reads, as spelled in the file.
pub const KUBELET_FIELDS: &[&str] = &[
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

/// `enforce` writes cgroups and evicts; `observe` computes and reports only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Observe,
}

/// eBPF on/off, globally and per sensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EbpfConfig {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Sensor name -> on/off; sensors not listed are on. The names are those of
    /// `sensors::table::SENSORS`; another name is an error.
    #[serde(default)]
    pub sensors: BTreeMap<String, bool>,
    /// The kernel programs log their rare paths (a ring buffer full, a map full, a watched
    /// cgroup without a CPU slot, a record they could not read) into qoslet's log, target
    /// `qoslet::kernel`. Off by default; off, the verifier removes the logging from the programs.
    #[serde(default)]
    pub kernel_diagnostics: bool,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sensors: BTreeMap::new(),
            kernel_diagnostics: false,
        }
    }
}

/// Node capacity given instead of read from the machine; absent entries are read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapacityOverride {
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub pids: Option<i64>,
}

/// qoslet's own file (kind `QosletConfiguration`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QosletConfiguration {
    #[serde(default = "qoslet_api_version")]
    pub api_version: String,
    #[serde(default = "qoslet_kind")]
    pub kind: String,
    #[serde(default)]
    pub mode: Mode,
    /// `/metrics`, `/healthz`, `/readyz`; loopback unless asked otherwise.
    #[serde(default = "default_metrics_address")]
    pub metrics_address: String,
    #[serde(default)]
    pub ebpf: EbpfConfig,
    /// cpu.weight formula for kubepods, QoS and pod cgroups.
    #[serde(default)]
    pub weight_formula: WeightFormula,
    /// cpu.weight formula for container cgroups (the runtime's).
    #[serde(default = "default_container_weight_formula")]
    pub container_weight_formula: WeightFormula,
    /// Evict whole gangs (or spare surplus members) instead of breaking them.
    #[serde(default = "yes")]
    pub gang_aware_eviction: bool,
    /// The largest manifest file the standalone source reads, in bytes (default 4 MiB); larger
    /// files are refused with a problem line.
    #[serde(default = "default_max_manifest_bytes")]
    pub max_manifest_bytes: u64,
    /// Go duration, e.g. `1s`.
    #[serde(
        default = "default_housekeeping",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub housekeeping_interval: Duration,
    /// What wakes the eviction manager: `events` (the memory watcher and the eBPF memcg events,
    /// as well as every housekeeping interval) or `housekeeping` (the interval alone, as the
    /// kubelet's eviction loop; for comparisons such as `cargo xtask bench peers`).
    #[serde(default)]
    pub eviction_wakeups: EvictionWakeups,
    /// How often per-pod statistics are sampled (run-queue latency, working sets, the Summary
    /// API's CPU base) and every container's processes scanned for their oom_score_adj. The
    /// eviction path does not wait for it: it reads usage fresh at decision time.
    #[serde(
        default = "default_stats_interval",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub stats_interval: Duration,
    /// Where state that must survive a crash is kept (evicted pods, the cgroups qoslet created).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    #[serde(default)]
    pub capacity: CapacityOverride,
    /// A cgroup that acts as the node; with a memory limit, that limit is the node's memory.
    #[serde(default)]
    pub node_root_cgroup: Option<String>,
    /// `reject` (upstream validation) or `openshift` (drop `-compressible` enforcement with a
    /// warning) when reservedSystemCPUs meets a reserved cgroup.
    #[serde(default)]
    pub reserved_cpus_conflict: ReservedCpusConflict,
    /// The Kubernetes version whose kubelet rules qoslet follows (`1.34` to `1.37`); unset: 1.37,
    /// the API version qoslet speaks. In cluster mode the node's `kubeletVersion` decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// Cluster mode: what qoslet writes beside the kubelet (nothing by default: it compares
    /// the kubelet's cgroups and reports drift). Ignored by the standalone node, which writes all.
    #[serde(default)]
    pub enforce: Vec<EnforceArea>,
    /// Cluster mode: a gang with `disruptionMode: all` is evicted on this node only (`node`, the
    /// default: each node writes its own pods) or with its members on other nodes too, through
    /// the Eviction API (`unit`).
    #[serde(default)]
    pub gang_eviction: GangEviction,
    /// Cluster mode: how a pod is evicted (`kubelet`: as the kubelet's eviction manager; `api`:
    /// the Eviction API, which honours PodDisruptionBudgets).
    #[serde(default)]
    pub eviction_method: EvictionMethod,
    /// Cluster mode: taint the node `qoslet.dev/pressure:NoSchedule` while one of qoslet's
    /// pressure conditions is true.
    #[serde(default)]
    pub taint_on_pressure: bool,
    /// Cluster mode: the namespace of the per-node Lease `qoslet-NODE` (the heartbeat).
    #[serde(default = "default_lease_namespace")]
    pub lease_namespace: String,
    /// The CPU-pressure controller (protects latency-sensitive pods from BestEffort CPU).
    #[serde(default)]
    pub cpu_pressure: CpuPressureConfiguration,
}

/// `evictionWakeups`: what wakes the eviction manager besides its housekeeping interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictionWakeups {
    /// The node root's memory watcher and the eBPF memcg events, as shipped.
    #[default]
    Events,
    /// Nothing: the housekeeping interval alone, as the kubelet.
    Housekeeping,
}

/// An area qoslet writes in cluster mode (QosletConfiguration `enforce`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EnforceArea {
    /// memory.min / memory.low / memory.high of kubepods, the QoS tiers, pods and containers.
    #[serde(rename = "memoryQoS")]
    MemoryQos,
    /// oom_score_adj of the processes in container cgroups.
    #[serde(rename = "oomScoreAdj")]
    OomScoreAdj,
    /// cpuset.cpus from reservedSystemCPUs.
    #[serde(rename = "reservedCPUs")]
    ReservedCpus,
    /// cpu.weight (cpu.shares) of the burstable and besteffort QoS cgroups.
    #[serde(rename = "qosTierWeights")]
    QosTierWeights,
    /// The CPU-pressure controller's levers on the BestEffort tier (cpu.idle, the CPU cap);
    /// with it the controller runs unless `cpuPressure.enabled` says otherwise.
    #[serde(rename = "cpuPressure")]
    CpuPressure,
}

impl EnforceArea {
    pub fn area(self) -> crate::cgroup::desired::Area {
        use crate::cgroup::desired::Area;
        match self {
            Self::MemoryQos => Area::MemoryQos,
            Self::OomScoreAdj => Area::OomScoreAdj,
            Self::ReservedCpus => Area::ReservedCpus,
            Self::QosTierWeights => Area::QosTierWeights,
            Self::CpuPressure => Area::CpuPressure,
        }
    }
}

/// `cpuPressure`: when the run-queue latency p99 of Guaranteed (and optionally Burstable) pods
/// passes a target, the BestEffort tier is constrained (`cpu.idle`, then a share of the CPUs by
/// cpuset, then a CPU cap, then the cap at a floor) and released step by step once calm
/// (agent/src/policy/cpu_pressure.rs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuPressureConfiguration {
    /// Unset: on where qoslet runs the pods and owns the BestEffort tier (standalone), off where
    /// the tier is the kubelet's (cluster), so writing it there is opt-in.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Go duration; the protected pods' run-queue latency p99 over a housekeeping window above
    /// which the tier is constrained.
    #[serde(
        default = "default_latency_target",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub latency_target: Duration,
    /// Protect Burstable pods too (Guaranteed pods always are).
    #[serde(default)]
    pub protect_burstable: bool,
    /// The node's CPU PSI `some` percentage of a window above which the tier is constrained;
    /// unset: PSI is not a trigger (it counts BestEffort's own waiting too).
    #[serde(default)]
    pub psi_some_target_percent: Option<f64>,
    /// Calm windows in a row before one level is released.
    #[serde(default = "default_calm_windows")]
    pub calm_windows: u32,
    /// The most calm windows a release needs after pressure came back soon after a release.
    #[serde(default = "default_max_calm_windows")]
    pub max_calm_windows: u32,
    /// The CPUs the tier keeps at level 2 (by cpuset) and its cap at level 3, percent of the
    /// node's CPU.
    #[serde(default = "default_cap_percent")]
    pub cap_percent: u32,
    /// The cap at level 4, percent of the node's CPU: BestEffort never gets less.
    #[serde(default = "default_floor_percent")]
    pub floor_percent: u32,
    /// Windows with fewer protected wake-ups than this do not count as pressure.
    #[serde(default = "default_min_wakeups")]
    pub min_wakeups: u64,
}

fn default_latency_target() -> Duration {
    CpuPressureConfig::default().latency_target
}
fn default_calm_windows() -> u32 {
    CpuPressureConfig::default().calm_windows
}
fn default_max_calm_windows() -> u32 {
    CpuPressureConfig::default().max_calm_windows
}
fn default_cap_percent() -> u32 {
    CpuPressureConfig::default().cap_percent
}
fn default_floor_percent() -> u32 {
    CpuPressureConfig::default().floor_percent
}
fn default_min_wakeups() -> u64 {
    CpuPressureConfig::default().min_wakeups
}

impl Default for CpuPressureConfiguration {
    fn default() -> Self {
        Self {
            enabled: None,
            latency_target: default_latency_target(),
            protect_burstable: false,
            psi_some_target_percent: None,
            calm_windows: default_calm_windows(),
            max_calm_windows: default_max_calm_windows(),
            cap_percent: default_cap_percent(),
            floor_percent: default_floor_percent(),
            min_wakeups: default_min_wakeups(),
        }
    }
}

/// How far a `disruptionMode: all` gang is evicted in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GangEviction {
    /// The unit's pods on this node.
    #[default]
    Node,
    /// The whole unit: members on other nodes through the Eviction API.
    Unit,
}

/// How a pod is evicted in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictionMethod {
    /// As the kubelet's eviction manager: the local kill (at once at a hard threshold; SIGTERM,
    /// the grace period, SIGKILL at a soft one), then `pods/status` phase Failed, reason
    /// Evicted. PodDisruptionBudgets are not consulted and the pod object is never deleted.
    #[default]
    Kubelet,
    /// The Eviction API (PodDisruptionBudgets honoured, a 429 retried) and no local kill at a
    /// soft threshold; a hard threshold is still handled as `kubelet`, since it cannot wait.
    Api,
}

fn default_lease_namespace() -> String {
    "kube-node-lease".into()
}

impl CpuPressureConfiguration {
    /// The controller's configuration; the first invalid field (camelCase) and why.
    pub fn policy(&self) -> Result<CpuPressureConfig, (&'static str, String)> {
        if self.latency_target.is_zero() {
            return Err(("latencyTarget", "must be more than 0".into()));
        }
        if let Some(p) = self.psi_some_target_percent
            && !(p > 0.0 && p <= 100.0)
        {
            return Err(("psiSomeTargetPercent", format!("{p} is not in (0, 100]")));
        }
        if self.calm_windows == 0 {
            return Err(("calmWindows", "must be at least 1".into()));
        }
        if self.max_calm_windows < self.calm_windows {
            return Err(("maxCalmWindows", "must be at least calmWindows".into()));
        }
        if !(1..=100).contains(&self.floor_percent) {
            return Err(("floorPercent", "must be in 1..=100".into()));
        }
        if !(self.floor_percent..=100).contains(&self.cap_percent) {
            return Err(("capPercent", "must be in floorPercent..=100".into()));
        }
        Ok(CpuPressureConfig {
            latency_target: self.latency_target,
            protect_burstable: self.protect_burstable,
            psi_some_target: self.psi_some_target_percent.map(|p| p / 100.0),
            calm_windows: self.calm_windows,
            max_calm_windows: self.max_calm_windows,
            cap_percent: self.cap_percent,
            floor_percent: self.floor_percent,
            min_wakeups: self.min_wakeups,
        })
    }
}

fn yes() -> bool {
    true
}
fn qoslet_api_version() -> String {
    QOSLET_API_VERSION.into()
}
fn qoslet_kind() -> String {
    "QosletConfiguration".into()
}
fn default_metrics_address() -> String {
    "127.0.0.1:9479".into()
}
fn default_container_weight_formula() -> WeightFormula {
    WeightFormula::RuncQuadratic
}
fn default_max_manifest_bytes() -> u64 {
    DEFAULT_MAX_BYTES
}
fn default_housekeeping() -> Duration {
    Duration::from_secs(1)
}

/// The kubelet's own statistics housekeeping interval.
fn default_stats_interval() -> Duration {
    Duration::from_secs(10)
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/qoslet")
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    let nanos = parse_duration_nanos(&text).map_err(serde::de::Error::custom)?;
    Ok(Duration::from_nanos(nanos.min(u128::from(u64::MAX)) as u64))
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}ms", d.as_millis()))
}

impl Default for QosletConfiguration {
    /// The same values as deserializing `{}` (a test pins that).
    fn default() -> Self {
        QosletConfiguration {
            api_version: qoslet_api_version(),
            kind: qoslet_kind(),
            mode: Mode::Enforce,
            metrics_address: default_metrics_address(),
            ebpf: EbpfConfig::default(),
            weight_formula: WeightFormula::KubeletLinear,
            container_weight_formula: default_container_weight_formula(),
            gang_aware_eviction: true,
            max_manifest_bytes: DEFAULT_MAX_BYTES,
            housekeeping_interval: default_housekeeping(),
            eviction_wakeups: EvictionWakeups::default(),
            stats_interval: default_stats_interval(),
            state_dir: default_state_dir(),
            capacity: CapacityOverride::default(),
            node_root_cgroup: None,
            reserved_cpus_conflict: ReservedCpusConflict::Reject,
            kubernetes_version: None,
            enforce: Vec::new(),
            gang_eviction: GangEviction::Node,
            eviction_method: EvictionMethod::Kubelet,
            taint_on_pressure: false,
            lease_namespace: default_lease_namespace(),
            cpu_pressure: CpuPressureConfiguration::default(),
        }
    }
}

/// Configuration files are read with the default cap: they are read before the
/// QosletConfiguration that could change it.
fn read(file: &Path) -> Result<String, ConfigError> {
    read_bounded(file, DEFAULT_MAX_BYTES).map_err(|source| ConfigError::Unreadable {
        file: file.into(),
        source,
    })
}

impl KubeletConfig {
    /// Reads and checks the kind of a KubeletConfiguration file.
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        Self::parse(file, &read(file)?)
    }

    pub fn parse(file: &Path, text: &str) -> Result<Self, ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            file: file.into(),
            kind: "KubeletConfiguration",
            field: field.into(),
            message,
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

    /// The note `plan` and `validate` print and `run` logs, when fields are ignored.
    pub fn ignored_note(&self) -> Option<String> {
        (!self.ignored.is_empty()).then(|| {
            format!(
                "KubeletConfiguration fields qoslet does not implement are ignored: {}",
                self.ignored.join(", ")
            )
        })
    }

    /// Every check [`node_settings`] makes that does not depend on the node's capacity, for
    /// `qoslet validate`, with the QosletConfiguration defaults.
    pub fn check(&self, file: &Path) -> Result<(), ConfigError> {
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
                })
            }
            // Reservations above capacity depend on the node, which validate does not know.
            _ => Ok(()),
        }
    }

    pub fn gate(&self, name: &str) -> Option<bool> {
        self.feature_gates
            .as_ref()
            .and_then(|g| g.get(name).copied())
    }
}

impl QosletConfiguration {
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        Self::parse(file, &read(file)?)
    }

    /// The values `run` and `plan` read from the file beyond its schema (for `qoslet validate`):
    /// the metrics address, the node root cgroup and the capacity quantities.
    pub fn check(&self, file: &Path) -> Result<(), ConfigError> {
        let invalid = |field: &str, value: &str, message: String| ConfigError::Invalid {
            file: file.into(),
            kind: "QosletConfiguration",
            field: field.into(),
            message: format!("{value:?}: {message}"),
        };
        self.metrics_address
            .parse::<std::net::SocketAddr>()
            .map_err(|e| invalid("metricsAddress", &self.metrics_address, e.to_string()))?;
        if let Some(root) = &self.node_root_cgroup {
            crate::cgroup::CgroupPath::parse(root)
                .map_err(|e| invalid("nodeRootCgroup", root, e.to_string()))?;
        }
        for (field, v) in [
            ("capacity.cpu", &self.capacity.cpu),
            ("capacity.memory", &self.capacity.memory),
        ] {
            if let Some(v) = v {
                let q: Quantity =
                    v.parse()
                        .map_err(|e: crate::policy::quantity::QuantityError| {
                            invalid(field, v, e.to_string())
                        })?;
                if q.signum() < 0 {
                    return Err(invalid(
                        field,
                        v,
                        "must be greater than or equal to 0".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn parse(file: &Path, text: &str) -> Result<Self, ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            file: file.into(),
            kind: "QosletConfiguration",
            field: field.into(),
            message,
        };
        check_nesting(text).map_err(|e| invalid("", e.to_string()))?;
        let qc: Self = serde_yaml_ng::from_str(text).map_err(|e| invalid("", e.to_string()))?;
        if qc.kind != "QosletConfiguration" {
            return Err(invalid(
                "kind",
                format!("expected QosletConfiguration, got {:?}", qc.kind),
            ));
        }
        if qc.api_version != QOSLET_API_VERSION {
            return Err(invalid(
                "apiVersion",
                format!("expected {QOSLET_API_VERSION}, got {:?}", qc.api_version),
            ));
        }
        if let Some(v) = &qc.kubernetes_version
            && let Err(e) = v.parse::<KubeVersion>()
        {
            return Err(invalid("kubernetesVersion", format!("{v:?}: {e}")));
        }
        SensorSwitches::new(&qc.ebpf.sensors)
            .map_err(|e| invalid("ebpf.sensors", e.to_string()))?;
        if let Err((field, message)) = qc.cpu_pressure.policy() {
            return Err(invalid(&format!("cpuPressure.{field}"), message));
        }
        Ok(qc)
    }

    /// `kubernetesVersion`, or 1.37 when unset (checked by [`Self::parse`]).
    pub fn kubernetes_version(&self) -> KubeVersion {
        self.kubernetes_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }
}

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
    settings_inner(kc, qc, capacity).map_err(|e| ConfigError::Invalid {
        file: kubelet_file.into(),
        kind: "KubeletConfiguration",
        field: e.field,
        message: e.message,
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

fn settings_inner(
    kc: &KubeletConfig,
    qc: &QosletConfiguration,
    capacity: Capacity,
) -> Result<NodeSettings, FieldError> {
    let mut s = NodeSettings::defaults(capacity);
    s.system_reserved = reservation("systemReserved", kc.system_reserved.as_ref())?;
    s.kube_reserved = reservation("kubeReserved", kc.kube_reserved.as_ref())?;
    s.enforcement = enforcement(kc)?;
    s.system_reserved_cgroup = kc.system_reserved_cgroup.clone().unwrap_or_default();
    s.kube_reserved_cgroup = kc.kube_reserved_cgroup.clone().unwrap_or_default();
    s.cgroups_per_qos = kc.cgroups_per_qos.unwrap_or(true);
    if !s.cgroups_per_qos && s.enforcement.pods {
        return Err(field_err(
            "enforceNodeAllocatable",
            "pods",
            "invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) is not supported unless cgroupsPerQOS (--cgroups-per-qos) feature is turned on",
        ));
    }
    let (hard, soft) = parse_thresholds(&EvictionInput {
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
    })?;
    s.hard_eviction = hard;
    s.soft_eviction = soft;
    if let Some(p) = &kc.eviction_pressure_transition_period {
        s.eviction_pressure_transition_secs =
            parse_duration(p).map_err(|e| field_err("evictionPressureTransitionPeriod", p, e))?;
    }
    if let Some(text) = kc
        .reserved_system_cpus
        .as_deref()
        .filter(|t| !t.trim().is_empty())
    {
        let set: CpuSet = text.parse().map_err(|e| {
            field_err("reservedSystemCPUs", text, format!("invalid configuration: unable to parse reservedSystemCPUs (--reserved-cpus), error: {e}"))
        })?;
        s.reserved_system_cpus = Some(set);
    }
    s.reserved_cpus_conflict = qc.reserved_cpus_conflict;
    s.cgroup_driver = match kc.cgroup_driver.as_deref() {
        None | Some("cgroupfs") => CgroupDriver::Cgroupfs,
        Some("systemd") => CgroupDriver::Systemd,
        Some(other) => {
            return Err(field_err(
                "cgroupDriver",
                other,
                "expected cgroupfs or systemd",
            ));
        }
    };
    s.cgroup_root = kc
        .cgroup_root
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "/".into());
    s.cpu_cfs_quota = kc.cpu_cfs_quota.unwrap_or(true);
    if let Some(p) = &kc.cpu_cfs_quota_period {
        let ns = parse_duration_nanos(p).map_err(|e| field_err("cpuCFSQuotaPeriod", p, e))?;
        let us = (ns / 1000) as u64;
        if !(1000..=1_000_000).contains(&us) {
            return Err(field_err(
                "cpuCFSQuotaPeriod",
                p,
                "must be between 1ms and 1s",
            ));
        }
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
            })?;
        s.qos_reserved_memory_pct = Some(pct);
    }
    let version = qc.kubernetes_version();
    s.kubernetes_version = version;
    if kc.memory_reservation_policy.is_some() && !version.has_memory_reservation_policy() {
        return Err(field_err(
            "memoryReservationPolicy",
            kc.memory_reservation_policy.as_deref().unwrap_or_default(),
            format!("not a field of the Kubernetes {version} KubeletConfiguration (added in 1.36)"),
        ));
    }
    // MemoryQoS is alpha (off) up to 1.36 and beta (on) from 1.37.
    if kc.gate("MemoryQoS").unwrap_or(version.memory_qos_default()) {
        let factor = match kc.memory_throttling_factor {
            Some(f) if !(f > 0.0 && f <= 1.0) => {
                return Err(field_err(
                    "memoryThrottlingFactor",
                    &f.to_string(),
                    "must be greater than 0 and less than or equal to 1.0",
                ));
            }
            Some(f) => Some((f * 1_000_000.0).round() as u32),
            None => version.default_throttling_factor_ppm(),
        };
        let policy = match kc.memory_reservation_policy.as_deref() {
            None | Some("None" | "") => MemoryReservationPolicy::None,
            Some("TieredReservation") => MemoryReservationPolicy::TieredReservation,
            Some(other) => {
                return Err(field_err(
                    "memoryReservationPolicy",
                    other,
                    "expected None or TieredReservation",
                ));
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
    Ok(s)
}

#[cfg(test)]
mod tests;
