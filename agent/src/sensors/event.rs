//! Decoding ring-buffer records into typed events. The kind is validated with `TryFrom` before
//! the record is read, and records are copied out unaligned: bytes are never transmuted.

use std::mem::{offset_of, size_of};

use qoslet_common::{
    CgroupEvent, EventHeader, EventKind, MemcgEvent, OomScoreAdjEvent, OomVictimEvent,
    ProcessEvent, ReclaimWakeEvent, UnknownEventKind,
    event::{
        CGROUP_MKDIR, CGROUP_RMDIR, MEMCG_ITEM_HIGH, MEMCG_ITEM_MAX, MEMCG_ITEM_OOM,
        MEMCG_ITEM_OOM_GROUP_KILL, MEMCG_ITEM_OOM_KILL, OOM_FLAG_CGROUP_OF_CURRENT,
        OOM_FLAG_FROM_BTF, OOM_FLAG_HAS_MEMCG, OOM_FLAG_HAS_RSS, OOM_FLAG_HAS_SCORE_ADJ,
        PROCESS_EXEC, PROCESS_FORK, RECLAIM_WAKE_DIRECT, RECLAIM_WAKE_KSWAPD, RECLAIM_WAKE_MEMCG,
    },
};
use thiserror::Error;

/// Where the kernel's page size is not 4 KiB the agent passes the real one; x86-64 is 4 KiB.
pub(crate) const PAGE_SIZE: u64 = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its header")]
    Short { len: usize },
    #[error("record kind {} is unknown", .0.0)]
    UnknownKind(UnknownEventKind),
    #[error("memcg record item {0} is unknown")]
    UnknownMemcgItem(u32),
    #[error("{kind:?} record operation {op} is unknown")]
    UnknownOp { kind: EventKind, op: u32 },
    #[error("{kind:?} record of {len} bytes is shorter than {expected}")]
    Truncated {
        kind: EventKind,
        len: usize,
        expected: usize,
    },
}

/// Which program saw an OOM victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomSource {
    /// `tp_btf/mark_victim`: the victim's own task, exact cgroup ids.
    BtfTracepoint,
    /// `tracepoint/oom/mark_victim`: cgroup ids are those of the task that hit the OOM.
    Tracepoint,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomVictim {
    pub pid: u32,
    /// 0 when the program could not tell.
    pub tgid: u32,
    pub comm: String,
    /// cgroup v2 (unified hierarchy) id.
    pub cgroup_id: u64,
    /// The memory controller's cgroup id (v1 memory hierarchy on hybrid hosts).
    pub memcg_id: Option<u64>,
    pub rss_bytes: Option<u64>,
    pub oom_score_adj: Option<i32>,
    pub source: OomSource,
    pub(crate) boot_ns: u64,
    /// The pod and container of `cgroup_id` (or `memcg_id`), filled by the [`super::Sensors`]
    /// facade from its owner table; `None` from the decoder or for unknown cgroups.
    pub(crate) owner: Option<CgroupOwner>,
}

/// The pod and container a cgroup belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CgroupOwner {
    pub(crate) pod_uid: String,
    pub(crate) container: String,
}

/// Which kind of process lifecycle step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessOp {
    Fork,
    Exec,
}

/// Which kind of cgroup lifecycle step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupOp {
    Created,
    Removed,
}

/// Which reclaim began (a `ReclaimWakeEvent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimKind {
    /// kswapd was woken: a zone fell below its low watermark (machine-wide).
    Kswapd,
    /// A task began direct reclaim (machine-wide; kswapd is behind).
    Direct,
    /// A task of a watched cgroup began memory cgroup reclaim (some memcg above it is at its
    /// limit or memory.high; which one the tracepoint does not say).
    Memcg,
}

/// What a PSI trigger watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PressureScope {
    System,
    /// A cgroup v2 id.
    Cgroup(u64),
}

/// The memory cgroup events the kernel reports in `memory.events`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemcgEventKind {
    High,
    Max,
    Oom,
    OomKill,
    OomGroupKill,
}

