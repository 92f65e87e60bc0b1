//! qoslet's own file (kind `QosletConfiguration`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Deserializer, Serialize};

use crate::{
    cgroup::Mode,
    policy::{
        cpu::WeightFormula, cpu_pressure::CpuPressureConfig, duration::parse_duration_nanos,
        quantity::Quantity, settings::ReservedCpusConflict, version::KubeVersion,
    },
    sensors::SensorSwitches,
    source::{
        fields::{shown, unknown_fields},
        file::DEFAULT_MAX_BYTES,
        manifest::field_path,
        nesting::check_nesting,
    },
};

use super::{
    ConfigError, MAX_CONFIG_ERRORS, QOSLET_API_VERSION, decode_as_text, read, remove_key,
    without_location,
};

/// eBPF on/off, globally and per sensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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

impl From<&EbpfConfig> for crate::sensors::SensorsConfig {
    /// The defaults with the configuration's `ebpf` settings, whose sensor names
    /// `QosletConfiguration::parse` checked when the file was loaded.
    fn from(ebpf: &EbpfConfig) -> Self {
        Self {
            ebpf: ebpf.enabled,
            switches: SensorSwitches::from_checked(&ebpf.sensors),
            kernel_diagnostics: ebpf.kernel_diagnostics,
            ..Self::default()
        }
    }
}

/// Node capacity given instead of read from the machine; absent entries are read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityOverride {
    pub(crate) cpu: Option<String>,
    pub(crate) memory: Option<String>,
    pub(crate) pids: Option<i64>,
}

/// qoslet's own file (kind `QosletConfiguration`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QosletConfiguration {
    #[serde(default = "qoslet_api_version")]
    pub api_version: String,
    #[serde(default = "qoslet_kind")]
    pub kind: String,
    #[serde(default)]
    pub mode: Mode,
    /// `/metrics`, `/healthz`, `/readyz`, `/stats/summary`, `/status`. Unset: `[::]:9479`
    /// (every address, IPv4 and IPv6; `0.0.0.0:9479` where the node has no IPv6) when the
    /// endpoints are authorized ([`Self::endpoint_auth`], cluster mode's default), else loopback,
    /// `127.0.0.1:9479` ([`Self::listen_address`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_address: Option<String>,
    /// Who may read `/metrics` and `/stats/summary`: `tokenReview` (the bearer token is
    /// authenticated by a TokenReview and the request authorized by a SubjectAccessReview, as
    /// kube-rbac-proxy does) or `none` (anyone who reaches the address). Unset: `tokenReview` in
    /// cluster mode, `none` in standalone mode, which has no API server to ask (and so
    /// `tokenReview` is an error there). `/healthz` and `/readyz` are always open (the
    /// kubelet's probes carry no token); `/status` is open to loopback (`qoslet status` on the
    /// node) and, from any other address, guarded as `/metrics` is (the URL `/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_auth: Option<EndpointAuth>,
    #[serde(default)]
    pub ebpf: EbpfConfig,
    /// cpu.weight formula for kubepods, QoS and pod cgroups.
    #[serde(default)]
    pub weight_formula: WeightFormula,
    /// cpu.weight formula for container cgroups (the runtime's).
    #[serde(default = "default_container_weight_formula")]
    pub container_weight_formula: WeightFormula,
    /// Deprecated spelling of [`Self::gang_eviction`]: `false` is `gangEviction: none`. Read,
    /// warned about and folded into `gang_eviction` by [`Self::parse`]; never written.
    #[serde(default, rename = "gangAwareEviction", skip_serializing)]
    pub deprecated_gang_aware_eviction: Option<bool>,
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
    /// eviction manager ranks on the usage less the `inactive_file` read here (held at most twice
    /// this long) and reads `memory.stat` only for the pods its decision turns on.
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
    /// The Kubernetes version whose kubelet rules qoslet follows (`1.34` to `1.37`). Unset: in
    /// cluster mode the Node's `status.nodeInfo.kubeletVersion` (clamped to 1.34..=1.37, with a
    /// warning), in standalone mode 1.37, the API version qoslet speaks. Set, it wins over the
    /// node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// Cluster mode: what qoslet writes beside the kubelet (nothing by default: it compares
    /// the kubelet's cgroups and reports drift). Ignored by the standalone node, which writes all.
    #[serde(default)]
    pub enforce: Vec<EnforceArea>,
    /// How eviction treats gangs: `none` breaks them (pods are ranked alone, as the kubelet
    /// does); `node` (the default) evicts whole gangs, or spares surplus members, with a
    /// `disruptionMode: all` unit's members on this node; `unit` (cluster mode) also evicts its
    /// members on other nodes, through the Eviction API.
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

