//! The node-level observations of one pass (`makeSignalObservations`), read fresh.

use crate::cgroup::CgroupBeneath;

use super::{
    signals::{MemoryCgroup, SignalError, read_pids, task_max},
    thresholds::{Observations, Observed},
};

/// Where the node's signals are read.
#[derive(Debug, Clone)]
pub struct NodeSignals {
    /// The cgroup that acts as the node: `memory.available` = capacity - its working set.
    pub node_root: MemoryCgroup,
    /// Node memory capacity; `None` takes the node root's memory limit.
    pub capacity_bytes: Option<i64>,
    /// The pods' cgroup: `allocatableMemory.available` = its limit - its working set.
    pub kubepods: Option<MemoryCgroup>,
    /// A pids cgroup of the node root: `pid.available` is its pids.max (without one, the
    /// kernel's task limit) less its pids.current.
    pub pids: Option<CgroupBeneath>,
}

impl NodeSignals {
    /// Every file [`NodeSignals::observe`] reads, by its directory.
    pub(crate) fn files(&self) -> Vec<(&CgroupBeneath, &'static str)> {
        let mut files: Vec<_> = self.node_root.files().into();
        if let Some(k) = &self.kubepods {
            files.extend(k.files());
        }
        if let Some(p) = &self.pids {
            files.extend([(p, "pids.current"), (p, "pids.max")]);
        }
        files
    }

    pub(crate) fn observe(&self) -> Result<Observations, SignalError> {
        let mut obs = Observations::new();
        let root = self.node_root.read()?;
        let capacity =
            self.capacity_bytes
                .or(root.limit_bytes)
                .ok_or_else(|| SignalError::NoCapacity {
                    path: self.node_root.display(),
                })?;
        obs.insert(
            "memory.available".into(),
            Observed {
                available: capacity - root.working_set(),
                capacity,
            },
        );
        // Absent, as the kubelet's is, while the pods' cgroup has no limit (`pods` not in
        // enforceNodeAllocatable) or cannot be read (not made yet): `memory.available` stands.
        // The limit first: without one its usage and `memory.stat` are not read.
        if let Some(k) = &self.kubepods
            && let Ok(Some(capacity)) = k.limit()
            && let Ok(r) = k.reading_without_limit()
        {
            obs.insert(
                "allocatableMemory.available".into(),
                Observed {
                    available: capacity - r.working_set(),
                    capacity,
                },
            );
        }
        if let Some(p) = &self.pids {
            let r = read_pids(p)?;
            let capacity = match r.max {
                Some(m) => m,
                None => task_max()?,
            };
            obs.insert(
                "pid.available".into(),
                Observed {
                    available: capacity - r.current,
                    capacity,
                },
            );
        }
        Ok(obs)
    }
}
