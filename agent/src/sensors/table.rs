//! The one table of qoslet's eBPF sensors: for each sensor, the programs of the eBPF object that
//! serve it, on which hooks in which order of preference, what each needs from the kernel, and
//! what runs instead when none attaches or `ebpf.sensors` switches the sensor off. Attaching
//! (`ebpf.rs`), the per-sensor status line (`facade.rs`) and the validation of `ebpf.sensors`
//! (`crate::config`) all read [`SENSORS`]; docs/kernels.md's "Sensors and their fallbacks" is
//! its prose form.
//!
//! [`attach_sensors`] walks the table and calls an [`Attach`] for the kernel work, so the
//! decision (which choice, which fallback, what a switched-off sensor does) is tested without
//! a kernel.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use thiserror::Error;

/// A kernel hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `tp_btf/<name>`: a BTF-typed tracepoint (the raw arguments, typed kernel pointers).
    BtfTracepoint(&'static str),
    /// `fentry/<function>`.
    Fentry(&'static str),
    /// `tracepoint/<category>/<name>`: a classic tracepoint and its record.
    Tracepoint {
        category: &'static str,
        name: &'static str,
    },
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hook::BtfTracepoint(name) => write!(f, "tp_btf/{name}"),
            Hook::Fentry(function) => write!(f, "fentry/{function}"),
            Hook::Tracepoint { category, name } => write!(f, "tracepoint/{category}/{name}"),
        }
    }
}

/// What a program needs before it is tried, besides its hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Requirement {
    /// Nothing: a classic tracepoint's record layout comes from tracefs, and a field it lacks
    /// makes the program return early rather than fail to load.
    None,
    /// Kernel BTF, `OomBtfLayout` resolved from it, and `EbpfOptions::prefer_btf`.
    OomBtfLayout,
    /// Kernel BTF and `MemcgEventLayout` (`__memcg_memory_event` exists from Linux 6.15).
    MemcgEventLayout,
    /// Kernel BTF and `SchedBtfLayout` (`CONFIG_SCHED_INFO` and `CONFIG_FAIR_GROUP_SCHED`).
    SchedLayout,
}

/// A program of the eBPF object and the hook it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    /// Its name in the object (the function name in agent-ebpf).
    pub(crate) name: &'static str,
    pub hook: Hook,
    pub(crate) requires: Requirement,
}

/// What runs when a sensor has no kernel hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Polling or a scan, available everywhere.
    Always(&'static str),
    /// Available where the kernel has PSI (`/proc/pressure/memory`); nothing otherwise.
    Psi(&'static str),
}

/// A sensor: its program sets in order of preference and its fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sensor {
    /// The name in `ebpf.sensors`, in the status line and in `qoslet_sensor_active`.
    pub name: &'static str,
    /// The sensor runs on the first set whose programs all attach.
    pub choices: &'static [&'static [Program]],
    pub fallback: Fallback,
    /// When switched on and none of its choices attaches, eBPF is unusable on this kernel and
    /// every sensor runs on its fallback (only the OOM victim: its classic tracepoint exists on
    /// every kernel qoslet supports).
    pub(crate) essential: bool,
}

const fn tracepoint(name: &'static str, category: &'static str, event: &'static str) -> Program {
    Program {
        name,
        hook: Hook::Tracepoint {
            category,
            name: event,
        },
        requires: Requirement::None,
    }
}

