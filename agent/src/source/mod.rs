//! Where pods and workload objects come from: a manifest directory (standalone) or the
//! Kubernetes API (cluster mode, `cluster/source.rs`). Every object passes [`admit`] before anything else sees it.

pub(crate) mod admit;
pub(crate) mod build;
pub(crate) mod fields;
pub(crate) mod file;
pub mod manifest;
pub(crate) mod nesting;
pub(crate) mod podset;
pub(crate) mod yaml;

#[cfg(test)]
pub(crate) use build::build;
pub(crate) use podset::{Diff, ManifestPod, PodSet};
#[cfg(test)]
pub(crate) use podset::{diff, spec_hash};

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
