//! OOM victims: `tp_btf/mark_victim` reads the victim's `task_struct`; the classic
//! `oom/mark_victim` tracepoint is the fallback for kernels where the BTF program cannot load.

use aya_ebpf::{
    EbpfContext, Global,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns,
        bpf_probe_read_kernel,
    },
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

use crate::{diag, maps::emit};

#[unsafe(no_mangle)]
static OOM_BTF_LAYOUT: Global<OomBtfLayout> = Global::new(OomBtfLayout::UNSET);

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

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
unsafe fn read_at<T>(base: *const u8, offset: u32) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one is an error, not a fault.
    unsafe { bpf_probe_read_kernel(base.add(offset as usize) as *const T) }
}

/// Follows `cgroup->kn->id`.
#[inline(always)]
unsafe fn cgroup_id(layout: &OomBtfLayout, cgroup: *const u8) -> Result<u64, i32> {
    unsafe {
        let kn: *const u8 = read_at(cgroup, layout.cgroup_kn)?;
        read_at(kn, layout.kernfs_node_id)
    }
}

fn try_oom_mark_victim_btf(ctx: &BtfTracePointContext) -> Result<(), i32> {
    let layout = OOM_BTF_LAYOUT.load();
    if layout.valid == 0 {
        return Err(0);
    }
    let task: *const u8 = ctx.arg(0);
    let mut flags = OOM_FLAG_FROM_BTF;
    let mut event = OomVictimEvent::EMPTY;
    unsafe {
        event.pid = read_at::<i32>(task, layout.task_pid)? as u32;
        event.tgid = read_at::<i32>(task, layout.task_tgid)? as u32;
        event.comm = read_at(task, layout.task_comm)?;
        let css_set: *const u8 = read_at(task, layout.task_cgroups)?;
        let dfl: *const u8 = read_at(css_set, layout.css_set_dfl_cgrp)?;
        event.cgroup_id = cgroup_id(&layout, dfl)?;
        if layout.has_memcg != 0 {
            let css: *const u8 = read_at(css_set, layout.css_set_memory_css)?;
            if !css.is_null() {
                let cgroup: *const u8 = read_at(css, layout.css_cgroup)?;
                if let Ok(id) = cgroup_id(&layout, cgroup) {
                    event.memcg_id = id;
                    flags |= OOM_FLAG_HAS_MEMCG;
                }
            }
        }
        let signal: *const u8 = read_at(task, layout.task_signal)?;
        if let Ok(adj) = read_at::<i16>(signal, layout.signal_oom_score_adj) {
            event.oom_score_adj = adj as i32;
            flags |= OOM_FLAG_HAS_SCORE_ADJ;
        }
        let mm: *const u8 = read_at(task, layout.task_mm)?;
        if !mm.is_null() {
            // Per-CPU counters may run slightly negative before they are folded; clamp at 0.
            let file = read_at::<i64>(mm, layout.mm_file_pages).unwrap_or(0);
            let anon = read_at::<i64>(mm, layout.mm_anon_pages).unwrap_or(0);
            let shmem = read_at::<i64>(mm, layout.mm_shmem_pages).unwrap_or(0);
            event.file_rss_pages = file.max(0) as u64;
            event.anon_rss_pages = anon.max(0) as u64;
            event.shmem_rss_pages = shmem.max(0) as u64;
            flags |= OOM_FLAG_HAS_RSS;
        }
    }
    event.header = EventHeader {
        kind: EventKind::OomVictim as u32,
        flags,
        boot_ns: unsafe { bpf_ktime_get_boot_ns() },
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
    let pid = unsafe { ctx.read_at::<i32>(layout.pid as usize)? } as u32;
    // The classic record has no tgid: it stays 0 unless the victim is the current task (below).
    let mut event = OomVictimEvent {
        pid,
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        ..OomVictimEvent::EMPTY
    };
    if layout.anon_rss != OomTracepointLayout::ABSENT {
        unsafe {
            event.anon_rss_pages = ctx.read_at::<u64>(layout.anon_rss as usize)?;
            event.file_rss_pages = ctx.read_at::<u64>(layout.file_rss as usize)?;
            event.shmem_rss_pages = ctx.read_at::<u64>(layout.shmem_rss as usize)?;
        }
        flags |= OOM_FLAG_HAS_RSS;
    }
    if layout.oom_score_adj != OomTracepointLayout::ABSENT {
        event.oom_score_adj = unsafe { ctx.read_at::<i16>(layout.oom_score_adj as usize)? } as i32;
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
        boot_ns: unsafe { bpf_ktime_get_boot_ns() },
    };
    emit(ctx, event);
    Ok(())
}
