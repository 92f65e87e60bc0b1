//! `qoslet run`: the daemon.
//!
//! What runs today: the node plan for the pods in `--standalone DIR` (logged), and the eBPF OOM
//! sensors (victims, memcg events and pressure logged as they happen). Cgroup writes, the process runtime
//! and eviction are not built yet, so the agent runs in observe mode only and says so; the
//! cluster mode (`--kube`) needs an API server and is not built either.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc};

use tracing::{info, warn};

use super::{
    EXIT_CONFIG,
    plan::{Output, PlanArgs, build_plan},
};
use crate::{
    config::{Mode, QosletConfiguration},
    policy::plan::Plan,
    sensors::{SensorEvent, SensorMode, Sensors, SensorsConfig},
    server::{
        self, AgentState, Metrics, Readiness, StatusStore, Summary, SummarySource,
        metrics::{MemcgEventLabels, SensorLabels},
        status::{EventRow, PodRow},
    },
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The node's KubeletConfiguration (kubelet.config.k8s.io/v1beta1).
    #[arg(long, value_name = "FILE")]
    pub kubelet_config: PathBuf,
    /// qoslet's own QosletConfiguration.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Standalone node: pods come from the manifests in DIR.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "kube",
        conflicts_with = "kube"
    )]
    pub standalone: Option<PathBuf>,
    /// Cluster mode: pods come from the Kubernetes API.
    #[arg(long)]
    pub kube: bool,
    /// Compute and report everything, write nothing, evict nobody.
    #[arg(long)]
    pub observe: bool,
}

