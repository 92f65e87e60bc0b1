//! The kubelet's node resource model as pure functions. No I/O: no filesystem, no environment,
//! no clock. Every formula cites the upstream kubernetes/kubernetes file it comes from.
//!
//! Entry point: [`plan::plan_node`] over [`settings::NodeSettings`] and [`pod::PodSpecView`]s.
#![forbid(unsafe_code)]

pub(crate) mod allocatable;
pub(crate) mod cgroup_name;
pub mod cpu;
pub mod cpu_pressure;
pub mod cpuset;
pub(crate) mod duration;
pub mod eviction;
pub(crate) mod memory_qos;
pub(crate) mod oom;
pub mod plan;
pub mod pod;
pub mod qos;
pub(crate) mod qos_class;
pub mod quantity;
pub(crate) mod reserved;
pub mod settings;
pub(crate) mod version;
