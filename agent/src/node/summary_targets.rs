//! Where the Summary API reads each cgroup the pass placed: the kubelet's system containers
//! and the pods' and containers' cgroups.

use super::{Node, summary::StatsCgroup};
use crate::{
    cgroup::{CgroupBeneath, CgroupPath, Tree},
    eviction::MemoryCgroup,
    policy::plan::Plan,
};

impl Node {
    /// Where the Summary API reads one cgroup: the memory hierarchy and the v2 tree.
    pub(super) fn stats_cgroup(
        &self,
        memory_tree: Option<Tree>,
        unified_tree: Option<Tree>,
        path: &CgroupPath,
    ) -> StatsCgroup {
        let dir = |tree| CgroupBeneath::new(self.cgroups.fs(), tree, path);
        StatsCgroup {
            memory: memory_tree.map(|t| MemoryCgroup::new(dir(t))),
            cpu: unified_tree.map(dir),
        }
    }

    /// The kubelet's system containers that exist here: `pods` (kubepods), `kubelet`
    /// (kubeReservedCgroup) and `misc` (systemReservedCgroup).
    pub(super) fn system_containers(
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
                CgroupPath::under_root(tier.cgroup.as_deref()?, &self.cgroups.naming.node_root)
                    .ok()?;
            let c = self.stats_cgroup(memory_tree, unified_tree, &path);
            c.memory
                .as_ref()
                .is_some_and(|m| m.dir().exists())
                .then(|| (name.to_owned(), c))
        })
        .collect()
    }
}
