//! One pass of the standalone node: manifests -> plan -> cgroups -> runtime -> eviction inventory,
//! metrics and status; plus the housekeeping and sensor-event reactions.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    cgroup::{
        self, CgroupFs, CgroupPath, CgroupRef, ContainerIds, DesiredState, Mode, Naming,
        OomTargets, Reconciler, Tree, WriteResult, desired::Role, desired_state,
        layout::Controller,
    },
    eviction::{
        Admission, EvictionAction, EvictionStats, Inventory, ManagedPod, MemoryCgroup,
        NodeCondition, Outcome, PodCgroups, PodKey as EvictionKey, action::ActionError, admit,
    },
    policy::{
        plan::{Plan, plan_node},
        pod::PodSpecView,
        qos::QosClass,
        settings::NodeSettings,
    },
    runtime::{ContainerCgroups, PodKey, PodRuntimeSpec, PodStatus, Runtime},
    sensors::{CgroupOwner, CpuUsage, SensorEvent, Sensors, WatchedCgroup},
    server::{
        AgentState,
        metrics::{
            ContainerLabels, EvictionLabels, MemcgEventLabels, PodLabels, ProgramLabels, RingLabels,
        },
        status::{EventRow, PodRow},
        summary::PodReference,
    },
    source::watch::ManifestWatch,
    workload::{Forest, ValidationOptions},
};

use super::summary::{CgroupSummary, PodTarget, StatsCgroup, SummaryTargets};

/// What one pod is on this node, after a pass.
struct PodEntry {
    view: PodSpecView,
    memory: Option<MemoryCgroup>,
    /// cgroup v2 ids of the pod's container cgroups (unified tree on hybrid hosts): the CPU
    /// sensor keys by the task's own cgroup.
    container_ids: Vec<u64>,
    /// Run-queue latency p99 (bucket upper bound, seconds), from the last housekeeping.
    runq_p99: Option<f64>,
}

pub struct Synced {
    settings: NodeSettings,
    naming: Naming,
    reconciler: Reconciler,
    runtime: Arc<Runtime>,
    state: Arc<AgentState>,
    validation: ValidationOptions,
    inventory_tx: watch::Sender<Arc<Inventory>>,
    /// memcg ids of the node root, whose memcg events wake the eviction manager.
    pub node_memory_ids: Vec<u64>,
    targets: Option<OomTargets>,
    desired: DesiredState,
    plan: Option<Plan>,
    pods: BTreeMap<PodKey, PodEntry>,
    summary: CgroupSummary,
    /// memcg ids (memory cgroup inodes) of pods and containers, with their memcg event labels
    /// (`event` left empty).
    memcg_owners: BTreeMap<u64, MemcgEventLabels>,
    reported: BTreeSet<String>,
    evictions_seen: usize,
    /// Pod and container cgroups no longer desired, removed once their processes are gone.
    stale: BTreeSet<CgroupPath>,
    /// cgroup ids handed to the sensors, so each is watched once and unwatched when it goes.
    watched: BTreeSet<u64>,
    /// Kernel run time per program and lost records at the last housekeeping (counters grow by
    /// the difference).
    last_run_ns: BTreeMap<String, u64>,
    last_lost: u64,
}

/// The hierarchy that holds memory accounting: the v2 tree, or v1's memory controller.
pub fn memory_tree(trees: impl IntoIterator<Item = Tree>) -> Option<Tree> {
    trees
        .into_iter()
        .find(|t| matches!(t, Tree::V2 | Tree::V1(Controller::Memory)))
}

/// The cgroup v2 hierarchy: the only one on v2 hosts, the controller-less one on hybrid hosts.
pub fn unified_tree(trees: impl IntoIterator<Item = Tree>) -> Option<Tree> {
    trees
        .into_iter()
        .find(|t| matches!(t, Tree::V2 | Tree::Unified))
}

/// A directory of `tree` as the eviction signals read it.
pub fn memory_cgroup(tree: Tree, dir: PathBuf) -> MemoryCgroup {
    match tree {
        Tree::V2 => MemoryCgroup::V2(dir),
        _ => MemoryCgroup::V1(dir),
    }
}

