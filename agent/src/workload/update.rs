//! Update rules: fields that cannot change once set (seed 002 "불변", KEP-5710, KEP-6012, and the
//! API server's `+k8s:immutable` / `NoAddItem` / `NoRemoveItem` tags of scheduling.k8s.io). An
//! update that tries is rejected and the old object kept, as the API server would.

use std::collections::BTreeMap;

use super::{
    problem::{Problem, Rule},
    types::{Kind, Object, Template, Workload},
};

/// An update the API server would refuse.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RejectedUpdate {
    /// Where the new object was read, what it is and which rule it breaks.
    pub(crate) problem: Problem,
}

/// The outcome of applying a change set to the objects it replaces.
#[derive(Debug, Clone, Default)]
pub(crate) struct Applied {
    /// The resulting objects: old ones, replaced by accepted updates, plus new ones.
    pub(crate) objects: Vec<Object>,
    pub(crate) rejected: Vec<RejectedUpdate>,
}

type Key = (String, Kind, String);

fn key(o: &Object) -> Key {
    (o.meta().namespace.clone(), o.kind(), o.meta().name.clone())
}

/// The immutable fields `new` changes relative to `old` (same kind, namespace and name).
pub(crate) fn check_update(old: &Object, new: &Object) -> Vec<RejectedUpdate> {
    let mut out = Vec::new();
    let mut reject = |rule: Rule, message: String| {
        out.push(RejectedUpdate {
            problem: Problem::on(new, rule, message),
        });
    };
    match (old, new) {
        (Object::Workload(a), Object::Workload(b)) => {
            for m in workload_changes(a, b) {
                reject(Rule::ImmutableWorkloadSpec, m);
            }
        }
        (Object::Group(a), Object::Group(b)) => {
            if a.workload_ref != b.workload_ref {
                reject(
                    Rule::ImmutableWorkloadRef,
                    format!(
                        "workloadRef cannot change ({:?} -> {:?})",
                        a.workload_ref, b.workload_ref
                    ),
                );
            }
            if a.parent != b.parent {
                reject(
                    Rule::ImmutableParent,
                    format!(
                        "parentCompositePodGroupName cannot change ({:?} -> {:?})",
                        a.parent, b.parent
                    ),
                );
            }
            if a.scheduling.disruption != b.scheduling.disruption {
                reject(
                    Rule::ImmutableDisruptionMode,
                    format!(
                        "disruptionMode cannot change ({:?} -> {:?})",
                        a.scheduling.disruption, b.scheduling.disruption
                    ),
                );
            }
            // basic and gang cannot be swapped after creation (PodGroupSchedulingPolicy API doc);
            // minGroupCount is immutable (seed 002), PodGroup minCount stays mutable (scaling).
            let (pa, pb) = (a.scheduling.policy, b.scheduling.policy);
            if std::mem::discriminant(&pa) != std::mem::discriminant(&pb) {
                reject(
                    Rule::ImmutableSchedulingPolicy,
                    format!(
                        "schedulingPolicy cannot switch between basic and gang ({pa:?} -> {pb:?})"
                    ),
                );
            } else if a.kind == Kind::CompositePodGroup && pa.gang_min() != pb.gang_min() {
                reject(
                    Rule::ImmutableMinGroupCount,
                    format!(
                        "gang minGroupCount cannot change ({:?} -> {:?})",
                        pa.gang_min(),
                        pb.gang_min()
                    ),
                );
            }
        }
        (Object::Pod(a), Object::Pod(b)) if a.pod_group != b.pod_group => reject(
            Rule::ImmutableSchedulingGroup,
            format!(
                "spec.schedulingGroup.podGroupName cannot change ({:?} -> {:?})",
                a.pod_group, b.pod_group
            ),
        ),
        _ => {}
    }
    out
}

/// Every template of a Workload by name, with its parent's name.
fn templates(w: &Workload) -> BTreeMap<&str, (&Template, Option<&str>)> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<(&Template, Option<&str>)> = w.templates.iter().map(|t| (t, None)).collect();
    while let Some((t, parent)) = stack.pop() {
        out.insert(t.name.as_str(), (t, parent));
        stack.extend(t.children.iter().map(|c| (c, Some(t.name.as_str()))));
    }
    out
}

/// What a Workload update changes that the API server keeps: its controllerRef, its templates
/// (none added, removed or moved) and each template's kind of schedulingPolicy, disruptionMode
/// and priority (a gang's minimum stays mutable).
fn workload_changes(a: &Workload, b: &Workload) -> Vec<String> {
    let mut out = Vec::new();
    if a.controller_ref != b.controller_ref {
        out.push(format!(
            "controllerRef cannot change ({:?} -> {:?})",
            a.controller_ref, b.controller_ref
        ));
    }
    let (ta, tb) = (templates(a), templates(b));
    for name in ta.keys().filter(|n| !tb.contains_key(*n)) {
        out.push(format!("template {name:?} cannot be removed"));
    }
    for name in tb.keys().filter(|n| !ta.contains_key(*n)) {
        out.push(format!("template {name:?} cannot be added"));
    }
    for (name, (x, px)) in &ta {
        let Some((y, py)) = tb.get(name) else {
            continue;
        };
        let (sx, sy) = (&x.scheduling, &y.scheduling);
        if x.kind != y.kind || px != py {
            out.push(format!("template {name:?} cannot change its kind or place"));
        }
        if std::mem::discriminant(&sx.policy) != std::mem::discriminant(&sy.policy) {
            out.push(format!(
                "template {name:?}: schedulingPolicy cannot switch between basic and gang"
            ));
        }
        if sx.disruption != sy.disruption {
            out.push(format!("template {name:?}: disruptionMode cannot change"));
        }
        if (sx.priority, &sx.priority_class_name) != (sy.priority, &sy.priority_class_name) {
            out.push(format!(
                "template {name:?}: priority and priorityClassName cannot change"
            ));
        }
    }
    out
}

/// Applies `new` over `old`, matching objects by kind, namespace and name. Rejected updates keep
/// the old object. Objects of `new` with no counterpart are additions.
pub(crate) fn apply_updates(old: Vec<Object>, new: Vec<Object>) -> Applied {
    let mut by_key: BTreeMap<Key, Object> = BTreeMap::new();
    let mut order: Vec<Key> = Vec::new();
    for o in old {
        let k = key(&o);
        if let std::collections::btree_map::Entry::Vacant(e) = by_key.entry(k.clone()) {
            order.push(k);
            e.insert(o);
        }
    }
    let mut rejected = Vec::new();
    let mut extra = Vec::new();
    for o in new {
        let k = key(&o);
        match by_key.get(&k) {
            Some(prev) => {
                let r = check_update(prev, &o);
                if r.is_empty() {
                    by_key.insert(k, o);
                } else {
                    rejected.extend(r);
                }
            }
            // Duplicates among the additions are kept so validation reports `name-unique`.
            None => extra.push(o),
        }
    }
    let mut objects: Vec<Object> = order
        .into_iter()
        .filter_map(|k| by_key.remove(&k))
        .collect();
    objects.extend(extra);
    rejected.sort();
    Applied { objects, rejected }
}
