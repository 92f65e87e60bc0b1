//! Choosing the unit to evict: the kubelet's ranking (policy::eviction, from
//! pkg/kubelet/eviction/helpers.go `rankMemoryPressure` / `rankPIDPressure`), then qoslet's
//! gang-aware layer (REFERENCE §6 "Gap upstream"). Pure.
//!
//! Gang-aware order, within the kubelet's tiers (usage above request, then priority) so a gang
//! never costs a Guaranteed pod its protection: a pod with a disruption unit takes its whole unit;
//! units that keep every gang at or above its minimum come first (surplus members before gang
//! members, as Volcano's "safe bundles"), then units that free enough, then the kubelet order.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use super::thresholds::Resource;
use crate::{
    policy::{
        eviction::{Candidate, rank_memory, rank_pids},
        pod::PodKey,
    },
    workload::{Forest, GangBreak, UnitRoot, breaks_gang, disruption_unit},
};

/// A pod as the ranking sees it, usage read at decision time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) key: PodKey,
    pub(crate) candidate: Candidate,
}

/// `gangEviction: none`, or gang-aware (`node`, `unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// One pod at a time in the kubelet's order.
    Kubelet,
    #[default]
    GangAware,
}

/// Why a unit was chosen, for the decision's log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reason {
    /// First in the kubelet's order.
    KubeletRank,
    GangAware {
        /// Units ranked ahead of it by the kubelet that were passed over.
        passed_over: usize,
        /// It is a `disruptionMode: all` unit of more than one pod.
        whole_unit: bool,
        keeps_gangs: bool,
        frees_enough: bool,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KubeletRank => f.write_str("first in the kubelet's order"),
            Self::GangAware {
                passed_over,
                whole_unit,
                keeps_gangs,
                frees_enough,
            } => write!(
                f,
                "gang-aware: {} unit, {}, {}, {passed_over} unit(s) ranked ahead passed over",
                if *whole_unit {
                    "whole disruption"
                } else {
                    "single-pod"
                },
                if *keeps_gangs {
                    "keeps every gang at its minimum"
                } else {
                    "breaks a gang (no better choice)"
                },
                if *frees_enough {
                    "frees enough"
                } else {
                    "does not free enough alone"
                },
            ),
        }
    }
}

/// The unit to evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Choice {
    pub(crate) pods: Vec<PodKey>,
    /// The `disruptionMode: all` group the unit is rooted at, if any.
    pub(crate) unit: Option<(String, UnitRoot)>,
    /// Bytes (memory) or processes (pids) the unit holds.
    pub(crate) frees: i64,
    pub(crate) breaks: Vec<GangBreak>,
    pub(crate) reason: Reason,
}

struct Unit {
    pods: Vec<usize>,
    root: Option<(String, UnitRoot)>,
    tier: (bool, i32),
    frees: i64,
    breaks: Vec<GangBreak>,
    rank: usize,
}

/// Chooses the unit to evict to free `need` of `resource`; `None` when nothing is evictable.
/// Critical pods are never chosen, nor a unit that holds one.
pub(crate) fn choose(
    samples: &[Sample],
    forests: &BTreeMap<String, Forest>,
    resource: Resource,
    need: i64,
    order: Order,
) -> Option<Choice> {
    let candidates: Vec<Candidate> = samples.iter().map(|s| s.candidate.clone()).collect();
    let ranked = match resource {
        Resource::Memory => rank_memory(&candidates),
        Resource::Pids => rank_pids(&candidates),
    };
    let amount = |c: &Candidate| match resource {
        Resource::Memory => c.usage_bytes,
        Resource::Pids => c.processes as i64,
    };
    if order == Order::Kubelet {
        let &i = ranked.first()?;
        let s = &samples[i];
        return Some(Choice {
            pods: vec![s.key.clone()],
            unit: None,
            frees: amount(&s.candidate),
            breaks: Vec::new(),
            reason: Reason::KubeletRank,
        });
    }
    // Workload units name their pods by namespace and name.
    let index: BTreeMap<(&str, &str), usize> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.key.namespace.as_str(), s.key.name.as_str()), i))
        .collect();
    let mut seen: BTreeSet<usize> = BTreeSet::new();
    let mut units: Vec<Unit> = Vec::new();
    for (rank, &i) in ranked.iter().enumerate() {
        if seen.contains(&i) {
            continue;
        }
        let s = &samples[i];
        let ns = &s.key.namespace;
        let forest = forests.get(ns);
        let (pods, root): (Vec<usize>, _) =
            match forest.and_then(|f| disruption_unit(f, &s.key.name)) {
                Some(u) => {
                    let pods = u
                        .pods
                        .iter()
                        .filter_map(|p| index.get(&(ns.as_str(), p.as_str())).copied())
                        .chain([i])
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    let root = matches!(u.root, UnitRoot::Group(_)).then(|| (ns.clone(), u.root));
                    (pods, root)
                }
                None => (vec![i], None),
            };
        seen.extend(pods.iter().copied());
        if pods.iter().any(|&p| samples[p].candidate.critical) {
            continue;
        }
        let names: Vec<String> = pods.iter().map(|&p| samples[p].key.name.clone()).collect();
        let breaks = forest.map(|f| breaks_gang(f, &names)).unwrap_or_default();
        let c = &s.candidate;
        let tier = match resource {
            Resource::Memory => (c.usage_bytes <= c.request_bytes, c.priority),
            Resource::Pids => (false, c.priority),
        };
        units.push(Unit {
            frees: pods.iter().map(|&p| amount(&samples[p].candidate)).sum(),
            pods,
            root,
            tier,
            breaks,
            rank,
        });
    }
    let best = units
        .iter()
        .min_by_key(|u| (u.tier, !u.breaks.is_empty(), u.frees < need, u.rank))?;
    let passed_over = units.iter().filter(|u| u.rank < best.rank).count();
    Some(Choice {
        pods: best.pods.iter().map(|&p| samples[p].key.clone()).collect(),
        unit: best.root.clone(),
        frees: best.frees,
        breaks: best.breaks.clone(),
        reason: Reason::GangAware {
            passed_over,
            whole_unit: best.pods.len() > 1,
            keeps_gangs: best.breaks.is_empty(),
            frees_enough: best.frees >= need,
        },
    })
}

#[cfg(test)]
mod tests;
