//! The eviction manager (issue 8): node-pressure signals read fresh from the node root cgroup,
//! kubelet thresholds and node conditions, the kubelet's ranking with a gang-aware layer, and
//! actions, woken by kernel events with a housekeeping interval as the floor.
//!
//! [`signals`] and [`node`] read cgroup files, each opened beneath the node root ([`dir`]); [`thresholds`], [`conditions`] and [`select`]
//! are pure; [`action`] signals processes; [`watch`] produces wake-ups; [`manager`] decides and
//! reports, and [`pipeline`] runs one eviction in the order both modes share (mark, the mode's
//! step, hold and record), keeping it in the state file (`crate::persist`).

pub mod action;
pub mod conditions;
pub mod dir;
pub mod held;
pub mod manager;
pub mod node;
pub mod pipeline;
pub mod select;
pub mod signals;
pub mod stats;
pub mod thresholds;
pub mod usage;
pub mod watch;

pub use action::{
    CgroupKill, EvictedStatus, EvictionAction, EvictionRequest, Outcome, PodCgroups, SeenPod,
};
pub use conditions::{Admission, NodeCondition, admit};
pub use manager::{Inventory, ManagedContainer, ManagedPod, Manager, ManagerConfig, ManagerError};
pub use node::NodeSignals;
pub use pipeline::{HoldEvicted, Pipeline};
pub use select::Order;
pub use signals::MemoryCgroup;
pub use stats::{Decision, EvictionStats, Histogram, Stages};
pub use usage::UsageCache;
pub use watch::{Wake, WakeSource, WatchConfig, spawn_watcher};
