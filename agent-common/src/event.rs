//! Records sent through the `EVENTS` ring buffer.

use crate::{CGROUP_PATH_LEN, TASK_COMM_LEN};

/// What a record is. Stored as `u32` in [`EventHeader::kind`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The kernel OOM killer chose a victim ([`OomVictimEvent`]).
    OomVictim = 1,
    /// A memory cgroup counted an event we watch ([`MemcgEvent`]).
    Memcg = 2,
    /// A task of a watched cgroup had its `oom_score_adj` written ([`OomScoreAdjEvent`]).
    OomScoreAdj = 3,
    /// A task forked or exec'd in a watched cgroup ([`ProcessEvent`]).
    Process = 4,
    /// A cgroup was created or removed ([`CgroupEvent`]).
    Cgroup = 5,
    /// The kernel began reclaiming memory ([`ReclaimWakeEvent`]).
    ReclaimWake = 6,
}

/// A record whose kind this build does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownEventKind(pub u32);

impl TryFrom<u32> for EventKind {
    type Error = UnknownEventKind;

    fn try_from(value: u32) -> Result<Self, Self::Error> {
        match value {
            1 => Ok(Self::OomVictim),
            2 => Ok(Self::Memcg),
            3 => Ok(Self::OomScoreAdj),
            4 => Ok(Self::Process),
            5 => Ok(Self::Cgroup),
            6 => Ok(Self::ReclaimWake),
            other => Err(UnknownEventKind(other)),
        }
    }
}

/// Starts every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// An [`EventKind`] value.
    pub kind: u32,
    /// Bit set of `FLAG_*` constants of the record's kind.
    pub flags: u32,
    /// `bpf_ktime_get_boot_ns()` when the kernel emitted the record.
    pub boot_ns: u64,
}

/// The OOM victim record came from the BTF-typed `tp_btf/mark_victim` program, which reads the
/// victim task itself.
pub const OOM_FLAG_FROM_BTF: u32 = 1;
/// The record came from the classic `oom/mark_victim` tracepoint: the cgroup ids are those of the
/// task that triggered the OOM (the allocating task), not necessarily the victim's.
pub const OOM_FLAG_CGROUP_OF_CURRENT: u32 = 2;
/// `oom_score_adj` is known (the classic tracepoint has it only from Linux 6.8).
pub const OOM_FLAG_HAS_SCORE_ADJ: u32 = 4;
/// The RSS fields are known.
pub const OOM_FLAG_HAS_RSS: u32 = 8;
/// `memcg_id` is known (the memory controller's cgroup of the victim, on v1 or v2).
pub const OOM_FLAG_HAS_MEMCG: u32 = 16;

/// The kernel OOM killer marked a task as its victim (`oom:mark_victim`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomVictimEvent {
    pub header: EventHeader,
    /// Thread id of the victim (what the kernel calls pid).
    pub pid: u32,
    /// Process id of the victim.
    pub tgid: u32,
    /// cgroup v2 id (kernfs inode) of the victim on the default (unified) hierarchy.
    pub cgroup_id: u64,
    /// Id of the victim's memory cgroup: on cgroup v1 the memory hierarchy's kernfs inode; on v2
    /// the same as `cgroup_id`'s nearest ancestor with the memory controller.
    pub memcg_id: u64,
    /// Resident anonymous, file and shmem pages.
    pub anon_rss_pages: u64,
    pub file_rss_pages: u64,
    pub shmem_rss_pages: u64,
    pub oom_score_adj: i32,
    pub _pad: u32,
    pub comm: [u8; TASK_COMM_LEN],
}

impl OomVictimEvent {
    /// All fields zero; programs fill in what their hook provides.
    pub const EMPTY: Self = Self {
        header: EventHeader {
            kind: 0,
            flags: 0,
            boot_ns: 0,
        },
        pid: 0,
        tgid: 0,
        cgroup_id: 0,
        memcg_id: 0,
        anon_rss_pages: 0,
        file_rss_pages: 0,
        shmem_rss_pages: 0,
        oom_score_adj: 0,
        _pad: 0,
        comm: [0; TASK_COMM_LEN],
    };
}

/// `MemcgEvent::item` values: which memory cgroup event was counted (stable across kernels; the
/// programs translate the kernel's enum values into these).
pub const MEMCG_ITEM_OOM_KILL: u32 = 1;
pub const MEMCG_ITEM_HIGH: u32 = 2;
pub const MEMCG_ITEM_MAX: u32 = 3;
pub const MEMCG_ITEM_OOM: u32 = 4;
pub const MEMCG_ITEM_OOM_GROUP_KILL: u32 = 5;

/// `MemcgEvent::count` is the number of events since the previous record for this cgroup and
/// item (the program coalesces bursts of `high`/`max`), not a single event.
pub const MEMCG_FLAG_COALESCED: u32 = 1;