impl MemcgEventKind {
    /// Every kind, in `memory.events` order.
    pub(crate) const ALL: [Self; 5] = [
        Self::High,
        Self::Max,
        Self::Oom,
        Self::OomKill,
        Self::OomGroupKill,
    ];

    fn from_item(item: u32) -> Option<Self> {
        Some(match item {
            MEMCG_ITEM_HIGH => Self::High,
            MEMCG_ITEM_MAX => Self::Max,
            MEMCG_ITEM_OOM => Self::Oom,
            MEMCG_ITEM_OOM_KILL => Self::OomKill,
            MEMCG_ITEM_OOM_GROUP_KILL => Self::OomGroupKill,
            _ => return None,
        })
    }

    /// The key of `memory.events` this counts.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Max => "max",
            Self::Oom => "oom",
            Self::OomKill => "oom_kill",
            Self::OomGroupKill => "oom_group_kill",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SensorEvent {
    OomVictim(OomVictim),
    /// A memory cgroup counted `count` events of one kind since its previous record.
    Memcg {
        memcg_id: u64,
        kind: MemcgEventKind,
        count: u64,
        /// The task that was running when the (last) event was counted; 0 when the event
        /// came from `memory.events` polling.
        pid: u32,
        boot_ns: u64,
    },
    /// A task's `oom_score_adj` was written while the writer was in a watched cgroup.
    OomScoreAdj {
        pid: u32,
        writer_tgid: u32,
        cgroup_id: u64,
        oom_score_adj: i32,
        comm: String,
    },
    Process {
        op: ProcessOp,
        pid: u32,
        /// The forking task; 0 for exec.
        parent_pid: u32,
        cgroup_id: u64,
    },
    Cgroup {
        op: CgroupOp,
        id: u64,
        /// Hierarchy id: 0 is the v2 (unified) hierarchy.
        hierarchy: i32,
        level: i32,
        /// Relative to the hierarchy root, possibly truncated.
        path: String,
    },
    /// A PSI memory trigger fired (stall above its threshold in its window).
    MemoryPressure {
        scope: PressureScope,
    },
    /// The kernel began reclaiming (at most one record per kind every 10 ms).
    ReclaimWake {
        kind: ReclaimKind,
        /// cgroup v2 id of the task that woke kswapd or began reclaiming.
        cgroup_id: u64,
        pid: u32,
        /// When the reclaim began (CLOCK_BOOTTIME).
        boot_ns: u64,
    },
}

/// CLOCK_BOOTTIME in nanoseconds, the clock of the kernel records (`EventHeader::boot_ns`).
pub(crate) fn boot_now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) with a valid clock id and a pointer to a timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) } != 0 {
        return 0;
    }
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

