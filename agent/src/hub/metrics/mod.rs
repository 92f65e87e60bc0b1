//! Prometheus metrics (prometheus-client, OpenMetrics text). The names are a stable interface,
//! documented in docs/usage.md ("Endpoints and metrics"); change them only on purpose.
//!
//! Registration and recording live here, apart from serving: the node (its passes, sensor
//! events and eviction decisions) and cluster mode record into [`Metrics`]; `server/` only
//! serves its text at `/metrics`.

mod evicted;
mod histogram;
mod labels;
pub(crate) mod process;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prometheus_client::{
    collector::Collector,
    encoding::text::encode,
    metrics::{
        MetricType,
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Metric, Registry, Unit},
};

use crate::{
    cgroup::{ReconcileReport, WriteResult},
    eviction::{
        Stages,
        thresholds::{Resource, resource_of},
    },
    policy::plan::{CgroupPlan, Plan},
    sensors::event::MemcgEventKind,
};
use process::ProcessCollector;

pub(crate) use evicted::EvictedPods;
pub(crate) use histogram::KernelHistogram;
pub(crate) use labels::*;

/// One gauge per eviction signal, in a family named after the signal's unit: the memory signals
/// in `<name>_bytes`, `pid.available` in `<name>_pids`. A pid count under a bytes name would
/// be scaled as bytes by every unit-aware tool (Grafana shows 4194304 pids as 4 MiB).
#[derive(Clone, Debug)]
pub(crate) struct SignalGauges<L: SignalLabel> {
    bytes: Family<L, Gauge>,
    pids: Family<L, Gauge>,
}

impl<L: SignalLabel + Clone + std::hash::Hash + Eq> SignalGauges<L> {
    /// The gauge of `labels`' signal, in the family of its unit.
    pub(crate) fn get_or_create(&self, labels: &L) -> Gauge {
        match resource_of(labels.signal()) {
            Some(Resource::Pids) => self.pids.get_or_create_owned(labels),
            Some(Resource::Memory) | None => self.bytes.get_or_create_owned(labels),
        }
    }
}