pub fn run(args: RunArgs) -> ExitCode {
    let Some(dir) = args.standalone.clone() else {
        eprintln!(
            "qoslet run --kube is not built yet (it needs the cluster source); use --standalone DIR."
        );
        return ExitCode::from(EXIT_CONFIG);
    };
    let qc = match &args.config {
        Some(f) => match QosletConfiguration::load(f) {
            Ok(qc) => qc,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        None => QosletConfiguration::default(),
    };
    if !args.observe && qc.mode != Mode::Observe {
        eprintln!(
            "qoslet cannot enforce yet (cgroup writes, the process runtime and eviction are not built); run with --observe."
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let plan_args = PlanArgs {
        kubelet_config: args.kubelet_config.clone(),
        config: args.config.clone(),
        capacity: None,
        cgroup_driver: None,
        output: Output::Table,
        paths: vec![dir],
    };
    let plan = match build_plan(&plan_args) {
        Ok(p) => p,
        Err(f) => {
            for l in f.lines {
                eprintln!("{l}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    log_plan(&plan);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("qoslet could not start its runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr: SocketAddr = match qc.metrics_address.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "{}: QosletConfiguration: metricsAddress: {:?} is not an address:port: {e}",
                args.config
                    .as_ref()
                    .map_or("(default)".into(), |p| p.display().to_string()),
                qc.metrics_address
            );
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let state = Arc::new(AgentState {
        metrics: Metrics::new(),
        readiness: Readiness::default(),
        status: StatusStore::default(),
        summary: Box::new(PlanOnlySummary),
    });
    state.metrics.set_plan(&plan);
    state.status.update(|s| {
        s.node.mode = "observe".into();
        s.pods = pod_rows(&plan);
    });
    runtime.block_on(observe(qc.ebpf.enabled, addr, state))
}

/// Until the cgroup statistics reader lands, `/stats/summary` carries the pods and no usage.
struct PlanOnlySummary;

impl SummarySource for PlanOnlySummary {
    fn summary(&self) -> Summary {
        Summary::default()
    }
}

fn pod_rows(plan: &Plan) -> Vec<PodRow> {
    plan.pods
        .iter()
        .map(|p| PodRow {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            qos_class: format!("{:?}", p.qos_class),
            phase: "Planned".into(),
            cpu_weight: p.cpu_weight,
            oom_score_adj: p
                .containers
                .iter()
                .map(|c| format!("{}={}", c.name, c.oom_score_adj))
                .collect(),
            memory_limit_bytes: p.memory_limit_bytes,
            ..Default::default()
        })
        .collect()
}

fn log_plan(plan: &Plan) {
    let n = &plan.node;
    info!(
        cpu_millis = n.allocatable.cpu_millis,
        memory_bytes = n.allocatable.memory_bytes,
        kubepods_memory_limit = ?n.kubepods.memory_limit_bytes,
        "Node allocatable computed."
    );
    for w in &n.warnings {
        warn!(warning = %w, "Node plan warning.");
    }
    for p in &plan.pods {
        let scores: Vec<String> = p
            .containers
            .iter()
            .map(|c| format!("{}={}", c.name, c.oom_score_adj))
            .collect();
        info!(
            pod = %format!("{}/{}", p.namespace, p.name),
            qos_class = ?p.qos_class,
            cpu_weight = ?p.cpu_weight,
            memory_limit = ?p.memory_limit_bytes,
            oom_score_adj = %scores.join(","),
            "Pod planned (observe mode: nothing written)."
        );
    }
}

async fn observe(sensors_enabled: bool, addr: SocketAddr, state: Arc<AgentState>) -> ExitCode {
    state.readiness.register("sensors");
    let server_task = match server::bind(addr, state.clone()).await {
        Ok((local, serve)) => {
            info!(addr = %local, "Serving /metrics, /healthz, /readyz, /stats/summary and /status.");
            tokio::spawn(serve)
        }
        Err(e) => {
            eprintln!("qoslet {}: {}", e, e.source);
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if !sensors_enabled {
        info!("eBPF sensors disabled by configuration; running on the fallbacks.");
    }
    let config = SensorsConfig {
        ebpf: sensors_enabled,
        ..SensorsConfig::default()
    };
    // Logs one line per sensor: which hook or fallback it runs on.
    let (sensors, mut events) = Sensors::start(config);
    let mut active = Vec::new();
    for st in sensors.statuses() {
        let on = st.mode != SensorMode::Off;
        if on {
            active.push(format!("{} ({})", st.name, st.source));
        }
        state
            .metrics
            .sensor_active
            .get_or_create(&SensorLabels {
                sensor: st.name.into(),
                source: st.source.clone(),
            })
            .set(on.into());
    }
    state.status.update(|s| s.node.sensors = active.clone());
    state.readiness.set("sensors", true, active.join(", "));
    let mut sigterm = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("qoslet could not watch SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    info!("qoslet is running in observe mode; Ctrl-C stops it.");
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            e = events.recv() => match e {
                Some(e) => {
                    log_event(&e);
                    record_event(&state, &e);
                }
                None => break,
            },
        }
    }
    let lost = sensors.events_lost();
    if lost > 0 {
        warn!(
            lost,
            "eBPF records were lost because the ring buffer was full."
        );
    }
    server_task.abort();
    info!("qoslet stopped.");
    ExitCode::SUCCESS
}

fn record_event(state: &AgentState, e: &SensorEvent) {
    let time = humantime_now();
    match e {
        SensorEvent::OomVictim(v) => state.status.push_event(EventRow {
            time,
            pod: String::new(),
            message: format!(
                "kernel OOM kill: pid {} ({}) cgroup {} rss {}",
                v.pid,
                v.comm,
                v.cgroup_id,
                v.rss_bytes.map_or("?".into(), |b| format!("{}Mi", b >> 20))
            ),
        }),
        SensorEvent::Memcg {
            memcg_id,
            kind,
            count,
            ..
        } => {
            state
                .metrics
                .memcg_events
                .get_or_create(&MemcgEventLabels {
                    cgroup: memcg_id.to_string(),
                    event: kind.as_str().into(),
                })
                .inc_by(*count);
        }
        // Shown in the log; the status table keeps OOM kills only.
        _ => {}
    }
}

/// Seconds since the Unix epoch, as the status table shows event times.
fn humantime_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:03}", now.as_secs(), now.subsec_millis())
}

fn log_event(e: &SensorEvent) {
    match e {
        SensorEvent::OomVictim(v) => warn!(
            pid = v.pid,
            comm = %v.comm,
            cgroup_id = v.cgroup_id,
            memcg_id = ?v.memcg_id,
            rss_bytes = ?v.rss_bytes,
            oom_score_adj = ?v.oom_score_adj,
            source = ?v.source,
            owner = ?v.owner,
            "Kernel OOM killer chose a victim."
        ),
        SensorEvent::Memcg {
            memcg_id,
            kind,
            count,
            ..
        } => info!(
            memcg_id,
            event = kind.as_str(),
            count,
            "Memory cgroup event."
        ),
        SensorEvent::MemoryPressure { scope } => {
            info!(scope = ?scope, "Memory pressure trigger fired.")
        }
        other => tracing::debug!(event = ?other, "Sensor event."),
    }
}
