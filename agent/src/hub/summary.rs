//! The kubelet's Summary API (`/stats/summary`, stats/v1alpha1) shape, which operators use to size
//! system-reserved. Field names follow k8s.io/kubelet/pkg/apis/stats/v1alpha1; absent values
//! are left out, as the kubelet's `omitempty` pointers are.

use serde::{Deserialize, Serialize};

/// Produces a fresh summary on each request (reads cgroup files at request time).
pub(crate) trait SummarySource: Send + Sync {
    fn summary(&self) -> Summary;
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Summary {
    pub(crate) node: NodeStats,
    pub(crate) pods: Vec<PodStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeStats {
    pub(crate) node_name: String,
    #[serde(default)]
    pub(crate) system_containers: Vec<ContainerStats>,
    pub(crate) start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodStats {
    pub(crate) pod_ref: PodReference,
    pub(crate) start_time: String,
    #[serde(default)]
    pub(crate) containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PodReference {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) uid: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContainerStats {
    pub(crate) name: String,
    pub(crate) start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CpuStats {
    pub(crate) time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemoryStats {
    pub(crate) time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) major_page_faults: Option<u64>,
}
