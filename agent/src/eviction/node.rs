//! The node-level observations of one pass (`makeSignalObservations`), read fresh.

use std::path::PathBuf;

use super::{
    signals::{MemoryCgroup, SignalError, pid_max, read_pids},
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
    /// A pids cgroup of the node root: `pid.available` = pids.max (or pid_max) - pids.current.
    pub pids: Option<PathBuf>,
}

impl NodeSignals {
    /// Every file [`NodeSignals::observe`] reads.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.node_root.files().into();
        if let Some(k) = &self.kubepods {
            files.extend(k.files());
        }
        if let Some(p) = &self.pids {
            files.push(p.join("pids.current"));
            files.push(p.join("pids.max"));
        }
        files
    }

    pub fn observe(&self) -> Result<Observations, SignalError> {
        let mut obs = Observations::new();
        let root = self.node_root.read()?;
        let capacity =
            self.capacity_bytes
                .or(root.limit_bytes)
                .ok_or_else(|| SignalError::NoCapacity {
                    path: self.node_root.path().to_owned(),
                })?;
        obs.insert(
            "memory.available".into(),
            Observed {
                available: capacity - root.working_set(),
                capacity,
            },
        );
        if let Some(k) = &self.kubepods {
            let r = k.read()?;
            let capacity = r.limit_bytes.ok_or_else(|| SignalError::NoCapacity {
                path: k.path().to_owned(),
            })?;
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
                None => pid_max()?,
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
