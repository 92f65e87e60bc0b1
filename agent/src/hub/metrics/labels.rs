//! The label sets of qoslet's metric families: one struct a family's key.

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResourceLabels {
    pub(crate) resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PodInfoLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) uid: String,
    pub(crate) qos_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PodResourceLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CgroupLabels {
    pub(crate) cgroup: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ContainerLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) container: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MemcgEventLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) uid: String,
    /// Empty for the pod's own cgroup.
    pub(crate) container: String,
    pub(crate) event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PodLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
}

/// An evicted pod (`evicted.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PodEvictionLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) signal: String,
    pub(crate) qos_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EvictionLabels {
    pub(crate) signal: String,
    pub(crate) qos_class: String,
}

/// A part of the eviction decision latency: `wake`, `decide`, `kill`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StageLabels {
    pub(crate) stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProgramLabels {
    pub(crate) program: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RingLabels {
    pub(crate) ring: String,
}

/// An eviction signal (`memory.available`, `pid.available`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SignalLabels {
    pub(crate) signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ThresholdLabels {
    pub(crate) signal: String,
    /// `hard` or `soft`.
    pub(crate) kind: String,
}

/// Labels that name an eviction signal.
pub(crate) trait SignalLabel {
    fn signal(&self) -> &str;
}

impl SignalLabel for SignalLabels {
    fn signal(&self) -> &str {
        &self.signal
    }
}

impl SignalLabel for ThresholdLabels {
    fn signal(&self) -> &str {
        &self.signal
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QosLabels {
    pub(crate) qos_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StepLabels {
    /// `engage` or `release`.
    pub(crate) direction: String,
    /// The level stepped to.
    pub(crate) level: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ApiWriteLabels {
    /// The write's kind (`podEvicted`, `evict`, `event`, `nodeCondition`, `nodeTaint`); empty
    /// for drops that are not about one write's answer.
    pub(crate) write: String,
    /// `rejected-<HTTP status>`, `expired`, `overflow`.
    pub(crate) reason: String,
}

/// What was built: the agent's version (the crate's). The build records no source revision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BuildLabels {
    pub(crate) version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ConditionLabels {
    /// `MemoryPressure`, `PIDPressure`.
    pub(crate) condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SensorLabels {
    pub(crate) sensor: String,
    /// `ebpf`, or the fallback in use (`psi`, `memory.events`, `polling`).
    pub(crate) source: String,
}
