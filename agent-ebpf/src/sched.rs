//! Run-queue latency (wakeup to running) and on-CPU time per watched cgroup, from
//! `tp_btf/sched_wakeup`, `sched_wakeup_new` and `sched_switch`.
//!
//! These run on every context switch of the node, so the common case, a task of a cgroup nobody
//! watches, must be cheap: its cgroup id (`task->cgroups->dfl_cgrp->kn->id`) is read with direct
//! BTF-typed loads (the offsets are frozen `.rodata` constants, so the verifier checks each load
//! against the kernel's own types; the JIT makes them fault-safe) and one hash lookup in
//! `CPU_STATS`, whose entries the agent creates for exactly the watched cgroups. The clock and
//! the per-task map are touched only for tasks of watched cgroups. The cgroup is read on every
//! event rather than cached per task, so a task moved between cgroups is attributed at once.

use aya_ebpf::{
    Global,
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, map},
    maps::{LruHashMap, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use qoslet_common::{
    SchedBtfLayout,
    sched::{CpuStats, RUNQ_HIST_BUCKETS, TASK_ONCPU, TASK_QUEUED, TaskState},
};

use crate::maps::{MAX_CGROUPS, add};

#[unsafe(no_mangle)]
static SCHED_LAYOUT: Global<SchedBtfLayout> = Global::new(SchedBtfLayout::UNSET);

/// Per watched cgroup v2 id: created by the agent when it watches the cgroup (its presence is
/// the scheduler programs' watch test), deleted on unwatch and by `cgroup_rmdir`. One copy per
/// CPU, summed by the agent, so the CPUs running one cgroup's tasks do not bounce a cache line
/// on every switch; not preallocated, so its memory follows the watched cgroups rather than
/// `MAX_CGROUPS` times the CPUs.
#[map]
pub static CPU_STATS: PerCpuHashMap<u64, CpuStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);

const BPF_F_NO_PREALLOC: u32 = 1;

/// Tasks of watched cgroups, by thread id. LRU: exited tasks age out.
#[map]
static TASKS: LruHashMap<u32, TaskState> = LruHashMap::with_max_entries(65536, 0);

/// `prev_state` of a task that was preempted while runnable.
const TASK_RUNNING: u32 = 0;

#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    try_wakeup(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    try_wakeup(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    // (bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
    try_switch(ctx.arg(1), ctx.arg(2), ctx.arg(3));
    0
}

/// A direct load at `base + offset`. `base` is a BTF-typed kernel pointer the verifier tracks
/// and `offset` a constant from the frozen layout, so the verifier checks the field's type and
/// size; a NULL or stale pointer reads as 0 (the JIT's exception table), never a fault.
#[inline(always)]
unsafe fn load<T: Copy>(base: *const u8, offset: u32) -> T {
    // SAFETY: see above; BPF_PROBE_MEM loads cannot fault the kernel.
    unsafe { core::ptr::read_volatile(base.add(offset as usize) as *const T) }
}

#[inline(always)]
fn pid_of(l: &SchedBtfLayout, task: *const u8) -> u32 {
    unsafe { load::<i32>(task, l.task_pid) as u32 }
}

#[inline(always)]
fn cgroup_of(l: &SchedBtfLayout, task: *const u8) -> u64 {
    unsafe {
        let css_set: *const u8 = load(task, l.task_cgroups);
        let cgroup: *const u8 = load(css_set, l.css_set_dfl_cgrp);
        let kn: *const u8 = load(cgroup, l.cgroup_kn);
        load(kn, l.kernfs_node_id)
    }
}

/// The stats of the task's cgroup when that cgroup is watched.
#[inline(always)]
fn watched_stats(l: &SchedBtfLayout, task: *const u8) -> Option<(u64, &'static mut CpuStats)> {
    let cgroup_id = cgroup_of(l, task);
    let s = CPU_STATS.get_ptr_mut(&cgroup_id)?;
    // SAFETY: a live map value.
    Some((cgroup_id, unsafe { &mut *s }))
}

