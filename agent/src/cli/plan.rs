//! `qoslet plan`: the desired node and pod cgroup state for the pods in PATH, touching nothing.
//! Exit 0 on success, 1 on bad input (one line per problem, `file: Kind/namespace/name: field:
//! message`), 2 when a file cannot be read.

use std::{collections::BTreeMap, fmt::Write as _, fs, path::PathBuf, process::ExitCode};

use crate::{
    config::{CapacityOverride, ConfigError, KubeletConfig, QosletConfiguration, node_settings},
    exit,
    hub::Summary,
    policy::{
        allocatable::AllocatableError,
        cpuset::CpuSet,
        eviction::memory_eviction_order,
        plan::{CgroupPlan, Plan, plan_node},
        pod::PodSpecView,
        quantity::Quantity,
        settings::{Capacity, CgroupDriver},
    },
    source::{
        admit::{Admitted, UnknownFields, admit, unique_uids},
        fields::shown,
        manifest::{Loaded, RawObject, load_paths},
    },
    workload::{Problem, problem::Rule},
};

/// Kinds other commands read; `plan` skips them without complaint.
const SKIPPED_KINDS: &[&str] = &[
    "KubeletConfiguration",
    "QosletConfiguration",
    "Workload",
    "PodGroup",
    "CompositePodGroup",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub(crate) struct PlanArgs {
    /// The node's KubeletConfiguration (kubelet.config.k8s.io/v1beta1).
    #[arg(long, value_name = "FILE")]
    pub(crate) kubelet_config: PathBuf,
    /// qoslet's own QosletConfiguration.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Node capacity, e.g. `cpu=4,memory=32Gi,pids=4194304` (optionally `cpus=0-3`); the machine
    /// is not consulted then.
    #[arg(long, value_name = "SPEC")]
    pub(crate) capacity: Option<String>,
    /// Overrides the KubeletConfiguration's cgroupDriver.
    #[arg(long, value_enum)]
    pub(crate) cgroup_driver: Option<Driver>,
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) output: Output,
    /// A running agent (e.g. `http://127.0.0.1:9479`) whose /stats/summary gives the pods'
    /// working sets: the plan then ranks the pods for memory-pressure eviction, with the reason
    /// for each rank.
    #[arg(long, value_name = "URL")]
    pub(crate) usage_from: Option<String>,
    /// The largest manifest file read, in bytes [default: the QosletConfiguration's
    /// maxManifestBytes, else 4194304 (4 MiB)]. FIFOs and devices are refused.
    #[arg(long, value_name = "BYTES")]
    pub(crate) max_manifest_bytes: Option<u64>,
    /// Files or directories of Pod manifests (multi-document YAML allowed).
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Driver {
    Cgroupfs,
    Systemd,
}

/// A failure with its exit status and the lines to print.
pub(super) struct Failure {
    pub(super) status: u8,
    pub(super) lines: Vec<String>,
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        let status = if matches!(e, ConfigError::Unreadable { .. }) {
            2
        } else {
            1
        };
        let lines = e
            .into_list()
            .into_iter()
            .map(|e| {
                let mut line = e.to_string();
                if let ConfigError::Unreadable { source, .. } = &e {
                    let _ = write!(line, ": {source}");
                }
                line
            })
            .collect();
        Failure { status, lines }
    }
}

pub(crate) fn run(args: PlanArgs) -> ExitCode {
    match plan(&args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(f) => {
            for line in f.lines {
                eprintln!("{line}");
            }
            ExitCode::from(f.status)
        }
    }
}

fn plan(args: &PlanArgs) -> Result<String, Failure> {
    let plan = build_plan(args)?;
    Ok(match args.output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(&plan).map_err(|e| Failure {
                status: exit::PROBLEMS,
                lines: vec![format!("cannot encode the plan: {e}")],
            })?;
            s.push('\n');
            s
        }
        Output::Table => table(&plan),
    })
}

