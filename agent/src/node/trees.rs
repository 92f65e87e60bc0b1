//! Which cgroup hierarchy holds what (memory accounting, the v2 tree) and the ids the kernel's
//! programs know cgroups by.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::{
    cgroup::{Tree, layout::Controller},
    eviction::MemoryCgroup,
};

/// The hierarchy that holds memory accounting: the v2 tree, or v1's memory controller.
pub fn memory_tree(trees: impl IntoIterator<Item = Tree>) -> Option<Tree> {
    trees
        .into_iter()
        .find(|t| matches!(t, Tree::V2 | Tree::V1(Controller::Memory)))
}

/// The cgroup v2 hierarchy: the only one on v2 hosts, the controller-less one on hybrid hosts.
pub fn unified_tree(trees: impl IntoIterator<Item = Tree>) -> Option<Tree> {
    trees
        .into_iter()
        .find(|t| matches!(t, Tree::V2 | Tree::Unified))
}

/// A directory of `tree` as the eviction signals read it.
pub fn memory_cgroup(tree: Tree, dir: PathBuf) -> MemoryCgroup {
    match tree {
        Tree::V2 => MemoryCgroup::V2(dir),
        _ => MemoryCgroup::V1(dir),
    }
}

/// A cgroup's id: the inode of its directory, as the kernel's programs see it; `None` when the
/// directory is gone.
pub(super) fn cgroup_id(dir: &Path) -> Option<u64> {
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

/// The node root's memcg id (the inode of its memory cgroup directory).
pub fn memory_ids(root: &MemoryCgroup) -> Vec<u64> {
    cgroup_id(root.path()).into_iter().collect()
}
