//! Maps shared by all programs.

use aya_ebpf::{
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use qoslet_common::EVENT_RING_BYTES;

/// Rare, meaningful events for the agent (OOM victims, memcg events).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENT_RING_BYTES, 0);

/// Records that did not fit in `EVENTS`, per CPU; the agent sums and exports them.
#[map]
pub static EVENTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Sends `value` to userspace, counting it as lost when the ring is full.
#[inline(always)]
pub fn emit<T: 'static>(value: T) {
    match EVENTS.reserve::<T>(0) {
        Some(mut entry) => {
            entry.write(value);
            entry.submit(0);
        }
        None => {
            if let Some(lost) = EVENTS_LOST.get_ptr_mut(0) {
                // SAFETY: per-CPU slot, no concurrent writer on this CPU.
                unsafe { *lost += 1 };
            }
        }
    }
}