/// A memory cgroup event (`high`, `max`, `oom`, `oom_kill`, `oom_group_kill`) from the fentry program.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemcgEvent {
    pub header: EventHeader,
    /// Id of the memory cgroup that counted the event.
    pub memcg_id: u64,
    /// A `MEMCG_ITEM_*` value.
    pub item: u32,
    /// Thread id of the current task when the event was counted.
    pub pid: u32,
    /// How many were counted.
    pub count: u64,
}

/// Key of the per-cgroup memcg event counters kept in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemcgCounterKey {
    pub memcg_id: u64,
    pub item: u32,
    pub _pad: u32,
}

/// Per-cgroup, per-item totals, and what was last sent to userspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgCounter {
    pub total: u64,
    /// `total` when the last record was emitted.
    pub emitted: u64,
    pub last_emit_boot_ns: u64,
}

/// Minimum gap between two records for the same cgroup and frequent item (`high`, `max`).
pub const MEMCG_EMIT_INTERVAL_NS: u64 = 10_000_000;

/// `oom:oom_score_adj_update` for a task while the current task is in a watched cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomScoreAdjEvent {
    pub header: EventHeader,
    /// Thread id whose score was written.
    pub pid: u32,
    /// Process id of the writer (the current task).
    pub writer_tgid: u32,
    /// cgroup v2 id of the writer.
    pub cgroup_id: u64,
    pub oom_score_adj: i32,
    pub _pad: u32,
    pub comm: [u8; TASK_COMM_LEN],
}

/// `ProcessEvent::op` values.
pub const PROCESS_FORK: u32 = 1;
pub const PROCESS_EXEC: u32 = 2;

/// A fork or exec in a watched cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    pub header: EventHeader,
    /// The new task (fork) or the task that exec'd.
    pub pid: u32,
    /// The forking task (fork) or 0.
    pub parent_pid: u32,
    /// cgroup v2 id (a child starts in its parent's cgroup).
    pub cgroup_id: u64,
    /// A `PROCESS_*` value.
    pub op: u32,
    pub _pad: u32,
}

/// `CgroupEvent::op` values.
pub const CGROUP_MKDIR: u32 = 1;
pub const CGROUP_RMDIR: u32 = 2;

/// `cgroup:cgroup_mkdir` / `cgroup:cgroup_rmdir`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupEvent {
    pub header: EventHeader,
    /// The cgroup's id (kernfs inode) in its hierarchy.
    pub id: u64,
    /// Hierarchy id (0 is the v2 default hierarchy), and depth below its root.
    pub root: i32,
    pub level: i32,
    /// A `CGROUP_*` value.
    pub op: u32,
    /// Bytes of `path` used, NUL excluded.
    pub path_len: u32,
    /// Path relative to the hierarchy root, NUL padded.
    pub path: [u8; CGROUP_PATH_LEN],
}

/// `ReclaimWakeEvent::reclaim` values.
/// kswapd was woken (`vmscan:mm_vmscan_wakeup_kswapd`): a zone fell below its low watermark.
pub const RECLAIM_WAKE_KSWAPD: u32 = 1;
/// A task began direct (global) reclaim (`vmscan:mm_vmscan_direct_reclaim_begin`): kswapd is
/// not keeping up and allocations stall.
pub const RECLAIM_WAKE_DIRECT: u32 = 2;
/// A task of a watched cgroup began memory cgroup reclaim (a limit or memory.high reached,
/// `vmscan:mm_vmscan_memcg_reclaim_begin`).
pub const RECLAIM_WAKE_MEMCG: u32 = 3;

/// Minimum gap between two [`ReclaimWakeEvent`]s of one kind, all CPUs together: a reclaiming node
/// enters reclaim thousands of times a second, and one wake-up per interval is all the agent
/// needs (its level check runs at this period near the level).
pub const RECLAIM_WAKE_INTERVAL_NS: u64 = 10_000_000;

/// The kernel began reclaiming memory: an early sign of node memory pressure, sent at most once
/// per [`RECLAIM_WAKE_INTERVAL_NS`] so the eviction manager wakes at the first reclaim instead of
/// at its next level check. `header.boot_ns` is when the reclaim began.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimWakeEvent {
    pub header: EventHeader,
    /// cgroup v2 id of the current task (for kswapd, the allocating task that woke it).
    pub cgroup_id: u64,
    /// A `RECLAIM_WAKE_*` value.
    pub reclaim: u32,
    /// Thread id of the current task.
    pub pid: u32,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain `repr(C)` integers without padding; every bit pattern is valid.
    unsafe impl aya::Pod for super::ReclaimWakeEvent {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::OomScoreAdjEvent {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::ProcessEvent {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::CgroupEvent {}
    // SAFETY: plain `repr(C)` integers without padding; every bit pattern is valid.
    unsafe impl aya::Pod for super::OomVictimEvent {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::MemcgEvent {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::MemcgCounterKey {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::MemcgCounter {}
}
