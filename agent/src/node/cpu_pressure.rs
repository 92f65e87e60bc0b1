//! The CPU-pressure controller in the node: each housekeeping tick it reads the run-queue
//! histograms of the protected pods' containers only (Guaranteed, plus Burstable when
//! configured: one map lookup per container), turns their growth since the last tick into a
//! window p99, and steps the level stepper (agent/src/policy/cpu_pressure.rs). A level change runs
//! a pass, whose plan gets the level's lever on the BestEffort tier: the reconciler is the only
//! writer, and in observe mode it reports the drift instead of writing. The cpuset lever also
//! goes on the tier's pods and containers in a v1 cpuset hierarchy, where a child keeps its own
//! list and the kernel refuses to narrow a parent below its children (the reconciler narrows
//! children first).

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use qoslet_common::sched::RUNQ_HIST_BUCKETS;
use tracing::info;

use super::{Node, sensing::SensorControl, trees::unified_tree};
use crate::{
    cgroup::{
        CgroupBeneath, CgroupFs, CgroupPath, DesiredState, Tree, desired::Role, layout::Controller,
    },
    hub::metrics::{QosLabels, StepLabels},
    policy::{
        cpu::QUOTA_PERIOD_US,
        cpu_pressure::{
            Available, CpuPressureConfig, Histogram, Level, LevelStepper, Lever, Step, Window,
            granted_millis, histogram_delta, parse_psi_some_total, psi_share, quantile,
        },
        cpuset::CpuSet,
        plan::Plan,
        qos::QosClass,
    },
    sensors::cpu_usage::read_cgroup_cpu,
};

/// The level stepper and what it remembers between windows.
pub(super) struct CpuPressure {
    stepper: LevelStepper,
    /// Each protected container's cumulative histogram at the last tick.
    last_hist: BTreeMap<u64, Histogram>,
    /// Where the node's CPU PSI is read (only with a PSI target).
    psi_file: Option<PathBuf>,
    psi_last: Option<(u64, Instant)>,
    /// The BestEffort tier's CPU usage counter (ns) at the last tick.
    besteffort_last: Option<(u64, Instant)>,
    /// The levers the BestEffort tier offers; `None` until its directory exists.
    available: Option<Available>,
    /// A pass is due on the next tick: leaving `cpu.idle` makes the kernel reset the tier's
    /// weight after the pass read it, so the next pass puts the kubelet's weight back.
    settle: bool,
}

impl CpuPressure {
    pub(super) fn new(cfg: CpuPressureConfig, fs: &CgroupFs) -> Self {
        let psi_file = cfg.psi_some_target.map(|_| {
            // The node root's own PSI where the unified tree has it; the machine's otherwise.
            unified_tree(fs.trees())
                .map(|t| fs.display_path(t, &CgroupPath::root()).join("cpu.pressure"))
                .filter(|f| f.exists())
                .unwrap_or_else(|| PathBuf::from("/proc/pressure/cpu"))
        });
        Self {
            stepper: LevelStepper::new(cfg),
            last_hist: BTreeMap::new(),
            psi_file,
            psi_last: None,
            besteffort_last: None,
            available: None,
            settle: false,
        }
    }

    fn lever(&self, cpu_millis: i64, pod_cpus: &CpuSet) -> Lever {
        self.stepper.lever(
            cpu_millis,
            pod_cpus,
            QUOTA_PERIOD_US,
            self.available.unwrap_or_default(),
        )
    }

    fn psi_window(&mut self) -> Option<f64> {
        let file = self.psi_file.as_ref()?;
        let total = parse_psi_some_total(&std::fs::read_to_string(file).ok()?)?;
        let now = Instant::now();
        let last = self.psi_last.replace((total, now));
        let (before, at) = last?;
        psi_share(before, total, now.duration_since(at))
    }

    /// The share of the node's `cpu_millis` the tier used since the last tick, from its usage
    /// counter `usage_ns` now; `None` on the first tick or when the counter went back.
    fn besteffort_window(&mut self, usage_ns: Option<u64>, cpu_millis: i64) -> Option<f64> {
        let now = Instant::now();
        let last = std::mem::replace(&mut self.besteffort_last, usage_ns.map(|u| (u, now)));
        let (before, at) = last?;
        let used_ns = usage_ns?.checked_sub(before)?;
        let capacity_ns = now.duration_since(at).as_secs_f64() * 1e9 * cpu_millis as f64 / 1000.0;
        (capacity_ns > 0.0).then(|| used_ns as f64 / capacity_ns)
    }
}

/// The BestEffort tier's CPU usage counter in ns: `cpu.stat usage_usec` of its v2 (or unified
/// tree) directory, else the v1 `cpuacct.usage`; `None` where neither is read.
fn besteffort_usage_ns(fs: &Arc<CgroupFs>, path: &CgroupPath) -> Option<u64> {
    let dir = |tree| CgroupBeneath::new(fs, tree, path);
    let v2 = unified_tree(fs.trees());
    let v1 = fs.trees().find(|t| matches!(t, Tree::V1(Controller::Cpu)));
    v2.and_then(|t| read_cgroup_cpu(Some(&dir(t)), None).ok())
        .or_else(|| v1.and_then(|t| read_cgroup_cpu(None, Some(&dir(t))).ok()))
        .map(|u| u.usage_ns)
}

