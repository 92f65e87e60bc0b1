//! The node root: the cgroup that acts as the node in standalone mode. qoslet creates it when it
//! is missing (and then removes it on exit), gives it the configured memory limit, and prepares
//! it for children: v1 cpusets copy their parent's CPUs and memory nodes (a v1 cpuset takes no
//! task until set); on v2 the controllers are enabled for its children.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use thiserror::Error;

use crate::cgroup::{CgroupPath, Mounts, Tree, layout::Controller};

#[derive(Debug, Error)]
#[error("node root cgroup {path}: {what}")]
pub struct NodeRootError {
    pub(crate) path: PathBuf,
    pub(crate) what: String,
    #[source]
    pub(crate) source: io::Error,
}

/// The directories qoslet created for the node root, removed by [`NodeRoot::remove`].
///
/// A marker file beside the state file records that qoslet created the node root, so a run after
/// a crash (which never got to remove it) knows the node root is its own to remove.
#[derive(Debug, Default)]
pub(crate) struct NodeRoot {
    created: Vec<PathBuf>,
    marker: Option<PathBuf>,
}

impl NodeRoot {
    /// Makes sure `path` exists in every hierarchy of `mounts`. Writes only to directories it
    /// creates itself.
    pub(crate) fn ensure(
        mounts: &Mounts,
        path: &CgroupPath,
        memory_limit: Option<i64>,
        marker: Option<PathBuf>,
    ) -> Result<Self, NodeRootError> {
        let mut root = Self::default();
        if path.depth() == 0 {
            return Ok(root);
        }
        // An earlier run created it and crashed: its leaf directories are ours again.
        let adopt = marker.as_ref().is_some_and(|m| m.exists());
        for (tree, mount) in &mounts.trees {
            let mut dir = mount.clone();
            for (i, component) in path.components().iter().enumerate() {
                let parent = dir.clone();
                dir.push(component);
                if dir.is_dir() {
                    if adopt && i + 1 == path.depth() {
                        root.created.push(dir.clone());
                    }
                    continue;
                }
                fs::create_dir(&dir).map_err(|source| NodeRootError {
                    path: dir.clone(),
                    what: "cannot create".into(),
                    source,
                })?;
                root.created.push(dir.clone());
                prepare(*tree, &parent, &dir, memory_limit)?;
            }
        }
        if let Some(m) = &marker
            && !root.created.is_empty()
        {
            if let Some(dir) = m.parent() {
                let _ = fs::create_dir_all(dir);
            }
            if let Err(e) = fs::write(m, path.to_string()) {
                tracing::warn!(path = %m.display(), error = %e, "Cannot record that qoslet created the node root; after a crash it would be left behind.");
            }
        }
        root.marker = marker;
        Ok(root)
    }

    /// Removes what `ensure` created, with every cgroup below it, deepest first. Everything
    /// under a node root qoslet created is qoslet's. The caller has stopped every process.
    pub(crate) fn remove(self) {
        let mut all_gone = true;
        for dir in self.created.iter().rev() {
            remove_below(dir);
            if let Err(e) = fs::remove_dir(dir) {
                all_gone = false;
                tracing::warn!(path = %dir.display(), error = %e, "Could not remove a cgroup qoslet created.");
            }
        }
        if all_gone && let Some(m) = &self.marker {
            let _ = fs::remove_file(m);
        }
    }
}

/// Removes the cgroup directories below `dir` (not `dir` itself), deepest first.
fn remove_below(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let child = e.path();
            remove_below(&child);
            if let Err(err) = fs::remove_dir(&child) {
                tracing::warn!(path = %child.display(), error = %err, "Could not remove a cgroup qoslet created.");
            }
        }
    }
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), NodeRootError> {
    fs::write(dir.join(file), value).map_err(|source| NodeRootError {
        path: dir.to_path_buf(),
        what: format!("cannot write {value:?} to {file}"),
        source,
    })
}

fn prepare(
    tree: Tree,
    parent: &Path,
    dir: &Path,
    memory_limit: Option<i64>,
) -> Result<(), NodeRootError> {
    match tree {
        Tree::V1(Controller::Cpuset) => {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value =
                    fs::read_to_string(parent.join(file)).map_err(|source| NodeRootError {
                        path: parent.to_path_buf(),
                        what: format!("cannot read {file}"),
                        source,
                    })?;
                write(dir, file, value.trim())?;
            }
        }
        Tree::V1(Controller::Memory) => {
            if let Some(limit) = memory_limit {
                write(dir, "memory.limit_in_bytes", &limit.to_string())?;
            }
        }
        Tree::V2 => {
            if let Some(limit) = memory_limit {
                write(dir, "memory.max", &limit.to_string())?;
                write(dir, "memory.swap.max", "0").ok();
            }
            // Children need the controllers the parent hands down; enable what we may.
            let available = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
            for c in ["cpu", "cpuset", "memory", "pids"] {
                if available.split_whitespace().any(|a| a == c) {
                    write(dir, "cgroup.subtree_control", &format!("+{c}"))?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}
