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

use crate::source::{
    fields::shown,
    file::{DEFAULT_MAX_BYTES, read_bounded},
    yaml::key_lines,
};

pub use kubelet::KubeletConfig;
pub use node_settings::node_settings;
pub use qoslet::*;

pub(crate) const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub(crate) const QOSLET_API_VERSION: &str = "qoslet.dev/v1alpha1";

/// The most problems reported of one configuration document.
pub(crate) const MAX_CONFIG_ERRORS: usize = 20;

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
    #[error("{}{}: {kind}: {}: {message}", file.display(), at(*.line), shown(.field))]
    Invalid {
        file: PathBuf,
        kind: &'static str,
        /// camelCase path of the field, e.g. `systemReserved.memory`; empty for the whole file.
        field: String,
        message: String,
        /// The 1-based line of the field in the file, when known.
        line: Option<u64>,
    },
    /// A field the kind does not have (qoslet's own configuration refuses them, as the file is
    /// qoslet's alone and a misspelt key would otherwise be a default silently taken).
    #[error("{}{}: {kind}: {}: {message}", file.display(), at(*.line), shown(.field))]
    UnknownField {
        file: PathBuf,
        kind: &'static str,
        field: String,
        /// `unknown field`, with "did you mean" where a field is close.
        message: String,
        line: Option<u64>,
    },
    /// More than one of the above, in the order found: every problem of a file is reported at
    /// once. One line each.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<ConfigError>),
}

/// `:LINE` when the line is known.
fn at(line: Option<u64>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

impl ConfigError {
    /// `Ok` when `errors` is empty, else the one error or [`Self::Several`].
    pub(crate) fn all(mut errors: Vec<ConfigError>) -> Result<(), ConfigError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Several(errors)),
        }
    }

    /// The errors one by one ([`Self::Several`] taken apart).
    pub(crate) fn into_list(self) -> Vec<ConfigError> {
        match self {
            ConfigError::Several(v) => v.into_iter().flat_map(Self::into_list).collect(),
            e => vec![e],
        }
    }

    /// Each error of a field with the line of that field in `text` (a one-document file).
    pub(crate) fn with_lines(self, text: &str) -> ConfigError {
        let mut list = self.into_list();
        let wanted: Vec<(usize, &str)> =
            list.iter()
                .filter_map(|e| match e {
                    ConfigError::Invalid { field, .. }
                    | ConfigError::UnknownField { field, .. } => Some((0, field.as_str())),
                    _ => None,
                })
                .collect();
        let found = key_lines(text, &wanted);
        for e in &mut list {
            if let ConfigError::Invalid { field, line, .. }
            | ConfigError::UnknownField { field, line, .. } = e
            {
                *line = found.get(&(0, field.clone())).copied();
            }
        }
        // In the file's order (the decoding finds them in another).
        list.sort_by_key(|e| match e {
            ConfigError::Invalid { line, .. } | ConfigError::UnknownField { line, .. } => {
                line.unwrap_or(u64::MAX)
            }
            _ => u64::MAX,
        });
        if list.len() == 1 {
            list.remove(0)
        } else {
            ConfigError::Several(list)
        }
    }
}

/// `value` decoded as `T` as its text would be: a plain scalar (`kubernetesVersion: 1.36`,
/// `latencyTarget: 0`) is read as a string where `T` wants one, as when the file is read
/// directly, which decoding the loaded value would refuse. The error names its field.
fn decode_as_text<T: serde::de::DeserializeOwned>(
    value: &serde_yaml_ng::Value,
) -> Result<T, serde_path_to_error::Error<serde_yaml_ng::Error>> {
    let text = serde_yaml_ng::to_string(value).unwrap_or_default();
    serde_path_to_error::deserialize(serde_yaml_ng::Deserializer::from_str(&text))
}

/// serde_yaml_ng's message about `field` without what the problem line says already: its
/// ` at line L column C` (a position in the text [`decode_as_text`] wrote, not in the file) and
/// its `path: ` prefix (`field` or the struct holding it).
fn without_location(e: &serde_yaml_ng::Error, field: &str) -> String {
    let mut text = e.to_string();
    if let Some(l) = e.location() {
        let at = format!(" at line {} column {}", l.line(), l.column());
        if let Some(t) = text.strip_suffix(&at) {
            text = t.to_owned();
        }
    }
    match text.split_once(": ") {
        Some((path, rest)) if !path.is_empty() && field.starts_with(path) => rest.to_owned(),
        _ => text,
    }
}

/// Removes the key of the mapping nearest to `path` (the key itself, or the mapping key a
/// failing sequence item is under) from `value`, so that the rest can be decoded again; false
/// when there is none.
fn remove_key(value: &mut serde_yaml_ng::Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some(last_key) = segments
        .iter()
        .rposition(|s| matches!(s, Segment::Map { .. }))
    else {
        return false;
    };
    let mut node = value;
    for seg in &segments[..last_key] {
        let next = match seg {
            Segment::Map { key } => node.get_mut(key.as_str()),
            Segment::Seq { index } => node.get_mut(*index),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return false,
        }
    }
    let Segment::Map { key } = segments[last_key] else {
        return false;
    };
    node.as_mapping_mut()
        .and_then(|m| m.remove(key.as_str()))
        .is_some()
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