/// A cgroup's id: the inode of its directory, as the kernel's programs see it; `None` when the
/// directory is gone.
fn cgroup_id(dir: &Path) -> Option<u64> {
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

/// The node root's memcg id (the inode of its memory cgroup directory).
pub fn memory_ids(root: &MemoryCgroup) -> Vec<u64> {
    cgroup_id(root.path()).into_iter().collect()
}

impl Synced {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: NodeSettings,
        naming: Naming,
        fs: CgroupFs,
        mode: Mode,
        runtime: Arc<Runtime>,
        state: Arc<AgentState>,
        validation: ValidationOptions,
        inventory_tx: watch::Sender<Arc<Inventory>>,
        summary: CgroupSummary,
    ) -> Self {
        Self {
            settings,
            naming,
            reconciler: with_change_feed(Reconciler::new(fs, mode)),
            runtime,
            state,
            validation,
            inventory_tx,
            node_memory_ids: Vec::new(),
            targets: None,
            desired: DesiredState::default(),
            plan: None,
            pods: BTreeMap::new(),
            summary,
            memcg_owners: BTreeMap::new(),
            reported: BTreeSet::new(),
            evictions_seen: 0,
            stale: BTreeSet::new(),
            watched: BTreeSet::new(),
            last_run_ns: BTreeMap::new(),
            last_lost: 0,
        }
    }

    fn fs(&self) -> &CgroupFs {
        self.reconciler.fs()
    }

    fn enforce(&self) -> bool {
        self.reconciler.mode() == Mode::Enforce
    }

    /// Reports each problem line once (the watch reports new ones; spec errors are ours).
    pub fn log_problems(&mut self, lines: &[String]) {
        for l in lines {
            if self.reported.insert(l.clone()) {
                warn!(problem = %l, "Manifest skipped.");
                self.state
                    .status
                    .push_event(event("", format!("skipped: {l}")));
            }
        }
    }

    /// Problems the manifest watch has already logged: status events only.
    pub fn note_problems(&mut self, lines: &[String]) {
        for l in lines {
            if self.reported.insert(l.clone()) {
                self.state
                    .status
                    .push_event(event("", format!("skipped: {l}")));
            }
        }
    }

    /// The whole pass.
    pub fn sync(
        &mut self,
        manifests: &ManifestWatch,
        conditions: &[NodeCondition],
        sensors: &Sensors,
    ) {
        let desired_state_now = manifests.state();
        let mut views = Vec::new();
        let mut specs = Vec::new();
        let mut problems = Vec::new();
        for (key, mp) in &desired_state_now.pods {
            match (
                PodSpecView::from_pod(&mp.pod),
                PodRuntimeSpec::from_pod(&mp.pod),
            ) {
                (Ok(v), Ok(s)) => {
                    views.push((key.clone(), v, &mp.pod));
                    specs.push(s);
                }
                (Err(e), _) => problems.push(format!("Pod/{}/{}: {e}", key.namespace, key.name)),
                (_, Err(e)) => problems.push(e.to_string()),
            }
        }
        self.log_problems(&problems);
        let pod_views: Vec<PodSpecView> = views.iter().map(|(_, v, _)| v.clone()).collect();
        let plan = match plan_node(&self.settings, &pod_views) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "The node plan failed; keeping the last one.");
                return;
            }
        };
        let ids: ContainerIds = pod_views
            .iter()
            .flat_map(|v| {
                v.containers
                    .iter()
                    .map(|c| ((v.uid.clone(), c.name.clone()), c.name.clone()))
            })
            .collect();
        let desired = desired_state(&plan, &self.naming, &ids);
        for r in &desired.refused_pods {
            self.log_problems(&[format!("{r}: {}", r.source)]);
        }
        let started = Instant::now();
        let report = self.reconciler.reconcile(&desired);
        self.state
            .metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        for w in &report.writes {
            match &w.result {
                WriteResult::Failed { .. } => {
                    warn!(path = %w.path.display(), file = w.file, value = %w.new, result = ?w.result, "Cgroup write failed.")
                }
                WriteResult::Drift => {
                    info!(path = %w.path.display(), file = w.file, current = ?w.old, wanted = %w.new, "Cgroup drift (observe mode: not written).")
                }
                _ => {}
            }
        }
        for e in &report.errors {
            warn!(error = %e, "Cgroup reconcile error.");
        }
        let targets = OomTargets::new(self.fs(), &desired);

        // Where each pod and container lives, in every hierarchy.
        let trees: Vec<Tree> = self.fs().trees().collect();
        let memory_tree = memory_tree(trees.iter().copied());
        let unified_tree = unified_tree(trees.iter().copied());
        // The v1 cpu hierarchy, for the sensors' CPU fallback (throttling, cpuacct.usage).
        let cpu_tree = trees
            .iter()
            .copied()
            .find(|t| *t == Tree::V1(Controller::Cpu));
        let mut pod_paths: BTreeMap<String, CgroupPath> = BTreeMap::new();
        let mut container_paths: BTreeMap<(String, String), CgroupPath> = BTreeMap::new();
        for c in &desired.cgroups {
            let Some(uid) = &c.pod_uid else { continue };
            match c.role {
                Role::Pod => {
                    pod_paths.insert(uid.clone(), c.path.clone());
                }
                Role::Container => {
                    let name = c.path.components().last().cloned().unwrap_or_default();
                    container_paths.insert((uid.clone(), name), c.path.clone());
                }
                _ => {}
            }
        }
        for spec in &mut specs {
            let names: Vec<String> = spec.containers.iter().map(|c| c.name.clone()).collect();
            for name in names {
                if let Some(path) = container_paths.get(&(spec.key.uid.clone(), name.clone())) {
                    let dirs = trees
                        .iter()
                        .map(|t| self.fs().display_path(*t, path))
                        .collect();
                    spec.set_cgroups(&name, ContainerCgroups { dirs });
                }
            }
        }

        // Admission: under MemoryPressure BestEffort pods that are not running yet wait.
        // One status read per pass: admission now, the status table at the end.
        let statuses = self.runtime.status();
        let running: BTreeSet<PodKey> = statuses
            .iter()
            .filter(|s| s.containers.iter().any(|c| !c.pids.is_empty()))
            .map(|s| s.key.clone())
            .collect();
        let startable = desired_state_now.startable_pods(&self.validation);
        let qos: BTreeMap<PodKey, (QosClass, bool)> = plan
            .pods
            .iter()
            .zip(&views)
            .map(|(p, (k, v, _))| (k.clone(), (p.qos_class, v.is_critical())))
            .collect();
        let may_start = |k: &PodKey| {
            startable.contains(k)
                && (running.contains(k)
                    || qos.get(k).is_none_or(|(q, critical)| {
                        admit(conditions, *q, *critical, false) == Admission::Admit
                    }))
        };
        if self.enforce() {
            self.runtime.apply(specs, may_start);
        }

        // Eviction inventory, sensors' watch list, summary sources, memcg owners.
        let old_pods = std::mem::take(&mut self.pods);
        self.memcg_owners.clear();
        let mut now_watched = BTreeSet::new();
        let mut managed = Vec::new();
        let mut summary = SummaryTargets {
            system: self.system_containers(&plan, memory_tree, unified_tree),
            pods: Vec::new(),
        };
        for ((key, view, pod), p) in views.iter().zip(&plan.pods) {
            let Some(path) = pod_paths.get(&view.uid) else {
                continue;
            };
            let dirs: Vec<PathBuf> = trees
                .iter()
                .map(|t| self.fs().display_path(*t, path))
                .collect();
            let cgroup = self.stats_cgroup(memory_tree, unified_tree, path);
            let memory = cgroup.memory.clone();
            let unified = cgroup.cpu.clone();
            let containers: Vec<(String, StatsCgroup)> = p
                .containers
                .iter()
                .filter_map(|c| {
                    let cpath = container_paths.get(&(view.uid.clone(), c.name.clone()))?;
                    Some((
                        c.name.clone(),
                        self.stats_cgroup(memory_tree, unified_tree, cpath),
                    ))
                })
                .collect();
            let owner = |container: &str| MemcgEventLabels {
                namespace: key.namespace.clone(),
                pod: key.name.clone(),
                uid: view.uid.clone(),
                container: container.into(),
                event: String::new(),
            };
            if let Some(memory) = &memory {
                managed.push(ManagedPod {
                    key: EvictionKey {
                        namespace: key.namespace.clone(),
                        name: key.name.clone(),
                    },
                    qos: p.qos_class,
                    request_bytes: view.requests().memory_bytes(),
                    priority: view.effective_priority(),
                    critical: view.is_critical(),
                    start_time: pod
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or(0, |t| t.0.as_second()),
                    grace_secs: pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                        .unwrap_or(30),
                    memory: memory.clone(),
                    cgroups: PodCgroups {
                        procs: dirs,
                        unified: unified.clone(),
                    },
                });
                if let Some(id) = cgroup_id(memory.path()) {
                    self.memcg_owners.insert(id, owner(""));
                }
            }
            if let Some(u) = &unified
                && let Some(id) = cgroup_id(u)
                && now_watched.insert(id)
                && !self.watched.contains(&id)
            {
                sensors.watch(WatchedCgroup {
                    id,
                    v2_dir: Some(u.clone()),
                    memory_dir: memory.as_ref().map(|m| m.path().to_path_buf()),
                    cpu_dir: cpu_tree.map(|t| self.fs().display_path(t, path)),
                });
            }
            let mut container_ids = Vec::new();
            for (name, c) in &containers {
                if let Some(id) = c.memory.as_ref().and_then(|m| cgroup_id(m.path())) {
                    self.memcg_owners.insert(id, owner(name));
                }
                // The CPU sensor keys by the task's own (v2) cgroup.
                let Some(id) = c.cpu.as_deref().and_then(cgroup_id) else {
                    continue;
                };
                sensors.set_owner(
                    id,
                    CgroupOwner {
                        pod_uid: view.uid.clone(),
                        container: name.clone(),
                    },
                );
                container_ids.push(id);
                now_watched.insert(id);
                if !self.watched.contains(&id) {
                    sensors.watch(WatchedCgroup {
                        id,
                        v2_dir: None,
                        memory_dir: None,
                        cpu_dir: None,
                    });
                }
            }
            summary.pods.push(PodTarget {
                pod_ref: PodReference {
                    name: key.name.clone(),
                    namespace: key.namespace.clone(),
                    uid: view.uid.clone(),
                },
                key: key.clone(),
                cgroup,
                containers,
            });
            self.pods.insert(
                key.clone(),
                PodEntry {
                    view: view.clone(),
                    memory,
                    container_ids,
                    runq_p99: None,
                },
            );
        }
        for (key, old) in &old_pods {
            if self
                .pods
                .get(key)
                .is_none_or(|new| new.view.uid != old.view.uid)
            {
                let containers: Vec<&str> = old
                    .view
                    .containers
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect();
                self.state
                    .metrics
                    .drop_pod(&key.namespace, &key.name, &old.view.uid, &containers);
            }
        }
        for gone in self.watched.difference(&now_watched) {
            sensors.unwatch(*gone);
        }
        self.watched = now_watched;
        let forests = Forest::by_namespace(
            desired_state_now
                .objects
                .values()
                .cloned()
                .chain(desired_state_now.pods.values().map(|p| p.object.clone())),
        );
        self.inventory_tx.send_replace(Arc::new(Inventory {
            pods: managed,
            forests,
        }));
        self.summary.set_targets(summary);
        self.state.metrics.set_plan(&plan);
        self.state
            .metrics
            .set_pod_requests(views.iter().map(|(k, v, _)| {
                let r = v.requests();
                (
                    k.namespace.as_str(),
                    k.name.as_str(),
                    r.cpu_millis(),
                    r.memory_bytes(),
                )
            }));
        let wanted: BTreeSet<&CgroupPath> = desired.cgroups.iter().map(|c| &c.path).collect();
        for c in &self.desired.cgroups {
            if matches!(c.role, Role::Pod | Role::Container) && !wanted.contains(&c.path) {
                self.stale.insert(c.path.clone());
            }
        }
        self.stale.retain(|p| !wanted.contains(p));
        self.targets = Some(targets);
        self.desired = desired;
        self.plan = Some(plan);
        self.refresh_status(conditions, statuses);
    }

    /// Where the Summary API reads one cgroup: the memory hierarchy and the v2 tree.
    fn stats_cgroup(
        &self,
        memory_tree: Option<Tree>,
        unified_tree: Option<Tree>,
        path: &CgroupPath,
    ) -> StatsCgroup {
        StatsCgroup {
            memory: memory_tree.map(|t| memory_cgroup(t, self.fs().display_path(t, path))),
            cpu: unified_tree.map(|t| self.fs().display_path(t, path)),
        }
    }

    /// The kubelet's system containers that exist here: `pods` (kubepods), `kubelet`
    /// (kubeReservedCgroup) and `misc` (systemReservedCgroup).
    fn system_containers(
        &self,
        plan: &Plan,
        memory_tree: Option<Tree>,
        unified_tree: Option<Tree>,
    ) -> Vec<(String, StatsCgroup)> {
        let n = &plan.node;
        [
            ("pods", &n.kubepods),
            ("kubelet", &n.kube_reserved),
            ("misc", &n.system_reserved),
        ]
        .into_iter()
        .filter_map(|(name, tier)| {
            let path =
                CgroupPath::under_root(tier.cgroup.as_deref()?, &self.naming.node_root).ok()?;
            let c = self.stats_cgroup(memory_tree, unified_tree, &path);
            c.memory
                .as_ref()
                .is_some_and(|m| m.path().is_dir())
                .then(|| (name.to_owned(), c))
        })
        .collect()
    }

    /// Every housekeeping interval: oom_score_adj of new processes, eviction results, status.
    pub fn housekeeping(
        &mut self,
        stats: &Arc<Mutex<EvictionStats>>,
        conditions: &[NodeCondition],
        sensors: &Sensors,
    ) {
        self.remove_stale();
        for cost in sensors.program_costs() {
            let last = self
                .last_run_ns
                .insert(cost.program.clone(), cost.run_time_ns);
            let delta = cost.run_time_ns.saturating_sub(last.unwrap_or(0));
            self.state
                .metrics
                .ebpf_program_run
                .get_or_create(&ProgramLabels {
                    program: cost.program,
                })
                .inc_by(delta as f64 * 1e-9);
        }
        let lost = sensors.events_lost();
        self.state
            .metrics
            .ebpf_events_lost
            .get_or_create(&RingLabels {
                ring: "EVENTS".into(),
            })
            .inc_by(lost.saturating_sub(self.last_lost));
        self.last_lost = lost;
        // Run-queue latency per pod, from the eBPF CPU sensor's kernel histograms.
        for (key, entry) in &mut self.pods {
            let mut seen = false;
            let (mut count, mut total) = (0, 0);
            let mut hist = [0u64; qoslet_common::sched::RUNQ_HIST_BUCKETS];
            for id in &entry.container_ids {
                // Only the eBPF sensor sees run-queue waits; its fallback leaves `runq` empty.
                if let Ok(Some(CpuUsage { runq: Some(w), .. })) = sensors.cpu_stats(*id) {
                    seen = true;
                    count += w.count;
                    total += w.total_ns;
                    for (h, n) in hist.iter_mut().zip(w.hist) {
                        *h += n;
                    }
                }
            }
            if seen {
                let h = self
                    .state
                    .metrics
                    .runqueue_latency
                    .get_or_create_owned(&PodLabels {
                        namespace: key.namespace.clone(),
                        pod: key.name.clone(),
                    });
                h.set(count, total, &hist);
                entry.runq_p99 = h.quantile_upper_bound(0.99);
            }
        }
        if let Some(t) = &self.targets {
            // Failures are logged by the scan itself, once per process and value.
            cgroup::scan_oom_scores(self.fs(), t, self.reconciler.mode());
        }
        let stats = stats.lock().map(|s| s.clone()).unwrap_or_default();
        for d in stats
            .recent
            .iter()
            .skip(self.evictions_seen.min(stats.recent.len()))
        {
            for pod in &d.pods {
                let qos = self
                    .plan
                    .as_ref()
                    .and_then(|p| {
                        p.pods
                            .iter()
                            .find(|pp| pp.namespace == pod.namespace && pp.name == pod.name)
                    })
                    .map_or("unknown".into(), |pp| format!("{:?}", pp.qos_class));
                self.state
                    .metrics
                    .evictions
                    .get_or_create(&EvictionLabels {
                        signal: d.signal.clone(),
                        qos_class: qos,
                    })
                    .inc();
                self.state.status.push_event(event(
                    &pod.to_string(),
                    format!(
                        "evicted: {} observed {} threshold {} ({})",
                        d.signal, d.observed, d.threshold, d.reason
                    ),
                ));
            }
            if let Some(l) = d.latency {
                self.state
                    .metrics
                    .eviction_decision_latency
                    .observe(l.as_secs_f64());
            }
        }
        self.evictions_seen = stats.recent.len();
        // The base of the Summary API's usageNanoCores.
        self.summary.sample_cpu();
        self.refresh_status(conditions, self.runtime.status());
    }

    pub fn on_sensor_event(&mut self, e: &SensorEvent) {
        match e {
            SensorEvent::Process { pid, cgroup_id, .. } => {
                if let Some(t) = &self.targets {
                    let _ = cgroup::apply_oom_score(
                        self.fs(),
                        t,
                        *pid as i32,
                        CgroupRef::Id(*cgroup_id),
                        self.reconciler.mode(),
                    );
                }
            }
            SensorEvent::OomVictim(v) => {
                let (ns, pod, container) = v
                    .owner
                    .as_ref()
                    .and_then(|o| {
                        self.pods
                            .iter()
                            .find(|(_, p)| p.view.uid == o.pod_uid)
                            .map(|(k, _)| {
                                (k.namespace.clone(), k.name.clone(), o.container.clone())
                            })
                    })
                    .unwrap_or_default();
                if !pod.is_empty() {
                    self.state
                        .metrics
                        .oom_kills
                        .get_or_create(&ContainerLabels {
                            namespace: ns.clone(),
                            pod: pod.clone(),
                            container: container.clone(),
                        })
                        .inc();
                }
                warn!(pid = v.pid, comm = %v.comm, pod = %format!("{ns}/{pod}"), container = %container, "Kernel OOM killer chose a victim.");
                self.state.status.push_event(event(
                    &format!("{ns}/{pod}"),
                    format!("kernel OOM kill: pid {} ({})", v.pid, v.comm),
                ));
            }
            SensorEvent::Memcg {
                memcg_id,
                kind,
                count,
                ..
            } => {
                // Node-level cgroups (node root, kubepods, QoS tiers) have no pod: empty labels.
                let labels = MemcgEventLabels {
                    event: kind.as_str().into(),
                    ..self.memcg_owners.get(memcg_id).cloned().unwrap_or_default()
                };
                self.state
                    .metrics
                    .memcg_events
                    .get_or_create(&labels)
                    .inc_by(*count);
            }
            _ => {}
        }
    }

    fn refresh_status(&self, conditions: &[NodeCondition], statuses: Vec<PodStatus>) {
        let Some(plan) = &self.plan else { return };
        let statuses: BTreeMap<PodKey, _> =
            statuses.into_iter().map(|s| (s.key.clone(), s)).collect();
        let rows = plan
            .pods
            .iter()
            .map(|p| {
                let entry = self
                    .pods
                    .iter()
                    .find(|(k, _)| k.namespace == p.namespace && k.name == p.name);
                let status = entry.and_then(|(k, _)| statuses.get(k));
                let working_set = entry
                    .and_then(|(_, e)| e.memory.as_ref())
                    .and_then(|m| m.read().ok())
                    .map(|r| r.working_set() as u64);
                PodRow {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    qos_class: format!("{:?}", p.qos_class),
                    phase: status.map_or_else(
                        || {
                            if self.enforce() {
                                "Pending".into()
                            } else {
                                "Planned".into()
                            }
                        },
                        |s| match &s.reason {
                            Some(r) => format!("{:?} ({r})", s.phase),
                            None => format!("{:?}", s.phase),
                        },
                    ),
                    cpu_weight: p.cpu_weight,
                    oom_score_adj: p
                        .containers
                        .iter()
                        .map(|c| format!("{}={}", c.name, c.oom_score_adj))
                        .collect(),
                    working_set_bytes: working_set,
                    memory_request_bytes: entry.map(|(_, e)| e.view.requests().memory_bytes()),
                    memory_limit_bytes: p.memory_limit_bytes,
                    runqueue_p99_seconds: entry.and_then(|(_, e)| e.runq_p99),
                    restarts: status
                        .map_or(0, |s| s.containers.iter().map(|c| c.restart_count).sum()),
                }
            })
            .collect();
        let mode = if self.enforce() { "enforce" } else { "observe" };
        self.state.status.update(|s| {
            s.node.mode = mode.into();
            s.node.memory_pressure = conditions.contains(&NodeCondition::MemoryPressure);
            s.node.pid_pressure = conditions.contains(&NodeCondition::PidPressure);
            s.pods = rows;
        });
    }

    /// Removes cgroups of pods that left the desired state once their processes are gone
    /// (rmdir fails while a cgroup has tasks; a later pass retries).
    fn remove_stale(&mut self) {
        if !self.enforce() || self.stale.is_empty() {
            return;
        }
        let trees: Vec<Tree> = self.fs().trees().collect();
        let mut paths: Vec<CgroupPath> = self.stale.iter().cloned().collect();
        paths.sort_by_key(|p| std::cmp::Reverse(p.depth()));
        for p in paths {
            let mut all_gone = true;
            for t in &trees {
                let dir = self.fs().display_path(*t, &p);
                if dir.is_dir() && std::fs::remove_dir(&dir).is_err() {
                    all_gone = false;
                }
            }
            if all_gone {
                self.stale.remove(&p);
            }
        }
    }

    /// Removes the cgroups of the desired state qoslet created, deepest first (pods are stopped).
    pub fn remove_cgroups(&self) {
        let trees: Vec<Tree> = self.fs().trees().collect();
        let mut paths: Vec<&CgroupPath> = self
            .desired
            .cgroups
            .iter()
            .filter(|c| c.role != Role::Reserved)
            .map(|c| &c.path)
            .chain(&self.stale)
            .collect();
        paths.sort_by_key(|p| std::cmp::Reverse(p.depth()));
        for p in paths {
            for t in &trees {
                let dir = self.fs().display_path(*t, p);
                if dir.is_dir()
                    && let Err(e) = std::fs::remove_dir(&dir)
                {
                    warn!(path = %dir.display(), error = %e, "Could not remove a cgroup qoslet created.");
                }
            }
        }
    }
}

