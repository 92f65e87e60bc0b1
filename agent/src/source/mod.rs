//! Where pods and workload objects come from: a manifest directory (standalone) or, later, the
//! Kubernetes API. Every object passes [`admit`] before anything else sees it.

pub mod admit;
pub mod build;
pub mod file;
pub mod manifest;
pub mod nesting;
pub mod podset;
pub mod watch;

pub use build::build;
pub use podset::{Diff, ManifestPod, ObjectKey, PodSet, diff, spec_hash};
