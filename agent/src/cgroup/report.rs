//! What a reconcile pass did (or, in observe mode, would do), and its errors.

use std::{io, path::PathBuf};

use thiserror::Error;

use super::{
    desired::{NodeCgroupRefused, PodRefused},
    layout::Tree,
    name::CgroupPath,
};

/// QosletConfiguration `mode` (and `--observe`): enforce writes cgroups and evicts; observe
/// computes and reports the same writes as drift, and writes and evicts nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Observe,
}

/// How one write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteResult {
    Written,
    /// Observe mode: the file differs and was left alone.
    Drift,
    /// Lowering a memory limit below usage failed; as the kubelet does, the limit was set to the
    /// current usage instead (`written`), which keeps the cgroup from growing.
    RetriedAtUsage {
        usage: i64,
        written: bool,
    },
    /// The cgroup went away meanwhile (a pod deleted): not an error.
    Vanished,
    Failed {
        errno: i32,
    },
}

/// One file write, attempted or observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteReport {
    pub(crate) cgroup: CgroupPath,
    pub(crate) tree: Tree,
    /// The cgroup directory on this host.
    pub path: PathBuf,
    pub file: &'static str,
    pub old: Option<String>,
    pub new: String,
    pub result: WriteResult,
}

/// A failure that concerns one cgroup or file; the rest of the pass goes on.
#[derive(Debug, Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Pod(#[from] PodRefused),
    #[error(transparent)]
    NodeCgroup(#[from] NodeCgroupRefused),
    #[error("reserved cgroup {path} does not exist (the kubelet never creates it)")]
    ReservedMissing { path: PathBuf },
    #[error("{path}: cannot create the cgroup: {source}{hint}", hint = crate::support::privilege_hint(.source))]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}/{file}: cannot read: {source}{hint}", hint = crate::support::privilege_hint(.source))]
    Read {
        path: PathBuf,
        file: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{path}/{file}: cannot write {value:?}: {source}{hint}", hint = crate::support::privilege_hint(.source))]
    Write {
        path: PathBuf,
        file: &'static str,
        value: String,
        #[source]
        source: io::Error,
    },
}

/// The outcome of one pass.
#[derive(Debug)]
pub struct ReconcileReport {
    /// Cgroup directories created (enforce) or missing (observe).
    pub created: Vec<PathBuf>,
    pub writes: Vec<WriteReport>,
    pub errors: Vec<ReconcileError>,
    /// Cgroups (per tree) whose files this pass read; with a change feed, only those that may
    /// have changed.
    pub read: usize,
    /// The cgroups (per tree) among them that exist and whose files were compared with the
    /// plan: a file of theirs not in `writes` holds the plan's value now, or could not be read
    /// (an entry of `errors`).
    pub(crate) compared: Vec<(CgroupPath, Tree)>,
}

impl ReconcileReport {
    pub(super) fn new() -> Self {
        Self {
            created: Vec::new(),
            writes: Vec::new(),
            errors: Vec::new(),
            read: 0,
            compared: Vec::new(),
        }
    }

    /// Appends a part's entries after this report's.
    pub(super) fn absorb(&mut self, part: Self) {
        self.created.extend(part.created);
        self.writes.extend(part.writes);
        self.errors.extend(part.errors);
        self.read += part.read;
        self.compared.extend(part.compared);
    }

    /// Writes actually issued to the kernel (retries included).
    pub fn writes_issued(&self) -> usize {
        self.writes
            .iter()
            .map(|w| match w.result {
                WriteResult::Drift => 0,
                WriteResult::RetriedAtUsage { written: true, .. } => 2,
                _ => 1,
            })
            .sum()
    }

    /// The differences found in observe mode.
    pub fn drift(&self) -> impl Iterator<Item = &WriteReport> {
        self.writes
            .iter()
            .filter(|w| w.result == WriteResult::Drift)
    }
}