fn read<T: Copy>(bytes: &[u8]) -> T {
    debug_assert!(bytes.len() >= size_of::<T>());
    // SAFETY: length checked by the caller; T is a plain repr(C) integer struct valid for any
    // bit pattern, read unaligned because ring-buffer records are only 8-byte aligned.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

fn checked<T: Copy>(kind: EventKind, bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() < size_of::<T>() {
        return Err(DecodeError::Truncated {
            kind,
            len: bytes.len(),
            expected: size_of::<T>(),
        });
    }
    Ok(read(bytes))
}

pub(crate) fn decode(bytes: &[u8]) -> Result<SensorEvent, DecodeError> {
    if bytes.len() < size_of::<EventHeader>() {
        return Err(DecodeError::Short { len: bytes.len() });
    }
    let kind_at = offset_of!(EventHeader, kind);
    let raw_kind = u32::from_ne_bytes(bytes[kind_at..kind_at + 4].try_into().expect("4 bytes"));
    let kind = EventKind::try_from(raw_kind).map_err(DecodeError::UnknownKind)?;
    Ok(match kind {
        EventKind::OomVictim => {
            let e: OomVictimEvent = checked(kind, bytes)?;
            SensorEvent::OomVictim(oom_victim(&e))
        }
        EventKind::Memcg => {
            let e: MemcgEvent = checked(kind, bytes)?;
            let kind =
                MemcgEventKind::from_item(e.item).ok_or(DecodeError::UnknownMemcgItem(e.item))?;
            SensorEvent::Memcg {
                memcg_id: e.memcg_id,
                kind,
                count: e.count,
                pid: e.pid,
                boot_ns: e.header.boot_ns,
            }
        }
        EventKind::OomScoreAdj => {
            let e: OomScoreAdjEvent = checked(kind, bytes)?;
            SensorEvent::OomScoreAdj {
                pid: e.pid,
                writer_tgid: e.writer_tgid,
                cgroup_id: e.cgroup_id,
                oom_score_adj: e.oom_score_adj,
                comm: c_string(&e.comm),
            }
        }
        EventKind::Process => {
            let e: ProcessEvent = checked(kind, bytes)?;
            let op = match e.op {
                PROCESS_FORK => ProcessOp::Fork,
                PROCESS_EXEC => ProcessOp::Exec,
                op => return Err(DecodeError::UnknownOp { kind, op }),
            };
            SensorEvent::Process {
                op,
                pid: e.pid,
                parent_pid: e.parent_pid,
                cgroup_id: e.cgroup_id,
            }
        }
        EventKind::Cgroup => {
            let e: CgroupEvent = checked(kind, bytes)?;
            let op = match e.op {
                CGROUP_MKDIR => CgroupOp::Created,
                CGROUP_RMDIR => CgroupOp::Removed,
                op => return Err(DecodeError::UnknownOp { kind, op }),
            };
            let len = (e.path_len as usize).min(e.path.len());
            SensorEvent::Cgroup {
                op,
                id: e.id,
                hierarchy: e.root,
                level: e.level,
                path: c_string(&e.path[..len]),
            }
        }
        EventKind::ReclaimWake => {
            let e: ReclaimWakeEvent = checked(kind, bytes)?;
            let reclaim = match e.reclaim {
                RECLAIM_WAKE_KSWAPD => ReclaimKind::Kswapd,
                RECLAIM_WAKE_DIRECT => ReclaimKind::Direct,
                RECLAIM_WAKE_MEMCG => ReclaimKind::Memcg,
                op => return Err(DecodeError::UnknownOp { kind, op }),
            };
            SensorEvent::ReclaimWake {
                kind: reclaim,
                cgroup_id: e.cgroup_id,
                pid: e.pid,
                boot_ns: e.header.boot_ns,
            }
        }
    })
}

/// A NUL-terminated (or full) kernel byte string.
fn c_string(bytes: &[u8]) -> String {
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..len]).into_owned()
}

