//! Configuration files: the node's own `kubelet.config.k8s.io/v1beta1` KubeletConfiguration
//! (the fields qoslet uses; unknown fields are ignored; [`kubelet`]) and qoslet's
//! `QosletConfiguration` (`qoslet.dev/v1alpha1`, unknown fields rejected; [`qoslet`]).
//! [`node_settings`] turns them into the policy's [`NodeSettings`](crate::policy::settings::NodeSettings),
//! with errors that name the file, the field and the value.

mod kubelet;
mod node_settings;
mod qoslet;

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::source::file::{DEFAULT_MAX_BYTES, read_bounded};

pub use kubelet::{KUBELET_FIELDS, KubeletConfig};
pub use node_settings::node_settings;
pub use qoslet::*;

pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const QOSLET_API_VERSION: &str = "qoslet.dev/v1alpha1";

/// A configuration file could not be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file cannot be read (exit status 2).
    #[error("{file}: cannot read")]
    Unreadable {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file or one of its values is malformed (exit status 1).
    #[error("{file}: {kind}: {field}: {message}")]
    Invalid {
        file: PathBuf,
        kind: &'static str,
        /// camelCase path of the field, e.g. `systemReserved.memory`; empty for the whole file.
        field: String,
        message: String,
    },
}

/// Configuration files are read with the default cap: they are read before the
/// QosletConfiguration that could change it.
fn read(file: &Path) -> Result<String, ConfigError> {
    read_bounded(file, DEFAULT_MAX_BYTES).map_err(|source| ConfigError::Unreadable {
        file: file.into(),
        source,
    })
}

#[cfg(test)]
mod tests;
