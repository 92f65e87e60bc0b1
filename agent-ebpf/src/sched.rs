//! Run-queue latency (enqueue to running) and on-CPU time per watched cgroup, from
//! `tp_btf/sched_switch` alone.
//!
//! The kernel already times both edges for its own delay accounting (`CONFIG_SCHED_INFO`): a
//! task's `sched_info.last_queued` is the run-queue clock when it was enqueued (woken, created or
//! preempted) and `last_arrival` when it last got a CPU. `sched_switch` fires just before the
//! kernel folds them into `run_delay` (`sched_info_switch`), with `rq->clock` already read for
//! this switch, so the wait of `next` is `rq->clock - next->sched_info.last_queued`, exactly
//! what the kernel adds to its `run_delay`. The CPU time of `prev`'s slice is what the scheduler
//! added to `se.sum_exec_runtime` since it picked the task (`prev_sum_exec_runtime`), capped by
//! the slice's length `rq->clock - last_arrival`: the cap is the whole value for a task the fair
//! class did not pick (real-time), whose `prev_sum_exec_runtime` is stale. Both are what
//! `/proc/<pid>/schedstat` reports; the task clock leaves out interrupts and, on a VM, stolen
//! time, which the run-queue clock counts.
//!
//! So there is no wakeup program, no per-task map and no clock helper: this program runs on
//! every context switch of the node, and each helper call or map it touches costs every switch.
//!
//! The common case, a task of a cgroup nobody watches, costs its cgroup id
//! (`task->cgroups->dfl_cgrp->kn->id`, direct BTF-typed loads whose offsets are frozen `.rodata`
//! constants, so the verifier checks each against the kernel's own types and the JIT makes them
//! fault-safe) and one bit of `WATCH_FILTER`. A set bit leads to the cgroup's statistics through
//! `SLOT_INDEX` into `CPU_SLOT_STATS`, all array accesses the verifier inlines; only cgroups the
//! slots could not hold take the hash lookup in `CPU_STATS`. Measured here, hash lookups had been
//! most of the program's cost. When `prev` and `next` share a css_set (threads of one process),
//! `next` reuses `prev`'s answer.

use aya_ebpf::{
    Global,
    macros::{btf_tracepoint, map},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use aya_log_ebpf::warn;
use qoslet_common::{
    SchedBtfLayout,
    sched::{
        CPU_SLOTS, CpuStats, RUNQ_HIST_BUCKETS, SLOT_INDEX_HALF, SlotIndexEntry,
        WATCH_FILTER_WORDS, slot_index_places, watch_filter_slot,
    },
};

use crate::{
    diag,
    kernel::sched::{CssSet, Task},
    maps::{MAX_CGROUPS, add},
};

// SAFETY: the only symbol of this name in the object; the agent sets it by name at load time.
#[unsafe(no_mangle)]
static SCHED_LAYOUT: Global<SchedBtfLayout> = Global::new(SchedBtfLayout::UNSET);

/// Statistics of the watched cgroups the slots could not hold, by cgroup v2 id: created by the
/// agent when it watches the cgroup, deleted on unwatch and by `cgroup_rmdir`. One copy per CPU,
/// summed by the agent, so the CPUs running one cgroup's tasks do not bounce a cache line on
/// every switch; not preallocated, so its memory follows those cgroups rather than
/// `MAX_CGROUPS` times the CPUs.
#[map]
pub static CPU_STATS: PerCpuHashMap<u64, CpuStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);

const BPF_F_NO_PREALLOC: u32 = 1;

/// One bit per low-16-bit value of the watched cgroups' ids, kept by the agent (see
/// `qoslet_common::sched::WATCH_FILTER_WORDS`). A set bit may be a neighbour's: `SLOT_INDEX`,
/// then `CPU_STATS`, decide.
#[map]
static WATCH_FILTER: Array<u64> = Array::with_max_entries(WATCH_FILTER_WORDS, 0);

/// Where a watched cgroup's slot is (see `qoslet_common::sched::SLOT_INDEX_HALF`); written by
/// the agent, which zeroes a slot before it publishes the entry naming it. A switch that read
/// the previous owner's entry just before it was cleared may still add to the slot once: these
/// are statistics, not accounting (see `maps::add`).
#[map]
static SLOT_INDEX: Array<SlotIndexEntry> = Array::with_max_entries(2 * SLOT_INDEX_HALF, 0);

