//! What `qoslet status` shows: a snapshot the agent's loops update and `/status` serves.

use std::sync::RwLock;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct StatusSnapshot {
    pub(crate) node: NodeStatus,
    pub(crate) pods: Vec<PodRow>,
    /// Most recent last.
    pub(crate) events: Vec<EventRow>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeStatus {
    pub(crate) mode: String,
    pub(crate) memory_available_bytes: Option<i64>,
    pub(crate) memory_pressure: bool,
    pub(crate) pid_pressure: bool,
    pub(crate) sensors: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PodRow {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) qos_class: String,
    pub(crate) phase: String,
    pub(crate) cpu_weight: Option<u64>,
    /// Score of each container, `name=score`.
    pub(crate) oom_score_adj: Vec<String>,
    pub(crate) working_set_bytes: Option<u64>,
    pub(crate) memory_request_bytes: Option<i64>,
    pub(crate) memory_limit_bytes: Option<i64>,
    pub(crate) runqueue_p99_seconds: Option<f64>,
    pub(crate) restarts: u32,
    /// The pod status's message: why a held pod waits, why an evicted one ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct EventRow {
    /// RFC 3339 time.
    pub(crate) time: String,
    pub(crate) pod: String,
    pub(crate) message: String,
}

/// Keeps the last `MAX_EVENTS` events.
pub(crate) const MAX_EVENTS: usize = 50;

#[derive(Debug, Default)]
pub(crate) struct StatusStore {
    inner: RwLock<StatusSnapshot>,
}

impl StatusStore {
    pub(crate) fn snapshot(&self) -> StatusSnapshot {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut StatusSnapshot)) {
        let mut guard = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard);
        let extra = guard.events.len().saturating_sub(MAX_EVENTS);
        guard.events.drain(..extra);
    }

    pub(crate) fn push_event(&self, event: EventRow) {
        self.update(|s| s.events.push(event));
    }
}
