//! Memory cgroup events (high, max, oom, oom_kill, oom_group_kill).
//!
//! Linux 6.15+ has an attachable `__memcg_memory_event()`; the fentry program counts every event
//! per cgroup in `MEMCG_COUNTERS` and forwards OOM events at once and `high`/`max` at most every
//! 10 ms per cgroup, so pressure cannot flood the ring. Older kernels run on memory.events polling
//! (the agent's fallback); why `memcg:count_memcg_events` is not used is said in the agent's
//! sensor table (agent/src/sensors/table.rs).

use aya_ebpf::{
    Global,
    helpers::bpf_get_current_pid_tgid,
    macros::{fentry, map},
    maps::LruHashMap,
    programs::FEntryContext,
};
use aya_log_ebpf::warn;
use qoslet_common::{
    EventHeader, EventKind, MemcgEvent, MemcgEventLayout,
    event::{
        MEMCG_EMIT_INTERVAL_NS, MEMCG_FLAG_COALESCED, MEMCG_ITEM_HIGH, MEMCG_ITEM_MAX,
        MEMCG_ITEM_OOM, MEMCG_ITEM_OOM_GROUP_KILL, MEMCG_ITEM_OOM_KILL, MemcgCounter,
        MemcgCounterKey,
    },
};

use crate::{
    diag,
    kernel::{boot_ns, memcg::MemCgroup},
    maps::emit,
};

// SAFETY: the only symbol of this name in the object; the agent sets it by name at load time.
#[unsafe(no_mangle)]
static MEMCG_EVENT_LAYOUT: Global<MemcgEventLayout> = Global::new(MemcgEventLayout::UNSET);

/// Totals per (cgroup, item). LRU so removed cgroups age out without bounding live ones.
#[map]
pub static MEMCG_COUNTERS: LruHashMap<MemcgCounterKey, MemcgCounter> =
    LruHashMap::with_max_entries(16384, 0);

#[fentry(function = "__memcg_memory_event")]
pub fn memcg_memory_event(ctx: FEntryContext) -> i32 {
    let _ = try_memcg_memory_event(&ctx);
    0
}

fn try_memcg_memory_event(ctx: &FEntryContext) -> Result<(), i32> {
    let layout = MEMCG_EVENT_LAYOUT.load();
    if layout.valid == 0 {
        return Err(0);
    }
    // (struct mem_cgroup *memcg, enum memcg_memory_event event)
    let memcg: *const u8 = ctx.arg(0);
    let event: i32 = ctx.arg(1);
    let item = if event == layout.high {
        MEMCG_ITEM_HIGH
    } else if event == layout.max {
        MEMCG_ITEM_MAX
    } else if event == layout.oom {
        MEMCG_ITEM_OOM
    } else if event == layout.oom_kill {
        MEMCG_ITEM_OOM_KILL
    } else if event == layout.oom_group_kill {
        MEMCG_ITEM_OOM_GROUP_KILL
    } else {
        return Ok(());
    };
    let memcg_id = MemCgroup::new(memcg, &layout).cgroup_id()?;
    count_and_emit(ctx, memcg_id, item, 1);
    Ok(())
}

/// Adds `n` to the cgroup's counter and emits a record unless a frequent item was already
/// reported in the last `MEMCG_EMIT_INTERVAL_NS`.
#[inline(always)]
fn count_and_emit(ctx: &FEntryContext, memcg_id: u64, item: u32, n: u64) {
    let key = MemcgCounterKey {
        memcg_id,
        item,
        _pad: 0,
    };
    let now = boot_ns();
    let frequent = item == MEMCG_ITEM_HIGH || item == MEMCG_ITEM_MAX;
    let (count, flags) = match MEMCG_COUNTERS.get_ptr_mut(&key) {
        Some(counter) => {
            // SAFETY: a live value of the LRU hash map, which the kernel frees only after this
            // program returns (RCU). Programs on other CPUs may update it at the same time and
            // lose a count, which only makes a coalesced total approximate; the fields are
            // plain integers, so no torn state is invalid.
            let c = unsafe { &mut *counter };
            c.total += n;
            if frequent && now.wrapping_sub(c.last_emit_boot_ns) < MEMCG_EMIT_INTERVAL_NS {
                return;
            }
            let count = c.total - c.emitted;
            c.emitted = c.total;
            c.last_emit_boot_ns = now;
            (count, MEMCG_FLAG_COALESCED)
        }
        None => {
            let c = MemcgCounter {
                total: n,
                emitted: n,
                last_emit_boot_ns: now,
            };
            if let Err(e) = MEMCG_COUNTERS.insert(&key, &c, 0)
                && diag::on()
            {
                warn!(
                    ctx,
                    "Could not count a memcg event of cgroup {} in MEMCG_COUNTERS (error {}).",
                    memcg_id,
                    e
                );
            }
            (n, 0)
        }
    };
    emit(
        ctx,
        MemcgEvent {
            header: EventHeader {
                kind: EventKind::Memcg as u32,
                flags,
                boot_ns: now,
            },
            memcg_id,
            item,
            pid: bpf_get_current_pid_tgid() as u32,
            count,
        },
    );
}
