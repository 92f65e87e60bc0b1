//! Loading the kernel programs, attaching each to the best hook the kernel offers, and reading
//! their ring buffer with tokio.

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, TracePoint},
};
use qoslet_common::{MemcgEventLayout, OomBtfLayout, OomTracepointLayout, SchedBtfLayout};
use std::os::fd::OwnedFd;
use tokio::io::unix::AsyncFd;

use super::{
    SensorError,
    btf::KernelBtf,
    event::{DecodeError, SensorEvent, decode},
    kernel_log::{self, KernelLogReader},
    privilege,
    slots::SlotTable,
    tracefs,
};

/// The object built by agent/build.rs (empty when built with `AYA_BUILD_SKIP=1`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/qoslet"));

/// Classic tracepoints each serving one sensor; one that is missing is skipped, not fatal.
const OPTIONAL_TRACEPOINTS: [(&str, &str, &str); 9] = [
    (
        "memcg_reclaim_begin",
        "vmscan",
        "mm_vmscan_memcg_reclaim_begin",
    ),
    ("memcg_reclaim_end", "vmscan", "mm_vmscan_memcg_reclaim_end"),
    (
        "direct_reclaim_begin",
        "vmscan",
        "mm_vmscan_direct_reclaim_begin",
    ),
    (
        "direct_reclaim_end",
        "vmscan",
        "mm_vmscan_direct_reclaim_end",
    ),
    ("oom_score_adj_update", "oom", "oom_score_adj_update"),
    ("process_fork", "sched", "sched_process_fork"),
    ("process_exec", "sched", "sched_process_exec"),
    ("cgroup_mkdir", "cgroup", "cgroup_mkdir"),
    ("cgroup_rmdir", "cgroup", "cgroup_rmdir"),
];

/// A program attached to a kernel hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedProgram {
    pub program: &'static str,
    /// `tp_btf/mark_victim`, `tracepoint/oom/mark_victim`, ...
    pub hook: String,
}

/// What to load.
#[derive(Debug, Clone, Copy)]
pub struct EbpfOptions {
    /// Try the BTF-typed tracepoint first (exact victim cgroup); false forces the classic one.
    pub prefer_btf: bool,
    /// Load the programs with their diagnostics on (see `kernel_log`); read them with
    /// [`EbpfSensors::kernel_log_reader`].
    pub diagnostics: bool,
}

impl Default for EbpfOptions {
    fn default() -> Self {
        Self {
            prefer_btf: true,
            diagnostics: false,
        }
    }
}

/// The loaded programs. Dropping it detaches them.
pub struct EbpfSensors {
    pub(super) ebpf: Ebpf,
    /// Keeps kernel BPF run-time statistics on while held (BPF_ENABLE_STATS: the kernel turns
    /// them off again when the fd closes, also if qoslet crashes; no sysctl is written).
    stats: Option<OwnedFd>,
    attached: Vec<AttachedProgram>,
    /// Hooks that were tried and skipped, with the reason (logged once by the caller).
    skipped: Vec<String>,
    /// The watched cgroup ids and where their CPU statistics live; each `WATCH_FILTER` word is
    /// recomputed from the ids (one bit may stand for several).
    pub(super) slots: SlotTable,
}

impl EbpfSensors {
    /// Whether this binary carries the kernel programs.
    pub fn object_built() -> bool {
        !OBJECT.is_empty()
    }

