//! The node root cgroup as the node: its own memory limit is the node's memory capacity
//! (`nodeRootCgroup`, docs/usage.md), so a "node" can live inside a cgroup on a shared machine.

use std::io;

use super::{
    fs::CgroupFs,
    layout::{Controller, Tree},
    name::CgroupPath,
    value::parse_limit,
};

/// The node root's memory limit in bytes (v2 `memory.max`, v1 `memory.limit_in_bytes`);
/// `None` when unlimited or when the node root is the hierarchy root (which has no limit).
pub fn node_root_memory_limit(fs: &CgroupFs) -> io::Result<Option<i64>> {
    let (tree, file) = if fs.mounts().trees.contains_key(&Tree::V2) {
        (Tree::V2, "memory.max")
    } else {
        (Tree::V1(Controller::Memory), "memory.limit_in_bytes")
    };
    if fs.node_root().depth() == 0 && tree == Tree::V2 {
        return Ok(None);
    }
    let text = match fs.read(tree, &CgroupPath::root(), file) {
        Ok(t) => t,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    parse_limit(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{file}: {text:?}")))
}