/// The tree holding the cpu controller's files (v2, or the v1 cpu hierarchy on hybrid hosts).
fn cpu_tree(fs: &CgroupFs) -> Option<Tree> {
    fs.trees()
        .find(|t| matches!(t, Tree::V2 | Tree::V1(Controller::Cpu)))
}

/// The tree holding the cpuset controller's files (v2, or the v1 cpuset hierarchy).
fn cpuset_tree(fs: &CgroupFs) -> Option<Tree> {
    fs.trees()
        .find(|t| matches!(t, Tree::V2 | Tree::V1(Controller::Cpuset)))
}

/// The BestEffort tier's path, when the plan has one.
fn besteffort_path(plan: &Plan, node_root: &CgroupPath) -> Option<CgroupPath> {
    let name = plan.node.besteffort.cgroup.as_ref()?;
    CgroupPath::under_root(name, node_root).ok()
}

/// The CPUs pods may use (kubepods' cpuset: the node's, less reservedSystemCPUs).
fn pod_cpus(plan: &Plan) -> CpuSet {
    plan.node
        .kubepods
        .cpuset
        .as_deref()
        .and_then(|c| c.parse().ok())
        .unwrap_or_default()
}

impl Node {
    /// One window of the level stepper; true when its level changed (a pass applies it) or a pass
    /// is due to settle the last change.
    pub(super) fn cpu_pressure_tick(&mut self, sensors: &impl SensorControl) -> bool {
        let Some(cp) = self.cpu_pressure.as_mut() else {
            return false;
        };
        let settle = std::mem::take(&mut cp.settle);
        if cp.available.is_none()
            && let Some(plan) = &self.plan
            && let Some(path) = besteffort_path(plan, &self.cgroups.naming.node_root)
            && let Some(tree) = cpu_tree(self.cgroups.fs())
        {
            let fs = self.cgroups.fs();
            let dir = fs.display_path(tree, &path);
            if dir.is_dir() {
                let cpuset = cpuset_tree(fs)
                    .is_some_and(|t| fs.display_path(t, &path).join("cpuset.cpus").exists())
                    && pod_cpus(plan).len() >= 2;
                cp.available = Some(Available {
                    idle: dir.join("cpu.idle").exists(),
                    cpuset,
                });
            }
        }
        let cfg = cp.stepper.config().clone();
        let mut by_class: BTreeMap<QosClass, Histogram> = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for entry in self.tracked.pods.values() {
            let protected = match entry.qos {
                QosClass::Guaranteed => true,
                QosClass::Burstable => cfg.protect_burstable,
                QosClass::BestEffort => false,
            };
            if !protected {
                continue;
            }
            let class = by_class.entry(entry.qos).or_insert([0; RUNQ_HIST_BUCKETS]);
            for id in &entry.container_ids {
                let Some(w) = sensors.cpu_stats(*id).and_then(|u| u.runq) else {
                    continue;
                };
                // A container seen for the first time only sets its baseline.
                if let Some(before) = cp.last_hist.get(id) {
                    for (c, d) in class.iter_mut().zip(histogram_delta(before, &w.hist)) {
                        *c += d;
                    }
                }
                seen.insert(*id, w.hist);
            }
        }
        cp.last_hist = seen;
        let metrics = &self.report.state.metrics;
        let mut all: Histogram = [0; RUNQ_HIST_BUCKETS];
        for (class, hist) in &by_class {
            for (a, n) in all.iter_mut().zip(hist) {
                *a += n;
            }
            let p99 = quantile(hist, 0.99, cfg.min_wakeups);
            metrics
                .qos_runqueue_latency_p99
                .get_or_create(&QosLabels {
                    qos_class: class.as_str().into(),
                })
                .set(p99.map_or(0.0, |d| d.as_secs_f64()));
        }
        let cpu_millis = self
            .plan
            .as_ref()
            .map_or(self.settings.capacity.cpu_millis, |p| {
                p.node.capacity.cpu_millis
            });
        let besteffort_usage = self
            .plan
            .as_ref()
            .and_then(|p| besteffort_path(p, &self.cgroups.naming.node_root))
            .and_then(|path| besteffort_usage_ns(self.cgroups.fs(), &path));
        let window = Window {
            latency_p99: quantile(&all, 0.99, cfg.min_wakeups),
            psi_some: cp.psi_window(),
            besteffort_share: cp.besteffort_window(besteffort_usage, cpu_millis),
        };
        if let Some(share) = window.besteffort_share {
            metrics
                .besteffort_cpu_used
                .set((share * cpu_millis as f64).round() as i64);
        }
        let step = cp
            .stepper
            .observe(&window, cp.available.unwrap_or_default());
        let pod_cpus = self
            .plan
            .as_ref()
            .map_or_else(|| self.settings.capacity.cpus.clone(), pod_cpus);
        let lever = cp.lever(cpu_millis, &pod_cpus);
        let level = cp.stepper.level();
        if matches!(step, Some(Step::Release { .. })) {
            cp.settle = true;
        }
        metrics.cpu_pressure_level.set(level.as_u8().into());
        metrics
            .besteffort_cpu_granted
            .set(granted_millis(&lever, cpu_millis));
        if let Some(step) = step {
            self.report_step(step, &window, &cfg, &lever, cpu_millis);
        }
        step.is_some() || settle
    }

