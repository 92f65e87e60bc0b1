//! Classic tracepoints for things the agent reacts to: `oom:oom_score_adj_update` and
//! `sched:sched_process_fork/exec` in watched cgroups, and `cgroup:cgroup_mkdir/rmdir`
//! everywhere. `cgroup_rmdir` also deletes the removed cgroup's entries from the per-cgroup maps,
//! so they do not grow without bound.

use aya_ebpf::{
    EbpfContext as _, Global,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use qoslet_common::{
    CGROUP_PATH_LEN, CgroupEvent, EventHeader, EventKind, LifecycleTracepointLayout,
    OomScoreAdjEvent, ProcessEvent, TASK_COMM_LEN,
    event::{
        CGROUP_MKDIR, CGROUP_RMDIR, MEMCG_ITEM_HIGH, MEMCG_ITEM_MAX, MEMCG_ITEM_OOM,
        MEMCG_ITEM_OOM_GROUP_KILL, MEMCG_ITEM_OOM_KILL, MemcgCounterKey, PROCESS_EXEC,
        PROCESS_FORK,
    },
};

use crate::{
    diag,
    maps::{EVENTS, WATCHED_CGROUPS, emit, lost, watched},
    memcg::MEMCG_COUNTERS,
    reclaim::RECLAIM_STATS,
    sched::CPU_STATS,
};

#[unsafe(no_mangle)]
static LIFECYCLE_LAYOUT: Global<LifecycleTracepointLayout> =
    Global::new(LifecycleTracepointLayout::UNSET);

const ABSENT: u32 = LifecycleTracepointLayout::ABSENT;

#[tracepoint]
pub fn oom_score_adj_update(ctx: TracePointContext) -> u32 {
    let _ = try_score(&ctx);
    0
}

#[tracepoint]
pub fn process_fork(ctx: TracePointContext) -> u32 {
    let _ = try_fork(&ctx);
    0
}

#[tracepoint]
pub fn process_exec(ctx: TracePointContext) -> u32 {
    let _ = try_exec(&ctx);
    0
}

#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    let _ = try_cgroup(&ctx, CGROUP_MKDIR);
    0
}

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    let _ = try_cgroup(&ctx, CGROUP_RMDIR);
    0
}

#[inline(always)]
fn header(kind: EventKind) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        flags: 0,
        boot_ns: unsafe { bpf_ktime_get_boot_ns() },
    }
}

fn try_score(ctx: &TracePointContext) -> Result<(), i32> {
    let l = LIFECYCLE_LAYOUT.load();
    if l.score_pid == ABSENT || l.score_adj == ABSENT || l.score_comm == ABSENT {
        return Err(0);
    }
    // The writer's cgroup: a task resetting its own score (or a sibling's) is in the cgroup.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    if !watched(cgroup_id) {
        return Ok(());
    }
    let event = unsafe {
        OomScoreAdjEvent {
            header: header(EventKind::OomScoreAdj),
            pid: ctx.read_at::<i32>(l.score_pid as usize)? as u32,
            writer_tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
            cgroup_id,
            oom_score_adj: ctx.read_at::<i16>(l.score_adj as usize)? as i32,
            _pad: 0,
            comm: ctx.read_at::<[u8; TASK_COMM_LEN]>(l.score_comm as usize)?,
        }
    };
    emit(ctx, event);
    Ok(())
}

fn try_fork(ctx: &TracePointContext) -> Result<(), i32> {
    let l = LIFECYCLE_LAYOUT.load();
    if l.fork_child_pid == ABSENT || l.fork_parent_pid == ABSENT {
        return Err(0);
    }
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    if !watched(cgroup_id) {
        return Ok(());
    }
    emit(
        ctx,
        ProcessEvent {
            header: header(EventKind::Process),
            pid: unsafe { ctx.read_at::<i32>(l.fork_child_pid as usize)? } as u32,
            parent_pid: unsafe { ctx.read_at::<i32>(l.fork_parent_pid as usize)? } as u32,
            cgroup_id,
            op: PROCESS_FORK,
            _pad: 0,
        },
    );
    Ok(())
}

fn try_exec(ctx: &TracePointContext) -> Result<(), i32> {
    let l = LIFECYCLE_LAYOUT.load();
    if l.exec_pid == ABSENT {
        return Err(0);
    }
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    if !watched(cgroup_id) {
        return Ok(());
    }
    emit(
        ctx,
        ProcessEvent {
            header: header(EventKind::Process),
            pid: unsafe { ctx.read_at::<i32>(l.exec_pid as usize)? } as u32,
            parent_pid: 0,
            cgroup_id,
            op: PROCESS_EXEC,
            _pad: 0,
        },
    );
    Ok(())
}

fn try_cgroup(ctx: &TracePointContext, op: u32) -> Result<(), i32> {
    let l = LIFECYCLE_LAYOUT.load();
    if l.cgroup_id == ABSENT || l.cgroup_path == ABSENT {
        return Err(0);
    }
    let id = unsafe { ctx.read_at::<u64>(l.cgroup_id as usize)? };
    if op == CGROUP_RMDIR {
        forget(id);
    }
    let Some(mut entry) = EVENTS.reserve::<CgroupEvent>(0) else {
        lost(ctx);
        return Ok(());
    };
    // Filled in place: the record is too large for the 512-byte BPF stack with a copy.
    let e = entry.as_mut_ptr();
    let result = unsafe { fill_cgroup_event(ctx, &l, e, id, op) };
    match result {
        Ok(()) => entry.submit(0),
        Err(e) => {
            entry.discard(0);
            if diag::on() {
                warn!(
                    ctx,
                    "Could not read a cgroup_{} record of cgroup {} (error {}); it was dropped.",
                    if op == CGROUP_RMDIR { "rmdir" } else { "mkdir" },
                    id,
                    e
                );
            }
        }
    }
    Ok(())
}

unsafe fn fill_cgroup_event(
    ctx: &TracePointContext,
    l: &LifecycleTracepointLayout,
    e: *mut CgroupEvent,
    id: u64,
    op: u32,
) -> Result<(), i32> {
    unsafe {
        (*e).header = header(EventKind::Cgroup);
        (*e).id = id;
        (*e).root = ctx.read_at::<i32>(l.cgroup_root as usize)?;
        (*e).level = ctx.read_at::<i32>(l.cgroup_level as usize)?;
        (*e).op = op;
        (*e).path = [0; CGROUP_PATH_LEN];
        // `__data_loc`: low 16 bits the offset of the string in the record, high 16 its length.
        let loc = ctx.read_at::<u32>(l.cgroup_path as usize)?;
        let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
        let len = match bpf_probe_read_kernel_str_bytes(src, &mut (*e).path) {
            Ok(s) => s.len() as u32,
            Err(_) => 0,
        };
        (*e).path_len = len;
    }
    Ok(())
}

/// Deletes every per-cgroup entry of a removed cgroup.
#[inline(always)]
fn forget(id: u64) {
    let _ = WATCHED_CGROUPS.remove(&id);
    let _ = CPU_STATS.remove(&id);
    let _ = RECLAIM_STATS.remove(&id);
    for item in [
        MEMCG_ITEM_OOM_KILL,
        MEMCG_ITEM_HIGH,
        MEMCG_ITEM_MAX,
        MEMCG_ITEM_OOM,
        MEMCG_ITEM_OOM_GROUP_KILL,
    ] {
        let key = MemcgCounterKey {
            memcg_id: id,
            item,
            _pad: 0,
        };
        let _ = MEMCG_COUNTERS.remove(&key);
    }
}