fn try_wakeup(task: *const u8) {
    let l = SCHED_LAYOUT.load();
    if l.valid == 0 {
        return;
    }
    if let Some((cgroup_id, _)) = watched_stats(&l, task) {
        let pid = pid_of(&l, task);
        let now = unsafe { bpf_ktime_get_ns() };
        // Updated in place: an LRU insert costs several times a lookup.
        match known(pid, cgroup_id) {
            Some(t) => {
                t.since_ns = now;
                t.state = TASK_QUEUED;
            }
            None => set(pid, cgroup_id, TASK_QUEUED, now),
        }
    }
}

/// Records the task's state, replacing whatever was known.
#[inline(always)]
fn set(pid: u32, cgroup_id: u64, state: u32, now: u64) {
    let t = TaskState {
        cgroup_id,
        since_ns: now,
        state,
        _pad: 0,
    };
    let _ = TASKS.insert(&pid, &t, 0);
}

/// The task's state if it was learnt in this cgroup (a task moved in from elsewhere starts over).
#[inline(always)]
fn known(pid: u32, cgroup_id: u64) -> Option<&'static mut TaskState> {
    let t = TASKS.get_ptr_mut(&pid)?;
    // SAFETY: a live map value.
    let t = unsafe { &mut *t };
    (t.cgroup_id == cgroup_id).then_some(t)
}

fn try_switch(prev: *const u8, next: *const u8, prev_state: u32) {
    let l = SCHED_LAYOUT.load();
    if l.valid == 0 {
        return;
    }
    // The clock is read once, and only when a watched task is involved.
    let mut now = 0u64;
    let mut clock = || {
        if now == 0 {
            now = unsafe { bpf_ktime_get_ns() };
        }
        now
    };
    // pid 0 is the idle task of every CPU.
    let prev_pid = pid_of(&l, prev);
    if prev_pid != 0
        && let Some((cgroup_id, s)) = watched_stats(&l, prev)
    {
        switched_out(prev_pid, cgroup_id, s, prev_state == TASK_RUNNING, clock());
    }
    let next_pid = pid_of(&l, next);
    if next_pid != 0
        && let Some((cgroup_id, s)) = watched_stats(&l, next)
    {
        switched_in(next_pid, cgroup_id, s, clock());
    }
}

#[inline(always)]
fn switched_out(pid: u32, cgroup_id: u64, s: &mut CpuStats, runnable: bool, now: u64) {
    // A preempted task waits on the run queue from now on; a sleeping one waits for its wakeup,
    // which restarts the clock. A CPU-bound task never wakes up: it is learnt here.
    let state = if runnable { TASK_QUEUED } else { 0 };
    match known(pid, cgroup_id) {
        Some(t) => {
            if t.state == TASK_ONCPU {
                add(&mut s.oncpu_ns, now.wrapping_sub(t.since_ns));
            }
            t.since_ns = now;
            t.state = state;
        }
        None if runnable => set(pid, cgroup_id, state, now),
        None => {}
    }
}

#[inline(always)]
fn switched_in(pid: u32, cgroup_id: u64, s: &mut CpuStats, now: u64) {
    match known(pid, cgroup_id) {
        Some(t) => {
            if t.state == TASK_QUEUED {
                let waited = now.wrapping_sub(t.since_ns);
                let bucket = log2(waited / 1000);
                add(&mut s.runq_count, 1);
                add(&mut s.runq_total_ns, waited);
                if bucket < RUNQ_HIST_BUCKETS {
                    add(&mut s.runq_hist[bucket], 1);
                }
            }
            t.since_ns = now;
            t.state = TASK_ONCPU;
        }
        None => set(pid, cgroup_id, TASK_ONCPU, now),
    }
}

/// floor(log2(v)), 0 for 0; branchy because BPF has no count-leading-zeros instruction.
#[inline(always)]
fn log2(mut v: u64) -> usize {
    let mut r = 0;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    r
}
