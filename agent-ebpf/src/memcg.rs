//! Memory cgroup events from `memcg:count_memcg_events`: forwards OOM kills counted by a memcg.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use qoslet_common::{
    EventHeader, EventKind, MemcgEvent, MemcgTracepointLayout, event::MEMCG_ITEM_OOM_KILL,
};

use crate::maps::emit;

#[unsafe(no_mangle)]
static MEMCG_TP_LAYOUT: Global<MemcgTracepointLayout> = Global::new(MemcgTracepointLayout::UNSET);

#[tracepoint]
pub fn memcg_count_events_tp(ctx: TracePointContext) -> u32 {
    let _ = try_memcg_count_events_tp(&ctx);
    0
}

fn try_memcg_count_events_tp(ctx: &TracePointContext) -> Result<(), i32> {
    let layout = MEMCG_TP_LAYOUT.load();
    if layout.oom_kill_item < 0 {
        return Err(0);
    }
    let item = unsafe { ctx.read_at::<i32>(layout.item as usize)? };
    // This tracepoint fires for every counted vm event; only OOM kills leave the kernel.
    if item != layout.oom_kill_item {
        return Ok(());
    }
    let event = MemcgEvent {
        header: EventHeader {
            kind: EventKind::Memcg as u32,
            flags: 0,
            boot_ns: unsafe { bpf_ktime_get_boot_ns() },
        },
        memcg_id: unsafe { ctx.read_at::<u64>(layout.id as usize)? },
        item: MEMCG_ITEM_OOM_KILL,
        pid: bpf_get_current_pid_tgid() as u32,
        count: unsafe { ctx.read_at::<u64>(layout.val as usize)? },
    };
    emit(event);
    Ok(())
}
