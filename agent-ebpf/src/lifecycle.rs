//! Classic tracepoints for things the agent reacts to: `oom:oom_score_adj_update` and
//! `sched:sched_process_fork/exec` in watched cgroups, and `cgroup:cgroup_mkdir/rmdir`
//! everywhere. `cgroup_rmdir` also deletes the removed cgroup's entries from the per-cgroup maps,
//! so they do not grow without bound.

use aya_ebpf::{
    Global, helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use aya_log_ebpf::warn;
use qoslet_common::{
    CgroupEvent, EventHeader, EventKind, LifecycleTracepointLayout, OomScoreAdjEvent, ProcessEvent,
    TASK_COMM_LEN,
    event::{
        CGROUP_MKDIR, CGROUP_RMDIR, MEMCG_ITEM_HIGH, MEMCG_ITEM_MAX, MEMCG_ITEM_OOM,
        MEMCG_ITEM_OOM_GROUP_KILL, MEMCG_ITEM_OOM_KILL, MemcgCounterKey, PROCESS_EXEC,
        PROCESS_FORK,
    },
};

use crate::{
    diag,
    kernel::{boot_ns, current_cgroup_id, record, record_str},
    maps::{EVENTS, WATCHED_CGROUPS, count_lost, emit, watched},
    memcg::MEMCG_COUNTERS,
    reclaim::RECLAIM_STATS,
    sched::CPU_STATS,
};

// SAFETY: the only symbol of this name in the object; the agent sets it by name at load time.
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
        boot_ns: boot_ns(),
    }
}

fn try_score(ctx: &TracePointContext) -> Result<(), i32> {
    let l = LIFECYCLE_LAYOUT.load();
    if l.score_pid == ABSENT || l.score_adj == ABSENT || l.score_comm == ABSENT {
        return Err(0);
    }
    // The writer's cgroup: a task resetting its own score (or a sibling's) is in the cgroup.
    let cgroup_id = current_cgroup_id();
    if !watched(cgroup_id) {
        return Ok(());
    }
    let event = OomScoreAdjEvent {
        header: header(EventKind::OomScoreAdj),
        pid: record::<i32>(ctx, l.score_pid)? as u32,
        writer_tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
        cgroup_id,
        oom_score_adj: record::<i16>(ctx, l.score_adj)? as i32,
        _pad: 0,
        comm: record::<[u8; TASK_COMM_LEN]>(ctx, l.score_comm)?,
    };
    emit(ctx, event);
    Ok(())
}

fn try_fork(ctx: &TracePointContext) -> Result<(), i32> {
    let l = LIFECYCLE_LAYOUT.load();
    if l.fork_child_pid == ABSENT || l.fork_parent_pid == ABSENT {
        return Err(0);
    }
    let cgroup_id = current_cgroup_id();
    if !watched(cgroup_id) {
        return Ok(());
    }
    emit(
        ctx,
        ProcessEvent {
            header: header(EventKind::Process),
            pid: record::<i32>(ctx, l.fork_child_pid)? as u32,
            parent_pid: record::<i32>(ctx, l.fork_parent_pid)? as u32,
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
    let cgroup_id = current_cgroup_id();
    if !watched(cgroup_id) {
        return Ok(());
    }
    emit(
        ctx,
        ProcessEvent {
            header: header(EventKind::Process),
            pid: record::<i32>(ctx, l.exec_pid)? as u32,
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
    let id = record::<u64>(ctx, l.cgroup_id)?;
    if op == CGROUP_RMDIR {
        forget(id);
    }
    let Some(mut entry) = EVENTS.reserve::<CgroupEvent>(0) else {
        count_lost(ctx);
        return Ok(());
    };
    // Filled in place: the record is too large for the 512-byte BPF stack with a copy.
    let result = {
        let slot = &mut *entry;
        // SAFETY: zeroing writes every byte of the reserved slot, which is ours alone until it
        // is submitted or discarded; all-zero bytes are a valid `CgroupEvent` (integers and a
        // byte array), so the slot is initialised afterwards.
        let e = unsafe {
            slot.as_mut_ptr().write_bytes(0, 1);
            slot.assume_init_mut()
        };
        fill_cgroup_event(ctx, &l, e, id, op)
    };
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

/// Fills a zeroed record from the tracepoint's.
#[inline(always)]
fn fill_cgroup_event(
    ctx: &TracePointContext,
    l: &LifecycleTracepointLayout,
    e: &mut CgroupEvent,
    id: u64,
    op: u32,
) -> Result<(), i32> {
    e.header = header(EventKind::Cgroup);
    e.id = id;
    e.root = record(ctx, l.cgroup_root)?;
    e.level = record(ctx, l.cgroup_level)?;
    e.op = op;
    e.path_len = record_str(ctx, l.cgroup_path, &mut e.path).unwrap_or(0) as u32;
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