/// The desired state for the arguments' node and pods (shared with `qoslet run`).
pub(super) fn build_plan(args: &PlanArgs) -> Result<Plan, Failure> {
    let kc = KubeletConfig::load(&args.kubelet_config)?;
    if let Some(note) = kc.ignored_note() {
        eprintln!("note: {}: {note}", args.kubelet_config.display());
    }
    let qc = match &args.config {
        Some(f) => QosletConfiguration::load(f)?,
        None => QosletConfiguration::default(),
    };
    let capacity = match &args.capacity {
        Some(spec) => parse_capacity(spec).map_err(|m| Failure {
            status: exit::PROBLEMS,
            lines: vec![format!("--capacity: {m}")],
        })?,
        None => machine_capacity(&qc.capacity).map_err(|m| Failure {
            status: exit::UNREADABLE,
            lines: vec![m],
        })?,
    };
    let mut settings = node_settings(&args.kubelet_config, &kc, &qc, capacity)?;
    if args.capacity.is_none() {
        settings.hugepage_sizes = host_hugepage_sizes();
    }
    if let Some(d) = args.cgroup_driver {
        settings.cgroup_driver = match d {
            Driver::Cgroupfs => CgroupDriver::Cgroupfs,
            Driver::Systemd => CgroupDriver::Systemd,
        };
    }
    let max_bytes = args.max_manifest_bytes.unwrap_or(qc.max_manifest_bytes);
    let loaded = load_paths(&args.paths, max_bytes).map_err(|e| Failure {
        status: exit::UNREADABLE,
        lines: vec![format!("{e}: {}", e.source)],
    })?;
    let mut lines: Vec<String> = loaded.malformed.iter().map(ToString::to_string).collect();
    let mut admitted = Vec::new();
    let mut problems = Vec::new();
    // Unknown fields are dropped, as the API server drops them, with a warning each.
    let UnknownFields {
        found: mut warnings,
        more,
    } = UnknownFields::of(&loaded.objects);
    for o in &loaded.objects {
        match pod_view(o) {
            Ok(Some(a)) => admitted.push(a),
            Ok(None) => {}
            Err(more) => problems.extend(more),
        }
    }
    problems.extend(unique_uids(&mut admitted, &BTreeMap::new()));
    {
        let mut all: Vec<&mut Problem> = problems.iter_mut().chain(warnings.iter_mut()).collect();
        Loaded::locate(&loaded.texts, &mut all);
    }
    warnings.sort();
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    for (file, n) in more {
        eprintln!("warning: {}", UnknownFields::more_line(&file, n));
    }
    lines.extend(problems.iter().map(plan_line));
    if !lines.is_empty() {
        return Err(Failure {
            status: exit::PROBLEMS,
            lines,
        });
    }
    let pods: Vec<PodSpecView> = admitted
        .into_iter()
        .filter_map(|a| a.pod.map(|p| p.view))
        .collect();
    let usage = match &args.usage_from {
        Some(url) => Some(pod_usage(url).map_err(|m| Failure {
            status: exit::PROBLEMS,
            lines: vec![format!("--usage-from: {m}")],
        })?),
        None => None,
    };
    let mut plan = plan_node(&settings, &pods).map_err(|e| {
        let field = match e {
            AllocatableError::ReservationAboveCapacity { .. } => "systemReserved",
            _ => "reservedSystemCPUs",
        };
        Failure {
            status: exit::PROBLEMS,
            lines: vec![format!(
                "{}: KubeletConfiguration: {field}: {e}",
                args.kubelet_config.display()
            )],
        }
    })?;
    if let Some(usage) = usage {
        plan.eviction_order = memory_eviction_order(&pods, |p| usage.get(&p.uid).copied());
    }
    Ok(plan)
}

/// Working set by pod UID from a running agent's /stats/summary.
fn pod_usage(url: &str) -> Result<BTreeMap<String, i64>, String> {
    let (addr, path) = super::http::parse_url(url, "/stats/summary")?;
    let summary: Summary = super::http::get_json(addr, &path).map_err(|e| format!("{url}: {e}"))?;
    Ok(summary
        .pods
        .iter()
        .filter_map(|p| {
            let ws = p.memory.as_ref()?.working_set_bytes?;
            Some((p.pod_ref.uid.clone(), i64::try_from(ws).ok()?))
        })
        .collect())
}

