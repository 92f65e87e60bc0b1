//! Which cgroup hierarchy holds what (memory accounting, the v2 tree) and the ids the kernel's
//! programs know cgroups by.

use crate::{
    cgroup::{CgroupBeneath, Tree, layout::Controller},
    eviction::MemoryCgroup,
};

/// The hierarchy that holds memory accounting: the v2 tree, or v1's memory controller.
pub(crate) fn memory_tree(trees: impl IntoIterator<Item = Tree>) -> Option<Tree> {
    trees
        .into_iter()
        .find(|t| matches!(t, Tree::V2 | Tree::V1(Controller::Memory)))
}

/// The cgroup v2 hierarchy: the only one on v2 hosts, the controller-less one on hybrid hosts.
pub(crate) fn unified_tree(trees: impl IntoIterator<Item = Tree>) -> Option<Tree> {
    trees
        .into_iter()
        .find(|t| matches!(t, Tree::V2 | Tree::Unified))
}

/// A cgroup's id: the inode of its directory (opened beneath the node root), as the kernel's
/// programs see it; `None` when the directory is gone.
pub(super) fn cgroup_id(dir: &CgroupBeneath) -> Option<u64> {
    dir.inode().ok()
}

/// The node root's memcg id (the inode of its memory cgroup directory).
pub(crate) fn memory_ids(root: &MemoryCgroup) -> Vec<u64> {
    cgroup_id(root.dir()).into_iter().collect()
}