fn latency_histogram() -> Histogram {
    // 100 us .. ~52 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// The registry and the series names it exposes, suffixes included (`_total`, `_bucket`, ...).
#[derive(Default)]
struct Registrar {
    registry: Registry,
    series: Vec<String>,
}

impl Registrar {
    fn add(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.note(name, &metric);
        self.registry.register(name, help, metric);
    }

    fn add_with_unit(&mut self, name: &str, help: &str, unit: Unit, metric: impl Metric) {
        self.note(&format!("{name}_{}", unit.as_str()), &metric);
        self.registry.register_with_unit(name, help, unit, metric);
    }

    /// A collector encoded at each scrape, and the series it writes.
    fn add_collector(&mut self, series: &[&str], collector: impl Collector) {
        self.series.extend(series.iter().map(ToString::to_string));
        self.registry.register_collector(Box::new(collector));
    }

    fn note(&mut self, base: &str, metric: &impl Metric) {
        let suffixes: &[&str] = match metric.metric_type() {
            MetricType::Counter => &["_total"],
            MetricType::Histogram => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        self.series
            .extend(suffixes.iter().map(|s| format!("{base}{s}")));
    }
}

/// All of qoslet's metric families. Cloning a family shares it, so producers keep clones.
pub struct Metrics {
    registry: Registry,
    series: Vec<String>,
    pub(crate) node_capacity: Family<ResourceLabels, Gauge>,
    pub(crate) node_allocatable: Family<ResourceLabels, Gauge>,
    pub(crate) pod_info: Family<PodInfoLabels, Gauge>,
    pub(crate) pod_requests: Family<PodResourceLabels, Gauge>,
    pub(crate) cgroup_cpu_weight: Family<CgroupLabels, Gauge>,
    pub(crate) container_oom_score_adj: Family<ContainerLabels, Gauge>,
    pub(crate) memcg_events: Family<MemcgEventLabels, Counter>,
    pub(crate) oom_kills: Family<ContainerLabels, Counter>,
    pub(crate) evictions: Family<EvictionLabels, Counter>,
    pub(crate) evicted_pods: EvictedPods,
    pub(crate) eviction_decision_latency: Histogram,
    pub(crate) eviction_stage_latency: Family<StageLabels, Histogram, fn() -> Histogram>,
    pub(crate) runqueue_latency: Family<PodLabels, KernelHistogram>,
    pub(crate) reconcile_duration: Histogram,
    pub(crate) ebpf_program_run: Family<ProgramLabels, Counter<f64, AtomicU64>>,
    pub(crate) ebpf_events_lost: Family<RingLabels, Counter>,
    pub(crate) sensor_active: Family<SensorLabels, Gauge>,
    pub(crate) node_signal_available: SignalGauges<SignalLabels>,
    pub(crate) node_eviction_threshold: SignalGauges<ThresholdLabels>,
    pub(crate) node_condition: Family<ConditionLabels, Gauge>,
    /// Errors of cgroup reconcile passes (see [`Metrics::record_reconcile`]). A plain counter,
    /// exported from the start at 0, so an alert on its increase has a baseline.
    pub(crate) reconcile_errors: Counter,
    /// Differences from the plan found in cgroup files and left alone (observe mode, or the
    /// kubelet's files in cluster mode), each counted once when first seen (the node's
    /// `NodeCgroups::reconcile`, which logs each once too).
    pub(crate) cgroup_drift: Counter,
    pub(crate) qos_runqueue_latency_p99: Family<QosLabels, Gauge<f64, AtomicU64>>,
    pub(crate) cpu_pressure_level: Gauge,
    pub(crate) cpu_pressure_steps: Family<StepLabels, Counter>,
    pub(crate) besteffort_cpu_granted: Gauge,
    /// The CPU the BestEffort tier used over the last window (the controller's idle test).
    pub(crate) besteffort_cpu_used: Gauge,
    /// Cluster mode: API writes given up on.
    pub(crate) api_writes_dropped: Family<ApiWriteLabels, Counter>,
    /// Cluster mode: 1 while eviction is gang-aware, 0 when the cluster does not serve the
    /// Workload API.
    pub(crate) gang_awareness: Gauge,
    /// The length of the last `/metrics` text, to size the next.
    last_len: AtomicUsize,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut reg = Registrar::default();
        let node_capacity = Family::default();
        reg.add(
            "qoslet_node_capacity",
            "Node capacity per resource (cpu in millicores, memory in bytes, pids)",
            node_capacity.clone(),
        );
        let node_allocatable = Family::default();
        reg.add(
            "qoslet_node_allocatable",
            "Node Allocatable per resource: capacity - kubeReserved - systemReserved - hard eviction threshold",
            node_allocatable.clone(),
        );
        let pod_info = Family::default();
        reg.add(
            "qoslet_pod_info",
            "One per pod qoslet manages, with its QoS class",
            pod_info.clone(),
        );
        let pod_requests = Family::default();
        reg.add(
            "qoslet_pod_requests",
            "Requests of each pod qoslet manages (cpu in millicores, memory in bytes), pod-level resources where set",
            pod_requests.clone(),
        );
        let cgroup_cpu_weight = Family::default();
        reg.add(
            "qoslet_cgroup_cpu_weight",
            "cgroup v2 cpu.weight qoslet wants for each managed cgroup (kubelet formula)",
            cgroup_cpu_weight.clone(),
        );
        let container_oom_score_adj = Family::default();
        reg.add(
            "qoslet_container_oom_score_adj",
            "oom_score_adj qoslet sets on every process of a container",
            container_oom_score_adj.clone(),
        );
        let memcg_events = Family::default();
        reg.add(
            "qoslet_memcg_events",
            "Memory cgroup events seen (high, max, oom, oom_kill, oom_group_kill) by pod and container; empty pod labels for the node's own cgroups",
            memcg_events.clone(),
        );
        let oom_kills = Family::default();
        reg.add(
            "qoslet_oom_kills",
            "Kernel OOM kills of processes in managed containers",
            oom_kills.clone(),
        );
        let evictions = Family::default();
        reg.add(
            "qoslet_evictions",
            "Pods evicted, by signal and QoS class",
            evictions.clone(),
        );
        let evicted_pods = EvictedPods::default();
        reg.add_with_unit(
            "qoslet_pod_eviction_timestamp",
            "Unix time of qoslet's eviction of a pod, naming it; each series leaves an hour after its eviction",
            Unit::Seconds,
            evicted_pods.family.clone(),
        );
        let eviction_decision_latency = latency_histogram();
        reg.add_with_unit(
            "qoslet_eviction_decision_latency",
            "From a threshold crossing seen to the first signal sent to the victim",
            Unit::Seconds,
            eviction_decision_latency.clone(),
        );
        let eviction_stage_latency = Family::<StageLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        // Every stage from the start, empty: a series born with the first eviction would hide
        // that eviction from rate() and increase(), which need a sample before it.
        let no_time = std::time::Duration::ZERO;
        let stages = Stages {
            wake: no_time,
            decide: no_time,
            kill: no_time,
        };
        for (stage, _) in stages.labelled() {
            eviction_stage_latency.get_or_create_owned(&StageLabels {
                stage: stage.into(),
            });
        }
        reg.add_with_unit(
            "qoslet_eviction_stage_latency",
            "The decision latency's parts: wake (wake-up seen to pass started), decide (to the action called), kill (to the first signal)",
            Unit::Seconds,
            eviction_stage_latency.clone(),
        );
        let runqueue_latency = Family::default();
        reg.add_with_unit(
            "qoslet_runqueue_latency",
            "Run-queue latency (enqueued to running) of a pod's tasks, from eBPF",
            Unit::Seconds,
            runqueue_latency.clone(),
        );
        let reconcile_duration = latency_histogram();
        reg.add_with_unit(
            "qoslet_reconcile_duration",
            "Duration of a cgroup reconcile pass",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        let ebpf_program_run = Family::default();
        reg.add_with_unit(
            "qoslet_ebpf_program_run",
            "Kernel time spent in each eBPF program (kernel.bpf_stats_enabled)",
            Unit::Seconds,
            ebpf_program_run.clone(),
        );
        let ebpf_events_lost = Family::default();
        reg.add(
            "qoslet_ebpf_events_lost",
            "Records the kernel could not put in a ring buffer because it was full",
            ebpf_events_lost.clone(),
        );
        let sensor_active = Family::default();
        reg.add(
            "qoslet_sensor_active",
            "1 for each sensor that runs, with its source (ebpf or a fallback)",
            sensor_active.clone(),
        );
        let node_signal_available = SignalGauges {
            bytes: Family::default(),
            pids: Family::default(),
        };
        reg.add_with_unit(
            "qoslet_node_signal_available",
            "What a memory eviction signal observed last (memory.available, allocatableMemory.available)",
            Unit::Bytes,
            node_signal_available.bytes.clone(),
        );
        reg.add(
            "qoslet_node_signal_available_pids",
            "What the pid.available eviction signal observed last, in pids",
            node_signal_available.pids.clone(),
        );
        let node_eviction_threshold = SignalGauges {
            bytes: Family::default(),
            pids: Family::default(),
        };
        reg.add_with_unit(
            "qoslet_node_eviction_threshold",
            "Each eviction threshold of a memory signal, as an amount of the signal (percentages taken of capacity)",
            Unit::Bytes,
            node_eviction_threshold.bytes.clone(),
        );
        reg.add(
            "qoslet_node_eviction_threshold_pids",
            "Each eviction threshold of pid.available, in pids (percentages taken of capacity)",
            node_eviction_threshold.pids.clone(),
        );
        let node_condition = Family::default();
        reg.add(
            "qoslet_node_condition",
            "1 while a node condition (MemoryPressure, PIDPressure) is in force, else 0",
            node_condition.clone(),
        );
        let reconcile_errors = Counter::default();
        reg.add(
            "qoslet_reconcile_errors",
            "Errors of cgroup reconcile passes (a write or read that failed)",
            reconcile_errors.clone(),
        );
        let cgroup_drift = Counter::default();
        reg.add(
            "qoslet_cgroup_drift",
            "Differences from the plan found in cgroup files and left alone (observe mode, or the kubelet's files in cluster mode), each counted once when first seen: a file's value and the plan's, counted again only after either changes or the file held the plan's value",
            cgroup_drift.clone(),
        );
        let qos_runqueue_latency_p99 = Family::default();
        reg.add_with_unit(
            "qoslet_qos_runqueue_latency_p99",
            "Run-queue latency p99 of the pods the CPU-pressure controller protects, per QoS class, over the last housekeeping window (interpolated in the kernel's log2 buckets)",
            Unit::Seconds,
            qos_runqueue_latency_p99.clone(),
        );
        let cpu_pressure_level = Gauge::default();
        reg.add(
            "qoslet_cpu_pressure_level",
            "How constrained the BestEffort tier is: 0 none, 1 cpu.idle, 2 a share of the CPUs by cpuset, 3 a CPU cap, 4 the cap at its floor",
            cpu_pressure_level.clone(),
        );
        let cpu_pressure_steps = Family::default();
        reg.add(
            "qoslet_cpu_pressure_steps",
            "Level changes of the CPU-pressure controller (direction engage or release, the level reached)",
            cpu_pressure_steps.clone(),
        );
        let besteffort_cpu_granted = Gauge::default();
        reg.add(
            "qoslet_besteffort_cpu_granted_millicores",
            "The CPU the BestEffort tier may use under the CPU-pressure controller (the node's CPU when uncapped)",
            besteffort_cpu_granted.clone(),
        );
        let besteffort_cpu_used = Gauge::default();
        reg.add(
            "qoslet_besteffort_cpu_used_millicores",
            "The CPU the BestEffort tier used over the last housekeeping window (under a quarter of the floor it is idle, and no wait is blamed on it)",
            besteffort_cpu_used.clone(),
        );
        let api_writes_dropped = Family::default();
        // The drops not about one write's answer, at 0 from the start, as a baseline for
        // increase() (a `rejected-<status>` series is born with its first drop).
        for reason in ["expired", "overflow"] {
            api_writes_dropped.get_or_create_owned(&ApiWriteLabels {
                write: String::new(),
                reason: reason.into(),
            });
        }
        reg.add(
            "qoslet_api_writes_dropped",
            "Cluster mode: API writes given up on (reason rejected-<status> for a permanent refusal such as a failed UID precondition, expired after the queue's TTL, overflow of the bounded queue)",
            api_writes_dropped.clone(),
        );
        let gang_awareness = Gauge::default();
        gang_awareness.set(1);
        reg.add(
            "qoslet_gang_awareness",
            "1 while eviction is gang-aware; 0 in cluster mode when the cluster does not serve the Workload API",
            gang_awareness.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        reg.add(
            "qoslet_build_info",
            "1, with the agent's version (the crate's; the build records no source revision)",
            build_info,
        );
        reg.add_collector(&process::SERIES, ProcessCollector);
        Self {
            registry: reg.registry,
            series: reg.series,
            node_capacity,
            node_allocatable,
            pod_info,
            pod_requests,
            cgroup_cpu_weight,
            container_oom_score_adj,
            memcg_events,
            oom_kills,
            evictions,
            evicted_pods,
            eviction_decision_latency,
            eviction_stage_latency,
            runqueue_latency,
            reconcile_duration,
            ebpf_program_run,
            ebpf_events_lost,
            sensor_active,
            node_signal_available,
            node_eviction_threshold,
            node_condition,
            reconcile_errors,
            cgroup_drift,
            qos_runqueue_latency_p99,
            cpu_pressure_level,
            cpu_pressure_steps,
            besteffort_cpu_granted,
            besteffort_cpu_used,
            api_writes_dropped,
            gang_awareness,
            last_len: AtomicUsize::new(0),
        }
    }

    /// Replaces the plan-derived gauges (node totals, pods, weights, scores) with `plan`'s.
    pub(crate) fn set_plan(&self, plan: &Plan) {
        let n = &plan.node;
        for (family, totals) in [
            (&self.node_capacity, &n.capacity),
            (&self.node_allocatable, &n.allocatable),
        ] {
            for (resource, value) in [
                ("cpu", totals.cpu_millis),
                ("memory", totals.memory_bytes),
                ("pids", totals.pids),
            ] {
                family
                    .get_or_create(&ResourceLabels {
                        resource: resource.into(),
                    })
                    .set(value);
            }
        }
        self.pod_info.clear();
        self.cgroup_cpu_weight.clear();
        self.container_oom_score_adj.clear();
        for tier in [
            &n.kubepods,
            &n.burstable,
            &n.besteffort,
            &n.system_reserved,
            &n.kube_reserved,
        ] {
            self.set_weight(tier);
        }
        for p in &plan.pods {
            self.pod_info
                .get_or_create(&PodInfoLabels {
                    namespace: p.namespace.clone(),
                    pod: p.name.clone(),
                    uid: p.uid.clone(),
                    qos_class: p.qos_class.as_str().into(),
                })
                .set(1);
            if let (Some(cgroup), Some(w)) = (&p.cgroup, p.cpu_weight) {
                self.cgroup_cpu_weight
                    .get_or_create(&CgroupLabels {
                        cgroup: cgroup.clone(),
                    })
                    .set(w as i64);
            }
            for c in &p.containers {
                self.container_oom_score_adj
                    .get_or_create(&ContainerLabels {
                        namespace: p.namespace.clone(),
                        pod: p.name.clone(),
                        container: c.name.clone(),
                    })
                    .set(c.oom_score_adj.into());
            }
        }
    }

    /// Records a reconcile pass: its duration, and one error per failed write and per entry of
    /// its `errors` (the lines the node logs as "Cgroup write failed." and "Cgroup reconcile
    /// error.").
    pub(crate) fn record_reconcile(&self, report: &ReconcileReport, took: std::time::Duration) {
        self.reconcile_duration.observe(took.as_secs_f64());
        let failed_writes = report
            .writes
            .iter()
            .filter(|w| matches!(w.result, WriteResult::Failed { .. }))
            .count();
        self.reconcile_errors
            .inc_by((failed_writes + report.errors.len()) as u64);
    }

    /// Replaces the pods' requests: `(namespace, pod, cpu millicores, memory bytes)`.
    pub(crate) fn set_pod_requests<'a>(
        &self,
        pods: impl IntoIterator<Item = (&'a str, &'a str, i64, i64)>,
    ) {
        self.pod_requests.clear();
        for (namespace, pod, cpu, memory) in pods {
            for (resource, value) in [("cpu", cpu), ("memory", memory)] {
                self.pod_requests
                    .get_or_create(&PodResourceLabels {
                        namespace: namespace.into(),
                        pod: pod.into(),
                        resource: resource.into(),
                    })
                    .set(value);
            }
        }
    }

    /// Drops the per-pod series of a pod that left the node, so series do not pile up as pods
    /// come and go (the plan-derived ones are replaced by `set_plan`).
    pub(crate) fn drop_pod(&self, namespace: &str, pod: &str, uid: &str, containers: &[&str]) {
        for container in std::iter::once("").chain(containers.iter().copied()) {
            for event in MemcgEventKind::ALL {
                self.memcg_events.remove(&MemcgEventLabels {
                    namespace: namespace.into(),
                    pod: pod.into(),
                    uid: uid.into(),
                    container: container.into(),
                    event: event.as_str().into(),
                });
            }
            self.oom_kills.remove(&ContainerLabels {
                namespace: namespace.into(),
                pod: pod.into(),
                container: container.into(),
            });
        }
        self.runqueue_latency.remove(&PodLabels {
            namespace: namespace.into(),
            pod: pod.into(),
        });
    }

    fn set_weight(&self, tier: &CgroupPlan) {
        if let (Some(cgroup), Some(w)) = (&tier.cgroup, tier.cpu_weight) {
            self.cgroup_cpu_weight
                .get_or_create(&CgroupLabels {
                    cgroup: cgroup.clone(),
                })
                .set(w as i64);
        }
    }

    /// Every series name `/metrics` can carry, whether or not it has a value yet (empty
    /// families are not encoded).
    pub fn series_names(&self) -> &[String] {
        &self.series
    }

    pub(crate) fn encode(&self) -> Result<String, std::fmt::Error> {
        // Sized from the last text, with room for a few more series: one block, mapped and
        // unmapped whole at this size (`cli/run.rs`, `tune_malloc`), not a string doubled on its
        // way to 394 KB (110 pods), a copy at each step and 512 KiB for the last.
        let last = self.last_len.load(Ordering::Relaxed);
        let mut out = String::with_capacity(last + last / 16);
        encode(&mut out, &self.registry)?;
        self.last_len.store(out.len(), Ordering::Relaxed);
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests;
