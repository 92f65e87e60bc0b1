//! Maps shared by all programs.

use aya_ebpf::{
    EbpfContext,
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
};
use aya_log_ebpf::warn;
use qoslet_common::EVENT_RING_BYTES;

use crate::diag;

/// Entries of the per-cgroup maps: far above the cgroups of one node.
pub const MAX_CGROUPS: u32 = 16384;

/// Rare, meaningful events for the agent (OOM victims, memcg events).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENT_RING_BYTES, 0);

/// Records that did not fit in `EVENTS`, per CPU; the agent sums and exports them.
#[map]
pub static EVENTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Sends `value` to userspace, counting it as lost when the ring is full.
#[inline(always)]
pub fn emit<C: EbpfContext, T: 'static>(ctx: &C, value: T) {
    match EVENTS.reserve::<T>(0) {
        Some(mut entry) => {
            entry.write(value);
            entry.submit(0);
        }
        None => count_lost(ctx),
    }
}

/// Counts one record that did not fit in `EVENTS`. With diagnostics on, says so when this CPU's
/// count reaches a power of two: a full ring under load logs a handful of lines, not one per
/// record.
#[inline(always)]
pub fn count_lost<C: EbpfContext>(ctx: &C) {
    let Some(lost) = EVENTS_LOST.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot of a per-CPU array, live for the program's lifetime; a program
    // runs to its end on one CPU and does not nest in itself, so no other writer touches the
    // slot during the increment.
    let n = unsafe {
        *lost += 1;
        *lost
    };
    if diag::on() && n & (n - 1) == 0 {
        warn!(
            ctx,
            "The EVENTS ring buffer is full: {} records lost on this CPU since load.", n
        );
    }
}

/// cgroup v2 ids the agent watches (value: `WATCH_FLAG_*`). Filled by the agent; entries of a
/// removed cgroup are deleted by the `cgroup_rmdir` program.
#[map]
pub static WATCHED_CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_CGROUPS, 0);

/// Whether `cgroup_id` is watched.
#[inline(always)]
pub fn watched(cgroup_id: u64) -> bool {
    // SAFETY: `get` is unsafe because the returned reference may see concurrent updates or a
    // deletion; only its presence is used, never the value.
    unsafe { WATCHED_CGROUPS.get(&cgroup_id) }.is_some()
}

/// Adds `value` to a counter of a map value. The BPF target has no `fetch_add` in core, so
/// two CPUs updating one cgroup at the same instant may lose an increment: the totals are
/// statistics, not accounting.
#[inline(always)]
pub fn add(counter: &mut u64, value: u64) {
    *counter = counter.wrapping_add(value);
}
