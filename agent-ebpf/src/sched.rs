//! Run-queue latency (wakeup to running) and on-CPU time per watched cgroup, from
//! `tp_btf/sched_wakeup`, `sched_wakeup_new` and `sched_switch`.
//!
//! A task's cgroup is resolved (`task->cgroups->dfl_cgrp->kn->id`, offsets from BTF) only when it
//! is not yet in `TASKS`; tasks of unwatched cgroups cost one hash lookup per switch side.

use aya_ebpf::{
    Global,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, map},
    maps::{HashMap, LruHashMap},
    programs::BtfTracePointContext,
};
use qoslet_common::{
    SchedBtfLayout,
    sched::{CpuStats, RUNQ_HIST_BUCKETS, TASK_ONCPU, TASK_QUEUED, TaskState},
};

use crate::maps::{MAX_CGROUPS, add, watched};

#[unsafe(no_mangle)]
static SCHED_LAYOUT: Global<SchedBtfLayout> = Global::new(SchedBtfLayout::UNSET);

/// Per watched cgroup v2 id.
#[map]
pub static CPU_STATS: HashMap<u64, CpuStats> = HashMap::with_max_entries(MAX_CGROUPS, 0);

/// Tasks of watched cgroups, by thread id. LRU: exited tasks age out.
#[map]
static TASKS: LruHashMap<u32, TaskState> = LruHashMap::with_max_entries(65536, 0);

/// `prev_state` of a task that was preempted while runnable.
const TASK_RUNNING: u32 = 0;

#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    let _ = try_wakeup(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    let _ = try_wakeup(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    // (bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
    let _ = try_switch(ctx.arg(1), ctx.arg(2), ctx.arg(3));
    0
}

#[inline(always)]
unsafe fn read_at<T>(base: *const u8, offset: u32) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one is an error, not a fault.
    unsafe { bpf_probe_read_kernel(base.add(offset as usize) as *const T) }
}

#[inline(always)]
fn pid_of(l: &SchedBtfLayout, task: *const u8) -> Result<u32, i32> {
    unsafe { read_at::<i32>(task, l.task_pid).map(|p| p as u32) }
}

#[inline(always)]
fn cgroup_of(l: &SchedBtfLayout, task: *const u8) -> Result<u64, i32> {
    unsafe {
        let css_set: *const u8 = read_at(task, l.task_cgroups)?;
        let cgroup: *const u8 = read_at(css_set, l.css_set_dfl_cgrp)?;
        let kn: *const u8 = read_at(cgroup, l.cgroup_kn)?;
        read_at(kn, l.kernfs_node_id)
    }
}

fn try_wakeup(task: *const u8) -> Result<(), i32> {
    let l = SCHED_LAYOUT.load();
    if l.valid == 0 {
        return Err(0);
    }
    let pid = pid_of(&l, task)?;
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(t) = TASKS.get_ptr_mut(&pid) {
        // SAFETY: a live map value.
        let t = unsafe { &mut *t };
        t.since_ns = now;
        t.state = TASK_QUEUED;
        return Ok(());
    }
    let cgroup_id = cgroup_of(&l, task)?;
    if watched(cgroup_id) {
        queue(pid, cgroup_id, now);
    }
    Ok(())
}

#[inline(always)]
fn queue(pid: u32, cgroup_id: u64, now: u64) {
    let t = TaskState {
        cgroup_id,
        since_ns: now,
        state: TASK_QUEUED,
        _pad: 0,
    };
    let _ = TASKS.insert(&pid, &t, 0);
}

fn try_switch(prev: *const u8, next: *const u8, prev_state: u32) -> Result<(), i32> {
    let l = SCHED_LAYOUT.load();
    if l.valid == 0 {
        return Err(0);
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let prev_pid = pid_of(&l, prev)?;
    // pid 0 is the idle task of every CPU.
    if prev_pid != 0 {
        switched_out(&l, prev, prev_pid, prev_state, now);
    }
    let next_pid = pid_of(&l, next)?;
    if next_pid != 0 {
        switched_in(&l, next, next_pid, now);
    }
    Ok(())
}

#[inline(always)]
fn switched_out(l: &SchedBtfLayout, prev: *const u8, pid: u32, prev_state: u32, now: u64) {
    let runnable = prev_state == TASK_RUNNING;
    match TASKS.get_ptr_mut(&pid) {
        Some(t) => {
            // SAFETY: a live map value.
            let t = unsafe { &mut *t };
            if t.state == TASK_ONCPU {
                stats_of(t.cgroup_id, |s| {
                    add(&mut s.oncpu_ns, now.wrapping_sub(t.since_ns))
                });
            }
            // A preempted task waits on the run queue from now on; a sleeping one waits for
            // its wakeup, which restarts the clock.
            t.since_ns = now;
            t.state = if runnable { TASK_QUEUED } else { 0 };
        }
        None if runnable => {
            // A CPU-bound task of a watched cgroup never wakes up: learn it when preempted.
            if let Ok(cgroup_id) = cgroup_of(l, prev)
                && watched(cgroup_id)
            {
                queue(pid, cgroup_id, now);
            }
        }
        None => {}
    }
}

#[inline(always)]
fn switched_in(l: &SchedBtfLayout, next: *const u8, pid: u32, now: u64) {
    match TASKS.get_ptr_mut(&pid) {
        Some(t) => {
            // SAFETY: a live map value.
            let t = unsafe { &mut *t };
            if t.state == TASK_QUEUED {
                let waited = now.wrapping_sub(t.since_ns);
                let bucket = log2(waited / 1000);
                stats_of(t.cgroup_id, |s| {
                    add(&mut s.runq_count, 1);
                    add(&mut s.runq_total_ns, waited);
                    if bucket < RUNQ_HIST_BUCKETS {
                        add(&mut s.runq_hist[bucket], 1);
                    }
                });
            }
            t.since_ns = now;
            t.state = TASK_ONCPU;
        }
        None => {
            if let Ok(cgroup_id) = cgroup_of(l, next)
                && watched(cgroup_id)
            {
                let t = TaskState {
                    cgroup_id,
                    since_ns: now,
                    state: TASK_ONCPU,
                    _pad: 0,
                };
                let _ = TASKS.insert(&pid, &t, 0);
            }
        }
    }
}

/// Runs `f` on the cgroup's stats, creating them for a watched cgroup.
#[inline(always)]
fn stats_of(cgroup_id: u64, f: impl FnOnce(&mut CpuStats)) {
    if let Some(s) = CPU_STATS.get_ptr_mut(&cgroup_id) {
        // SAFETY: a live map value.
        f(unsafe { &mut *s });
        return;
    }
    // The cgroup may have been removed (and unwatched) since the task was learnt.
    if !watched(cgroup_id) {
        return;
    }
    let _ = CPU_STATS.insert(&cgroup_id, &CpuStats::ZERO, 1 /* BPF_NOEXIST */);
    if let Some(s) = CPU_STATS.get_ptr_mut(&cgroup_id) {
        // SAFETY: a live map value.
        f(unsafe { &mut *s });
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
