//! The pod QoS class as a value (`status.qosClass`), apart from its computation in
//! [`super::qos`]: the pod view carries a class the API reported, and the computation reads the
//! pod view, so one file holding both would make the two import each other.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The API spelling (`status.qosClass`).
    pub(crate) fn from_api(s: &str) -> Option<Self> {
        match s {
            "Guaranteed" => Some(Self::Guaranteed),
            "Burstable" => Some(Self::Burstable),
            "BestEffort" => Some(Self::BestEffort),
            _ => None,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}