fn event(pod: &str, message: String) -> EventRow {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    EventRow {
        time: format!("{}.{:03}", now.as_secs(), now.subsec_millis()),
        pod: pod.into(),
        message,
    }
}

/// The eviction action of the standalone node: the runtime marks the pod Evicted (so it is not
/// restarted and its phase is Failed) and the cgroup-wide kill makes sure nothing survives.
pub struct RuntimeEviction<A> {
    runtime: Arc<Runtime>,
    kill: A,
}

impl<A> RuntimeEviction<A> {
    pub fn new(runtime: Arc<Runtime>, kill: A) -> Self {
        Self { runtime, kill }
    }
}

impl<A: EvictionAction> EvictionAction for RuntimeEviction<A> {
    async fn evict(
        &self,
        pod: &EvictionKey,
        cgroups: &PodCgroups,
        grace: std::time::Duration,
        message: &str,
    ) -> Result<Outcome, ActionError> {
        let key = self
            .runtime
            .status()
            .into_iter()
            .map(|s| s.key)
            .find(|k| k.namespace == pod.namespace && k.name == pod.name);
        if let Some(k) = &key {
            self.runtime.mark_evicted(k, message, grace);
        }
        self.kill.evict(pod, cgroups, grace, message).await
    }
}
/// Every file is read again at least this often, for changes inotify cannot see (the kernel
/// itself narrowing a v1 cpuset when a CPU goes offline).
const FULL_RECONCILE_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// The reconciler reading only what inotify says may have changed; every file on each pass
/// when inotify is unavailable (out of instances), which is slower but as correct.
fn with_change_feed(mut reconciler: Reconciler) -> Reconciler {
    if let Err(e) = reconciler.enable_change_feed(FULL_RECONCILE_EVERY) {
        tracing::warn!(error = %e, "No inotify for the cgroup change feed; every pass reads every cgroup file.");
    }
    reconciler
}
