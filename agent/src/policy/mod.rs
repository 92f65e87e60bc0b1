//! The kubelet's node resource model as pure functions. No I/O: no filesystem, no environment,
//! no clock. Every formula cites the upstream kubernetes/kubernetes file it comes from.
//!
//! Entry point: [`plan::plan_node`] over [`settings::NodeSettings`] and [`pod::PodSpecView`]s.
#![forbid(unsafe_code)]

pub mod allocatable;
pub mod cgroup_name;
pub mod cpu;
pub mod cpu_pressure;
pub mod cpuset;
pub mod duration;
pub mod eviction;
pub mod memory_qos;
pub mod oom;
pub mod plan;
pub mod pod;
pub mod qos;
pub mod qos_class;
pub mod quantity;
pub mod reserved;
pub mod settings;
pub mod version;