    pub fn load(options: EbpfOptions) -> Result<Self, SensorError> {
        privilege::check()?;
        if !Self::object_built() {
            return Err(SensorError::NotBuilt);
        }
        raise_memlock_limit();
        let mut skipped = Vec::new();

        let kernel_btf = match KernelBtf::vmlinux() {
            Ok(b) => Some(b),
            Err(e) => {
                skipped.push(format!("kernel BTF unavailable: {e}"));
                None
            }
        };
        let oom_btf_layout = match (&kernel_btf, options.prefer_btf) {
            (Some(b), true) => b.oom_layout().unwrap_or_else(|e| {
                skipped.push(format!("tp_btf/mark_victim: {e}"));
                OomBtfLayout::UNSET
            }),
            _ => OomBtfLayout::UNSET,
        };
        let root = tracefs::ensure_mounted()?;
        let oom_tp_layout = oom_tracepoint_layout(root);
        let memcg_event_layout = match &kernel_btf {
            Some(b) => b.memcg_event_layout().unwrap_or_else(|e| {
                skipped.push(format!("fentry/__memcg_memory_event: {e}"));
                MemcgEventLayout::UNSET
            }),
            None => MemcgEventLayout::UNSET,
        };

        let sched_layout = match &kernel_btf {
            Some(b) => b.sched_layout().unwrap_or_else(|e| {
                skipped.push(format!("tp_btf/sched_switch: {e}"));
                SchedBtfLayout::UNSET
            }),
            None => SchedBtfLayout::UNSET,
        };
        let lifecycle_layout = tracefs::lifecycle_layout(root);
        // Every layout is resolved: unmap it before aya parses its own copy of the BTF.
        drop(kernel_btf);

        let aya_btf = aya::Btf::from_sys_fs().ok();
        let log_level = if options.diagnostics {
            kernel_log::LEVEL_ON
        } else {
            kernel_log::LEVEL_OFF
        };
        let mut loader = EbpfLoader::new();
        loader
            .btf(aya_btf.as_ref())
            .override_global("OOM_BTF_LAYOUT", &oom_btf_layout, true)
            .override_global("OOM_TP_LAYOUT", &oom_tp_layout, true)
            .override_global("MEMCG_EVENT_LAYOUT", &memcg_event_layout, true)
            .override_global("SCHED_LAYOUT", &sched_layout, true)
            .override_global("LIFECYCLE_LAYOUT", &lifecycle_layout, true)
            .override_global(aya_log::LEVEL, &log_level, true);
        if !options.diagnostics {
            // Nothing writes aya-log's 128 KiB ring then: one page, the smallest a ring can be.
            loader.map_max_entries(kernel_log::RING, page_size());
        }
        let mut ebpf = loader.load(OBJECT).map_err(SensorError::Load)?;

        let mut attached = Vec::new();
        // OOM victims: the BTF program reads the victim itself; the classic tracepoint only knows
        // the cgroup of the task that ran into the OOM.
        let mut oom_attached = false;
        if oom_btf_layout.valid == 1
            && let Some(btf) = aya_btf.as_ref()
        {
            match attach_btf_tracepoint(&mut ebpf, "oom_mark_victim_btf", "mark_victim", btf) {
                Ok(a) => {
                    attached.push(a);
                    oom_attached = true;
                }
                Err(e) => skipped.push(error_chain(&e)),
            }
        }
        if !oom_attached {
            match attach_tracepoint(&mut ebpf, "oom_mark_victim_tp", "oom", "mark_victim") {
                Ok(a) => attached.push(a),
                Err(e) => return Err(SensorError::NoOomProgram(error_chain(&e))),
            }
        }
        // memcg events: fentry where `__memcg_memory_event` exists (6.15+), memory.events polling
        // elsewhere. `memcg:count_memcg_events` is deliberately not used: it fires for every
        // memcg vm event (tens of thousands a second under load), carries OOM_KILL only on
        // 6.12-6.14 (no such tracepoint on 6.1, no OOM_KILL through it on 6.15+), and there it
        // only repeated what `oom:mark_victim` (the victim) and memory.events (the count) give.
        if memcg_event_layout.valid == 1
            && let Some(btf) = aya_btf.as_ref()
        {
            match attach_fentry(&mut ebpf, "memcg_memory_event", "__memcg_memory_event", btf) {
                Ok(a) => attached.push(a),
                Err(e) => skipped.push(error_chain(&e)),
            }
        }
        if sched_layout.valid == 1
            && let Some(btf) = aya_btf.as_ref()
        {
            match attach_btf_tracepoint(&mut ebpf, "sched_switch", "sched_switch", btf) {
                Ok(a) => attached.push(a),
                Err(e) => skipped.push(error_chain(&e)),
            }
        }
        for (program, category, name) in OPTIONAL_TRACEPOINTS {
            match attach_tracepoint(&mut ebpf, program, category, name) {
                Ok(a) => attached.push(a),
                Err(e) => skipped.push(error_chain(&e)),
            }
        }
        let stats = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Some(fd),
            Err(e) => {
                skipped.push(format!("BPF run-time statistics: {e}"));
                None
            }
        };
        Ok(Self {
            ebpf,
            stats,
            attached,
            skipped,
            slots: SlotTable::default(),
        })
    }

    /// Whether kernel BPF run-time statistics are on for [`Self::program_costs`].
    pub fn stats_enabled(&self) -> bool {
        self.stats.is_some()
    }

    /// Whether the program with this name is attached.
    pub fn is_attached(&self, program: &str) -> bool {
        self.attached.iter().any(|a| a.program == program)
    }

    pub fn attached(&self) -> &[AttachedProgram] {
        &self.attached
    }

    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// Takes the event ring buffer for a reader task. Call once.
    pub fn event_reader(&mut self) -> Result<EventReader, SensorError> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .ok_or(SensorError::MissingMap("EVENTS"))?;
        let ring: RingBuf<MapData> = RingBuf::try_from(map).map_err(|source| SensorError::Map {
            name: "EVENTS",
            source,
        })?;
        // SAFETY: the RingBuf owns its map fd, which stays open and unchanged until the AsyncFd
        // (and the RingBuf inside it) is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| SensorError::Intake(e.into()))?;
        Ok(EventReader { fd })
    }

    /// Takes the diagnostics ring buffer for a reader task (useful only when loaded with
    /// [`EbpfOptions::diagnostics`]). Call once, inside a tokio runtime.
    pub fn kernel_log_reader(&mut self) -> Result<KernelLogReader, SensorError> {
        KernelLogReader::new(&mut self.ebpf)
    }

    /// Records the kernel could not put in the ring buffer because it was full.
    pub fn events_lost(&self) -> Result<u64, SensorError> {
        let map = self
            .ebpf
            .map("EVENTS_LOST")
            .ok_or(SensorError::MissingMap("EVENTS_LOST"))?;
        let lost: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(map).map_err(|source| SensorError::Map {
                name: "EVENTS_LOST",
                source,
            })?;
        let values = lost.get(&0, 0).map_err(|source| SensorError::Map {
            name: "EVENTS_LOST",
            source,
        })?;
        Ok(values.iter().sum())
    }
}

