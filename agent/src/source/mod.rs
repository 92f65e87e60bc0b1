//! Where pods and workload objects come from: a manifest directory (standalone) or the
//! Kubernetes API (cluster mode, `cluster/source.rs`). Every object passes [`admit`] before anything else sees it.

pub mod admit;
pub mod build;
pub mod file;
pub mod manifest;
pub mod nesting;
pub mod podset;
pub mod watch;

pub use build::build;
pub use podset::{Diff, ManifestPod, ObjectKey, PodSet, diff, spec_hash};
