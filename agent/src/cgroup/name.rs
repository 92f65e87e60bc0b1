//! Validated cgroup path components and the names runtimes give container cgroups. Every path
//! qoslet writes under is built from these, so nothing from a manifest reaches the filesystem
//! unchecked.

use std::{fmt, sync::Arc};

use thiserror::Error;

use crate::policy::settings::CgroupDriver;

/// A value that cannot be part of a cgroup path. The values come from manifests and the API
/// (a container id of a megabyte has been seen): messages show them [`shortened`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error("pod UID {} is not a UUID", shortened(.uid))]
    Uid { uid: String },
    #[error("container id {} is not valid for the {runtime:?} runtime", shortened(.id))]
    ContainerId {
        id: String,
        runtime: ContainerRuntime,
    },
    #[error("container name {} is not a DNS label", shortened(.name))]
    ContainerName { name: String },
    #[error(
        "cgroup {}: component {} is not a plain directory name",
        shortened(.path),
        shortened(.component)
    )]
    Component { path: String, component: String },
    #[error("cgroup {} is not inside the node root {root:?}", shortened(.path))]
    OutsideRoot { path: String, root: String },
    #[error("cgroup {} does not name pod UID {}", shortened(.path), shortened(.uid))]
    PodMismatch { path: String, uid: String },
}

/// The most of a value a message shows.
const SHOWN: usize = 100;

/// `value` quoted as `{:?}` does, cut after [`SHOWN`] characters with its length said.
pub(crate) fn shortened(value: &str) -> String {
    match value.char_indices().nth(SHOWN) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &value[..cut], value.len()),
    }
}

/// The container runtime, which decides how container cgroups are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerRuntime {
    /// containerd's CRI plugin: `cri-containerd-<id>.scope` (systemd), `<id>` (cgroupfs).
    Containerd,
    /// CRI-O: `crio-<id>.scope` (systemd), `crio-<id>` (cgroupfs).
    CriO,
    /// qoslet's standalone runtime: `<id>` under both drivers.
    Standalone,
}

/// A cgroup path relative to the node root, as validated components.
///
/// Shared, not copied: the pass, the reconciler's change feed, the sensors and the eviction
/// path each keep the paths of every pod and container, and a clone is a count, not a vector and
/// a string per component.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CgroupPath(Arc<[String]>);

impl CgroupPath {
    /// The node root itself.
    pub fn root() -> Self {
        Self::default()
    }

    /// Parses a cgroup name (`/a/b`); every component must be a plain directory name.
    pub fn parse(path: &str) -> Result<Self, NameError> {
        let mut out = Vec::new();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            if !is_component(c) {
                return Err(NameError::Component {
                    path: path.into(),
                    component: c.into(),
                });
            }
            out.push(c.to_string());
        }
        Ok(Self(out.into()))
    }

    /// Appends a component that was already validated by the caller's rules.
    pub(crate) fn join(&self, component: &str) -> Result<Self, NameError> {
        if !is_component(component) {
            return Err(NameError::Component {
                path: self.to_string(),
                component: component.into(),
            });
        }
        let mut out = self.0.to_vec();
        out.push(component.into());
        Ok(Self(out.into()))
    }

    pub(crate) fn components(&self) -> &[String] {
        &self.0
    }

    pub(crate) fn depth(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn parent(&self) -> Option<Self> {
        (!self.0.is_empty()).then(|| Self(self.0[..self.0.len() - 1].into()))
    }

    pub(crate) fn starts_with(&self, other: &CgroupPath) -> bool {
        self.0.starts_with(&other.0)
    }

    /// `a/b` with no leading slash; empty for the root. Safe to hand to openat2 beneath the root.
    pub(crate) fn relative(&self) -> String {
        self.0.join("/")
    }

    /// Where a plan's cgroup name lives below `node_root`: names already under the node root
    /// (config folds `nodeRootCgroup` into `cgroupRoot`) are kept, other names are the kubelet's
    /// own, relative to the node, and go beneath it.
    pub(crate) fn under_root(name: &str, node_root: &CgroupPath) -> Result<Self, NameError> {
        let full = Self::parse(name)?;
        if !node_root.0.is_empty() && full.starts_with(node_root) {
            return Ok(Self(full.0[node_root.0.len()..].into()));
        }
        Ok(full)
    }
}