/// `endpointAuth`: how `/metrics` and `/stats/summary` are guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EndpointAuth {
    /// A bearer token, authenticated by a TokenReview and authorized by a SubjectAccessReview.
    TokenReview,
    /// Open to anyone who reaches the address.
    None,
}

/// The port qoslet serves on unless `metricsAddress` says otherwise.
pub(crate) const DEFAULT_PORT: u16 = 9479;

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
    pub(crate) fn area(self) -> crate::cgroup::desired::Area {
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
#[serde(rename_all = "camelCase")]
pub struct CpuPressureConfiguration {
    /// Unset: on where qoslet runs the pods and owns the BestEffort tier (standalone), off where
    /// the tier is the kubelet's (cluster), so writing it there is opt-in.
    #[serde(default)]
    pub(crate) enabled: Option<bool>,
    /// Go duration; the protected pods' run-queue latency p99 over a housekeeping window above
    /// which the tier is constrained.
    #[serde(
        default = "default_latency_target",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub(crate) latency_target: Duration,
    /// Protect Burstable pods too (Guaranteed pods always are).
    #[serde(default)]
    pub(crate) protect_burstable: bool,
    /// The node's CPU PSI `some` percentage of a window above which the tier is constrained;
    /// unset: PSI is not a trigger (it counts BestEffort's own waiting too).
    #[serde(default)]
    pub(crate) psi_some_target_percent: Option<f64>,
    /// Calm windows in a row before one level is released.
    #[serde(default = "default_calm_windows")]
    pub(crate) calm_windows: u32,
    /// The most calm windows a release needs after pressure came back soon after a release.
    #[serde(default = "default_max_calm_windows")]
    pub(crate) max_calm_windows: u32,
    /// The CPUs the tier keeps at level 2 (by cpuset) and its cap at level 3, percent of the
    /// node's CPU.
    #[serde(default = "default_cap_percent")]
    pub(crate) cap_percent: u32,
    /// The cap at level 4, percent of the node's CPU: BestEffort never gets less.
    #[serde(default = "default_floor_percent")]
    pub(crate) floor_percent: u32,
    /// Windows with fewer protected wake-ups than this do not count as pressure.
    #[serde(default = "default_min_wakeups")]
    pub(crate) min_wakeups: u64,
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

/// `gangEviction`: whether eviction is gang-aware, and how far a `disruptionMode: all` gang is
/// evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GangEviction {
    /// Gangs are not considered: each pod is ranked and evicted alone (the kubelet's order).
    /// Not `off`, which YAML 1.1 readers (Helm, kubectl) turn into a boolean.
    None,
    /// Gang-aware, the unit's pods on this node.
    #[default]
    Node,
    /// The whole unit: members on other nodes through the Eviction API.
    Unit,
}

/// How a pod is evicted in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictionMethod {
    /// The pod ends as the kubelet's evictions end, in an order that never shows a pod Failed
    /// while its code runs: the pod's cgroup frozen, `pods/status` phase Failed, reason Evicted,
    /// then the kill, with no grace (`cluster/action.rs`). The kubelet gives 2 s (SIGTERM, then
    /// SIGKILL); a frozen process cannot run a SIGTERM handler, and the node cannot wait.
    /// PodDisruptionBudgets are not consulted and the pod object is never deleted.
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
    pub(crate) fn policy(&self) -> Result<CpuPressureConfig, (&'static str, String)> {
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

/// The error of a document that neither decodes nor has an error to say why: it cannot happen
/// (`decode_all` notes an error whenever it gives no configuration), but is an error, not a
/// panic.
fn unreachable_decode(file: &Path) -> ConfigError {
    ConfigError::Invalid {
        file: file.into(),
        kind: "QosletConfiguration",
        field: String::new(),
        message: "does not decode".into(),
        line: None,
    }
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
            metrics_address: None,
            endpoint_auth: None,
            ebpf: EbpfConfig::default(),
            weight_formula: WeightFormula::KubeletLinear,
            container_weight_formula: default_container_weight_formula(),
            deprecated_gang_aware_eviction: None,
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

impl QosletConfiguration {
    /// `endpointAuth` for a node that has an API server to ask (`cluster`) or not.
    pub(crate) fn endpoint_auth(&self, cluster: bool) -> Result<EndpointAuth, String> {
        match (self.endpoint_auth, cluster) {
            (Some(EndpointAuth::TokenReview), false) => Err(
                "tokenReview needs an API server: standalone mode has none (use none, and keep metricsAddress on loopback)".into(),
            ),
            (Some(auth), _) => Ok(auth),
            (None, true) => Ok(EndpointAuth::TokenReview),
            (None, false) => Ok(EndpointAuth::None),
        }
    }

    /// Where to listen: `metricsAddress`, or by default every address when the endpoints are
    /// authorized and loopback when they are open.
    pub(crate) fn listen_address(
        &self,
        auth: EndpointAuth,
    ) -> Result<std::net::SocketAddr, std::net::AddrParseError> {
        match &self.metrics_address {
            Some(a) => a.parse(),
            None if auth == EndpointAuth::TokenReview => Ok(std::net::SocketAddr::from((
                std::net::Ipv6Addr::UNSPECIFIED,
                DEFAULT_PORT,
            ))),
            None => Ok(std::net::SocketAddr::from((
                std::net::Ipv4Addr::LOCALHOST,
                DEFAULT_PORT,
            ))),
        }
    }

    pub(crate) fn load(file: &Path) -> Result<Self, ConfigError> {
        Self::parse(file, &read(file)?)
    }

    /// The values `run` and `plan` read from the file beyond its schema (for `qoslet validate`):
    /// the metrics address, the node root cgroup and the capacity quantities. Every one that is
    /// wrong is reported.
    pub fn check(&self, file: &Path) -> Result<(), ConfigError> {
        let invalid = |field: &str, value: &str, message: String| ConfigError::Invalid {
            file: file.into(),
            kind: "QosletConfiguration",
            field: field.into(),
            message: format!("{value:?}: {message}"),
            line: None,
        };
        let mut errors = Vec::new();
        if let Some(addr) = &self.metrics_address
            && let Err(e) = addr.parse::<std::net::SocketAddr>()
        {
            errors.push(invalid("metricsAddress", addr, e.to_string()));
        }
        if let Some(root) = &self.node_root_cgroup
            && let Err(e) = crate::cgroup::CgroupPath::parse(root)
        {
            errors.push(invalid("nodeRootCgroup", root, e.to_string()));
        }
        for (field, v) in [
            ("capacity.cpu", &self.capacity.cpu),
            ("capacity.memory", &self.capacity.memory),
        ] {
            if let Some(v) = v {
                match v.parse::<Quantity>() {
                    Err(e) => errors.push(invalid(field, v, e.to_string())),
                    Ok(q) if q.signum() < 0 => errors.push(invalid(
                        field,
                        v,
                        "must be greater than or equal to 0".into(),
                    )),
                    Ok(_) => {}
                }
            }
        }
        ConfigError::all(errors)
    }

    /// Reads the file's text: every problem of it (each with its field and line), not only the
    /// first.
    pub fn parse(file: &Path, text: &str) -> Result<Self, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            file: file.into(),
            kind: "QosletConfiguration",
            field: String::new(),
            message,
            line: None,
        };
        check_nesting(text).map_err(|e| invalid(e.to_string()))?;
        let value: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let (qc, errors) = Self::decode_all(file, value, Some(text));
        ConfigError::all(errors).map_err(|e| e.with_lines(text))?;
        qc.ok_or_else(|| unreachable_decode(file))
    }

    /// Every problem of a loaded document, those of [`Self::check`] too (for `qoslet
    /// validate`): a value that does not decode is left out of the rest of the checks.
    pub(crate) fn problems(file: &Path, value: serde_yaml_ng::Value) -> Vec<ConfigError> {
        let (qc, mut errors) = Self::decode_all(file, value, None);
        if let Some(Err(e)) = qc.map(|qc| qc.check(file)) {
            errors.extend(e.into_list());
        }
        errors
    }

    /// The configuration in a loaded document, with every problem of it: each field that does
    /// not decode (its key is then left out and the rest decoded again, up to
    /// [`MAX_CONFIG_ERRORS`]), each unknown field (with "did you mean" where a field is close:
    /// `source::fields`), and each value out of bounds. `text`, the document's own text when
    /// there is one, is decoded first, so that its scalars are read as written (`kubernetesVersion: 1.30` is `"1.30"`,
    /// which the loaded value holds as the number 1.3).
    /// The configuration (when it decodes, with the failing values left out) and every problem.
    fn decode_all(
        file: &Path,
        mut value: serde_yaml_ng::Value,
        text: Option<&str>,
    ) -> (Option<Self>, Vec<ConfigError>) {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            file: file.into(),
            kind: "QosletConfiguration",
            field: field.into(),
            message,
            line: None,
        };
        let mut errors = Vec::new();
        let mut decoded = None;
        while errors.len() < MAX_CONFIG_ERRORS {
            let attempt = match text {
                Some(t) if errors.is_empty() => {
                    serde_path_to_error::deserialize(serde_yaml_ng::Deserializer::from_str(t))
                }
                _ => decode_as_text::<Self>(&value),
            };
            match attempt {
                Ok(qc) => {
                    decoded = Some(qc);
                    break;
                }
                Err(e) => {
                    let field = field_path(e.path());
                    let message = without_location(e.inner(), &field);
                    errors.push(invalid(&field, message));
                    if !remove_key(&mut value, e.path()) {
                        break;
                    }
                }
            }
        }
        let (unknown, more) = unknown_fields::<Self>(&value, MAX_CONFIG_ERRORS);
        for f in &unknown {
            errors.push(ConfigError::UnknownField {
                file: file.into(),
                kind: "QosletConfiguration",
                message: f.message(),
                field: f.path.clone(),
                line: None,
            });
        }
        if more > 0 {
            errors.push(invalid("", format!("and {more} more unknown fields")));
        }
        let Some(mut qc) = decoded else {
            // Past MAX_CONFIG_ERRORS, or an error at the document itself (not a mapping).
            return (None, errors);
        };
        if qc.kind != "QosletConfiguration" {
            errors.push(invalid(
                "kind",
                format!("expected QosletConfiguration, got {:?}", shown(&qc.kind)),
            ));
        }
        if qc.api_version != QOSLET_API_VERSION {
            errors.push(invalid(
                "apiVersion",
                format!(
                    "expected {QOSLET_API_VERSION}, got {:?}",
                    shown(&qc.api_version)
                ),
            ));
        }
        if let Some(v) = &qc.kubernetes_version
            && let Err(e) = v.parse::<KubeVersion>()
        {
            errors.push(invalid("kubernetesVersion", format!("{v:?}: {e}")));
        }
        if let Err(e) = SensorSwitches::new(&qc.ebpf.sensors) {
            errors.push(invalid("ebpf.sensors", e.to_string()));
        }
        if let Err((field, message)) = qc.cpu_pressure.policy() {
            errors.push(invalid(&format!("cpuPressure.{field}"), message));
        }
        if let Some(aware) = qc.deprecated_gang_aware_eviction.take() {
            tracing::warn!(file = %file.display(), "gangAwareEviction is deprecated: write gangEviction (none, node or unit) instead.");
            if !aware {
                if qc.gang_eviction == GangEviction::Unit {
                    errors.push(invalid(
                        "gangAwareEviction",
                        "false contradicts gangEviction: unit".into(),
                    ));
                }
                qc.gang_eviction = GangEviction::None;
            }
        }
        (Some(qc), errors)
    }

    /// `kubernetesVersion`, or 1.37 when unset (checked by [`Self::parse`]).
    pub(crate) fn kubernetes_version(&self) -> KubeVersion {
        self.kubernetes_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }
}
