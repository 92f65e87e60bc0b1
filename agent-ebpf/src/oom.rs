//! OOM victims: `tp_btf/mark_victim` reads the victim's `task_struct`; the classic
//! `oom/mark_victim` tracepoint is the fallback for kernels where the BTF program cannot load.

use aya_ebpf::{
    EbpfContext, Global,
    helpers::bpf_get_current_pid_tgid,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use aya_log_ebpf::warn;
use qoslet_common::{
    EventHeader, EventKind, OomBtfLayout, OomTracepointLayout, OomVictimEvent,
    event::{
        OOM_FLAG_CGROUP_OF_CURRENT, OOM_FLAG_FROM_BTF, OOM_FLAG_HAS_MEMCG, OOM_FLAG_HAS_RSS,
        OOM_FLAG_HAS_SCORE_ADJ,
    },
};

use crate::{
    diag,
    kernel::{boot_ns, current_cgroup_id, oom::Task, record},
    maps::emit,
};

// SAFETY: the only symbol of this name in the object; the agent sets it by name at load time.
#[unsafe(no_mangle)]
static OOM_BTF_LAYOUT: Global<OomBtfLayout> = Global::new(OomBtfLayout::UNSET);

// SAFETY: the only symbol of this name in the object; the agent sets it by name at load time.
#[unsafe(no_mangle)]
static OOM_TP_LAYOUT: Global<OomTracepointLayout> = Global::new(OomTracepointLayout::UNSET);

#[btf_tracepoint(function = "mark_victim")]
pub fn oom_mark_victim_btf(ctx: BtfTracePointContext) -> i32 {
    if let Err(e) = try_oom_mark_victim_btf(&ctx) {
        dropped(&ctx, e);
    }
    0
}

#[tracepoint]
pub fn oom_mark_victim_tp(ctx: TracePointContext) -> u32 {
    if let Err(e) = try_oom_mark_victim_tp(&ctx) {
        dropped(&ctx, e);
    }
    0
}

/// An OOM victim the program could not read: the agent learns of the kill only from
/// memory.events, without the victim.
#[inline(always)]
fn dropped<C: EbpfContext>(ctx: &C, error: i32) {
    if diag::on() {
        warn!(
            ctx,
            "Could not read an OOM victim (error {}); its record was dropped.", error
        );
    }
}

fn try_oom_mark_victim_btf(ctx: &BtfTracePointContext) -> Result<(), i32> {
    let layout = OOM_BTF_LAYOUT.load();
    if layout.valid == 0 {
        return Err(0);
    }
    // (struct task_struct *task, enum oom_constraint constraint)
    let task = Task::new(ctx.arg(0), &layout);
    let mut flags = OOM_FLAG_FROM_BTF;
    let mut event = OomVictimEvent::EMPTY;
    event.pid = task.pid()? as u32;
    event.tgid = task.tgid()? as u32;
    event.comm = task.comm()?;
    let css_set = task.css_set()?;
    event.cgroup_id = css_set.dfl_cgroup()?.id()?;
    if let Some(memcg) = css_set.memory_cgroup()?
        && let Ok(id) = memcg.id()
    {
        event.memcg_id = id;
        flags |= OOM_FLAG_HAS_MEMCG;
    }
    if let Ok(adj) = task.signal()?.oom_score_adj() {
        event.oom_score_adj = adj as i32;
        flags |= OOM_FLAG_HAS_SCORE_ADJ;
    }
    if let Some(mm) = task.mm()? {
        // Per-CPU counters may run slightly negative before they are folded; clamp at 0.
        event.file_rss_pages = mm.file_pages().unwrap_or(0).max(0) as u64;
        event.anon_rss_pages = mm.anon_pages().unwrap_or(0).max(0) as u64;
        event.shmem_rss_pages = mm.shmem_pages().unwrap_or(0).max(0) as u64;
        flags |= OOM_FLAG_HAS_RSS;
    }
    event.header = EventHeader {
        kind: EventKind::OomVictim as u32,
        flags,
        boot_ns: boot_ns(),
    };
    emit(ctx, event);
    Ok(())
}

fn try_oom_mark_victim_tp(ctx: &TracePointContext) -> Result<(), i32> {
    let layout = OOM_TP_LAYOUT.load();
    if layout.pid == OomTracepointLayout::ABSENT {
        return Err(0);
    }
    let mut flags = OOM_FLAG_CGROUP_OF_CURRENT;
    let pid = record::<i32>(ctx, layout.pid)? as u32;
    // The classic record has no tgid: it stays 0 unless the victim is the current task (below).
    let mut event = OomVictimEvent {
        pid,
        cgroup_id: current_cgroup_id(),
        ..OomVictimEvent::EMPTY
    };
    if layout.anon_rss != OomTracepointLayout::ABSENT {
        event.anon_rss_pages = record(ctx, layout.anon_rss)?;
        event.file_rss_pages = record(ctx, layout.file_rss)?;
        event.shmem_rss_pages = record(ctx, layout.shmem_rss)?;
        flags |= OOM_FLAG_HAS_RSS;
    }
    if layout.oom_score_adj != OomTracepointLayout::ABSENT {
        event.oom_score_adj = record::<i16>(ctx, layout.oom_score_adj)? as i32;
        flags |= OOM_FLAG_HAS_SCORE_ADJ;
    }
    // The victim is usually the allocating task for a small memcg OOM; say when it is.
    let current = bpf_get_current_pid_tgid() as u32;
    if current == pid {
        event.tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    }
    event.header = EventHeader {
        kind: EventKind::OomVictim as u32,
        flags,
        boot_ns: boot_ns(),
    };
    emit(ctx, event);
    Ok(())
}
