//! Kernel sensors: eBPF programs (loading, kernel layouts, ring-buffer intake) and, when eBPF is
//! not available, the reason why, stated once.

pub(crate) mod btf;
pub mod cpu_usage;
pub mod ebpf;
pub mod event;
pub(crate) mod facade;
pub mod kernel_log;
pub mod kmaps;
pub(crate) mod memory_events;
pub(crate) mod owners;
pub mod psi;
pub(crate) mod scores;
pub(crate) mod slots;
pub mod table;
pub(crate) mod tracefs;

pub use cpu_usage::CpuSource;
pub(crate) use cpu_usage::CpuUsage;
pub use ebpf::EbpfSensors;
pub(crate) use ebpf::EventReader;
pub(crate) use event::CgroupOwner;
pub use event::SensorEvent;
pub use facade::SensorMode;
pub use facade::SensorStatus;
pub use facade::Sensors;
pub use facade::SensorsConfig;
pub use facade::WatchedCgroup;
pub use scores::ScoreKey;
pub use table::SensorSwitches;

use thiserror::Error;

/// Why a sensor could not start. Each message is one sentence an operator can act on.
#[derive(Debug, Error)]
pub enum SensorError {
    #[error(transparent)]
    Privilege(#[from] crate::support::privilege::PrivilegeError),
    #[error(
        "the eBPF programs were not built into this binary (built with AYA_BUILD_SKIP); rebuild with `cargo xtask build-ebpf`"
    )]
    NotBuilt,
    #[error("tracefs is not available at {path}")]
    Tracefs {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("loading the eBPF object failed")]
    Load(#[source] aya::EbpfError),
    #[error("program {program} could not be loaded or attached to {hook}")]
    Program {
        program: &'static str,
        hook: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("map {0} is missing from the eBPF object")]
    MissingMap(&'static str),
    #[error("map {name} could not be opened")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(transparent)]
    Essential(table::EssentialMissing),
    #[error("the kernel diagnostics ring buffer could not be opened")]
    KernelLog(#[source] aya_log::Error),
    #[error("registering the ring buffer with the runtime failed")]
    Intake(#[source] std::io::Error),
    #[error("the CPU files of cgroup {cgroup_id} could not be read")]
    CgroupFiles {
        cgroup_id: u64,
        #[source]
        source: std::io::Error,
    },
}
