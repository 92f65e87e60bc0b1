//! One pass of the node: the source's pods -> plan -> cgroups -> executor -> eviction inventory,
//! sensors' watch list, metrics and status. Runs on every change of the source, of the node
//! conditions (admission), and when a managed cgroup was removed behind qoslet's back.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use tracing::warn;

use super::{
    Node,
    seams::{PlannedPod, PodExecutor},
    sensing::SensorControl,
    summary::{PodTarget, StatsCgroup, SummaryTargets},
    trees::{cgroup_id, memory_tree, unified_tree},
};
use crate::{
    cgroup::{
        CgroupBeneath, CgroupPath, DesiredState, Tree, desired::Role, desired_state,
        layout::Controller,
    },
    eviction::{
        Inventory, ManagedContainer, ManagedPod, MemoryCgroup, NodeCondition, PodCgroups, SeenPod,
    },
    hub::metrics::MemcgEventLabels,
    hub::summary::PodReference,
    policy::{
        plan::{Plan, PodPlan, plan_node},
        pod::{PodKey, PodSpecView},
        qos::QosClass,
        quantity::Quantity,
    },
    sensors::{CgroupOwner, WatchedCgroup},
    source::{ManifestPod, PodSet},
    workload::Forest,
};

/// What one pod is on this node, after a pass.
pub(super) struct PodEntry {
    pub(super) view: PodSpecView,
    pub(super) qos: QosClass,
    pub(super) memory: Option<MemoryCgroup>,
    /// cgroup v2 ids of the pod's container cgroups (unified tree on hybrid hosts): the CPU
    /// sensor keys by the task's own cgroup.
    pub(super) container_ids: Vec<u64>,
    /// Run-queue latency p99 (bucket upper bound, seconds), from the last statistics sample.
    pub(super) runq_p99: Option<f64>,
    /// Working set (bytes) at the last statistics sample.
    pub(super) working_set: Option<u64>,
}

/// A source pod the pass can plan: its key, its policy view (computed at admission) and the pod.
type PodView<'a> = (PodKey, &'a PodSpecView, &'a ManifestPod);

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
    /// Pods that ended evicted: tracked, but no longer eviction candidates.
    evicted: BTreeSet<PodKey>,
}

impl Node {
    /// The whole pass.
    pub(crate) fn pass(
        &mut self,
        pods: &PodSet,
        executor: &impl PodExecutor,
        conditions: &[NodeCondition],
        sensors: &impl SensorControl,
    ) {
        let views = self.read_pods(pods, executor);
        let Some((plan, desired)) = self.plan_pods(&views, pods, executor) else {
            return;
        };
        self.cgroups.reconcile(&desired, &self.report);
        let placement = self.place(&desired);
        self.apply_executor(pods, &plan, &views, &placement, executor, conditions);
        let (managed, summary, evicted) =
            self.track_pods(&plan, &views, &placement, executor, sensors);
        self.refresh_inventory(pods, managed, &evicted);
        self.summary.set_targets(summary);
        self.report
            .record_plan(&plan, views.iter().map(|(k, v, _)| (k, *v)));
        self.cgroups.set_desired(desired);
        self.plan = Some(plan);
        self.refresh_status(conditions, executor.status());
    }

