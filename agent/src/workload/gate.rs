//! Gating and admissibility: what the scheduler holds and what it lets start (seed 002 "생성 순서",
//! KEP-4671 gang semantics, KEP-6012 composite groups).
//!
//! A group whose parent (or Workload) does not exist yet, or a pod whose PodGroup does not, is
//! held until every ancestor exists. A hierarchy that fails validation is held as a whole. A
//! released pod starts only when every group from its PodGroup up to the root is admissible, so
//! with gang policy nothing of a hierarchy starts until the root is admissible.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use super::{
    forest::Forest,
    problem::Rule,
    types::{Kind, ObjRef, Policy},
    validate::{ValidationOptions, validate},
};

/// Whether the scheduler would consider an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    Released,
    Held(HoldReason),
}

/// Why an object is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HoldReason {
    /// An ancestor (parent group, PodGroup or Workload) does not exist yet.
    Missing { ancestor: ObjRef },
    /// Its hierarchy fails validation: unschedulable as a whole.
    Invalid { rule: Rule, object: ObjRef },
}

impl fmt::Display for HoldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldReason::Missing { ancestor } => write!(f, "waiting for {ancestor} to exist"),
            HoldReason::Invalid { rule, object } => {
                write!(f, "hierarchy unschedulable: {rule} on {object}")
            }
        }
    }
}

/// The nearest missing ancestor of a group: its Workload, its parent, theirs, ...
pub(crate) fn missing_ancestor(f: &Forest, g: &ObjRef) -> Option<ObjRef> {
    let mut cur = g.clone();
    let mut seen = BTreeSet::new();
    while seen.insert(cur.clone()) {
        let group = f.groups.get(&cur)?;
        if let Some(r) = &group.workload_ref
            && !f.workloads.contains_key(&r.workload_name)
        {
            return Some(ObjRef::new(Kind::Workload, &r.workload_name));
        }
        let parent = f.parent_ref(&cur)?;
        if !f.groups.contains_key(&parent) {
            return Some(parent);
        }
        cur = parent;
    }
    None // a cycle: validation reports it
}

/// The gate of every group and pod of the forest (Workloads are never held).
pub(crate) fn gate(f: &Forest, opts: &ValidationOptions) -> BTreeMap<ObjRef, Gate> {
    // Hierarchies touched by a problem, with the first problem's rule and object.
    let mut invalid: BTreeMap<ObjRef, HoldReason> = BTreeMap::new();
    for p in validate(f, opts) {
        let Some(obj) = &p.object else { continue };
        let keys: Vec<ObjRef> = match obj.kind {
            Kind::Workload => f
                .groups
                .values()
                .filter(|g| {
                    g.workload_ref
                        .as_ref()
                        .is_some_and(|r| r.workload_name == obj.name)
                })
                .map(|g| f.hierarchy_key(&g.obj_ref()))
                .collect(),
            Kind::Pod => f
                .group_of_pod(&obj.name)
                .filter(|g| f.groups.contains_key(g))
                .map(|g| f.hierarchy_key(&g))
                .into_iter()
                .collect(),
            _ if f.groups.contains_key(obj) => vec![f.hierarchy_key(obj)],
            _ => Vec::new(),
        };
        for k in keys {
            invalid.entry(k).or_insert_with(|| HoldReason::Invalid {
                rule: p.rule,
                object: obj.clone(),
            });
        }
    }
    let group_gate = |g: &ObjRef| -> Gate {
        if let Some(ancestor) = missing_ancestor(f, g) {
            return Gate::Held(HoldReason::Missing { ancestor });
        }
        match invalid.get(&f.hierarchy_key(g)) {
            Some(r) => Gate::Held(r.clone()),
            None => Gate::Released,
        }
    };
    let mut out = BTreeMap::new();
    for g in f.groups.keys() {
        out.insert(g.clone(), group_gate(g));
    }
    for (name, p) in &f.pods {
        let gate = match &p.pod_group {
            None => Gate::Released, // not part of any hierarchy
            Some(pg) => {
                let g = ObjRef::new(Kind::PodGroup, pg);
                match out.get(&g) {
                    None => Gate::Held(HoldReason::Missing { ancestor: g }),
                    Some(gate) => gate.clone(),
                }
            }
        };
        out.insert(ObjRef::new(Kind::Pod, name), gate);
    }
    out
}

/// A leaf is admissible with at least minCount live pods (basic: at least one); a composite with
/// at least minGroupCount admissible children (basic: at least one) (KEP-4671, KEP-6012).
pub(crate) fn admissible(f: &Forest, g: &ObjRef) -> bool {
    admissible_except(f, g, &BTreeSet::new(), &mut BTreeSet::new())
}

/// Admissibility as if the pods in `without` were gone. `visiting` guards against cycles.
pub(crate) fn admissible_except(
    f: &Forest,
    g: &ObjRef,
    without: &BTreeSet<String>,
    visiting: &mut BTreeSet<ObjRef>,
) -> bool {
    let count = admissible_count(f, g, without, visiting);
    let Some(group) = f.groups.get(g) else {
        return false;
    };
    match group.scheduling.policy {
        Policy::Gang { min } => count >= usize::try_from(min.max(1)).unwrap_or(usize::MAX),
        Policy::Basic | Policy::Ambiguous => count >= 1,
    }
}

/// Live pods of a leaf, or admissible children of a composite.
pub(crate) fn admissible_count(
    f: &Forest,
    g: &ObjRef,
    without: &BTreeSet<String>,
    visiting: &mut BTreeSet<ObjRef>,
) -> usize {
    if !visiting.insert(g.clone()) {
        return 0;
    }
    let n = match g.kind {
        Kind::PodGroup => f
            .pods_of(g)
            .iter()
            .filter(|p| !p.is_terminal() && !without.contains(&p.meta.name))
            .count(),
        _ => f
            .children(g)
            .iter()
            .filter(|c| admissible_except(f, c, without, visiting))
            .count(),
    };
    visiting.remove(g);
    n
}

/// The pods the scheduler may start now: released, and every group from the pod's PodGroup to
/// the root admissible. Pods outside any hierarchy are always startable.
pub(crate) fn startable(f: &Forest, opts: &ValidationOptions) -> BTreeSet<String> {
    let held = held(f, opts);
    f.pods
        .values()
        .filter(|p| !held.contains_key(&p.meta.name))
        .map(|p| p.meta.name.clone())
        .collect()
}

/// The pods the scheduler would not start now, by name, each with why, as a pod's status
/// message says it: a forward reference (its PodGroup or an ancestor not created yet) is held,
/// not an error, and so is a hierarchy that fails validation or a group short of its minimum.
pub(crate) fn held(f: &Forest, opts: &ValidationOptions) -> BTreeMap<String, String> {
    let gates = gate(f, opts);
    let mut out = BTreeMap::new();
    for p in f.pods.values() {
        let Some(pg) = &p.pod_group else { continue };
        let why = match gates.get(&ObjRef::new(Kind::Pod, &p.meta.name)) {
            Some(Gate::Held(r)) => Some(r.to_string()),
            _ => {
                let g = ObjRef::new(Kind::PodGroup, pg);
                let chain = f.ancestors(&g).unwrap_or_default();
                std::iter::once(&g)
                    .chain(chain.iter())
                    .find(|x| !admissible(f, x))
                    .map(|x| format!("waiting for {x} to reach its minimum"))
            }
        };
        if let Some(why) = why {
            out.insert(p.meta.name.clone(), why);
        }
    }
    out
}
