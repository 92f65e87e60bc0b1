//! The node's cgroups: the reconciler that writes them, the desired state of the last pass, the
//! oom_score_adj targets, and removal of what qoslet no longer wants (stale pod and container
//! cgroups during the run, everything it created at shutdown). Every path goes through
//! [`CgroupFs`], beneath the node root.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::Arc,
    time::Instant,
};

use tracing::{info, warn};

use super::report::Report;
use crate::cgroup::{
    CgroupFs, CgroupPath, DesiredState, Mode, OomTargets, ReconcileReport, Reconciler, Tree,
    WriteResult, desired::Role,
};

/// Every file is read again at least this often, for changes inotify cannot see (the kernel
/// itself narrowing a v1 cpuset when a CPU goes offline).
const FULL_RECONCILE_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// A cgroup file: its cgroup, hierarchy and name.
type FileKey = (CgroupPath, Tree, &'static str);

pub(super) struct NodeCgroups {
    reconciler: Reconciler,
    pub(super) naming: crate::cgroup::Naming,
    /// The desired state of the last pass.
    pub(super) desired: DesiredState,
    pub(super) targets: Option<OomTargets>,
    /// Pod and container cgroups no longer desired, removed once their processes are gone.
    pub(super) stale: BTreeSet<CgroupPath>,
    /// The differences from the plan that are still there, per file: (its value, the plan's).
    /// A file the kubelet keeps at another value differs at every pass that reads it; the
    /// difference is logged and counted (`qoslet_cgroup_drift_total`) once, when first seen.
    drift: BTreeMap<FileKey, (Option<String>, String)>,
}

impl NodeCgroups {
    pub(super) fn new(fs: Arc<CgroupFs>, mode: Mode, naming: crate::cgroup::Naming) -> Self {
        let mut reconciler = Reconciler::new(fs, mode);
        // Without inotify every pass reads every file, which is slower but as correct.
        if let Err(e) = reconciler.enable_change_feed(FULL_RECONCILE_EVERY) {
            warn!(error = %e, "No inotify for the cgroup change feed; every pass reads every cgroup file.");
        }
        Self {
            reconciler,
            naming,
            desired: DesiredState::default(),
            targets: None,
            stale: BTreeSet::new(),
            drift: BTreeMap::new(),
        }
    }

    pub(super) fn fs(&self) -> &Arc<CgroupFs> {
        self.reconciler.fs()
    }

    pub(super) fn mode(&self) -> Mode {
        self.reconciler.mode()
    }

    pub(super) fn enforce(&self) -> bool {
        self.mode() == Mode::Enforce
    }

    /// Whether someone wrote or removed a managed cgroup since the last pass.
    pub(super) fn changed_since_pass(&self) -> bool {
        self.reconciler.changed_since_pass()
    }

    /// Writes (or, observing, compares) the cgroup files and logs what went wrong.
    pub(super) fn reconcile(&mut self, desired: &DesiredState, report: &Report) {
        let started = Instant::now();
        let result = self.reconciler.reconcile(desired);
        report
            .state
            .metrics
            .record_reconcile(&result, started.elapsed());
        let mut new_drift = 0;
        for w in &result.writes {
            match &w.result {
                WriteResult::Failed { .. } => {
                    warn!(path = %w.path.display(), file = w.file, value = %w.new, result = ?w.result, "Cgroup write failed.");
                }
                WriteResult::Drift => {
                    let values = (w.old.clone(), w.new.clone());
                    let key = (w.cgroup.clone(), w.tree, w.file);
                    if self.drift.get(&key) != Some(&values) {
                        info!(path = %w.path.display(), file = w.file, current = ?w.old, wanted = %w.new, "Cgroup drift (observe mode or the kubelet's file: not written).");
                        new_drift += 1;
                        self.drift.insert(key, values);
                    }
                }
                // Written now: a later drift of this file is news again.
                WriteResult::Written => {
                    self.drift.remove(&(w.cgroup.clone(), w.tree, w.file));
                }
                _ => {}
            }
        }
        for e in &result.errors {
            warn!(error = %e, "Cgroup reconcile error.");
        }
        self.forget_drift_gone(desired, &result);
        report.state.metrics.cgroup_drift.inc_by(new_drift);
    }

    /// Forgets the differences that are gone: the file was compared and holds the plan's value
    /// (so its next difference is news again), or its cgroup is no longer desired. A file whose
    /// read failed (a reconcile error) is forgotten too: should it differ at its next read, that
    /// is logged and counted again.
    fn forget_drift_gone(&mut self, desired: &DesiredState, result: &ReconcileReport) {
        if self.drift.is_empty() {
            return;
        }
        let compared: HashSet<(&CgroupPath, Tree)> =
            result.compared.iter().map(|(c, t)| (c, *t)).collect();
        let drifting: HashSet<(&CgroupPath, Tree, &str)> = result
            .drift()
            .map(|w| (&w.cgroup, w.tree, w.file))
            .collect();
        let wanted: HashSet<&CgroupPath> = desired.cgroups.iter().map(|c| &c.path).collect();
        self.drift.retain(|(cgroup, tree, file), _| {
            wanted.contains(cgroup)
                && (!compared.contains(&(cgroup, *tree))
                    || drifting.contains(&(cgroup, *tree, *file)))
        });
    }

    /// The pass's desired state becomes current: its oom_score_adj targets, and the pod and
    /// container cgroups it drops become stale (those it wants again are not).
    pub(super) fn set_desired(&mut self, desired: DesiredState) {
        let wanted: BTreeSet<&CgroupPath> = desired.cgroups.iter().map(|c| &c.path).collect();
        for c in &self.desired.cgroups {
            // Only what qoslet created: the kubelet removes its own cgroups.
            if c.create
                && matches!(c.role, Role::Pod | Role::Container)
                && !wanted.contains(&c.path)
            {
                self.stale.insert(c.path.clone());
            }
        }
        self.stale.retain(|p| !wanted.contains(p));
        self.targets = Some(OomTargets::new(self.fs(), &desired));
        self.desired = desired;
    }

    /// The pod and container cgroups qoslet creates (it removes them when they go).
    pub(super) fn created(&self) -> BTreeSet<CgroupPath> {
        self.desired
            .cgroups
            .iter()
            .filter(|c| c.create && matches!(c.role, Role::Pod | Role::Container))
            .map(|c| c.path.clone())
            .chain(self.stale.iter().cloned())
            .collect()
    }

    /// Removes stale cgroups once their processes are gone (rmdir fails while a cgroup has
    /// tasks; a later call retries).
    pub(super) fn remove_stale(&mut self) {
        if !self.enforce() || self.stale.is_empty() {
            return;
        }
        let mut paths: Vec<CgroupPath> = self.stale.iter().cloned().collect();
        paths.sort_by_key(|p| std::cmp::Reverse(p.depth()));
        for p in paths {
            if self.remove(&p, false) {
                self.stale.remove(&p);
            }
        }
    }

    /// Removes the cgroups of the desired state qoslet created, deepest first (pods are
    /// stopped), and forgets them.
    pub(super) fn remove_all(&mut self) {
        let mut paths: Vec<&CgroupPath> = self
            .desired
            .cgroups
            .iter()
            .filter(|c| c.create && c.role != Role::Reserved)
            .map(|c| &c.path)
            .chain(&self.stale)
            .collect();
        paths.sort_by_key(|p| std::cmp::Reverse(p.depth()));
        for p in paths {
            self.remove(p, true);
        }
        self.stale.clear();
        self.desired = DesiredState::default();
    }

    /// Removes `path` in every hierarchy; true when it is gone from all of them.
    pub(super) fn remove(&self, path: &CgroupPath, log: bool) -> bool {
        let trees: Vec<Tree> = self.fs().trees().collect();
        let mut gone = true;
        for t in trees {
            if let Err(e) = self.fs().rmdir(t, path) {
                gone = false;
                if log {
                    warn!(path = %self.fs().display_path(t, path).display(), error = %e, "Could not remove a cgroup qoslet created.");
                }
            }
        }
        gone
    }
}