fn oom_victim(e: &OomVictimEvent) -> OomVictim {
    let flags = e.header.flags;
    let has = |f: u32| flags & f != 0;
    let source = if has(OOM_FLAG_FROM_BTF) && !has(OOM_FLAG_CGROUP_OF_CURRENT) {
        OomSource::BtfTracepoint
    } else {
        OomSource::Tracepoint
    };
    OomVictim {
        pid: e.pid,
        tgid: e.tgid,
        comm: c_string(&e.comm),
        cgroup_id: e.cgroup_id,
        memcg_id: has(OOM_FLAG_HAS_MEMCG).then_some(e.memcg_id),
        rss_bytes: has(OOM_FLAG_HAS_RSS).then(|| {
            (e.anon_rss_pages + e.file_rss_pages + e.shmem_rss_pages).saturating_mul(PAGE_SIZE)
        }),
        oom_score_adj: has(OOM_FLAG_HAS_SCORE_ADJ).then_some(e.oom_score_adj),
        source,
        boot_ns: e.header.boot_ns,
        owner: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T>(v: &T) -> Vec<u8> {
        // SAFETY: test-only view of a plain repr(C) value.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn victim(flags: u32) -> OomVictimEvent {
        let mut comm = [0u8; 16];
        comm[..3].copy_from_slice(b"hog");
        OomVictimEvent {
            header: EventHeader {
                kind: EventKind::OomVictim as u32,
                flags,
                boot_ns: 7,
            },
            pid: 42,
            tgid: 41,
            cgroup_id: 1000,
            memcg_id: 2000,
            anon_rss_pages: 10,
            file_rss_pages: 1,
            shmem_rss_pages: 0,
            oom_score_adj: -5,
            _pad: 0,
            comm,
        }
    }

    #[test]
    fn decodes_a_btf_victim_with_every_field() {
        let flags =
            OOM_FLAG_FROM_BTF | OOM_FLAG_HAS_MEMCG | OOM_FLAG_HAS_RSS | OOM_FLAG_HAS_SCORE_ADJ;
        let SensorEvent::OomVictim(v) = decode(&bytes_of(&victim(flags))).unwrap() else {
            panic!("not a victim");
        };
        assert_eq!(v.pid, 42);
        assert_eq!(v.comm, "hog");
        assert_eq!(v.memcg_id, Some(2000));
        assert_eq!(v.rss_bytes, Some(11 * 4096));
        assert_eq!(v.oom_score_adj, Some(-5));
        assert_eq!(v.source, OomSource::BtfTracepoint);
    }

    #[test]
    fn fields_the_program_did_not_fill_are_none() {
        let SensorEvent::OomVictim(v) =
            decode(&bytes_of(&victim(OOM_FLAG_CGROUP_OF_CURRENT))).unwrap()
        else {
            panic!("not a victim");
        };
        assert_eq!(
            (v.memcg_id, v.rss_bytes, v.oom_score_adj),
            (None, None, None)
        );
        assert_eq!(v.source, OomSource::Tracepoint);
    }

    #[test]
    fn rejects_unknown_kinds_and_short_records() {
        let mut e = victim(0);
        e.header.kind = 99;
        assert_eq!(
            decode(&bytes_of(&e)),
            Err(DecodeError::UnknownKind(UnknownEventKind(99)))
        );
        let ok = bytes_of(&victim(0));
        assert!(matches!(
            decode(&ok[..20]),
            Err(DecodeError::Truncated { .. })
        ));
        assert_eq!(decode(&ok[..4]), Err(DecodeError::Short { len: 4 }));
    }

    #[test]
    fn decodes_a_reclaim_wake_and_rejects_unknown_kinds_of_reclaim() {
        let mut e = ReclaimWakeEvent {
            header: EventHeader {
                kind: EventKind::ReclaimWake as u32,
                flags: 0,
                boot_ns: 123,
            },
            cgroup_id: 1,
            reclaim: RECLAIM_WAKE_KSWAPD,
            pid: 9,
        };
        assert_eq!(
            decode(&bytes_of(&e)),
            Ok(SensorEvent::ReclaimWake {
                kind: ReclaimKind::Kswapd,
                cgroup_id: 1,
                pid: 9,
                boot_ns: 123
            })
        );
        e.reclaim = 7;
        assert_eq!(
            decode(&bytes_of(&e)),
            Err(DecodeError::UnknownOp {
                kind: EventKind::ReclaimWake,
                op: 7
            })
        );
    }

    #[test]
    fn decodes_a_cgroup_record_and_rejects_unknown_operations() {
        let mut path = [0u8; qoslet_common::CGROUP_PATH_LEN];
        path[..6].copy_from_slice(b"/a/b/c");
        let mut e = CgroupEvent {
            header: EventHeader {
                kind: EventKind::Cgroup as u32,
                flags: 0,
                boot_ns: 1,
            },
            id: 77,
            root: 0,
            level: 3,
            op: CGROUP_RMDIR,
            path_len: 6,
            path,
        };
        let SensorEvent::Cgroup { op, id, path, .. } = decode(&bytes_of(&e)).unwrap() else {
            panic!("not a cgroup record");
        };
        assert_eq!((op, id, path.as_str()), (CgroupOp::Removed, 77, "/a/b/c"));
        e.op = 9;
        assert_eq!(
            decode(&bytes_of(&e)),
            Err(DecodeError::UnknownOp {
                kind: EventKind::Cgroup,
                op: 9
            })
        );
    }
}
