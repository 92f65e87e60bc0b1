//! Which interface files hold a cgroup's settings in each hierarchy, and their values. Pure.

use super::{
    desired::{DesiredCgroup, Role},
    layout::{Controller, Tree},
    value::Value,
};
use crate::policy::cpuset::CpuSet;

/// Facts read once per pass that some values depend on.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileContext {
    /// The node root's `cpuset.mems` in a v1 cpuset hierarchy, copied into new cgroups there
    /// (a v1 cpuset starts empty and takes no tasks until both lists are set).
    pub(crate) node_mems: Option<CpuSet>,
}

/// The files to hold `c`'s settings in `tree`, in the order they are written within the cgroup.
pub(crate) fn files(
    c: &DesiredCgroup,
    tree: Tree,
    ctx: &FileContext,
) -> Vec<(&'static str, Value)> {
    let s = &c.settings;
    let limit = |v: Option<i64>, unlimited, paged| Value::Limit {
        value: v,
        unlimited,
        paged,
    };
    let mut out = Vec::new();
    match tree {
        Tree::Unified => {}
        Tree::V1(Controller::Cpu) => {
            // Before the weight: leaving idle resets the kernel's weight to the default, which
            // the weight's write (planned from the value read before) then corrects.
            if let Some(idle) = s.cpu_idle {
                out.push(("cpu.idle", Value::Plain(idle.into())));
            }
            if let Some(v) = s.cpu_shares {
                out.push(("cpu.shares", Value::Plain(v as i64)));
            }
            if let Some(p) = s.cpu_period_us {
                out.push(("cpu.cfs_period_us", Value::Plain(p as i64)));
                out.push(("cpu.cfs_quota_us", limit(s.cpu_quota_us, "-1", false)));
            }
        }
        Tree::V1(Controller::Memory) => {
            if let Some(v) = s.memory_limit {
                out.push(("memory.limit_in_bytes", limit(Some(v), "-1", true)));
            }
        }
        Tree::V1(Controller::Pids) => {
            if let Some(v) = s.pids_max {
                out.push(("pids.max", limit(Some(v), "max", false)));
            }
        }
        Tree::V1(Controller::Cpuset) => {
            if let Some(cpus) = &s.cpus {
                // mems first: a cgroup qoslet created has neither, the reserved ones keep theirs.
                if c.role != Role::Reserved
                    && let Some(mems) = &ctx.node_mems
                {
                    out.push(("cpuset.mems", Value::List(mems.clone())));
                }
                out.push(("cpuset.cpus", Value::List(cpus.clone())));
            }
        }
        Tree::V2 => {
            if let Some(idle) = s.cpu_idle {
                out.push(("cpu.idle", Value::Plain(idle.into())));
            }
            if let Some(v) = s.cpu_weight {
                out.push(("cpu.weight", Value::Plain(v as i64)));
            }
            if let Some(period) = s.cpu_period_us {
                out.push((
                    "cpu.max",
                    Value::CpuMax {
                        quota: s.cpu_quota_us,
                        period,
                    },
                ));
            }
            for (file, v) in [
                ("memory.max", s.memory_limit),
                ("memory.min", s.memory_min),
                ("memory.low", s.memory_low),
                ("memory.high", s.memory_high),
            ] {
                if let Some(v) = v {
                    out.push((file, limit(Some(v), "max", true)));
                }
            }
            if let Some(group) = s.memory_oom_group {
                out.push(("memory.oom.group", Value::Plain(i64::from(group))));
            }
            if let Some(v) = s.pids_max {
                out.push(("pids.max", limit(Some(v), "max", false)));
            }
            if let Some(cpus) = s.cpus.as_ref().filter(|_| !s.cpus_v1_only) {
                out.push(("cpuset.cpus", Value::List(cpus.clone())));
            }
        }
    }
    out
}

/// The v2 controllers a cgroup's children need enabled in its `cgroup.subtree_control`.
pub(crate) const V2_CONTROLLERS: [&str; 4] = ["cpu", "cpuset", "memory", "pids"];

/// Whether `c` has children qoslet manages.
pub(crate) fn has_managed_children(c: &DesiredCgroup) -> bool {
    super::desired::has_children(c.role)
}
