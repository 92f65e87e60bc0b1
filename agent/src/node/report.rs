//! What the node tells operators: problem lines reported once, status events, and the plan in
//! the metrics. Owns the shared [`AgentState`] that the HTTP server reads.

use std::{collections::BTreeSet, sync::Arc};

use tracing::warn;

use crate::{
    hub::{AgentState, status::EventRow},
    policy::{
        plan::Plan,
        pod::{PodKey, PodSpecView},
    },
};

pub(super) struct Report {
    pub(super) state: Arc<AgentState>,
    /// Problem lines already reported, so each is reported once.
    reported: BTreeSet<String>,
}

impl Report {
    pub(super) fn new(state: Arc<AgentState>) -> Self {
        Self {
            state,
            reported: BTreeSet::new(),
        }
    }

    /// Reports each problem line once: a log line and a status event.
    pub(super) fn problems(&mut self, lines: &[String]) {
        for l in lines {
            if self.reported.insert(l.clone()) {
                warn!(problem = %l, "Manifest skipped.");
                self.event("", format!("skipped: {l}"));
            }
        }
    }

    /// Problems the source has already logged: status events only.
    pub(super) fn noted(&mut self, lines: &[String]) {
        for l in lines {
            if self.reported.insert(l.clone()) {
                self.event("", format!("skipped: {l}"));
            }
        }
    }

    pub(super) fn event(&self, pod: &str, message: String) {
        self.state.status.push_event(EventRow {
            time: now_local(),
            pod: pod.into(),
            message,
        });
    }

    /// The plan's and the pods' requests in the metrics.
    pub(super) fn record_plan<'a>(
        &self,
        plan: &Plan,
        pods: impl Iterator<Item = (&'a PodKey, &'a PodSpecView)>,
    ) {
        self.state.metrics.set_plan(plan);
        self.state.metrics.set_pod_requests(pods.map(|(k, v)| {
            let r = v.requests();
            (
                k.namespace.as_str(),
                k.name.as_str(),
                r.cpu_millis(),
                r.memory_bytes(),
            )
        }));
    }
}

/// The local time, to the millisecond, as an operator reads it in `qoslet status`
/// (`2026-11-30 10:21:05.123 +00:00`).
pub(super) fn now_local() -> String {
    let now = jiff::Zoned::now();
    now.strftime("%Y-%m-%d %H:%M:%S%.3f %:z").to_string()
}
