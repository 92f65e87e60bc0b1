//! Kernel-specific layouts handed to the programs at load time as globals.
//!
//! Rust eBPF objects carry no CO-RE relocations, so the agent reads these values from
//! `/sys/kernel/btf/vmlinux` and from tracefs `format` files of the running kernel.

/// Field offsets of a classic `oom/mark_victim` tracepoint record, from its tracefs format.
/// A field the kernel does not have is `u32::MAX`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomTracepointLayout {
    pub pid: u32,
    pub anon_rss: u32,
    pub file_rss: u32,
    pub shmem_rss: u32,
    pub oom_score_adj: u32,
    pub _pad: u32,
}

impl OomTracepointLayout {
    pub const ABSENT: u32 = u32::MAX;

    /// A layout that makes the program read nothing; replaced at load time.
    pub const UNSET: Self = Self {
        pid: Self::ABSENT,
        anon_rss: Self::ABSENT,
        file_rss: Self::ABSENT,
        shmem_rss: Self::ABSENT,
        oom_score_adj: Self::ABSENT,
        _pad: 0,
    };
}

/// Offsets inside kernel structures used to read an OOM victim from its `task_struct`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomBtfLayout {
    /// 1 when every offset below was resolved; 0 makes the program drop its events.
    pub valid: u32,
    /// `task_struct.pid`, `task_struct.tgid`.
    pub task_pid: u32,
    pub task_tgid: u32,
    /// `task_struct.comm`.
    pub task_comm: u32,
    /// `task_struct.cgroups` (`struct css_set *`).
    pub task_cgroups: u32,
    /// `css_set.dfl_cgrp` (`struct cgroup *`).
    pub css_set_dfl_cgrp: u32,
    /// `css_set.subsys[memory_cgrp_id]`: offset of the array plus index times pointer size.
    pub css_set_memory_css: u32,
    /// `cgroup_subsys_state.cgroup`.
    pub css_cgroup: u32,
    /// `cgroup.kn` (`struct kernfs_node *`).
    pub cgroup_kn: u32,
    /// `kernfs_node.id` (u64).
    pub kernfs_node_id: u32,
    /// `task_struct.signal`, `signal_struct.oom_score_adj` (short).
    pub task_signal: u32,
    pub signal_oom_score_adj: u32,
    /// `task_struct.mm`.
    pub task_mm: u32,
    /// Offset of the counter (an i64) for file, anon and shmem pages inside `mm_struct`:
    /// `rss_stat` plus the element index times element size plus the count's offset inside it.
    pub mm_file_pages: u32,
    pub mm_anon_pages: u32,
    pub mm_shmem_pages: u32,
    /// 1 when the memory controller is known (`memory_cgrp_id` resolved).
    pub has_memcg: u32,
}

impl OomBtfLayout {
    /// A layout that makes the program emit nothing; replaced at load time.
    pub const UNSET: Self = Self {
        valid: 0,
        task_pid: 0,
        task_tgid: 0,
        task_comm: 0,
        task_cgroups: 0,
        css_set_dfl_cgrp: 0,
        css_set_memory_css: 0,
        css_cgroup: 0,
        cgroup_kn: 0,
        kernfs_node_id: 0,
        task_signal: 0,
        signal_oom_score_adj: 0,
        task_mm: 0,
        mm_file_pages: 0,
        mm_anon_pages: 0,
        mm_shmem_pages: 0,
        has_memcg: 0,
    };
}

/// Offsets and enum values for the `fentry/__memcg_memory_event` program (Linux 6.15+, where
/// `memcg_memory_event()` is no longer only inline): `mem_cgroup.css.cgroup->kn->id` and the
/// kernel's `enum memcg_memory_event` values of the events we forward (-1 when unknown).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemcgEventLayout {
    pub valid: u32,
    /// `mem_cgroup.css` plus `cgroup_subsys_state.cgroup`.
    pub memcg_css_cgroup: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    pub high: i32,
    pub max: i32,
    pub oom: i32,
    pub oom_kill: i32,
    pub oom_group_kill: i32,
    pub _pad: u32,
}

