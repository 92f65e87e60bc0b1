//! Per-cgroup CPU, reclaim and watch-list map types, kept in kernel maps and read by the agent.

/// Number of log2 buckets of a run-queue latency histogram; bucket `i` counts waits of
/// `[2^i, 2^(i+1))` microseconds (bucket 0 also holds waits under 1 µs).
pub const RUNQ_HIST_BUCKETS: usize = 32;

/// `WATCHED_CGROUPS` value: the cgroup is watched (the only flag so far).
pub const WATCH_FLAG_WATCHED: u32 = 1;

/// Words of `WATCH_FILTER`, the scheduler program's first watch test: bit `id & 0xffff` is set
/// when some watched cgroup's id has those low 16 bits. Reading it is an inlined array access,
/// where a hash lookup is a call; so a task of an unwatched cgroup costs no lookup unless its id
/// shares the bit with a watched one (about watched / 65,536 of them).
pub const WATCH_FILTER_WORDS: u32 = 1024;

/// The `WATCH_FILTER` word and bit of a cgroup id.
#[inline(always)]
pub const fn watch_filter_slot(cgroup_id: u64) -> (u32, u64) {
    let bit = (cgroup_id & 0xffff) as u32;
    (bit >> 6, 1 << (bit & 63))
}

/// Slots of `CPU_SLOT_STATS`, the per-CPU array holding the statistics of the first watched
/// cgroups: a watched task's statistics are then found with inlined array accesses, where the
/// `CPU_STATS` hash (for the rest) costs a call and a hash per lookup. Preallocated per possible
/// CPU (`CPU_SLOTS * size_of::<CpuStats>()` bytes each, 140 KiB), so sized for a full node
/// (110 pods with their containers), not for every cgroup the agent could watch.
pub const CPU_SLOTS: u32 = 512;

/// Entries of each half of `SLOT_INDEX`. A cgroup's entry is at one of two places: its id's low
/// bits in the first half, or a multiplicative hash of the id in the second. A watched cgroup
/// whose two places are taken, or that finds no free slot, keeps its statistics in `CPU_STATS`.
pub const SLOT_INDEX_HALF: u32 = 16384;

/// A `SLOT_INDEX` entry: `cgroup_id` (0 when free) keeps its statistics in slot `slot`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotIndexEntry {
    pub cgroup_id: u64,
    pub slot: u32,
    pub _pad: u32,
}

/// The two `SLOT_INDEX` places of a cgroup id.
#[inline(always)]
pub const fn slot_index_places(cgroup_id: u64) -> [u32; 2] {
    let mask = SLOT_INDEX_HALF as u64 - 1;
    let mixed = cgroup_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    [
        (cgroup_id & mask) as u32,
        SLOT_INDEX_HALF + (mixed & mask) as u32,
    ]
}

/// CPU use of one watched cgroup (v2 id) on one CPU, filled by the scheduler programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuStats {
    /// Nanoseconds its tasks ran.
    pub oncpu_ns: u64,
    /// Number of measured waits and their sum, in nanoseconds.
    pub runq_count: u64,
    pub runq_total_ns: u64,
    pub runq_hist: [u64; RUNQ_HIST_BUCKETS],
}

impl CpuStats {
    pub const ZERO: Self = Self {
        oncpu_ns: 0,
        runq_count: 0,
        runq_total_ns: 0,
        runq_hist: [0; RUNQ_HIST_BUCKETS],
    };

    /// Adds another CPU's copy (the kernel keeps one per CPU).
    pub fn merge(&mut self, other: &Self) {
        self.oncpu_ns = self.oncpu_ns.wrapping_add(other.oncpu_ns);
        self.runq_count = self.runq_count.wrapping_add(other.runq_count);
        self.runq_total_ns = self.runq_total_ns.wrapping_add(other.runq_total_ns);
        for (a, b) in self.runq_hist.iter_mut().zip(other.runq_hist.iter()) {
            *a = a.wrapping_add(*b);
        }
    }
}

/// Reclaim stalls of one watched cgroup (v2 id of the stalled task).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimStats {
    /// Memory-cgroup reclaim (limit or memory.high reached): count and total nanoseconds.
    pub memcg_count: u64,
    pub memcg_ns: u64,
    /// Direct (global) reclaim.
    pub direct_count: u64,
    pub direct_ns: u64,
    /// Longest single stall.
    pub max_ns: u64,
}

/// `ReclaimStart::kind`.
pub const RECLAIM_MEMCG: u32 = 1;
pub const RECLAIM_DIRECT: u32 = 2;

/// A reclaim in progress, keyed by thread id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimStart {
    pub cgroup_id: u64,
    pub start_ns: u64,
    pub kind: u32,
    pub _pad: u32,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain `repr(C)` integers without padding; every bit pattern is valid.
    unsafe impl aya::Pod for super::CpuStats {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::SlotIndexEntry {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::ReclaimStats {}
    // SAFETY: `repr(C)` integers and integer arrays with explicit padding fields; every bit pattern is valid.
    unsafe impl aya::Pod for super::ReclaimStart {}
}
