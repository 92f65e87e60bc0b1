//! The agent's HTTP endpoints (loopback by default): `/metrics` (OpenMetrics), `/healthz`,
//! `/readyz` (a latch per subsystem, with the active sensors), `/stats/summary` (the kubelet's
//! Summary API shape) and `/status` (what `qoslet status` shows).

pub mod metrics;
pub mod process;
pub mod readiness;
pub mod serve;
pub mod status;
pub mod summary;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use thiserror::Error;

pub use metrics::Metrics;
pub use readiness::Readiness;
pub use serve::ServeLimits;
pub use status::{StatusSnapshot, StatusStore};
pub use summary::{Summary, SummarySource};

/// Everything the endpoints read. Producers update it; requests only read.
pub struct AgentState {
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub status: StatusStore,
    pub summary: Box<dyn SummarySource>,
    /// The node conditions whose eviction thresholds are met, published by the node as they
    /// change (cluster mode's reporter turns them into the API's node conditions).
    pub conditions: tokio::sync::watch::Sender<Vec<crate::eviction::NodeCondition>>,
}

#[derive(Debug, Error)]
#[error("cannot listen on {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

pub fn router(state: Arc<AgentState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/stats/summary", get(summary_handler))
        .route("/status", get(status_handler))
        .with_state(state)
}

/// Binds `addr` (so a taken port is an error at start-up, not later) and serves until the
/// returned future is dropped, within the default [`ServeLimits`].
pub async fn bind(
    addr: SocketAddr,
    state: Arc<AgentState>,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), BindError> {
    bind_with(addr, state, ServeLimits::default()).await
}

/// [`bind`] within `limits`.
pub async fn bind_with(
    addr: SocketAddr,
    state: Arc<AgentState>,
    limits: ServeLimits,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), BindError> {
    let listener = serve::listen(addr).map_err(|source| BindError { addr, source })?;
    serve_on(listener, state, limits)
}

/// Serves on a listener bound already (the address stays bound from one server to the next).
pub fn serve_on(
    listener: tokio::net::TcpListener,
    state: Arc<AgentState>,
    limits: ServeLimits,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), BindError> {
    let local = listener.local_addr().map_err(|source| BindError {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let app = router(state);
    Ok((local, serve::serve(listener, app, limits)))
}

async fn metrics_handler(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    match state.metrics.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

async fn readyz(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    let (ready, body) = state.readiness.report();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

async fn summary_handler(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    Json(state.summary.summary())
}

async fn status_handler(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    Json(state.status.snapshot())
}

#[cfg(test)]
mod tests;