    /// The source's pods with their policy views; a pod the executor cannot run is a problem,
    /// reported once, and nothing of it is planned.
    fn read_pods<'a>(&mut self, pods: &'a PodSet, executor: &impl PodExecutor) -> Vec<PodView<'a>> {
        let mut views = Vec::new();
        let mut problems = Vec::new();
        for (key, mp) in &pods.pods {
            match executor.accepts(mp) {
                Ok(()) => views.push((key.clone(), &mp.view, mp)),
                Err(e) => problems.push(e),
            }
        }
        self.report.problems(&problems);
        views
    }

    /// The node plan and the cgroups it wants; `None` keeps the last plan.
    fn plan_pods(
        &mut self,
        views: &[PodView<'_>],
        pods: &PodSet,
        executor: &impl PodExecutor,
    ) -> Option<(Plan, DesiredState)> {
        let pod_views: Vec<PodSpecView> = views.iter().map(|(_, v, _)| (*v).clone()).collect();
        let plan = match plan_node(&self.settings, &pod_views) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "The node plan failed; keeping the last one.");
                return None;
            }
        };
        let mut desired = desired_state(&plan, &self.cgroups.naming, &executor.container_ids(pods));
        self.constrain_besteffort(&plan, &mut desired);
        let refused: Vec<String> = desired
            .refused_pods
            .iter()
            .map(|r| format!("{r}: {}", r.source))
            .collect();
        self.report.problems(&refused);
        Some((plan, desired))
    }

    /// Where each pod and container lives, in every hierarchy.
    fn place(&self, desired: &DesiredState) -> Placement {
        let trees: Vec<Tree> = self.cgroups.fs().trees().collect();
        let mut pod_paths = BTreeMap::new();
        let mut container_paths = BTreeMap::new();
        for c in &desired.cgroups {
            let Some(uid) = &c.pod_uid else { continue };
            match c.role {
                Role::Pod => {
                    pod_paths.insert(uid.clone(), c.path.clone());
                }
                Role::Container => {
                    if let Some(name) = &c.container {
                        container_paths.insert((uid.clone(), name.clone()), c.path.clone());
                    }
                }
                _ => {}
            }
        }
        Placement {
            memory_tree: memory_tree(trees.iter().copied()),
            unified_tree: unified_tree(trees.iter().copied()),
            cpu_tree: trees
                .iter()
                .copied()
                .find(|t| *t == Tree::V1(Controller::Cpu)),
            trees,
            pod_paths,
            container_paths,
        }
    }

    /// Hands the planned pods to the executor (enforce mode), with each container's cgroup
    /// directories. Pods evicted earlier and not changed since are not handed over again.
    fn apply_executor(
        &mut self,
        pods: &PodSet,
        plan: &Plan,
        views: &[PodView<'_>],
        placement: &Placement,
        executor: &impl PodExecutor,
        conditions: &[NodeCondition],
    ) {
        if !self.cgroups.enforce() {
            return;
        }
        let held = pods.held_pods(&self.validation);
        let planned: Vec<PlannedPod<'_>> = views
            .iter()
            .zip(&plan.pods)
            .filter(|((key, _, mp), _)| {
                !crate::support::lock(&self.persisted).is_evicted(key, mp.spec_hash)
            })
            .map(|((key, view, pod), p)| PlannedPod {
                key: key.clone(),
                pod,
                qos_class: p.qos_class,
                critical: view.is_critical(),
                held: held.get(key).cloned(),
                container_cgroups: view
                    .containers
                    .iter()
                    .filter_map(|c| {
                        let path = placement
                            .container_paths
                            .get(&(view.uid.clone(), c.name.clone()))?;
                        let dirs = placement
                            .trees
                            .iter()
                            .map(|&tree| CgroupBeneath::new(self.cgroups.fs(), tree, path))
                            .collect();
                        Some((c.name.clone(), dirs))
                    })
                    .collect(),
            })
            .collect();
        let problems = executor.apply(planned, conditions);
        self.report.problems(&problems);
        crate::support::lock(&self.persisted).retain_present(pods);
    }

    /// Eviction inventory, sensors' watch list, summary sources, memcg owners.
    fn track_pods(
        &mut self,
        plan: &Plan,
        views: &[PodView<'_>],
        placement: &Placement,
        executor: &impl PodExecutor,
        sensors: &impl SensorControl,
    ) -> (Vec<ManagedPod>, SummaryTargets, BTreeSet<PodKey>) {
        let old_pods = std::mem::take(&mut self.tracked.pods);
        self.tracked.memcg_owners.clear();
        // Pods that already ended evicted are not candidates again (after a restart, too).
        let evicted: BTreeSet<PodKey> = executor
            .status()
            .into_iter()
            .filter(super::PodStatus::is_evicted)
            .map(|s| s.key)
            .chain(crate::support::lock(&self.persisted).evicted())
            .collect();
        let mut tracked = Tracked {
            now_watched: BTreeSet::new(),
            managed: Vec::new(),
            summary: SummaryTargets {
                system: self.system_containers(plan, placement.memory_tree, placement.unified_tree),
                pods: Vec::new(),
            },
            evicted,
        };
        for (view, p) in views.iter().zip(&plan.pods) {
            let previous = old_pods.get(&view.0);
            self.track_pod(view, p, placement, sensors, previous, &mut tracked);
        }
        for (key, old) in &old_pods {
            if !self.tracked.pods.contains_key(key) {
                let containers: Vec<&str> = old
                    .view
                    .containers
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect();
                self.report.state.metrics.drop_pod(
                    &key.namespace,
                    &key.name,
                    &key.uid,
                    &containers,
                );
            }
        }
        let Tracked {
            now_watched,
            managed,
            summary,
            evicted,
        } = tracked;
        for gone in self.tracked.watched.difference(&now_watched) {
            sensors.unwatch(*gone);
        }
        self.tracked.watched = now_watched;
        (managed, summary, evicted)
    }

    /// One pod with a cgroup: its eviction inventory entry, its cgroups for the sensors and the
    /// Summary API, its memcg owners and its `PodEntry`.
    fn track_pod(
        &mut self,
        (key, view, pod): &PodView<'_>,
        p: &PodPlan,
        placement: &Placement,
        sensors: &impl SensorControl,
        previous: Option<&PodEntry>,
        tracked: &mut Tracked,
    ) {
        let Some(path) = placement.pod_paths.get(&view.uid) else {
            return;
        };
        let (memory_tree, unified_tree) = (placement.memory_tree, placement.unified_tree);
        let dirs: Vec<CgroupBeneath> = placement
            .trees
            .iter()
            .map(|&tree| CgroupBeneath::new(self.cgroups.fs(), tree, path))
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
            if !tracked.evicted.contains(key) {
                tracked.managed.push(ManagedPod {
                    key: key.clone(),
                    qos: p.qos_class,
                    request_bytes: crate::policy::eviction::eviction_request_bytes(view),
                    priority: view.effective_priority(),
                    critical: view.is_critical(),
                    start_time: pod
                        .pod
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or(0, |t| t.0.as_second()),
                    grace_secs: pod
                        .pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                        .unwrap_or(30),
                    revision: pod.spec_hash,
                    memory: memory.clone(),
                    cgroups: PodCgroups {
                        procs: dirs,
                        unified: unified.clone(),
                    },
                    containers: managed_containers(view, &containers),
                    pod_memory_request: self
                        .settings
                        .pod_level_resources
                        .then(|| pod_memory_request(&pod.pod))
                        .flatten(),
                    seen: SeenPod::of(&pod.pod),
                });
            }
            if let Some(id) = cgroup_id(memory.dir()) {
                self.tracked.memcg_owners.insert(id, owner(""));
            }
        }
        if let Some(u) = &unified
            && let Some(id) = cgroup_id(u)
            && tracked.now_watched.insert(id)
            && !self.tracked.watched.contains(&id)
        {
            sensors.watch(WatchedCgroup {
                id,
                v2_dir: Some(u.clone()),
                memory_dir: memory.as_ref().map(|m| m.dir().clone()),
                cpu_dir: placement
                    .cpu_tree
                    .map(|tree| CgroupBeneath::new(self.cgroups.fs(), tree, path)),
            });
        }
        let mut container_ids = Vec::new();
        for (name, c) in &containers {
            if let Some(id) = c.memory.as_ref().and_then(|m| cgroup_id(m.dir())) {
                self.tracked.memcg_owners.insert(id, owner(name));
            }
            // The CPU sensor keys by the task's own (v2) cgroup.
            let Some(id) = c.cpu.as_ref().and_then(cgroup_id) else {
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
            if !self.tracked.watched.contains(&id) {
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
        let (runq_p99, working_set) =
            previous.map_or((None, None), |e| (e.runq_p99, e.working_set));
        self.tracked.pods.insert(
            key.clone(),
            PodEntry {
                view: (*view).clone(),
                qos: p.qos_class,
                memory,
                container_ids,
                runq_p99,
                working_set,
            },
        );
    }

    /// The eviction manager's new inventory: the managed pods and the workload objects above
    /// them, the pods that ended evicted counted Failed there (the API may not show it yet), so
    /// that gangs count right without the manager remembering its evictions for good.
    fn refresh_inventory(
        &self,
        pods: &PodSet,
        managed: Vec<ManagedPod>,
        evicted: &BTreeSet<PodKey>,
    ) {
        let mut forests = Forest::by_namespace(pods.workload_objects().cloned());
        for k in evicted {
            if let Some(p) = forests
                .get_mut(&k.namespace)
                .and_then(|f| f.pods.get_mut(&k.name))
            {
                p.phase = Some("Failed".into());
            }
        }
        self.inventory_tx.send_replace(Arc::new(Inventory {
            pods: managed,
            forests,
        }));
    }
}

/// The eviction manager's containers of a pod: those of its stats (`containers`, in the Summary
/// API's order) with a memory cgroup, each with its memory request from the spec.
fn managed_containers(
    view: &PodSpecView,
    containers: &[(String, StatsCgroup)],
) -> Vec<ManagedContainer> {
    containers
        .iter()
        .filter_map(|(name, c)| {
            Some(ManagedContainer {
                name: name.clone(),
                memory_request: view
                    .containers
                    .iter()
                    .find(|v| v.name == *name)
                    .and_then(|v| v.resources.requests.memory),
                memory: c.memory.clone()?,
            })
        })
        .collect()
}

/// Pod-level `spec.resources.requests.memory` as the object sets it: the kubelet's eviction
/// message reads `pod.Spec.Resources.Requests[memory]` (helpers.go `evictionMessage`, line
/// 1256) as given, which for an API pod the API server has defaulted (1.37:
/// `PrepareForCreate`, gate `PodLevelResourcesFixDefaulting`), not the view's request defaulted
/// from the limit. A quantity that does not parse was refused at admission; here it is unset.
fn pod_memory_request(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Quantity> {
    pod.spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("memory")?
        .0
        .parse()
        .ok()
}
