//! Workload / PodGroup / CompositePodGroup: model, validation, gating, gang units. No I/O.
//!
//! [`types`] decodes manifests, [`forest::Forest`] indexes one namespace, [`validate`] checks the
//! rules (their names are listed there) and reports [`problem::Problem`]s, [`update`] the immutable fields, [`gate`] holding and
//! admissibility, `lifecycle` (a model the unit tests check) cascading deletion and finalisation, [`disruption`] eviction units.
#![forbid(unsafe_code)]

pub(crate) mod disruption;
pub(crate) mod forest;
pub(crate) mod gate;
#[cfg(test)]
mod lifecycle;
pub(crate) mod problem;
pub(crate) mod types;
pub(crate) mod update;
pub mod validate;

pub(crate) use disruption::{GangBreak, UnitRoot, breaks_gang, disruption_unit};
pub use forest::Forest;
#[cfg(test)]
pub(crate) use gate::{Gate, HoldReason, admissible, gate};
pub(crate) use gate::{held, startable};
#[cfg(test)]
pub(crate) use lifecycle::{cascade_delete, finalise};
pub(crate) use problem::Problem;
#[cfg(test)]
pub(crate) use problem::Rule;
pub(crate) use types::{
    DecodeError, Decoder, Kind, Object, Origin, Typed, kind_of, object, pod_object,
};
#[cfg(test)]
pub(crate) use types::{Group, ObjRef, Pod, Workload};
pub(crate) use update::apply_updates;
pub use validate::ValidationOptions;
pub(crate) use validate::{dangling, validate};

#[cfg(test)]
mod tests;
