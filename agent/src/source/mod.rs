//! Where pods and workload objects come from: a manifest directory (standalone) or, later, the
//! Kubernetes API.

pub mod manifest;
pub mod watch;

pub use watch::{Diff, ManifestPod, PodSet};