/// Reads decoded events from the ring buffer as they arrive.
pub struct EventReader {
    fd: AsyncFd<RingBuf<MapData>>,
}

impl EventReader {
    /// Waits until at least one record is available and appends every available one to `out`.
    /// Records that fail to decode are returned separately (counted by the caller).
    pub async fn read_batch(
        &mut self,
        out: &mut Vec<SensorEvent>,
        bad: &mut Vec<DecodeError>,
    ) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.readable_mut().await?;
            let ring = guard.get_inner_mut();
            let before = out.len() + bad.len();
            while let Some(item) = ring.next() {
                match decode(&item[..]) {
                    Ok(e) => out.push(e),
                    Err(e) => bad.push(e),
                }
            }
            guard.clear_ready();
            if out.len() + bad.len() > before {
                return Ok(());
            }
        }
    }
}

/// Finds `program` in the object as a `P` and runs `attach` on it, naming the hook in errors.
fn attach_with<P>(
    ebpf: &mut Ebpf,
    program: &'static str,
    hook: String,
    attach: impl FnOnce(&mut P) -> Result<(), aya::programs::ProgramError>,
) -> Result<AttachedProgram, SensorError>
where
    for<'a> &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let wrap = |source| SensorError::Program {
        program,
        hook: hook.clone(),
        source,
    };
    let prog: &mut P = ebpf
        .program_mut(program)
        .ok_or_else(|| wrap(aya::programs::ProgramError::UnexpectedProgramType))?
        .try_into()
        .map_err(wrap)?;
    attach(prog).map_err(wrap)?;
    Ok(AttachedProgram { program, hook })
}

fn attach_btf_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    hook: &str,
    btf: &aya::Btf,
) -> Result<AttachedProgram, SensorError> {
    attach_with(
        ebpf,
        program,
        format!("tp_btf/{hook}"),
        |p: &mut BtfTracePoint| {
            p.load(hook, btf)?;
            p.attach().map(drop)
        },
    )
}

fn attach_fentry(
    ebpf: &mut Ebpf,
    program: &'static str,
    function: &str,
    btf: &aya::Btf,
) -> Result<AttachedProgram, SensorError> {
    attach_with(
        ebpf,
        program,
        format!("fentry/{function}"),
        |p: &mut FEntry| {
            p.load(function, btf)?;
            p.attach().map(drop)
        },
    )
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &str,
    name: &str,
) -> Result<AttachedProgram, SensorError> {
    attach_with(
        ebpf,
        program,
        format!("tracepoint/{category}/{name}"),
        |p: &mut TracePoint| {
            p.load()?;
            p.attach(category, name).map(drop)
        },
    )
}

fn oom_tracepoint_layout(root: &str) -> OomTracepointLayout {
    let Ok(fields) = tracefs::read_format(root, "oom", "mark_victim") else {
        return OomTracepointLayout::UNSET;
    };
    let at = |name: &str| {
        fields
            .get(name)
            .map_or(OomTracepointLayout::ABSENT, |f| f.offset)
    };
    let rss_complete = ["anon_rss", "file_rss", "shmem_rss"]
        .iter()
        .all(|f| fields.contains_key(*f));
    OomTracepointLayout {
        pid: at("pid"),
        anon_rss: if rss_complete {
            at("anon_rss")
        } else {
            OomTracepointLayout::ABSENT
        },
        file_rss: at("file_rss"),
        shmem_rss: at("shmem_rss"),
        oom_score_adj: at("oom_score_adj"),
        _pad: 0,
    }
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(n).unwrap_or(4096)
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; later ones ignore it.
fn raise_memlock_limit() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
    if ret != 0 {
        tracing::debug!("Could not raise RLIMIT_MEMLOCK.");
    }
}

/// An error and its sources in one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
