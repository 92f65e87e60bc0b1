//! The cgroup enforcement engine: writes the policy's plan into real cgroups (v1, v2 and hybrid
//! hosts; cgroupfs and systemd naming) and keeps it there.
//!
//! Pure parts: [`name`] (validation, runtime naming), [`desired`] (plan -> cgroups), [`files`]
//! (settings -> interface files), [`value`] (comparison, directions), [`diff`] (minimal ordered
//! writes). I/O parts: [`layout`] (mount detection), [`fs`] (safe opens), [`reconcile`],
//! [`changes`] (inotify: which cgroups need reading again), [`oom`], [`capacity`].
//!
//! Why not cgroups-rs: it models one cgroup per hierarchy set and writes whole resource structs,
//! so it can neither keep a second, controller-less unified tree beside the v1 controllers
//! (hybrid hosts), nor compare each file before writing (idempotent minimal writes, observe
//! mode), nor order writes across a tree (widen parents first); and its path handling follows
//! symlinks. The files are few and plainly formatted, so qoslet writes them directly, through
//! `openat2` beneath the node root with symlinks refused.

pub(crate) mod beneath;
pub(crate) mod capacity;
pub(crate) mod changes;
pub(crate) mod desired;
pub(crate) mod diff;
pub(crate) mod files;
pub(crate) mod fs;
pub mod layout;
pub(crate) mod name;
pub(crate) mod oom;
pub(crate) mod reconcile;
pub mod report;
pub(crate) mod value;

pub use beneath::CgroupBeneath;
pub(crate) use beneath::{Access, parse_procs};
pub use capacity::node_root_memory_limit;
pub use desired::ContainerIds;
pub(crate) use desired::DesiredState;
pub use desired::Naming;
pub use desired::Runner;
pub use desired::desired_state;
pub use fs::CgroupFs;
pub(crate) use layout::LayoutKind;
pub use layout::Mounts;
pub use layout::Tree;
pub use name::CgroupPath;
pub use name::ContainerRuntime;
pub use oom::CgroupRef;
pub use oom::OomTargets;
pub use oom::apply_oom_score;
pub use oom::scan as scan_oom_scores;
pub(crate) use oom::set_own_oom_score;
pub use reconcile::Reconciler;
pub use report::Mode;
pub use report::ReconcileReport;
#[cfg(test)]
pub(crate) use report::WriteReport;
pub use report::WriteResult;
