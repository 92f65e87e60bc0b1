//! Where pods and workload objects come from: a manifest directory (standalone) or the
//! Kubernetes API (cluster mode, `cluster/source.rs`). Every object passes [`admit`] before anything else sees it.

pub mod admit;
pub mod build;
pub mod fields;
pub mod file;
pub mod manifest;
pub mod nesting;
pub mod podset;
pub mod yaml;

pub use build::build;
pub use podset::{Diff, ManifestPod, ObjectKey, PodSet, diff, spec_hash};

/// A PodSet from YAML documents, through the manifest source's own decoding and validation.
#[cfg(test)]
pub(crate) fn pod_set(yaml: &str, previous: &PodSet) -> PodSet {
    let mut loaded = manifest::Loaded::default();
    manifest::parse_documents(std::path::Path::new("test.yaml"), yaml, &mut loaded);
    build(
        loaded,
        previous,
        &crate::workload::ValidationOptions::default(),
        std::collections::BTreeSet::new(),
        None,
    )
    .0
}
