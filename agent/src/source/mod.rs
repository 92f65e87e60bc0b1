//! Where pods and workload objects come from: a manifest directory (standalone) or, later, the
//! Kubernetes API. Every object passes [`admit`] before anything else sees it.

pub mod admit;
pub mod file;
pub mod manifest;
pub mod nesting;
pub mod watch;

pub use watch::{Diff, ManifestPod, PodSet, build, diff};