/// An admitted Pod, `None` for kinds plan skips, or its problems. Pods pass the same admission
/// as in `validate` and `run` (crate::source::admit), which names the field of a value that
/// does not decode.
fn pod_view(o: &RawObject) -> Result<Option<Admitted>, Vec<Problem>> {
    if SKIPPED_KINDS.contains(&o.kind.as_str()) {
        return Ok(None);
    }
    if o.kind != "Pod" || o.api_version != "v1" {
        let message = format!(
            "unknown kind {:?} ({}): qoslet plan reads v1 Pods",
            shown(&o.kind),
            shown(&o.api_version)
        );
        let p = Problem::new(
            &o.origin(),
            o.display_id().to_string(),
            Rule::KindKnown,
            message,
        );
        return Err(vec![p.at("kind")]);
    }
    admit(o).map(Some)
}

/// A problem as plan prints it, `file:line: Kind/namespace/name: field: message` (the rule's
/// message starts with its field).
fn plan_line(p: &Problem) -> String {
    let line = p.line.map(|l| format!(":{l}")).unwrap_or_default();
    format!("{}{line}: {}: {}", p.origin.file.display(), p.id, p.message)
}

/// `cpu=4,memory=32Gi,pids=4194304[,cpus=0-3]`; cpu and memory are required.
pub(super) fn parse_capacity(spec: &str) -> Result<Capacity, String> {
    let (mut cpu, mut memory, mut pids, mut cpus) = (None, None, 4_194_304, None);
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected key=value"))?;
        let q = || v.parse::<Quantity>().map_err(|e| format!("{k}: {e}"));
        match k {
            "cpu" => cpu = Some(q()?.milli_value()),
            "memory" => memory = Some(q()?.value()),
            "pids" => pids = q()?.value(),
            "cpus" => cpus = Some(v.parse::<CpuSet>().map_err(|e| format!("{k}: {e}"))?),
            _ => return Err(format!("{k:?}: unknown resource (cpu, memory, pids, cpus)")),
        }
    }
    let cpu_millis = cpu.ok_or("cpu: missing")?;
    let memory_bytes = memory.ok_or("memory: missing")?;
    if cpu_millis <= 0 || memory_bytes <= 0 || pids <= 0 {
        return Err("capacity must be positive".into());
    }
    let cpus = cpus.unwrap_or_else(|| CpuSet::first(((cpu_millis + 999) / 1000) as u32));
    Ok(Capacity {
        cpu_millis,
        memory_bytes,
        pids,
        cpus,
    })
}

/// The machine's capacity as the kubelet (cadvisor) sees it: online CPUs, MemTotal, the lower of
/// pid_max and threads-max; entries of the qoslet config's `capacity` win.
pub(crate) fn machine_capacity(over: &CapacityOverride) -> Result<Capacity, String> {
    let read =
        |path: &str| fs::read_to_string(path).map_err(|e| format!("{path}: cannot read: {e}"));
    let cpus: CpuSet = read("/sys/devices/system/cpu/online")?
        .trim()
        .parse()
        .map_err(|e| format!("/sys/devices/system/cpu/online: {e}"))?;
    let mut cpu_millis = cpus.len() as i64 * 1000;
    let meminfo = read("/proc/meminfo")?;
    let mut memory_bytes = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map(|kb| kb * 1024)
        .ok_or("/proc/meminfo: no MemTotal")?;
    let mut pids = crate::eviction::signals::task_max().map_err(|e| e.to_string())?;
    let q = |field: &str, v: &str| {
        v.parse::<Quantity>()
            .map_err(|e| format!("capacity.{field}: {e}"))
    };
    if let Some(v) = &over.cpu {
        cpu_millis = q("cpu", v)?.milli_value();
    }
    if let Some(v) = &over.memory {
        memory_bytes = q("memory", v)?.value();
    }
    if let Some(v) = over.pids {
        pids = v;
    }
    Ok(Capacity {
        cpu_millis,
        memory_bytes,
        pids,
        cpus,
    })
}

