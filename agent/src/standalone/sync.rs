//! One pass of the standalone node: manifests -> plan -> cgroups -> runtime -> eviction inventory,
//! metrics and status.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::Arc,
    time::Instant,
};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    cgroup::{
        CgroupFs, CgroupPath, ContainerIds, DesiredState, Mode, Naming, OomTargets, Reconciler,
        Tree, WriteResult, desired::Role, desired_state, layout::Controller,
    },
    eviction::{
        Admission, Inventory, ManagedPod, MemoryCgroup, NodeCondition, PodCgroups,
        PodKey as EvictionKey, admit,
    },
    policy::{
        plan::{Plan, PodPlan, plan_node},
        pod::PodSpecView,
        qos::QosClass,
        settings::NodeSettings,
    },
    runtime::{ContainerCgroups, PodKey, PodRuntimeSpec, PodStatus, Runtime},
    sensors::{CgroupOwner, Sensors, WatchedCgroup},
    server::{AgentState, metrics::MemcgEventLabels, summary::PodReference},
    source::{PodSet as Manifests, watch::ManifestWatch},
    workload::{Forest, ValidationOptions},
};

use super::{
    summary::{CgroupSummary, PodTarget, StatsCgroup, SummaryTargets},
    trees::{cgroup_id, memory_tree, unified_tree},
};

/// What one pod is on this node, after a pass.
pub(super) struct PodEntry {
    pub(super) view: PodSpecView,
    pub(super) memory: Option<MemoryCgroup>,
    /// cgroup v2 ids of the pod's container cgroups (unified tree on hybrid hosts): the CPU
    /// sensor keys by the task's own cgroup.
    pub(super) container_ids: Vec<u64>,
    /// Run-queue latency p99 (bucket upper bound, seconds), from the last housekeeping.
    pub(super) runq_p99: Option<f64>,
}

pub struct Synced {
    settings: NodeSettings,
    pub(super) naming: Naming,
    pub(super) reconciler: Reconciler,
    pub(super) runtime: Arc<Runtime>,
    pub(super) state: Arc<AgentState>,
    validation: ValidationOptions,
    inventory_tx: watch::Sender<Arc<Inventory>>,
    /// memcg ids of the node root, whose memcg events wake the eviction manager.
    pub node_memory_ids: Vec<u64>,
    pub(super) targets: Option<OomTargets>,
    pub(super) desired: DesiredState,
    pub(super) plan: Option<Plan>,
    pub(super) pods: BTreeMap<PodKey, PodEntry>,
    pub(super) summary: CgroupSummary,
    /// memcg ids (memory cgroup inodes) of pods and containers, with their memcg event labels
    /// (`event` left empty).
    pub(super) memcg_owners: BTreeMap<u64, MemcgEventLabels>,
    pub(super) reported: BTreeSet<String>,
    pub(super) evictions_seen: usize,
    /// Pod and container cgroups no longer desired, removed once their processes are gone.
    pub(super) stale: BTreeSet<CgroupPath>,
    /// cgroup ids handed to the sensors, so each is watched once and unwatched when it goes.
    watched: BTreeSet<u64>,
    /// Kernel run time per program and lost records at the last housekeeping (counters grow by
    /// the difference).
    pub(super) last_run_ns: BTreeMap<String, u64>,
    pub(super) last_lost: u64,
}

/// A manifest pod the pass can plan: its key, its policy view and the manifest itself.
type PodView<'a> = (PodKey, PodSpecView, &'a Pod);

/// Where the pass puts each pod and container, in every hierarchy.
struct Placement {
    trees: Vec<Tree>,
    memory_tree: Option<Tree>,
    unified_tree: Option<Tree>,
    /// The v1 cpu hierarchy, for the sensors' CPU fallback (throttling, cpuacct.usage).
    cpu_tree: Option<Tree>,
    /// Pod cgroups by pod uid.
    pod_paths: BTreeMap<String, CgroupPath>,
    /// Container cgroups by pod uid and container name.
    container_paths: BTreeMap<(String, String), CgroupPath>,
}

/// What the pass gathers pod by pod for the eviction manager, the sensors and the Summary API.
struct Tracked {
    /// cgroup ids the sensors watch after this pass.
    now_watched: BTreeSet<u64>,
    managed: Vec<ManagedPod>,
    summary: SummaryTargets,
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

    pub(super) fn fs(&self) -> &CgroupFs {
        self.reconciler.fs()
    }

    pub(super) fn enforce(&self) -> bool {
        self.reconciler.mode() == Mode::Enforce
    }

    /// The whole pass.
    pub fn sync(
        &mut self,
        manifests: &ManifestWatch,
        conditions: &[NodeCondition],
        sensors: &Sensors,
    ) {
        let desired_state_now = manifests.state();
        let (views, mut specs) = self.read_pods(desired_state_now);
        let Some((plan, desired)) = self.plan_pods(&views) else {
            return;
        };
        let targets = self.reconcile_cgroups(&desired);
        let placement = self.place(&desired, &mut specs);
        let statuses = self.apply_runtime(desired_state_now, &plan, &views, specs, conditions);
        let (managed, summary) = self.track_pods(&plan, &views, &placement, sensors);
        self.refresh_inventory(desired_state_now, managed);
        self.summary.set_targets(summary);
        self.record_plan(&plan, &views);
        self.note_stale(&desired);
        self.targets = Some(targets);
        self.desired = desired;
        self.plan = Some(plan);
        self.refresh_status(conditions, statuses);
    }

