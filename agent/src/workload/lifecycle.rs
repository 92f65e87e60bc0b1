//! Lifecycle as pure functions over a [`Forest`] (seed 002 "소유권과 가비지 컬렉션"): cascading
//! deletion top-down, finalisation bottom-up. The standalone runtime applies the results.

use std::collections::BTreeSet;

use super::{
    forest::Forest,
    types::{Kind, Meta, ObjRef},
};

/// Objects that go with `deleted`: owned through ownerReferences (matched by kind and name, and
/// by uid when both sides have one), groups created from a deleted Workload (workloadRef), child
/// groups of a deleted CompositePodGroup and pods of a deleted PodGroup, transitively. `deleted`
/// comes first, then dependents top-down.
pub(crate) fn cascade_delete(f: &Forest, deleted: &ObjRef) -> Vec<ObjRef> {
    if !f.contains(deleted) {
        return Vec::new();
    }
    let mut out = vec![deleted.clone()];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i].clone();
        for d in dependents(f, &cur) {
            if !out.contains(&d) {
                out.push(d);
            }
        }
        i += 1;
    }
    out
}

fn owned_by(meta: &Meta, owner: &ObjRef, owner_uid: Option<&str>) -> bool {
    meta.owners.iter().any(|o| {
        o.kind == owner.kind.as_str()
            && o.name == owner.name
            && (o.uid.is_empty() || owner_uid.is_none_or(|u| u == o.uid))
    })
}

fn dependents(f: &Forest, x: &ObjRef) -> Vec<ObjRef> {
    let uid = f.get(x).and_then(|o| o.meta().uid.clone());
    let mut out: Vec<ObjRef> = f
        .refs()
        .into_iter()
        .filter(|r| {
            f.get(r)
                .is_some_and(|o| owned_by(o.meta(), x, uid.as_deref()))
        })
        .collect();
    match x.kind {
        Kind::Workload => out.extend(
            f.groups
                .values()
                .filter(|g| {
                    g.workload_ref
                        .as_ref()
                        .is_some_and(|r| r.workload_name == x.name)
                })
                .map(super::types::Group::obj_ref),
        ),
        Kind::CompositePodGroup => out.extend(f.children(x)),
        Kind::PodGroup => out.extend(
            f.pods_of(x)
                .iter()
                .map(|p| ObjRef::new(Kind::Pod, &p.meta.name)),
        ),
        Kind::Pod => {}
    }
    out
}

/// What can be removed now of the objects being deleted, and what still waits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Finalisation {
    /// In removal order: pods, then leaves, then their parents, the Workload last.
    pub(crate) removable: Vec<ObjRef>,
    /// Objects that stay, with what they wait for.
    pub(crate) waiting: Vec<(ObjRef, String)>,
}

/// Bottom-up finalisation: a pod goes once Succeeded or Failed; a PodGroup once every pod
/// referencing it is Succeeded or Failed (or gone); a CompositePodGroup once its children are
/// gone; a Workload once no group refers to it.
pub(crate) fn finalise(f: &Forest, deleting: &BTreeSet<ObjRef>) -> Finalisation {
    let mut live = f.clone();
    let mut removable = Vec::new();
    loop {
        let mut ready: Vec<ObjRef> = deleting
            .iter()
            .filter(|r| live.contains(r) && blocker(&live, r).is_none())
            .cloned()
            .collect();
        if ready.is_empty() {
            break;
        }
        // Bottom-up within a round too: pods, PodGroups, CompositePodGroups, Workloads.
        ready.sort_by_key(|r| std::cmp::Reverse(r.kind));
        for r in ready {
            live.remove(&r);
            removable.push(r);
        }
    }
    let waiting = deleting
        .iter()
        .filter(|r| live.contains(r))
        .filter_map(|r| blocker(&live, r).map(|b| (r.clone(), b)))
        .collect();
    Finalisation { removable, waiting }
}

/// Why `r` cannot go yet, if it cannot.
fn blocker(f: &Forest, r: &ObjRef) -> Option<String> {
    match r.kind {
        Kind::Pod => {
            let p = f.pods.get(&r.name)?;
            (!p.is_terminal()).then(|| {
                format!(
                    "phase {}; waits for Succeeded or Failed",
                    p.phase.as_deref().unwrap_or("Pending")
                )
            })
        }
        Kind::PodGroup => f
            .pods_of(r)
            .iter()
            .find(|p| !p.is_terminal())
            .map(|p| format!("Pod/{} is not Succeeded or Failed", p.meta.name)),
        Kind::CompositePodGroup => f
            .children(r)
            .first()
            .map(|c| format!("child {c} still exists")),
        Kind::Workload => f
            .groups
            .values()
            .find(|g| {
                g.workload_ref
                    .as_ref()
                    .is_some_and(|w| w.workload_name == r.name)
            })
            .map(|g| format!("{} still exists", g.obj_ref())),
    }
}