/// The host's hugepage sizes: `/sys/kernel/mm/hugepages/hugepages-<n>kB` (libcontainer's
/// `HugePageSizes`); none when the directory is missing.
fn host_hugepage_sizes() -> Vec<i64> {
    let Ok(dir) = fs::read_dir("/sys/kernel/mm/hugepages") else {
        return Vec::new();
    };
    let mut sizes: Vec<i64> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kb: i64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some(kb * 1024)
        })
        .collect();
    sizes.sort_unstable();
    sizes
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn table(plan: &Plan) -> String {
    let n = &plan.node;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Following the kubelet of Kubernetes {}.\n",
        n.kubernetes_version
    );
    let _ = writeln!(out, "NODE         CPU(m)  MEMORY(bytes)  PIDS");
    for (label, t) in [("capacity", &n.capacity), ("allocatable", &n.allocatable)] {
        let _ = writeln!(
            out,
            "{label:<12} {:>6}  {:>13}  {}",
            t.cpu_millis, t.memory_bytes, t.pids
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<16} {:<52} {:>7} {:>6} {:>12} {:>12} {:>12} {:>8} CPUSET",
        "TIER", "CGROUP", "SHARES", "WEIGHT", "MEMORY.MAX", "MEMORY.MIN", "MEMORY.LOW", "PIDS"
    );
    let tiers: [(&str, &CgroupPlan); 5] = [
        ("kubepods", &n.kubepods),
        ("burstable", &n.burstable),
        ("besteffort", &n.besteffort),
        ("system-reserved", &n.system_reserved),
        ("kube-reserved", &n.kube_reserved),
    ];
    for (label, c) in tiers {
        let _ = writeln!(
            out,
            "{label:<16} {:<52} {:>7} {:>6} {:>12} {:>12} {:>12} {:>8} {}",
            opt(c.cgroup.clone()),
            opt(c.cpu_shares),
            opt(c.cpu_weight),
            opt(c.memory_limit_bytes),
            opt(c.memory_min_bytes),
            opt(c.memory_low_bytes),
            opt(c.pids_max),
            opt(c.cpuset.clone()),
        );
    }
    for t in &n.eviction.hard {
        let _ = writeln!(
            out,
            "eviction hard    {} < {}",
            t.signal,
            threshold_text(&t.value)
        );
    }
    for t in &n.eviction.soft {
        let _ = writeln!(
            out,
            "eviction soft    {} < {} for {}s",
            t.signal,
            threshold_text(&t.value),
            t.grace_period_secs
        );
    }
    for w in &n.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    for p in &plan.pods {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "POD {}/{} uid={} qos={}",
            p.namespace,
            p.name,
            p.uid,
            p.qos_class.as_str()
        );
        let _ = writeln!(
            out,
            "  cgroup {}  shares={} weight={} quota={} period={} memory.max={} memory.min={} memory.low={} memory.high={} pids.max={}",
            opt(p.cgroup.clone()),
            opt(p.cpu_shares),
            opt(p.cpu_weight),
            opt(p.cpu_quota_us),
            opt(p.cpu_period_us),
            opt(p.memory_limit_bytes),
            opt(p.memory_min_bytes),
            opt(p.memory_low_bytes),
            opt(p.memory_high_bytes),
            opt(p.pids_max),
        );
        let _ = writeln!(
            out,
            "  {:<24} {:<8} {:>9} {:>7} {:>6} {:>8} {:>12} {:>12} OOM.GROUP",
            "CONTAINER",
            "KIND",
            "OOM_ADJ",
            "SHARES",
            "WEIGHT",
            "QUOTA",
            "MEMORY.MAX",
            "MEMORY.HIGH"
        );
        for c in &p.containers {
            let kind = serde_json::to_value(c.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<24} {:<8} {:>9} {:>7} {:>6} {:>8} {:>12} {:>12} {}",
                c.name,
                kind,
                c.oom_score_adj,
                c.cpu_shares,
                c.cpu_weight,
                opt(c.cpu_quota_us),
                opt(c.memory_limit_bytes),
                opt(c.memory_high_bytes),
                opt(c.memory_oom_group.map(u8::from)),
            );
        }
    }
    if !plan.eviction_order.is_empty() {
        let _ = writeln!(out, "\nEVICTION ORDER (memory pressure)");
        for e in &plan.eviction_order {
            let _ = writeln!(
                out,
                "  {:>4}  {}/{}  {}",
                opt(e.rank),
                e.namespace,
                e.name,
                e.reason
            );
        }
    }
    out
}

fn threshold_text(v: &crate::policy::eviction::ThresholdValue) -> String {
    match v {
        crate::policy::eviction::ThresholdValue::Quantity(q) => q.canonical(),
        crate::policy::eviction::ThresholdValue::Percentage(p) => {
            // Shown as typed: the f32 fraction carries float noise (15% is 0.15000001).
            let pct = format!("{:.4}", f64::from(*p) * 100.0);
            format!("{}%", pct.trim_end_matches('0').trim_end_matches('.'))
        }
    }
}
