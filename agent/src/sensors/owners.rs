//! Which pod and container a cgroup belongs to, filled by the agent, used to attribute OOM
//! victims.

use std::collections::HashMap;

use super::event::{CgroupOwner, OomVictim};

#[derive(Debug, Default, Clone)]
pub(crate) struct CgroupOwners {
    by_id: HashMap<u64, CgroupOwner>,
}

impl CgroupOwners {
    pub(crate) fn insert(&mut self, cgroup_id: u64, owner: CgroupOwner) {
        self.by_id.insert(cgroup_id, owner);
    }

    pub(crate) fn remove(&mut self, cgroup_id: u64) {
        self.by_id.remove(&cgroup_id);
    }

    pub(crate) fn get(&self, cgroup_id: u64) -> Option<&CgroupOwner> {
        self.by_id.get(&cgroup_id)
    }

    /// Fills `victim.owner` from its v2 cgroup, else from its memory cgroup (v1 hosts).
    pub(crate) fn attribute(&self, victim: &mut OomVictim) {
        victim.owner = self
            .get(victim.cgroup_id)
            .or_else(|| victim.memcg_id.and_then(|m| self.get(m)))
            .cloned();
    }
}
