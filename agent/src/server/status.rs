//! What `qoslet status` shows: a snapshot the agent's loops update and `/status` serves.

use std::sync::RwLock;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusSnapshot {
    pub node: NodeStatus,
    pub pods: Vec<PodRow>,
    /// Most recent last.
    pub events: Vec<EventRow>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub mode: String,
    pub memory_available_bytes: Option<i64>,
    pub memory_pressure: bool,
    pub pid_pressure: bool,
    pub sensors: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodRow {
    pub namespace: String,
    pub name: String,
    pub qos_class: String,
    pub phase: String,
    pub cpu_weight: Option<u64>,
    /// Score of each container, `name=score`.
    pub oom_score_adj: Vec<String>,
    pub working_set_bytes: Option<u64>,
    pub memory_request_bytes: Option<i64>,
    pub memory_limit_bytes: Option<i64>,
    pub runqueue_p99_seconds: Option<f64>,
    pub restarts: u32,
    /// The pod status's message: why a held pod waits, why an evicted one ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventRow {
    /// RFC 3339 time.
    pub time: String,
    pub pod: String,
    pub message: String,
}

/// Keeps the last `MAX_EVENTS` events.
pub const MAX_EVENTS: usize = 50;

#[derive(Debug, Default)]
pub struct StatusStore {
    inner: RwLock<StatusSnapshot>,
}

impl StatusStore {
    pub fn snapshot(&self) -> StatusSnapshot {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn update(&self, f: impl FnOnce(&mut StatusSnapshot)) {
        let mut guard = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard);
        let extra = guard.events.len().saturating_sub(MAX_EVENTS);
        guard.events.drain(..extra);
    }

    pub fn push_event(&self, event: EventRow) {
        self.update(|s| s.events.push(event));
    }
}