    fn report_step(
        &self,
        step: Step,
        window: &Window,
        cfg: &CpuPressureConfig,
        lever: &Lever,
        cpu_millis: i64,
    ) {
        let (direction, from, to) = match step {
            Step::Engage { from, to } => ("engage", from, to),
            Step::Release { from, to } => ("release", from, to),
        };
        self.report
            .state
            .metrics
            .cpu_pressure_steps
            .get_or_create(&StepLabels {
                direction: direction.into(),
                level: to.as_str().into(),
            })
            .inc();
        let would = if self.cgroups.enforce() { "" } else { "would " };
        let what = describe(to, lever, cpu_millis);
        let p99 = fmt_ms(window.latency_p99);
        let target = fmt_ms(Some(cfg.latency_target));
        let psi = window
            .psi_some
            .map_or_else(|| "-".into(), |s| format!("{:.0}%", s * 100.0));
        match step {
            Step::Engage { .. } => info!(
                from = from.as_str(),
                to = to.as_str(),
                p99,
                target,
                psi,
                observe = !would.is_empty(),
                "CPU pressure on protected pods: constraining the BestEffort tier."
            ),
            Step::Release { .. } => info!(
                from = from.as_str(),
                to = to.as_str(),
                p99,
                target,
                observe = !would.is_empty(),
                "CPU pressure gone: releasing the BestEffort tier one level."
            ),
        }
        self.report.event(
            "",
            format!(
                "cpu pressure: {would}{direction} BestEffort tier, level {} -> {} ({what}); protected p99 {p99}, target {target}, psi {psi}",
                from.as_u8(),
                to.as_u8(),
            ),
        );
    }

    /// Puts the level's lever on the BestEffort tier's desired settings.
    pub(super) fn constrain_besteffort(&self, plan: &Plan, desired: &mut DesiredState) {
        let Some(cp) = &self.cpu_pressure else {
            return;
        };
        let Some(path) = besteffort_path(plan, &self.cgroups.naming.node_root) else {
            return;
        };
        let lever = cp.lever(plan.node.capacity.cpu_millis, &pod_cpus(plan));
        if let Some(cpus) = &lever.cpus {
            // The tier's pods and containers keep their own list in a v1 cpuset hierarchy.
            for c in &mut desired.cgroups {
                let s = &mut c.settings;
                if c.path != path && c.path.starts_with(&path) && s.cpus_v1_only && s.cpus.is_some()
                {
                    s.cpus = Some(cpus.clone());
                }
            }
        }
        let Some(tier) = desired
            .cgroups
            .iter_mut()
            .find(|c| c.role == Role::QosTier && c.path == path)
        else {
            return;
        };
        let s = &mut tier.settings;
        if let Some(cpus) = lever.cpus {
            // Written on v2 too: the tier's own list confines its pods there.
            s.cpus = Some(cpus);
            s.cpus_v1_only = false;
        }
        s.cpu_idle = lever.idle;
        if lever.idle == Some(true) {
            // The kernel refuses a weight on an idle group (EINVAL) and reads back its own
            // idle weight; the kubelet's (already the minimum) returns with the release.
            s.cpu_shares = None;
            s.cpu_weight = None;
        }
        s.cpu_period_us = Some(lever.period_us);
        s.cpu_quota_us = lever.quota_us;
    }

    /// The level (tests).
    #[cfg(test)]
    pub(super) fn cpu_pressure_level(&self) -> Option<Level> {
        self.cpu_pressure.as_ref().map(|c| c.stepper.level())
    }
}

fn describe(level: Level, lever: &Lever, cpu_millis: i64) -> String {
    if level == Level::None {
        return "kubelet weights only".into();
    }
    let mut parts = Vec::new();
    if lever.idle == Some(true) {
        parts.push("cpu.idle".to_owned());
    }
    if level >= Level::Cpuset
        && let Some(cpus) = &lever.cpus
    {
        parts.push(format!("BestEffort on CPUs {cpus}"));
    }
    if lever.quota_us.is_some() {
        parts.push(format!(
            "cap {}m of {cpu_millis}m",
            granted_millis(lever, cpu_millis)
        ));
    }
    parts.join(" and ")
}

fn fmt_ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.2}ms", d.as_secs_f64() * 1e3))
}
