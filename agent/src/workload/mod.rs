//! Workload / PodGroup / CompositePodGroup: model, validation, gating, gang units. No I/O.
//!
//! [`types`] decodes manifests, [`forest::Forest`] indexes one namespace, [`validate`] checks the
//! rules (their names are listed there) and reports [`problem::Problem`]s, [`update`] the immutable fields, [`gate`] holding and
//! admissibility, [`lifecycle`] cascading deletion and finalisation, [`disruption`] eviction units.
#![forbid(unsafe_code)]

pub mod disruption;
pub mod forest;
pub mod gate;
pub mod lifecycle;
pub mod problem;
pub mod types;
pub mod update;
pub mod validate;

pub use disruption::{GangBreak, Unit, UnitRoot, breaks_gang, disruption_unit};
pub use forest::{Forest, Top};
pub use gate::{Gate, HoldReason, admissible, gate, held, startable};
pub use lifecycle::{Finalisation, cascade_delete, finalise};
pub use problem::{Problem, Rule};
pub use types::{
    DecodeError, Group, Kind, ObjRef, Object, Origin, Pod, Typed, Workload, kind_of, object,
    pod_object,
};
pub use update::{Applied, RejectedUpdate, apply_updates, check_update};
pub use validate::{ValidationOptions, dangling, validate};

#[cfg(test)]
mod tests;
