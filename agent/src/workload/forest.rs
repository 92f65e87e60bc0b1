//! The hierarchy of one namespace: Workloads, groups linked by `parentCompositePodGroupName`, pods
//! linked by `spec.schedulingGroup` (KEP-6012). Names are unique per namespace and kind (seed
//! 002), so a kind and a name identify an object.

use std::collections::{BTreeMap, BTreeSet};

use super::types::{Group, Kind, ObjRef, Object, Pod, Workload};

/// Everything of one namespace, indexed.
#[derive(Debug, Clone, Default)]
pub struct Forest {
    pub(crate) workloads: BTreeMap<String, Workload>,
    /// PodGroups and CompositePodGroups, keyed by kind and name.
    pub(crate) groups: BTreeMap<ObjRef, Group>,
    pub(crate) pods: BTreeMap<String, Pod>,
    /// Objects dropped because an earlier one had the same kind and name (`name-unique`).
    pub(crate) duplicates: Vec<Object>,
}

/// Where walking up from a group ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Top {
    /// The topmost existing group. `complete` when it has no parent (a real root); otherwise its
    /// parent is missing and the hierarchy is not whole yet.
    Group { group: ObjRef, complete: bool },
    /// The parent chain loops (`no-cycles`).
    Cycle,
}

impl Forest {
    /// Indexes `objects`, all of the same namespace; the first of two same-named objects wins.
    pub(crate) fn new(objects: impl IntoIterator<Item = Object>) -> Self {
        let mut f = Forest::default();
        for o in objects {
            f.insert(o);
        }
        f
    }

    /// Splits objects by namespace into one forest each.
    pub fn by_namespace(objects: impl IntoIterator<Item = Object>) -> BTreeMap<String, Forest> {
        let mut out: BTreeMap<String, Forest> = BTreeMap::new();
        for o in objects {
            let ns = o.meta().namespace.clone();
            out.entry(ns.clone())
                .or_insert_with(|| Forest::new([]))
                .insert(o);
        }
        out
    }

    /// Adds an object; returns false (and keeps it in `duplicates`) if the name is taken.
    pub(crate) fn insert(&mut self, o: Object) -> bool {
        if self.contains(&o.obj_ref()) {
            self.duplicates.push(o);
            return false;
        }
        match o {
            Object::Workload(w) => {
                self.workloads.insert(w.meta.name.clone(), w);
            }
            Object::Group(g) => {
                self.groups.insert(g.obj_ref(), g);
            }
            Object::Pod(p) => {
                self.pods.insert(p.meta.name.clone(), p);
            }
        }
        true
    }

    /// Removes an object, returning it.
    #[cfg(test)]
    pub(crate) fn remove(&mut self, r: &ObjRef) -> Option<Object> {
        match r.kind {
            Kind::Workload => self.workloads.remove(&r.name).map(Object::Workload),
            Kind::Pod => self.pods.remove(&r.name).map(Object::Pod),
            _ => self.groups.remove(r).map(Object::Group),
        }
    }

    pub(crate) fn contains(&self, r: &ObjRef) -> bool {
        match r.kind {
            Kind::Workload => self.workloads.contains_key(&r.name),
            Kind::Pod => self.pods.contains_key(&r.name),
            _ => self.groups.contains_key(r),
        }
    }

    pub(crate) fn get(&self, r: &ObjRef) -> Option<Object> {
        match r.kind {
            Kind::Workload => self.workloads.get(&r.name).cloned().map(Object::Workload),
            Kind::Pod => self.pods.get(&r.name).cloned().map(Object::Pod),
            _ => self.groups.get(r).cloned().map(Object::Group),
        }
    }

    /// Every object, in kind then name order.
    pub(crate) fn refs(&self) -> Vec<ObjRef> {
        let mut v: Vec<ObjRef> = self
            .workloads
            .keys()
            .map(|n| ObjRef::new(Kind::Workload, n))
            .chain(self.groups.keys().cloned())
            .chain(self.pods.keys().map(|n| ObjRef::new(Kind::Pod, n)))
            .collect();
        v.sort();
        v
    }

    /// The reference a group's parent name stands for (the parent is always composite).
    pub(crate) fn parent_ref(&self, g: &ObjRef) -> Option<ObjRef> {
        let parent = self.groups.get(g)?.parent.as_ref()?;
        Some(ObjRef::new(Kind::CompositePodGroup, parent))
    }

    /// The existing parent group.
    pub(crate) fn parent(&self, g: &ObjRef) -> Option<&Group> {
        self.groups.get(&self.parent_ref(g)?)
    }

    /// The groups whose parent is `g`, in name order.
    pub(crate) fn children(&self, g: &ObjRef) -> Vec<ObjRef> {
        if g.kind != Kind::CompositePodGroup {
            return Vec::new();
        }
        self.groups
            .values()
            .filter(|c| c.parent.as_deref() == Some(g.name.as_str()))
            .map(Group::obj_ref)
            .collect()
    }

