//! From current file contents to the minimal, safely ordered list of writes. Pure.
//!
//! Order: every widening write (raised limits, wider cpusets, relative weights) parents first,
//! then every narrowing write children first. So a v1 child never exceeds its parent's cpuset or
//! CFS quota at any moment, and a parent is never lowered under a child that still holds more.

use super::{
    layout::Tree,
    value::{Direction, Value},
};

/// One managed file as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileState {
    /// Index of the cgroup in the desired state.
    pub(crate) cgroup: usize,
    pub(crate) depth: usize,
    pub(crate) tree: Tree,
    pub(crate) file: &'static str,
    /// `None`: the cgroup does not exist yet (observe mode) or the file could not be read.
    pub(crate) current: Option<String>,
    pub(crate) want: Value,
}

/// A write to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedWrite {
    pub(crate) cgroup: usize,
    pub(crate) depth: usize,
    pub(crate) tree: Tree,
    pub(crate) file: &'static str,
    pub(crate) old: Option<String>,
    pub(crate) new: Value,
    pub(crate) direction: Direction,
}

/// The writes that bring every file to its wanted value, in a safe order.
pub(crate) fn plan_writes(files: Vec<FileState>, page: i64) -> Vec<PlannedWrite> {
    let mut widen = Vec::new();
    let mut narrow = Vec::new();
    for f in files {
        let mut old = f.current.as_deref().map(|c| c.trim().to_string());
        for (new, direction) in f.want.steps(f.current.as_deref(), page) {
            let w = PlannedWrite {
                cgroup: f.cgroup,
                depth: f.depth,
                tree: f.tree,
                file: f.file,
                old: old.clone(),
                new: new.clone(),
                direction,
            };
            old = Some(new.render());
            match direction {
                Direction::Widen => widen.push(w),
                Direction::Narrow => narrow.push(w),
            }
        }
    }
    // Stable sorts keep the per-cgroup file order (cfs_period before cfs_quota, mems before cpus).
    widen.sort_by_key(|w| w.depth);
    narrow.sort_by_key(|w| std::cmp::Reverse(w.depth));
    widen.append(&mut narrow);
    widen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::layout::Controller;

    fn cpus(cgroup: usize, depth: usize, current: &str, want: &str) -> FileState {
        FileState {
            cgroup,
            depth,
            tree: Tree::V1(Controller::Cpuset),
            file: "cpuset.cpus",
            current: Some(current.into()),
            want: Value::List(want.parse().unwrap()),
        }
    }

    fn order(w: &[PlannedWrite]) -> Vec<(usize, String)> {
        w.iter().map(|w| (w.cgroup, w.new.render())).collect()
    }

    #[test]
    fn parents_widen_first_and_children_narrow_first() {
        // kubepods (0) and a pod (1) move from CPU 0 to CPU 1: widen top-down to 0-1, then
        // narrow bottom-up to 1.
        let w = plan_writes(vec![cpus(1, 3, "0", "1"), cpus(0, 1, "0", "1")], 4096);
        assert_eq!(
            order(&w),
            vec![
                (0, "0-1".into()),
                (1, "0-1".into()),
                (1, "1".into()),
                (0, "1".into())
            ]
        );
        assert_eq!(w[2].old.as_deref(), Some("0-1"));
    }

    #[test]
    fn limits_raise_parents_first_and_lower_children_first() {
        let mem = |cgroup, depth, current: &str, want| FileState {
            cgroup,
            depth,
            tree: Tree::V2,
            file: "memory.max",
            current: Some(current.into()),
            want: Value::Limit {
                value: Some(want),
                unlimited: "max",
                paged: true,
            },
        };
        let w = plan_writes(
            vec![
                mem(2, 3, "4096", 8192),
                mem(1, 2, "8192", 4096),
                mem(0, 1, "4096", 16384),
                mem(3, 3, "16384", 4096),
            ],
            4096,
        );
        assert_eq!(
            order(&w),
            vec![
                (0, "16384".into()),
                (2, "8192".into()),
                (3, "4096".into()),
                (1, "4096".into())
            ]
        );
    }

    #[test]
    fn nothing_to_do_when_everything_matches() {
        assert!(plan_writes(vec![cpus(0, 1, "0-1\n", "0-1")], 4096).is_empty());
    }
}
