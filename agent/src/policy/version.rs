//! The Kubernetes version whose kubelet `qoslet plan` follows. Every rule that changed between
//! the versions qoslet knows is keyed by it; the rest is the same in all of them.
//!
//! What changes (each rule cites its upstream source where it is applied):
//! - 1.34, 1.35: Memory QoS protects every pod's memory request with `memory.min` (pods and
//!   containers; `kubepods/burstable` the Burstable sum, `kubepods` Guaranteed + Burstable), only
//!   where the sum is above 0; `memoryThrottlingFactor` defaults to 0.9.
//! - 1.36: `memoryReservationPolicy` (`None` by default: no protection; `TieredReservation`:
//!   Guaranteed `memory.min`, Burstable `memory.low`), with explicit zeros where nothing is
//!   protected; `memoryThrottlingFactor` still defaults to 0.9.
//! - 1.37: `memoryThrottlingFactor` has no default (no `memory.high` unless set), the `MemoryQoS`
//!   gate is on by default (beta), pods with pod-level memory get a pod `memory.high`
//!   (`applyPodLevelMemoryHigh`), and BestEffort containers get `memory.high` against allocatable.

use std::{fmt, str::FromStr};

use serde::Serialize;
use thiserror::Error;

/// A Kubernetes minor version of the 1.x line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct KubeVersion {
    minor: u32,
}

impl KubeVersion {
    /// The oldest and newest minor versions whose rules qoslet knows.
    pub(crate) const OLDEST: Self = Self { minor: 34 };
    pub(crate) const NEWEST: Self = Self { minor: 37 };
    /// The API version qoslet speaks, used when nothing says otherwise.
    pub(crate) const DEFAULT: Self = Self::NEWEST;

    #[cfg(test)]
    pub(crate) const fn v1(minor: u32) -> Self {
        Self { minor }
    }

    /// `memoryReservationPolicy` exists (1.36+).
    pub(crate) fn has_memory_reservation_policy(self) -> bool {
        self.minor >= 36
    }

    /// `memoryThrottlingFactor` when the KubeletConfiguration does not set it, in millionths:
    /// 0.9 up to 1.36, none from 1.37.
    pub(crate) fn default_throttling_factor_ppm(self) -> Option<u32> {
        (self.minor < 37).then_some(900_000)
    }

    /// The `MemoryQoS` feature gate's default: alpha (off) up to 1.36, beta (on) from 1.37.
    pub(crate) fn memory_qos_default(self) -> bool {
        self.minor >= 37
    }

    /// Pod-level `memory.high` (`applyPodLevelMemoryHigh`) and BestEffort container
    /// `memory.high` are written (1.37+).
    pub(crate) fn pod_level_memory_high(self) -> bool {
        self.minor >= 37
    }
}

impl Default for KubeVersion {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor)
    }
}

impl Serialize for KubeVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum VersionError {
    #[error("not a Kubernetes version (expected 1.MINOR, e.g. 1.37)")]
    Malformed,
    #[error("Kubernetes {0} is not followed: qoslet knows 1.34 to 1.37")]
    Unsupported(String),
}

impl KubeVersion {
    /// A node's `kubeletVersion` (`v1.36.3`, `v1.36.3+k3s1`), clamped to the versions qoslet
    /// knows: a kubelet older than 1.34 gets 1.34's rules, a newer one than 1.37 gets 1.37's (the
    /// nearest qoslet has; the caller warns). `Ok((version, clamped))`; `Err` when it is no 1.x
    /// version at all.
    pub(crate) fn of_kubelet(s: &str) -> Result<(Self, bool), VersionError> {
        let v = Self {
            minor: minor_of(s)?,
        };
        let clamped = v.clamp(Self::OLDEST, Self::NEWEST);
        Ok((clamped, clamped != v))
    }
}

/// The minor version of `1.MINOR`, `v1.MINOR.PATCH` and the like, in any range.
fn minor_of(s: &str) -> Result<u32, VersionError> {
    let t = s.trim();
    let t = t.strip_prefix('v').unwrap_or(t);
    let mut parts = t.split(['.', '-', '+']);
    let major = parts.next().ok_or(VersionError::Malformed)?;
    let minor: u32 = parts
        .next()
        .and_then(|m| m.parse().ok())
        .ok_or(VersionError::Malformed)?;
    if major != "1" {
        return Err(VersionError::Malformed);
    }
    Ok(minor)
}

/// Accepts `1.36`, `v1.36` and `v1.36.2` (a node's `kubeletVersion`); the patch is ignored.
impl FromStr for KubeVersion {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let v = Self {
            minor: minor_of(s)?,
        };
        if !(Self::OLDEST..=Self::NEWEST).contains(&v) {
            return Err(VersionError::Unsupported(v.to_string()));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions_and_node_versions() {
        assert_eq!("1.36".parse(), Ok(KubeVersion::v1(36)));
        assert_eq!("v1.34.2".parse(), Ok(KubeVersion::v1(34)));
        assert_eq!("v1.37.0-rc.1+k3s1".parse(), Ok(KubeVersion::v1(37)));
        assert_eq!(
            "1.33".parse::<KubeVersion>(),
            Err(VersionError::Unsupported("1.33".into()))
        );
        assert_eq!("2.1".parse::<KubeVersion>(), Err(VersionError::Malformed));
        assert_eq!("1".parse::<KubeVersion>(), Err(VersionError::Malformed));
        assert_eq!(KubeVersion::default().to_string(), "1.37");
    }

    #[test]
    fn a_kubelets_version_is_clamped_to_the_known_ones() {
        let of = KubeVersion::of_kubelet;
        assert_eq!(of("v1.36.3"), Ok((KubeVersion::v1(36), false)));
        assert_eq!(of("v1.37.2-eks-1234"), Ok((KubeVersion::v1(37), false)));
        assert_eq!(of("v1.33.9+k3s1"), Ok((KubeVersion::v1(34), true)));
        assert_eq!(of("v1.40.0"), Ok((KubeVersion::v1(37), true)));
        assert_eq!(of("v2.0.0"), Err(VersionError::Malformed));
        assert_eq!(of(""), Err(VersionError::Malformed));
    }

    #[test]
    fn version_dependent_defaults() {
        let (v35, v36, v37) = (
            KubeVersion::v1(35),
            KubeVersion::v1(36),
            KubeVersion::v1(37),
        );
        assert!(!v35.has_memory_reservation_policy() && v36.has_memory_reservation_policy());
        assert_eq!(v36.default_throttling_factor_ppm(), Some(900_000));
        assert_eq!(v37.default_throttling_factor_ppm(), None);
        assert!(!v36.memory_qos_default() && v37.memory_qos_default());
        assert!(!v36.pod_level_memory_high() && v37.pod_level_memory_high());
    }
}
