//! The ABI between qoslet's kernel programs and its agent.
//!
//! Every type here is `#[repr(C)]`, `Copy`, has no implicit padding, and uses integers instead of
//! `bool` or enums, so any byte pattern the kernel writes is a valid value. Userspace validates
//! the `kind` of a record with [`EventKind::try_from`] before it decodes the rest.
#![no_std]

pub mod config;
pub mod event;
pub mod sched;

pub use config::{
    LifecycleTracepointLayout, MemcgEventLayout, OomBtfLayout, OomTracepointLayout, SchedBtfLayout,
};
pub use event::{
    CgroupEvent, EventHeader, EventKind, MemcgEvent, OomScoreAdjEvent, OomVictimEvent,
    ProcessEvent, ReclaimWakeEvent, UnknownEventKind,
};

/// Length of a task's `comm` as the kernel stores it (`TASK_COMM_LEN`).
pub const TASK_COMM_LEN: usize = 16;

/// Size of the ring buffer that carries events to userspace, in bytes (a power of two).
pub const EVENT_RING_BYTES: u32 = 256 * 1024;

/// Bytes of a cgroup path carried by a [`CgroupEvent`] (longer paths are truncated).
pub const CGROUP_PATH_LEN: usize = 128;