impl fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.0.join("/"))
    }
}

/// A directory name that cannot climb, hide or inject: printable ASCII without `/`, not `.` or
/// `..`, at most 255 bytes.
pub(crate) fn is_component(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= 255
        && c != "."
        && c != ".."
        && c.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'\\')
}

/// A Kubernetes pod UID: the 8-4-4-4-12 hexadecimal UUID form.
pub(crate) fn validate_uid(uid: &str) -> Result<(), NameError> {
    let groups: Vec<&str> = uid.split('-').collect();
    let ok = groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(NameError::Uid { uid: uid.into() })
    }
}

/// An RFC 1123 DNS label (container names).
pub(crate) fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Validates a container id in the runtime's form: hexadecimal (CRI runtimes use 64 digits),
/// or for the standalone runtime a DNS label.
pub(crate) fn validate_container_id(id: &str, runtime: ContainerRuntime) -> Result<(), NameError> {
    let hex = !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
    let ok = match runtime {
        ContainerRuntime::Containerd | ContainerRuntime::CriO => hex,
        ContainerRuntime::Standalone => hex || is_dns_label(id),
    };
    if ok {
        Ok(())
    } else {
        Err(NameError::ContainerId {
            id: id.into(),
            runtime,
        })
    }
}

/// The container cgroup's directory name as the runtime creates it.
pub(crate) fn container_component(
    driver: CgroupDriver,
    runtime: ContainerRuntime,
    id: &str,
) -> String {
    match (driver, runtime) {
        (CgroupDriver::Systemd, ContainerRuntime::Containerd) => {
            format!("cri-containerd-{id}.scope")
        }
        (CgroupDriver::Systemd, ContainerRuntime::CriO) => format!("crio-{id}.scope"),
        (CgroupDriver::Cgroupfs, ContainerRuntime::CriO) => format!("crio-{id}"),
        (_, ContainerRuntime::Containerd | ContainerRuntime::Standalone) => id.into(),
    }
}

/// The pod component the driver gives a pod cgroup must end the plan's name: `pod<uid>` for
/// cgroupfs, `...-pod<uid with _>.slice` for systemd.
pub(crate) fn check_pod_component(
    path: &CgroupPath,
    driver: CgroupDriver,
    uid: &str,
) -> Result<(), NameError> {
    let last = path.components().last().map(String::as_str).unwrap_or("");
    let ok = match driver {
        CgroupDriver::Cgroupfs => last == format!("pod{uid}"),
        CgroupDriver::Systemd => last.ends_with(&format!("pod{}.slice", uid.replace('-', "_"))),
    };
    if ok {
        Ok(())
    } else {
        Err(NameError::PodMismatch {
            path: path.to_string(),
            uid: uid.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A megabyte-long container id from the API is refused with a message of about a hundred
    /// characters that still says how long it was; a short one is quoted whole.
    #[test]
    fn a_huge_invalid_value_is_shown_shortened() {
        let id = "z".repeat(1 << 20);
        let e = validate_container_id(&id, ContainerRuntime::Containerd)
            .unwrap_err()
            .to_string();
        assert!(e.len() < 200, "{} bytes", e.len());
        assert!(
            e.contains(&format!("{}\"... ({} bytes)", "z".repeat(SHOWN), 1 << 20)),
            "{e}"
        );
        let e = validate_container_id("nothex", ContainerRuntime::CriO).unwrap_err();
        assert_eq!(
            e.to_string(),
            "container id \"nothex\" is not valid for the CriO runtime"
        );
    }
}
