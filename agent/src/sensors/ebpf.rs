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
    btf::{BtfError, KernelBtf},
    event::{DecodeError, SensorEvent, decode},
    kernel_log::{self, KernelLogReader},
    slots::SlotTable,
    table::{
        Attach, AttachedProgram, Attachment, Hook, Program, Requirement, Sensor, SensorSwitches,
        attach_sensors,
    },
    tracefs,
};

/// The object built by agent/build.rs (empty when built with `AYA_BUILD_SKIP=1`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/qoslet"));

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
    /// How each sensor of the table came out.
    outcomes: Vec<(&'static Sensor, Attachment)>,
    /// Hooks that were tried and skipped, with the reason.
    skipped: Vec<String>,
    /// The watched cgroup ids and where their CPU statistics live; each `WATCH_FILTER` word is
    /// recomputed from the ids (one bit may stand for several).
    pub(super) slots: SlotTable,
}

impl EbpfSensors {
    /// Whether this binary carries the kernel programs.
    pub(crate) fn object_built() -> bool {
        !OBJECT.is_empty()
    }

    /// Loads the object and attaches every sensor.
    pub fn load(options: EbpfOptions) -> Result<Self, SensorError> {
        Self::load_switched(options, &SensorSwitches::default())
    }

    /// Loads the object and attaches the sensors `switches` leaves on, each to the first of
    /// its choices in [`SENSORS`](super::table::SENSORS) that the kernel accepts.
    pub(crate) fn load_switched(
        options: EbpfOptions,
        switches: &SensorSwitches,
    ) -> Result<Self, SensorError> {
        crate::support::privilege::check()?;
        if !Self::object_built() {
            return Err(SensorError::NotBuilt);
        }
        raise_memlock_limit();

        let kernel_btf = KernelBtf::vmlinux();
        // Each BTF layout, or why it is unavailable (the program needing it is then skipped).
        let btf = kernel_btf.as_ref();
        let oom_btf_layout: Result<OomBtfLayout, String> = if options.prefer_btf {
            layout_from(btf, KernelBtf::oom_layout)
        } else {
            Err("not tried: the classic tracepoint was asked for".to_owned())
        };
        let memcg_event_layout: Result<MemcgEventLayout, String> =
            layout_from(btf, KernelBtf::memcg_event_layout);
        let sched_layout: Result<SchedBtfLayout, String> =
            layout_from(btf, KernelBtf::sched_layout);
        let root = tracefs::ensure_mounted()?;
        let oom_tp_layout = oom_tracepoint_layout(root);
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
            .override_global(
                "OOM_BTF_LAYOUT",
                oom_btf_layout.as_ref().unwrap_or(&OomBtfLayout::UNSET),
                true,
            )
            .override_global("OOM_TP_LAYOUT", &oom_tp_layout, true)
            .override_global(
                "MEMCG_EVENT_LAYOUT",
                memcg_event_layout
                    .as_ref()
                    .unwrap_or(&MemcgEventLayout::UNSET),
                true,
            )
            .override_global(
                "SCHED_LAYOUT",
                sched_layout.as_ref().unwrap_or(&SchedBtfLayout::UNSET),
                true,
            )
            .override_global("LIFECYCLE_LAYOUT", &lifecycle_layout, true)
            .override_global(aya_log::LEVEL, &log_level, true);
        if !options.diagnostics {
            // Nothing writes aya-log's 128 KiB ring then: one page, the smallest a ring can be.
            loader.map_max_entries(kernel_log::RING, page_size());
        }
        let mut ebpf = loader.load(OBJECT).map_err(SensorError::Load)?;

        let unmet = |r: Requirement| -> Option<String> {
            match r {
                Requirement::None => None,
                Requirement::OomBtfLayout => oom_btf_layout.as_ref().err().cloned(),
                Requirement::MemcgEventLayout => memcg_event_layout.as_ref().err().cloned(),
                Requirement::SchedLayout => sched_layout.as_ref().err().cloned(),
            }
        };
        let table = attach_sensors(
            switches,
            &mut KernelAttach {
                ebpf: &mut ebpf,
                btf: aya_btf.as_ref(),
                unmet: &unmet,
            },
        )
        .map_err(SensorError::Essential)?;
        let mut skipped = table.skipped;
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
            attached: table.programs,
            outcomes: table.outcomes,
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

    /// Each sensor of [`SENSORS`](super::table::SENSORS) and how it came out, in table order.
    pub(crate) fn outcomes(&self) -> &[(&'static Sensor, Attachment)] {
        &self.outcomes
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

/// [`Attach`] on the loaded object: checks the program's requirement, then loads and attaches it.
struct KernelAttach<'a> {
    ebpf: &'a mut Ebpf,
    /// aya's parse of the kernel BTF, for the BTF-typed hooks.
    btf: Option<&'a aya::Btf>,
    /// Why a requirement is unmet (a layout that could not be resolved).
    unmet: &'a dyn Fn(Requirement) -> Option<String>,
}

impl Attach for KernelAttach<'_> {
    fn attach(&mut self, program: &Program) -> Result<(), String> {
        let hook = program.hook.to_string();
        if let Some(why) = (self.unmet)(program.requires) {
            return Err(format!("{hook}: {why}"));
        }
        let btf = || {
            self.btf
                .ok_or_else(|| format!("{hook}: the loader could not parse the kernel BTF"))
        };
        let name = program.name;
        let attached = match program.hook {
            Hook::BtfTracepoint(event) => {
                let btf = btf()?;
                attach_with(self.ebpf, name, &hook, |p: &mut BtfTracePoint| {
                    p.load(event, btf)?;
                    p.attach().map(drop)
                })
            }
            Hook::Fentry(function) => {
                let btf = btf()?;
                attach_with(self.ebpf, name, &hook, |p: &mut FEntry| {
                    p.load(function, btf)?;
                    p.attach().map(drop)
                })
            }
            Hook::Tracepoint {
                category,
                name: event,
            } => attach_with(self.ebpf, name, &hook, |p: &mut TracePoint| {
                p.load()?;
                p.attach(category, event).map(drop)
            }),
        };
        attached.map_err(|e| error_chain(&e))
    }

    fn detach(&mut self, program: &Program) {
        let unloaded = match self.ebpf.program_mut(program.name) {
            Some(aya::programs::Program::BtfTracePoint(p)) => p.unload(),
            Some(aya::programs::Program::FEntry(p)) => p.unload(),
            Some(aya::programs::Program::TracePoint(p)) => p.unload(),
            _ => Ok(()),
        };
        if let Err(e) = unloaded {
            tracing::debug!(program = program.name, error = %error_chain(&e), "Could not unload a program.");
        }
    }
}

/// Finds `program` in the object as a `P` and runs `attach` on it, naming the hook in errors.
fn attach_with<P>(
    ebpf: &mut Ebpf,
    program: &'static str,
    hook: &str,
    attach: impl FnOnce(&mut P) -> Result<(), aya::programs::ProgramError>,
) -> Result<(), SensorError>
where
    for<'a> &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let wrap = |source| SensorError::Program {
        program,
        hook: hook.to_owned(),
        source,
    };
    let prog: &mut P = ebpf
        .program_mut(program)
        .ok_or_else(|| wrap(aya::programs::ProgramError::UnexpectedProgramType))?
        .try_into()
        .map_err(wrap)?;
    attach(prog).map_err(wrap)
}

/// A layout resolved from the kernel BTF, or why there is none.
fn layout_from<L>(
    btf: Result<&KernelBtf, &BtfError>,
    resolve: fn(&KernelBtf) -> Result<L, BtfError>,
) -> Result<L, String> {
    match btf {
        Ok(b) => resolve(b).map_err(|e| e.to_string()),
        Err(e) => Err(format!("kernel BTF unavailable: {e}")),
    }
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
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