/// Per-CPU statistics of the watched cgroups that have a slot.
#[map]
static CPU_SLOT_STATS: PerCpuArray<CpuStats> = PerCpuArray::with_max_entries(CPU_SLOTS, 0);

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    // (bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
    try_switch(&ctx, ctx.arg(1), ctx.arg(2));
    0
}

/// The stats of the css_set's default-hierarchy cgroup when that cgroup is watched.
#[inline(always)]
fn watched_stats(ctx: &BtfTracePointContext, css_set: CssSet) -> Option<&'static mut CpuStats> {
    let cgroup_id = css_set.cgroup_id();
    let (word, bit) = watch_filter_slot(cgroup_id);
    if WATCH_FILTER.get(word).is_none_or(|w| w & bit == 0) {
        return None;
    }
    for place in slot_index_places(cgroup_id) {
        if let Some(e) = SLOT_INDEX.get(place)
            && e.cgroup_id == cgroup_id
        {
            let s = CPU_SLOT_STATS.get_ptr_mut(e.slot)?;
            // SAFETY: a live value of a per-CPU array, this CPU's copy: with preemption off in
            // the tracepoint, nothing else on this CPU uses it while the reference lives.
            return Some(unsafe { &mut *s });
        }
    }
    let s = CPU_STATS.get_ptr_mut(&cgroup_id)?;
    // SAFETY: a live value of a per-CPU hash map, this CPU's copy (see above); the agent or
    // `cgroup_rmdir` may delete the entry, but the kernel frees it only after this program
    // returns (RCU).
    let s = unsafe { &mut *s };
    // The slot table was full when the agent watched this cgroup. Said once per CPU, while this
    // CPU's copy has recorded nothing yet.
    if diag::on() && s.runq_count == 0 && s.oncpu_ns == 0 {
        warn!(
            ctx,
            "Watched cgroup {} has no CPU slot (all {} taken); its CPU statistics are kept in the CPU_STATS hash, at a hash lookup per switch.",
            cgroup_id,
            CPU_SLOTS
        );
    }
    Some(s)
}

fn try_switch(ctx: &BtfTracePointContext, prev: *const u8, next: *const u8) {
    let l = SCHED_LAYOUT.load();
    if l.valid == 0 {
        return;
    }
    // SAFETY: `prev` and `next` are the BTF-typed task_struct arguments of `sched_switch`, and
    // a valid layout was resolved from the running kernel's BTF.
    let (prev, next) = unsafe { (Task::new(prev, &l), Task::new(next, &l)) };
    // `rq->clock` of this CPU through the current task (`prev`): the clock `__schedule` read
    // for this switch, and the one the kernel's `sched_info` timestamps come from. Read once,
    // and only when a watched task is involved.
    let mut now = 0u64;
    let mut clock = || {
        if now == 0 {
            now = prev.rq_clock();
        }
        now
    };
    // pid 0 is the idle task of every CPU; the kernel keeps no sched_info for it. Its pid is a
    // cheaper test than its cgroup (measured: through-idle switches cost 15-20% more without
    // it).
    let prev_set = if prev.pid() != 0 {
        prev.css_set()
    } else {
        CssSet::none(&l)
    };
    let mut prev_stats = if prev_set.is_none() {
        None
    } else {
        watched_stats(ctx, prev_set)
    };
    if let Some(s) = prev_stats.as_deref_mut() {
        let arrived = prev.sched_info_last_arrival();
        let runtime = prev.se_sum_exec_runtime();
        let picked_at = prev.se_prev_sum_exec_runtime();
        let slice = clock().wrapping_sub(arrived);
        // `last_arrival` is 0 before the first arrival.
        if arrived != 0 && (slice as i64) > 0 {
            add(&mut s.oncpu_ns, runtime.wrapping_sub(picked_at).min(slice));
        }
    }
    if next.pid() == 0 {
        return;
    }
    let next_set = next.css_set();
    let next_stats = if next_set.same(prev_set) {
        prev_stats
    } else {
        watched_stats(ctx, next_set)
    };
    if let Some(s) = next_stats {
        // 0 when the task was not queued through `enqueue_task` (never the case for a task
        // being switched in, but the kernel checks it too).
        let queued = next.sched_info_last_queued();
        let waited = clock().wrapping_sub(queued);
        if queued != 0 && (waited as i64) >= 0 {
            add(&mut s.runq_count, 1);
            add(&mut s.runq_total_ns, waited);
            let bucket = log2(waited / 1000);
            if bucket < RUNQ_HIST_BUCKETS {
                add(&mut s.runq_hist[bucket], 1);
            }
        }
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