    /// The manifest pods as policy views and runtime specs; a pod that fails either is a problem.
    fn read_pods<'a>(
        &mut self,
        desired_state_now: &'a Manifests,
    ) -> (Vec<PodView<'a>>, Vec<PodRuntimeSpec>) {
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
        (views, specs)
    }

    /// The node plan and the cgroups it wants; `None` keeps the last plan.
    fn plan_pods(&mut self, views: &[PodView<'_>]) -> Option<(Plan, DesiredState)> {
        let pod_views: Vec<PodSpecView> = views.iter().map(|(_, v, _)| v.clone()).collect();
        let plan = match plan_node(&self.settings, &pod_views) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "The node plan failed; keeping the last one.");
                return None;
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
        Some((plan, desired))
    }

    /// Writes (or, observing, compares) the cgroup files and logs what went wrong; then the
    /// oom_score_adj targets of the new desired state.
    fn reconcile_cgroups(&self, desired: &DesiredState) -> OomTargets {
        let started = Instant::now();
        let report = self.reconciler.reconcile(desired);
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
        OomTargets::new(self.fs(), desired)
    }

    /// Where each pod and container lives, in every hierarchy; the containers' directories go
    /// into their runtime specs.
    fn place(&self, desired: &DesiredState, specs: &mut [PodRuntimeSpec]) -> Placement {
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
        for spec in specs {
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
        Placement {
            trees,
            memory_tree,
            unified_tree,
            cpu_tree,
            pod_paths,
            container_paths,
        }
    }

    /// Hands the specs to the runtime (enforce mode), which starts only the pods admission lets
    /// start; returns the runtime's status from before, for the status table.
    fn apply_runtime(
        &self,
        desired_state_now: &Manifests,
        plan: &Plan,
        views: &[PodView<'_>],
        specs: Vec<PodRuntimeSpec>,
        conditions: &[NodeCondition],
    ) -> Vec<PodStatus> {
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
            .zip(views)
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
        statuses
    }

    /// Eviction inventory, sensors' watch list, summary sources, memcg owners.
    fn track_pods(
        &mut self,
        plan: &Plan,
        views: &[PodView<'_>],
        placement: &Placement,
        sensors: &Sensors,
    ) -> (Vec<ManagedPod>, SummaryTargets) {
        let old_pods = std::mem::take(&mut self.pods);
        self.memcg_owners.clear();
        let mut tracked = Tracked {
            now_watched: BTreeSet::new(),
            managed: Vec::new(),
            summary: SummaryTargets {
                system: self.system_containers(plan, placement.memory_tree, placement.unified_tree),
                pods: Vec::new(),
            },
        };
        for (view, p) in views.iter().zip(&plan.pods) {
            self.track_pod(view, p, placement, sensors, &mut tracked);
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
        let Tracked {
            now_watched,
            managed,
            summary,
        } = tracked;
        for gone in self.watched.difference(&now_watched) {
            sensors.unwatch(*gone);
        }
        self.watched = now_watched;
        (managed, summary)
    }

    /// One pod with a cgroup: its eviction inventory entry, its cgroups for the sensors and the
    /// Summary API, its memcg owners and its `PodEntry`.
    fn track_pod(
        &mut self,
        (key, view, pod): &PodView<'_>,
        p: &PodPlan,
        placement: &Placement,
        sensors: &Sensors,
        tracked: &mut Tracked,
    ) {
        let Some(path) = placement.pod_paths.get(&view.uid) else {
            return;
        };
        let (memory_tree, unified_tree) = (placement.memory_tree, placement.unified_tree);
        let dirs: Vec<PathBuf> = placement
            .trees
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
                let cpath = placement
                    .container_paths
                    .get(&(view.uid.clone(), c.name.clone()))?;
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
            tracked.managed.push(ManagedPod {
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
            && tracked.now_watched.insert(id)
            && !self.watched.contains(&id)
        {
            sensors.watch(WatchedCgroup {
                id,
                v2_dir: Some(u.clone()),
                memory_dir: memory.as_ref().map(|m| m.path().to_path_buf()),
                cpu_dir: placement.cpu_tree.map(|t| self.fs().display_path(t, path)),
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
            tracked.now_watched.insert(id);
            if !self.watched.contains(&id) {
                sensors.watch(WatchedCgroup {
                    id,
                    v2_dir: None,
                    memory_dir: None,
                    cpu_dir: None,
                });
            }
        }
        tracked.summary.pods.push(PodTarget {
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

    /// The eviction manager's new inventory: the managed pods and the workload objects above
    /// them.
    fn refresh_inventory(&self, desired_state_now: &Manifests, managed: Vec<ManagedPod>) {
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
    }

    /// The plan's and the pods' requests in the metrics.
    fn record_plan(&self, plan: &Plan, views: &[PodView<'_>]) {
        self.state.metrics.set_plan(plan);
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
