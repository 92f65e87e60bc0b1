//! The eviction manager (issue 8): node-pressure signals read fresh from the node root cgroup,
//! kubelet thresholds and node conditions, the kubelet's ranking with a gang-aware layer, and
//! actions, woken by kernel events with a housekeeping interval as the floor.
//!
//! [`signals`] and [`node`] read cgroup files, each opened beneath the node root ([`dir`]); [`thresholds`], [`conditions`] and [`select`]
//! are pure; [`action`] signals processes; [`watch`] produces wake-ups; [`manager`] decides and
//! reports, and [`pipeline`] runs one eviction in the order both modes share (mark, the mode's
//! step, hold and record), keeping it in the state file (`crate::persist`).

pub(crate) mod action;
pub(crate) mod conditions;
pub(crate) mod dir;
pub(crate) mod held;
pub(crate) mod inventory;
pub(crate) mod manager;
pub(crate) mod node;
pub(crate) mod pipeline;
pub(crate) mod select;
pub(crate) mod signals;
pub(crate) mod stats;
pub(crate) mod thresholds;
pub(crate) mod usage;
pub mod watch;

pub use action::CgroupKill;
pub use action::EvictionAction;
pub use action::EvictionRequest;
pub use action::PodCgroups;
pub(crate) use action::{EvictedStatus, Outcome, SeenPod};
pub(crate) use conditions::{Admission, NodeCondition, admit};
pub use inventory::Inventory;
pub(crate) use inventory::ManagedContainer;
pub use inventory::ManagedPod;
pub use manager::Manager;
pub use manager::ManagerConfig;
pub use node::NodeSignals;
pub(crate) use pipeline::{HoldEvicted, Pipeline};
pub use select::Order;
pub use signals::MemoryCgroup;
pub use stats::EvictionStats;
pub(crate) use stats::{Decision, Stages};
pub(crate) use usage::UsageCache;
pub(crate) use watch::Wake;
pub use watch::WakeSource;
pub use watch::WatchConfig;
pub use watch::spawn_watcher;
