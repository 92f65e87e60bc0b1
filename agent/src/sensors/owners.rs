//! Which pod and container a cgroup belongs to, filled by the agent, used to attribute OOM
//! victims.

use std::collections::HashMap;

use super::event::{CgroupOwner, OomVictim};

#[derive(Debug, Default, Clone)]
pub struct CgroupOwners {
    by_id: HashMap<u64, CgroupOwner>,
}

impl CgroupOwners {
    pub fn insert(&mut self, cgroup_id: u64, owner: CgroupOwner) {
        self.by_id.insert(cgroup_id, owner);
    }

    pub fn remove(&mut self, cgroup_id: u64) {
        self.by_id.remove(&cgroup_id);
    }

    pub fn get(&self, cgroup_id: u64) -> Option<&CgroupOwner> {
        self.by_id.get(&cgroup_id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Fills `victim.owner` from its v2 cgroup, else from its memory cgroup (v1 hosts).
    pub fn attribute(&self, victim: &mut OomVictim) {
        victim.owner = self
            .get(victim.cgroup_id)
            .or_else(|| victim.memcg_id.and_then(|m| self.get(m)))
            .cloned();
    }
}