/// The eBPF sensors. `memory_pressure` is not here: it is PSI only, has no program, and
/// `ebpf.sensors` does not switch it.
pub const SENSORS: &[Sensor] = &[
    Sensor {
        name: "oom_victim",
        // The BTF program reads the victim itself; the classic tracepoint only knows the cgroup
        // of the task that ran into the OOM.
        choices: &[
            &[Program {
                name: "oom_mark_victim_btf",
                hook: Hook::BtfTracepoint("mark_victim"),
                requires: Requirement::OomBtfLayout,
            }],
            &[tracepoint("oom_mark_victim_tp", "oom", "mark_victim")],
        ],
        // Both arrive as `memcg_events` records: the poller's on its fallback, the fentry
        // program's on its hook.
        fallback: Fallback::Always("oom_kill counts of memcg_events (no victim pid)"),
        essential: true,
    },
    Sensor {
        name: "memcg_events",
        // `memcg:count_memcg_events` is deliberately not used: it fires for every memcg vm event
        // (tens of thousands a second under load), carries OOM_KILL only on 6.12-6.14 (no such
        // tracepoint on 6.1, no OOM_KILL through it on 6.15+), and there it only repeated what
        // `oom:mark_victim` (the victim) and memory.events (the count) give.
        choices: &[&[Program {
            name: "memcg_memory_event",
            hook: Hook::Fentry("__memcg_memory_event"),
            requires: Requirement::MemcgEventLayout,
        }]],
        fallback: Fallback::Always(
            "memory.events on change notifications and a 10 s resync (v1: memory.failcnt, memory.oom_control)",
        ),
        essential: false,
    },
    Sensor {
        name: "reclaim_stall",
        choices: &[&[
            tracepoint(
                "memcg_reclaim_begin",
                "vmscan",
                "mm_vmscan_memcg_reclaim_begin",
            ),
            tracepoint("memcg_reclaim_end", "vmscan", "mm_vmscan_memcg_reclaim_end"),
            tracepoint(
                "direct_reclaim_begin",
                "vmscan",
                "mm_vmscan_direct_reclaim_begin",
            ),
            tracepoint(
                "direct_reclaim_end",
                "vmscan",
                "mm_vmscan_direct_reclaim_end",
            ),
        ]],
        fallback: Fallback::Psi("PSI memory triggers"),
        essential: false,
    },
    Sensor {
        name: "reclaim_wake",
        // kswapd woken: the node's first reclaim, before any allocation stalls. The direct and
        // memcg reclaim wake-ups come from `reclaim_stall`'s begin programs.
        choices: &[&[tracepoint(
            "kswapd_wakeup",
            "vmscan",
            "mm_vmscan_wakeup_kswapd",
        )]],
        fallback: Fallback::Psi("PSI memory triggers and the eviction level check"),
        essential: false,
    },
    Sensor {
        name: "cpu_runqueue",
        choices: &[&[Program {
            name: "sched_switch",
            hook: Hook::BtfTracepoint("sched_switch"),
            requires: Requirement::SchedLayout,
        }]],
        fallback: Fallback::Always(
            "cgroup CPU files read at housekeeping (usage, throttling, cpu.pressure; no run-queue histograms)",
        ),
        essential: false,
    },
    Sensor {
        name: "oom_score_adj",
        choices: &[&[tracepoint(
            "oom_score_adj_update",
            "oom",
            "oom_score_adj_update",
        )]],
        fallback: Fallback::Always("oom_score_adj polling of expected pids"),
        essential: false,
    },
    Sensor {
        name: "process_lifecycle",
        choices: &[&[
            tracepoint("process_fork", "sched", "sched_process_fork"),
            tracepoint("process_exec", "sched", "sched_process_exec"),
        ]],
        fallback: Fallback::Always("periodic cgroup.procs scan of the oom_score_adj housekeeping"),
        essential: false,
    },
    Sensor {
        name: "cgroup_lifecycle",
        choices: &[&[
            tracepoint("cgroup_mkdir", "cgroup", "cgroup_mkdir"),
            tracepoint("cgroup_rmdir", "cgroup", "cgroup_rmdir"),
        ]],
        fallback: Fallback::Always(
            "scan of watched cgroup directories every second; removed ones unwatched",
        ),
        essential: false,
    },
];

/// The reason on the status line of a sensor `ebpf.sensors` switched off.
pub const SWITCHED_OFF: &str = "switched off by ebpf.sensors";

/// A name in `ebpf.sensors` that is not an eBPF sensor.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown sensor {name:?} (the eBPF sensors are {})", known_names())]
pub struct UnknownSensor {
    pub(crate) name: String,
}

fn known_names() -> String {
    let names: Vec<&str> = SENSORS.iter().map(|s| s.name).collect();
    names.join(", ")
}

/// Which sensors `ebpf.sensors` switched off; sensors not listed are on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SensorSwitches {
    off: BTreeSet<&'static str>,
}

impl SensorSwitches {
    /// From the `ebpf.sensors` map (sensor name -> on); a name that is not in [`SENSORS`] is an
    /// error.
    pub fn new(settings: &BTreeMap<String, bool>) -> Result<Self, UnknownSensor> {
        if let Some(name) = settings
            .keys()
            .find(|name| !SENSORS.iter().any(|s| s.name == name.as_str()))
        {
            return Err(UnknownSensor { name: name.clone() });
        }
        Ok(Self::from_checked(settings))
    }

