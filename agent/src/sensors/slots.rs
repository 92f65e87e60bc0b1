//! Where each watched cgroup's CPU statistics live in the kernel: a slot of the per-CPU array
//! `CPU_SLOT_STATS`, found through one of its two `SLOT_INDEX` places, or, when the slots are
//! full or both places are taken, the `CPU_STATS` hash. Pure bookkeeping; `kmaps` writes the
//! maps to match.

use std::collections::{HashMap, HashSet};

use qoslet_common::sched::{CPU_SLOTS, slot_index_places};

/// The kernel home of one watched cgroup's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatsHome {
    /// `CPU_SLOT_STATS[slot]`, published at `SLOT_INDEX[place]`.
    Slot { slot: u32, place: u32 },
    /// A `CPU_STATS` entry keyed by the cgroup id.
    Hash,
}

#[derive(Debug)]
pub(crate) struct SlotTable {
    homes: HashMap<u64, StatsHome>,
    /// Free slots, the lowest last (taken first).
    free: Vec<u32>,
    taken_places: HashSet<u32>,
}

impl Default for SlotTable {
    fn default() -> Self {
        Self {
            homes: HashMap::new(),
            free: (0..CPU_SLOTS).rev().collect(),
            taken_places: HashSet::new(),
        }
    }
}

impl SlotTable {
    /// Gives a newly watched cgroup its home; `None` when it already has one (watching again
    /// keeps its statistics).
    pub(crate) fn place(&mut self, cgroup_id: u64) -> Option<StatsHome> {
        if self.homes.contains_key(&cgroup_id) {
            return None;
        }
        let place = slot_index_places(cgroup_id)
            .into_iter()
            .find(|p| !self.taken_places.contains(p));
        let home = match (place, self.free.pop()) {
            (Some(place), Some(slot)) => {
                self.taken_places.insert(place);
                StatsHome::Slot { slot, place }
            }
            (None, Some(slot)) => {
                self.free.push(slot);
                StatsHome::Hash
            }
            (_, None) => StatsHome::Hash,
        };
        self.homes.insert(cgroup_id, home);
        Some(home)
    }

    /// Forgets a cgroup, freeing its slot and place; returns where it lived.
    pub(crate) fn remove(&mut self, cgroup_id: u64) -> Option<StatsHome> {
        let home = self.homes.remove(&cgroup_id)?;
        if let StatsHome::Slot { slot, place } = home {
            self.taken_places.remove(&place);
            self.free.push(slot);
        }
        Some(home)
    }

    pub(crate) fn home(&self, cgroup_id: u64) -> Option<StatsHome> {
        self.homes.get(&cgroup_id).copied()
    }

    /// The watched cgroup ids.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.homes.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_common::sched::SLOT_INDEX_HALF;

    #[test]
    fn slots_first_then_the_hash_once_they_run_out() {
        let mut t = SlotTable::default();
        // Consecutive ids: distinct low bits, so the first place is always free.
        let homes: Vec<_> = (0..CPU_SLOTS as u64 + 3)
            .map(|i| t.place(1000 + i).expect("new"))
            .collect();
        assert!(
            homes[..CPU_SLOTS as usize]
                .iter()
                .all(|h| matches!(h, StatsHome::Slot { .. }))
        );
        assert!(
            homes[CPU_SLOTS as usize..]
                .iter()
                .all(|h| *h == StatsHome::Hash)
        );
        let slots: HashSet<_> = homes
            .iter()
            .filter_map(|h| match h {
                StatsHome::Slot { slot, .. } => Some(*slot),
                StatsHome::Hash => None,
            })
            .collect();
        assert_eq!(slots.len(), CPU_SLOTS as usize, "no slot given twice");
        assert_eq!(t.place(1000), None, "watching again keeps the home");

        // A freed slot goes to the next cgroup.
        let StatsHome::Slot { slot, .. } = t.remove(1000).expect("watched") else {
            panic!("1000 had a slot");
        };
        assert_eq!(
            t.place(5000),
            Some(StatsHome::Slot {
                slot,
                place: slot_index_places(5000)[0]
            })
        );
        assert_eq!(t.remove(1000), None, "already forgotten");
    }

    #[test]
    fn a_cgroup_whose_two_places_are_taken_lives_in_the_hash() {
        let mut t = SlotTable::default();
        let half = SLOT_INDEX_HALF as u64;
        let a = 7u64;
        let [a_first, _] = slot_index_places(a);
        // Same low bits as `a`: the same first place, so it takes its second.
        let b = a + half;
        assert_eq!(slot_index_places(b)[0], a_first);
        assert_eq!(
            t.place(a),
            Some(StatsHome::Slot {
                slot: 0,
                place: a_first
            })
        );
        let b_second = slot_index_places(b)[1];
        assert_eq!(
            t.place(b),
            Some(StatsHome::Slot {
                slot: 1,
                place: b_second
            })
        );
        // An id with `a`'s first place and `b`'s second.
        let c = (2..4_000_000u64)
            .map(|k| a + k * half)
            .find(|&c| slot_index_places(c)[1] == b_second)
            .expect("some id shares both places");
        assert_eq!(t.place(c), Some(StatsHome::Hash), "both places taken");
        assert_eq!(t.home(c), Some(StatsHome::Hash));
        // Once `a` goes, its place and slot serve the next cgroup that needs them.
        t.remove(a);
        let d = a + 3 * half;
        assert_ne!(d, c);
        assert_eq!(
            t.place(d),
            Some(StatsHome::Slot {
                slot: 0,
                place: a_first
            })
        );
        assert_eq!(t.ids().count(), 3);
    }
}
