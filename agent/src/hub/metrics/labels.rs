//! The label sets of qoslet's metric families: one struct a family's key.

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodInfoLabels {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub qos_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodResourceLabels {
    pub namespace: String,
    pub pod: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CgroupLabels {
    pub cgroup: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemcgEventLabels {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    /// Empty for the pod's own cgroup.
    pub container: String,
    pub event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    pub namespace: String,
    pub pod: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    pub signal: String,
    pub qos_class: String,
}

/// A part of the eviction decision latency: `wake`, `decide`, `kill`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProgramLabels {
    pub program: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RingLabels {
    pub ring: String,
}

/// An eviction signal (`memory.available`, `pid.available`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThresholdLabels {
    pub signal: String,
    /// `hard` or `soft`.
    pub kind: String,
}

/// Labels that name an eviction signal.
pub trait SignalLabel {
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
pub struct QosLabels {
    pub qos_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// `engage` or `release`.
    pub direction: String,
    /// The level stepped to.
    pub level: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiWriteLabels {
    /// The write's kind (`podEvicted`, `evict`, `event`, `nodeCondition`, `nodeTaint`); empty
    /// for drops that are not about one write's answer.
    pub write: String,
    /// `rejected-<HTTP status>`, `expired`, `overflow`.
    pub reason: String,
}

/// What was built: the agent's version (the crate's). The build records no source revision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    /// `MemoryPressure`, `PIDPressure`.
    pub condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SensorLabels {
    pub sensor: String,
    /// `ebpf`, or the fallback in use (`psi`, `memory.events`, `polling`).
    pub source: String,
}