    /// The pods whose `schedulingGroup` names the PodGroup `g`.
    pub(crate) fn pods_of(&self, g: &ObjRef) -> Vec<&Pod> {
        if g.kind != Kind::PodGroup {
            return Vec::new();
        }
        self.pods
            .values()
            .filter(|p| p.pod_group.as_deref() == Some(g.name.as_str()))
            .collect()
    }

    /// The existing ancestors of `g`, nearest first; `None` if the chain loops.
    pub(crate) fn ancestors(&self, g: &ObjRef) -> Option<Vec<ObjRef>> {
        let mut seen = BTreeSet::from([g.clone()]);
        let mut out = Vec::new();
        let mut cur = g.clone();
        while let Some(p) = self.parent_ref(&cur) {
            if !self.groups.contains_key(&p) {
                break;
            }
            if !seen.insert(p.clone()) {
                return None;
            }
            out.push(p.clone());
            cur = p;
        }
        Some(out)
    }

    /// Where walking up from `g` ends.
    pub(crate) fn top(&self, g: &ObjRef) -> Top {
        match self.ancestors(g) {
            None => Top::Cycle,
            Some(a) => {
                let top = a.last().cloned().unwrap_or_else(|| g.clone());
                let complete = self.groups.get(&top).is_some_and(|t| t.parent.is_none());
                Top::Group {
                    group: top,
                    complete,
                }
            }
        }
    }

    /// The root of `g`'s hierarchy: the topmost group, when it has no parent.
    #[cfg(test)]
    pub(crate) fn root(&self, g: &ObjRef) -> Option<ObjRef> {
        match self.top(g) {
            Top::Group {
                group,
                complete: true,
            } => Some(group),
            _ => None,
        }
    }

    /// 1 for a root, 2 for its children, ...; `None` on a cycle. A parent that is named but absent
    /// counts as one level: the group is at least this deep once it exists (a parent's name is
    /// immutable), so a chain is judged too deep without reading the level past the limit.
    pub(crate) fn depth(&self, g: &ObjRef) -> Option<usize> {
        let ancestors = self.ancestors(g)?;
        let top = ancestors.last().unwrap_or(g);
        // `ancestors` stops below a parent that is absent, so a top that names one lacks it.
        let absent_parent = usize::from(self.parent_ref(top).is_some());
        // A Vec's length is at most isize::MAX: two more cannot overflow.
        Some(ancestors.len() + 1 + absent_parent)
    }

    /// `g` and every group below it, parents before children.
    pub(crate) fn subtree(&self, g: &ObjRef) -> Vec<ObjRef> {
        let mut out = vec![g.clone()];
        let mut i = 0;
        while i < out.len() {
            for c in self.children(&out[i]) {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
            i += 1;
        }
        out
    }

    /// Every pod below `g`, in name order.
    pub(crate) fn pods_below(&self, g: &ObjRef) -> Vec<&Pod> {
        let mut pods: Vec<&Pod> = self
            .subtree(g)
            .iter()
            .flat_map(|x| self.pods_of(x))
            .collect();
        pods.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
        pods
    }

    /// The hierarchies: each topmost group (or a group on a cycle, by its smallest member) with
    /// its groups and pods. Every group and every pod of an existing PodGroup is in exactly one.
    pub(crate) fn hierarchies(&self) -> BTreeMap<ObjRef, Vec<ObjRef>> {
        let mut out: BTreeMap<ObjRef, Vec<ObjRef>> = BTreeMap::new();
        for g in self.groups.keys() {
            let key = self.hierarchy_key(g);
            out.entry(key).or_default().push(g.clone());
        }
        for p in self.pods.values() {
            let Some(pg) = &p.pod_group else { continue };
            let g = ObjRef::new(Kind::PodGroup, pg);
            if self.groups.contains_key(&g) {
                out.entry(self.hierarchy_key(&g))
                    .or_default()
                    .push(ObjRef::new(Kind::Pod, &p.meta.name));
            }
        }
        out
    }

    /// The key of the hierarchy `g` belongs to (see [`Forest::hierarchies`]).
    pub(crate) fn hierarchy_key(&self, g: &ObjRef) -> ObjRef {
        match self.top(g) {
            Top::Group { group, .. } => group,
            Top::Cycle => self.cycle_key(g),
        }
    }

    /// The smallest group on the loop reached from `g`, so all members of one cycle (and the
    /// groups hanging below it) share a key.
    fn cycle_key(&self, g: &ObjRef) -> ObjRef {
        let mut seen = Vec::new();
        let mut cur = g.clone();
        loop {
            if let Some(pos) = seen.iter().position(|x| x == &cur) {
                return seen[pos..].iter().min().cloned().unwrap_or(cur);
            }
            seen.push(cur.clone());
            match self.parent_ref(&cur) {
                Some(p) if self.groups.contains_key(&p) => cur = p,
                _ => return cur,
            }
        }
    }

    /// The group a pod belongs to, if it names one.
    pub(crate) fn group_of_pod(&self, pod: &str) -> Option<ObjRef> {
        let p = self.pods.get(pod)?;
        p.pod_group.as_ref().map(|n| ObjRef::new(Kind::PodGroup, n))
    }
}