    /// From an `ebpf.sensors` map already checked by [`Self::new`] (as
    /// `QosletConfiguration::parse` does); a name that is not a sensor switches nothing.
    pub(crate) fn from_checked(settings: &BTreeMap<String, bool>) -> Self {
        let off = SENSORS
            .iter()
            .filter(|s| settings.get(s.name) == Some(&false))
            .map(|s| s.name)
            .collect();
        Self { off }
    }

    pub(crate) fn is_on(&self, sensor: &str) -> bool {
        !self.off.contains(sensor)
    }

    /// Whether any eBPF sensor is on (otherwise nothing is loaded).
    pub(crate) fn any_on(&self) -> bool {
        SENSORS.iter().any(|s| self.is_on(s.name))
    }
}

/// A program attached to a kernel hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedProgram {
    pub program: &'static str,
    /// `tp_btf/mark_victim`, `tracepoint/oom/mark_victim`, ...
    pub hook: String,
}

/// The kernel work [`attach_sensors`] asks for, one program at a time.
pub(crate) trait Attach {
    /// Loads `program` and attaches it to its hook; the error is one line saying why not (an
    /// unmet requirement or the kernel's refusal).
    fn attach(&mut self, program: &Program) -> Result<(), String>;
    /// Detaches and unloads a program `attach` attached (the rest of its set did not attach).
    fn detach(&mut self, program: &Program);
}

/// How one sensor came out of attaching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attachment {
    /// On the programs of its first choice that attached completely.
    Hooked(Vec<AttachedProgram>),
    /// No choice attached: why, for each choice in order.
    Unhooked {
        reason: String,
    },
    SwitchedOff,
}

/// Every sensor's outcome, in [`SENSORS`] order, and the programs attached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Attached {
    pub(crate) outcomes: Vec<(&'static Sensor, Attachment)>,
    pub(crate) programs: Vec<AttachedProgram>,
    /// Programs tried and not attached, with the reason.
    pub(crate) skipped: Vec<String>,
}

/// An essential sensor that is switched on could not attach any of its choices.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("no {sensor} program could be attached: {reason}")]
pub struct EssentialMissing {
    pub(crate) sensor: &'static str,
    pub(crate) reason: String,
}

/// Attaches each switched-on sensor to its first choice whose programs all attach. A set that
/// attaches only in part is detached again, so a sensor on its fallback runs no program.
pub(crate) fn attach_sensors(
    switches: &SensorSwitches,
    kernel: &mut impl Attach,
) -> Result<Attached, EssentialMissing> {
    let mut out = Attached::default();
    for sensor in SENSORS {
        let outcome = if switches.is_on(sensor.name) {
            attach_one(sensor, kernel, &mut out)
        } else {
            Attachment::SwitchedOff
        };
        if let (true, Attachment::Unhooked { reason }) = (sensor.essential, &outcome) {
            return Err(EssentialMissing {
                sensor: sensor.name,
                reason: reason.clone(),
            });
        }
        out.outcomes.push((sensor, outcome));
    }
    Ok(out)
}

fn attach_one(sensor: &Sensor, kernel: &mut impl Attach, out: &mut Attached) -> Attachment {
    let mut reasons = Vec::new();
    for choice in sensor.choices {
        let mut attached = Vec::new();
        let mut refused = None;
        for program in choice.iter() {
            match kernel.attach(program) {
                Ok(()) => attached.push(program),
                Err(why) => {
                    out.skipped.push(why.clone());
                    refused.get_or_insert(why);
                }
            }
        }
        match refused {
            None => {
                let hooked: Vec<AttachedProgram> = attached
                    .iter()
                    .map(|p| AttachedProgram {
                        program: p.name,
                        hook: p.hook.to_string(),
                    })
                    .collect();
                out.programs.extend(hooked.iter().cloned());
                return Attachment::Hooked(hooked);
            }
            Some(why) => {
                for p in attached {
                    kernel.detach(p);
                }
                reasons.push(why);
            }
        }
    }
    Attachment::Unhooked {
        reason: reasons.join("; "),
    }
}

#[cfg(test)]
mod tests;
