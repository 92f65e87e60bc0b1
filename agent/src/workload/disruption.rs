//! Gang-aware eviction: kubelet eviction ignores gangs
//! (KEP-5710 non-goal), so qoslet computes what a pod drags along and what an eviction breaks.

use std::collections::BTreeSet;

use super::{forest::Forest, gate::admissible_count, types::ObjRef};

/// What a disruption unit is rooted at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum UnitRoot {
    /// The pod alone.
    Pod(String),
    /// A group with `disruptionMode: all`: the highest such ancestor.
    Group(ObjRef),
}

/// The indivisible set of pods evicted together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unit {
    pub(crate) root: UnitRoot,
    /// Live (not Succeeded or Failed) pods of the unit, in name order.
    pub(crate) pods: Vec<String>,
}

/// A gang that an eviction would drop below its minimum.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct GangBreak {
    pub(crate) group: ObjRef,
    /// minCount (PodGroup) or minGroupCount (CompositePodGroup).
    pub(crate) min: i32,
    /// Live pods (leaf) or admissible children (composite), before and after the eviction.
    pub(crate) before: usize,
    pub(crate) after: usize,
}

/// The disruption unit of `pod`: itself; its PodGroup when that is `disruptionMode: all`; the
/// highest `all` ancestor of an unbroken chain of `all` groups (KEP-5710). `None` for an
/// unknown pod.
pub(crate) fn disruption_unit(f: &Forest, pod: &str) -> Option<Unit> {
    let p = f.pods.get(pod)?;
    let alone = || Unit {
        root: UnitRoot::Pod(pod.to_owned()),
        pods: vec![pod.to_owned()],
    };
    let Some(g) = f.group_of_pod(pod).filter(|g| f.groups.contains_key(g)) else {
        return Some(alone());
    };
    let is_all = |r: &ObjRef| {
        f.groups
            .get(r)
            .is_some_and(|x| x.scheduling.disruption.is_all())
    };
    if !is_all(&g) {
        return Some(alone());
    }
    let mut top = g.clone();
    for a in f.ancestors(&g).unwrap_or_default() {
        if !is_all(&a) {
            break;
        }
        top = a;
    }
    let mut pods: Vec<String> = f
        .pods_below(&top)
        .iter()
        .filter(|q| !q.is_terminal())
        .map(|q| q.meta.name.clone())
        .collect();
    if !pods.iter().any(|q| q == pod) && !p.is_terminal() {
        pods.push(pod.to_owned());
        pods.sort();
    }
    Some(Unit {
        root: UnitRoot::Group(top),
        pods,
    })
}

/// The gangs that evicting `evicted` drops below minCount / minGroupCount, leaves and the
/// composites above them alike (a leaf falling below minCount stops counting for its parent).
pub(crate) fn breaks_gang(f: &Forest, evicted: &[String]) -> Vec<GangBreak> {
    let without: BTreeSet<String> = evicted.iter().cloned().collect();
    let mut out = Vec::new();
    for (r, g) in &f.groups {
        let Some(min) = g.scheduling.policy.gang_min() else {
            continue;
        };
        let need = usize::try_from(min.max(1)).unwrap_or(usize::MAX);
        let before = admissible_count(f, r, &BTreeSet::new(), &mut BTreeSet::new());
        let after = admissible_count(f, r, &without, &mut BTreeSet::new());
        if before >= need && after < need {
            out.push(GangBreak {
                group: r.clone(),
                min,
                before,
                after,
            });
        }
    }
    out
}
