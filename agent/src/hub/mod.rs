//! The agent's shared state: what the node publishes as it runs (the metrics it records, a
//! readiness latch per subsystem, the status `qoslet status` shows, the Summary API's data, the
//! node conditions) and what the HTTP endpoints (`server/`) and cluster mode's reporter read.

pub mod metrics;
pub(crate) mod readiness;
pub(crate) mod status;
pub(crate) mod summary;

pub(crate) use readiness::Readiness;
pub(crate) use status::{StatusSnapshot, StatusStore};
pub(crate) use summary::{Summary, SummarySource};

use metrics::Metrics;

/// Everything the endpoints read. Producers update it; requests only read.
pub(crate) struct AgentState {
    pub(crate) metrics: Metrics,
    pub(crate) readiness: Readiness,
    pub(crate) status: StatusStore,
    pub(crate) summary: Box<dyn SummarySource>,
    /// The node conditions whose eviction thresholds are met, published by the node as they
    /// change (cluster mode's reporter turns them into the API's node conditions).
    pub(crate) conditions: tokio::sync::watch::Sender<Vec<crate::eviction::NodeCondition>>,
    /// Guards `/metrics` and `/stats/summary` (and keeps `/status` to loopback); `None`: open.
    pub(crate) auth: Option<std::sync::Arc<crate::server::auth::Guard>>,
}

impl AgentState {
    /// A state as at start: nothing measured, nothing ready, no conditions; `summary` feeds
    /// `/stats/summary`, `auth` guards the endpoints.
    pub(crate) fn new(
        summary: Box<dyn SummarySource>,
        auth: Option<std::sync::Arc<crate::server::auth::Guard>>,
    ) -> Self {
        Self {
            metrics: Metrics::new(),
            readiness: Readiness::default(),
            status: StatusStore::default(),
            summary,
            conditions: Default::default(),
            auth,
        }
    }
}

impl crate::server::Endpoints for AgentState {
    type Summary = Summary;
    type Status = StatusSnapshot;

    fn metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics.encode()
    }

    fn readiness(&self) -> (bool, String) {
        self.readiness.report()
    }

    fn summary(&self) -> Summary {
        self.summary.summary()
    }

    fn status(&self) -> StatusSnapshot {
        self.status.snapshot()
    }

    fn auth(&self) -> Option<&crate::server::auth::Guard> {
        self.auth.as_deref()
    }
}
