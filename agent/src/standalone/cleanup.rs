//! Removing cgroups qoslet no longer wants: stale pod and container cgroups during the run, and
//! every cgroup it created at shutdown.

use std::collections::BTreeSet;

use tracing::warn;

use super::sync::Synced;
use crate::cgroup::{CgroupPath, DesiredState, Tree, desired::Role};

impl Synced {
    /// Pod and container cgroups of the last desired state that `desired` drops become stale;
    /// those it wants again are not.
    pub(super) fn note_stale(&mut self, desired: &DesiredState) {
        let wanted: BTreeSet<&CgroupPath> = desired.cgroups.iter().map(|c| &c.path).collect();
        for c in &self.desired.cgroups {
            if matches!(c.role, Role::Pod | Role::Container) && !wanted.contains(&c.path) {
                self.stale.insert(c.path.clone());
            }
        }
        self.stale.retain(|p| !wanted.contains(p));
    }

    /// Removes cgroups of pods that left the desired state once their processes are gone
    /// (rmdir fails while a cgroup has tasks; a later pass retries).
    pub(super) fn remove_stale(&mut self) {
        if !self.enforce() || self.stale.is_empty() {
            return;
        }
        let trees: Vec<Tree> = self.fs().trees().collect();
        let mut paths: Vec<CgroupPath> = self.stale.iter().cloned().collect();
        paths.sort_by_key(|p| std::cmp::Reverse(p.depth()));
        for p in paths {
            let mut all_gone = true;
            for t in &trees {
                let dir = self.fs().display_path(*t, &p);
                if dir.is_dir() && std::fs::remove_dir(&dir).is_err() {
                    all_gone = false;
                }
            }
            if all_gone {
                self.stale.remove(&p);
            }
        }
    }

    /// Removes the cgroups of the desired state qoslet created, deepest first (pods are stopped).
    pub fn remove_cgroups(&self) {
        let trees: Vec<Tree> = self.fs().trees().collect();
        let mut paths: Vec<&CgroupPath> = self
            .desired
            .cgroups
            .iter()
            .filter(|c| c.role != Role::Reserved)
            .map(|c| &c.path)
            .chain(&self.stale)
            .collect();
        paths.sort_by_key(|p| std::cmp::Reverse(p.depth()));
        for p in paths {
            for t in &trees {
                let dir = self.fs().display_path(*t, p);
                if dir.is_dir()
                    && let Err(e) = std::fs::remove_dir(&dir)
                {
                    warn!(path = %dir.display(), error = %e, "Could not remove a cgroup qoslet created.");
                }
            }
        }
    }
}
