//! Reclaim stalls per watched cgroup: `vmscan:mm_vmscan_memcg_reclaim_begin/end` (a memory
//! cgroup at its limit or memory.high) and `mm_vmscan_direct_reclaim_begin/end` (global direct
//! reclaim). The stalled task is the current one, so no record field is read.
//!
//! Reclaim wake-ups: the begin programs and `vmscan:mm_vmscan_wakeup_kswapd` also send a
//! `ReclaimWakeEvent` (direct reclaim and kswapd wakes from any task, memcg reclaim from a task
//! of a watched cgroup), at most one per `RECLAIM_WAKE_INTERVAL_NS` for all of them together, so
//! the eviction manager wakes at the first reclaim of a fast ramp.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap},
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use qoslet_common::{
    EventHeader, EventKind, ReclaimWakeEvent,
    event::{
        RECLAIM_WAKE_DIRECT, RECLAIM_WAKE_INTERVAL_NS, RECLAIM_WAKE_KSWAPD, RECLAIM_WAKE_MEMCG,
    },
    sched::{RECLAIM_DIRECT, RECLAIM_MEMCG, ReclaimStart, ReclaimStats},
};

use crate::{
    diag,
    kernel::{boot_ns, current_cgroup_id, monotonic_ns},
    maps::{MAX_CGROUPS, add, emit, watched},
};

/// Per watched cgroup v2 id.
#[map]
pub static RECLAIM_STATS: HashMap<u64, ReclaimStats> = HashMap::with_max_entries(MAX_CGROUPS, 0);

/// Reclaims in progress by thread id (LRU: a missed end cannot leak an entry for ever).
#[map]
static RECLAIM_STARTS: LruHashMap<u32, ReclaimStart> = LruHashMap::with_max_entries(4096, 0);

/// When the last `ReclaimWakeEvent` of each kind was sent (`bpf_ktime_get_boot_ns`), indexed by
/// `RECLAIM_WAKE_*`, shared by all CPUs: a pod reclaiming at its own limit cannot hold back the
/// node's kswapd and direct-reclaim wake-ups.
#[map]
static RECLAIM_WAKE_LAST: Array<u64> = Array::with_max_entries(4, 0);

#[tracepoint]
pub fn kswapd_wakeup(ctx: TracePointContext) -> u32 {
    wake(&ctx, current_cgroup_id(), RECLAIM_WAKE_KSWAPD);
    0
}

#[tracepoint]
pub fn memcg_reclaim_begin(ctx: TracePointContext) -> u32 {
    if let Some(cgroup_id) = begin(RECLAIM_MEMCG) {
        wake(&ctx, cgroup_id, RECLAIM_WAKE_MEMCG);
    }
    0
}

#[tracepoint]
pub fn memcg_reclaim_end(ctx: TracePointContext) -> u32 {
    end(&ctx);
    0
}

#[tracepoint]
pub fn direct_reclaim_begin(ctx: TracePointContext) -> u32 {
    let cgroup_id = begin(RECLAIM_DIRECT).unwrap_or_else(current_cgroup_id);
    wake(&ctx, cgroup_id, RECLAIM_WAKE_DIRECT);
    0
}

/// Sends a `ReclaimWakeEvent` unless one of its kind was sent in the last
/// `RECLAIM_WAKE_INTERVAL_NS`.
#[inline(always)]
fn wake(ctx: &TracePointContext, cgroup_id: u64, reclaim: u32) {
    let Some(last) = RECLAIM_WAKE_LAST.get_ptr_mut(reclaim) else {
        return;
    };
    let now = boot_ns();
    // SAFETY: a slot of an array map, live as long as the program. CPUs race on it: two may
    // both send within an interval, which only adds a wake-up; it is a plain integer.
    unsafe {
        if now.wrapping_sub(*last) < RECLAIM_WAKE_INTERVAL_NS {
            return;
        }
        *last = now;
    }
    emit(
        ctx,
        ReclaimWakeEvent {
            header: EventHeader {
                kind: EventKind::ReclaimWake as u32,
                flags: 0,
                boot_ns: now,
            },
            cgroup_id,
            reclaim,
            pid: bpf_get_current_pid_tgid() as u32,
        },
    );
}

#[tracepoint]
pub fn direct_reclaim_end(ctx: TracePointContext) -> u32 {
    end(&ctx);
    0
}

/// Records the start of a reclaim by a task of a watched cgroup; returns that cgroup's id.
#[inline(always)]
fn begin(kind: u32) -> Option<u64> {
    let cgroup_id = current_cgroup_id();
    if !watched(cgroup_id) {
        return None;
    }
    let start = ReclaimStart {
        cgroup_id,
        start_ns: monotonic_ns(),
        kind,
        _pad: 0,
    };
    let _ = RECLAIM_STARTS.insert(&(bpf_get_current_pid_tgid() as u32), &start, 0);
    Some(cgroup_id)
}

#[inline(always)]
fn end(ctx: &TracePointContext) {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: `get` is unsafe because the value may change or be deleted while referenced; it
    // is copied out at once, before this program removes the entry (the key is this thread's
    // id, so no other program run removes or rewrites it meanwhile).
    let Some(start) = (unsafe { RECLAIM_STARTS.get(&tid) }).copied() else {
        return;
    };
    let _ = RECLAIM_STARTS.remove(&tid);
    let stalled = monotonic_ns().wrapping_sub(start.start_ns);
    let stats = match RECLAIM_STATS.get_ptr_mut(&start.cgroup_id) {
        Some(s) => s,
        None => {
            if !watched(start.cgroup_id) {
                return;
            }
            if let Err(e) = RECLAIM_STATS.insert(&start.cgroup_id, &ReclaimStats::default(), 1)
                && diag::on()
            {
                warn!(
                    ctx,
                    "Could not add cgroup {} to RECLAIM_STATS (error {}, {} entries at most); its reclaim stall is not counted.",
                    start.cgroup_id,
                    e,
                    MAX_CGROUPS
                );
            }
            match RECLAIM_STATS.get_ptr_mut(&start.cgroup_id) {
                Some(s) => s,
                None => return,
            }
        }
    };
    // SAFETY: a live value of the hash map, freed only after this program returns (RCU) even
    // if the agent or `cgroup_rmdir` deletes the entry; other CPUs may add to it at the same
    // time, which only loses an increment (see `maps::add`): the fields are plain integers.
    let s = unsafe { &mut *stats };
    if start.kind == RECLAIM_MEMCG {
        add(&mut s.memcg_count, 1);
        add(&mut s.memcg_ns, stalled);
    } else {
        add(&mut s.direct_count, 1);
        add(&mut s.direct_ns, stalled);
    }
    // A racy maximum is good enough for a diagnostic.
    if stalled > s.max_ns {
        s.max_ns = stalled;
    }
}
