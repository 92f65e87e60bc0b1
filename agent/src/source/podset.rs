//! What a source yields: the valid pods and workload objects ([`PodSet`]), and what changed
//! between two of them ([`Diff`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
};

use k8s_openapi::api::core::v1 as core;

use crate::{
    policy::pod::{PodKey, PodSpecView},
    workload::{self, Forest, Kind, Object, ValidationOptions},
};

/// A workload object's identity: namespace, kind and name.
pub(crate) type ObjectKey = (String, Kind, String);

/// A pod a source yields: the API object and what is derived from it, each computed once, at
/// admission (`source/admit.rs`), and carried to the plan and the executor.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestPod {
    pub(crate) pod: core::Pod,
    /// Its workload-hierarchy view.
    pub(crate) object: Object,
    /// The policy's view.
    pub(crate) view: PodSpecView,
    /// [`spec_hash`] of the pod: recorded with an eviction, a changed spec makes a new pod.
    pub(crate) spec_hash: u64,
}

/// A hash of the pod's spec, stable across runs of the same build.
pub(crate) fn spec_hash(pod: &core::Pod) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    serde_json::to_vec(&pod.spec)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// The valid objects of the directory, and the problems of the invalid ones.
#[derive(Debug, Clone, Default)]
pub struct PodSet {
    pub pods: BTreeMap<PodKey, ManifestPod>,
    /// Workloads, PodGroups and CompositePodGroups.
    pub(crate) objects: BTreeMap<ObjectKey, Object>,
    /// Every current problem line, sorted.
    pub problems: BTreeSet<String>,
    /// Every current warning line (a manifest's unknown field, dropped), sorted.
    pub(crate) warnings: BTreeSet<String>,
    /// Files that could not be read or hold a document that does not parse or decode.
    pub(crate) broken_files: BTreeSet<PathBuf>,
    /// Broken files whose last good objects are kept in this state for the parse grace period.
    pub(crate) held_files: BTreeSet<PathBuf>,
}

/// What changed between two loads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub pods_added: Vec<PodKey>,
    pub pods_changed: Vec<PodKey>,
    pub pods_removed: Vec<PodKey>,
    pub(crate) objects_added: Vec<ObjectKey>,
    pub(crate) objects_changed: Vec<ObjectKey>,
    pub(crate) objects_removed: Vec<ObjectKey>,
    /// Problem lines that were not reported by the previous load.
    pub new_problems: Vec<String>,
    /// Warning lines that were not reported by the previous load.
    pub new_warnings: Vec<String>,
}

impl Diff {
    pub(crate) fn is_empty(&self) -> bool {
        *self == Diff::default()
    }
}

impl PodSet {
    /// Every workload object and pod, as the workload module reads them.
    pub(crate) fn workload_objects(&self) -> impl Iterator<Item = &Object> {
        self.objects
            .values()
            .chain(self.pods.values().map(|p| &p.object))
    }

    /// The pods workload gating lets start now (`workload::startable`, per namespace).
    #[cfg(test)]
    pub(crate) fn startable_pods(&self, opts: &ValidationOptions) -> BTreeSet<PodKey> {
        let held = self.held_pods(opts);
        self.pods
            .keys()
            .filter(|k| !held.contains_key(*k))
            .cloned()
            .collect()
    }

    /// The pods workload gating holds, each with why (`workload::held`, per namespace).
    pub(crate) fn held_pods(&self, opts: &ValidationOptions) -> BTreeMap<PodKey, String> {
        let mut why: BTreeMap<(String, String), String> = BTreeMap::new();
        for (ns, forest) in Forest::by_namespace(self.workload_objects().cloned()) {
            for (name, reason) in workload::held(&forest, opts) {
                why.insert((ns.clone(), name), reason);
            }
        }
        self.pods
            .iter()
            .filter_map(|(k, p)| {
                let m = p.object.meta();
                let reason = why.get(&(m.namespace.clone(), m.name.clone()))?;
                Some((k.clone(), reason.clone()))
            })
            .collect()
    }
}

/// What changed from `old` to `new`.
pub(crate) fn diff(old: &PodSet, new: &PodSet) -> Diff {
    fn split<K: Ord + Clone, V: PartialEq>(
        old: &BTreeMap<K, V>,
        new: &BTreeMap<K, V>,
    ) -> (Vec<K>, Vec<K>, Vec<K>) {
        let added = new
            .keys()
            .filter(|k| !old.contains_key(*k))
            .cloned()
            .collect();
        let changed = new
            .iter()
            .filter(|(k, v)| old.get(*k).is_some_and(|o| o != *v))
            .map(|(k, _)| k.clone())
            .collect();
        let removed = old
            .keys()
            .filter(|k| !new.contains_key(*k))
            .cloned()
            .collect();
        (added, changed, removed)
    }
    let (pods_added, pods_changed, pods_removed) = split(&old.pods, &new.pods);
    let (objects_added, objects_changed, objects_removed) = split(&old.objects, &new.objects);
    Diff {
        pods_added,
        pods_changed,
        pods_removed,
        objects_added,
        objects_changed,
        objects_removed,
        new_problems: new.problems.difference(&old.problems).cloned().collect(),
        new_warnings: new.warnings.difference(&old.warnings).cloned().collect(),
    }
}

pub(super) fn object_key(o: &Object) -> ObjectKey {
    let m = o.meta();
    (m.namespace.clone(), o.kind(), m.name.clone())
}

pub(super) fn pod_key(p: &ManifestPod) -> PodKey {
    let m = &p.pod.metadata;
    let namespace = m.namespace.clone().unwrap_or_else(|| "default".into());
    let name = m.name.clone().unwrap_or_default();
    let uid = m
        .uid
        .clone()
        .unwrap_or_else(|| crate::policy::pod::derived_uid(&namespace, &name));
    PodKey {
        namespace,
        name,
        uid,
    }
}