impl MemcgEventLayout {
    pub const UNSET: Self = Self {
        valid: 0,
        memcg_css_cgroup: 0,
        cgroup_kn: 0,
        kernfs_node_id: 0,
        high: -1,
        max: -1,
        oom: -1,
        oom_kill: -1,
        oom_group_kill: -1,
        _pad: 0,
    };
}

/// Offsets the scheduler program reads from a task: its pid, its cgroup v2 id
/// (`task->cgroups->dfl_cgrp->kn->id`), the kernel's own run-queue timestamps
/// (`task->sched_info.last_queued` / `last_arrival`, `CONFIG_SCHED_INFO`), the clock they are
/// taken from (`task->se.cfs_rq->rq->clock`, `CONFIG_FAIR_GROUP_SCHED`) and its CPU time
/// (`task->se.sum_exec_runtime`, and its value when the task was last picked).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedBtfLayout {
    /// 1 when every offset below was resolved; 0 makes the program do nothing.
    pub valid: u32,
    pub task_pid: u32,
    pub task_cgroups: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    /// `task_struct.sched_info` plus the member's offset within it.
    pub task_last_queued: u32,
    pub task_last_arrival: u32,
    /// `task_struct.se` plus `sched_entity.cfs_rq`, `sum_exec_runtime` and
    /// `prev_sum_exec_runtime`.
    pub task_se_cfs_rq: u32,
    pub task_se_runtime: u32,
    pub task_se_prev_runtime: u32,
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
}

impl SchedBtfLayout {
    pub const UNSET: Self = Self {
        valid: 0,
        task_pid: 0,
        task_cgroups: 0,
        css_set_dfl_cgrp: 0,
        cgroup_kn: 0,
        kernfs_node_id: 0,
        task_last_queued: 0,
        task_last_arrival: 0,
        task_se_cfs_rq: 0,
        task_se_runtime: 0,
        task_se_prev_runtime: 0,
        cfs_rq_rq: 0,
        rq_clock: 0,
    };
}

/// Field offsets of the classic lifecycle and score tracepoints, from their tracefs formats.
/// A field the kernel does not have is `u32::MAX` and disables the program that needs it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LifecycleTracepointLayout {
    /// `oom:oom_score_adj_update`: pid, comm (char[16]), oom_score_adj (short).
    pub score_pid: u32,
    pub score_comm: u32,
    pub score_adj: u32,
    /// `sched:sched_process_fork`: parent_pid, child_pid.
    pub fork_parent_pid: u32,
    pub fork_child_pid: u32,
    /// `sched:sched_process_exec`: pid.
    pub exec_pid: u32,
    /// `cgroup:cgroup_mkdir` / `cgroup_rmdir`: root (hierarchy id), level, id (u64), path
    /// (`__data_loc char[]`).
    pub cgroup_root: u32,
    pub cgroup_level: u32,
    pub cgroup_id: u32,
    pub cgroup_path: u32,
}

impl LifecycleTracepointLayout {
    pub const ABSENT: u32 = u32::MAX;

    pub const UNSET: Self = Self {
        score_pid: Self::ABSENT,
        score_comm: Self::ABSENT,
        score_adj: Self::ABSENT,
        fork_parent_pid: Self::ABSENT,
        fork_child_pid: Self::ABSENT,
        exec_pid: Self::ABSENT,
        cgroup_root: Self::ABSENT,
        cgroup_level: Self::ABSENT,
        cgroup_id: Self::ABSENT,
        cgroup_path: Self::ABSENT,
    };
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::SchedBtfLayout {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::LifecycleTracepointLayout {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::MemcgEventLayout {}
    // SAFETY: plain `repr(C)` integers without padding; every bit pattern is valid.
    unsafe impl aya::Pod for super::OomTracepointLayout {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::OomBtfLayout {}
}
