//! The agent's HTTP endpoints (loopback by default): `/metrics` (OpenMetrics), `/healthz`,
//! `/readyz` (a latch per subsystem, with the active sensors), `/stats/summary` (the kubelet's
//! Summary API shape) and `/status` (what `qoslet status` shows). Serving only: the routes, the
//! listener and its connection limits, and the endpoints' guard. What they serve is an
//! [`Endpoints`], which the hub's `AgentState` is; the server knows nothing of what fills it.
//!
//! With [`Endpoints::auth`] a guard (cluster mode's default), `/metrics` and `/stats/summary`
//! need a bearer token the API server authenticates and authorizes ([`auth`], through a
//! [`auth::Reviewer`] cluster mode supplies), as does `/status` from any address but loopback;
//! `/healthz` and `/readyz` are open.

pub(crate) mod auth;
pub(crate) mod serve;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Extension, Json, Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use thiserror::Error;

pub(crate) use serve::{Peer, ServeLimits};

/// What the endpoints serve. Producers update it; requests only read.
pub(crate) trait Endpoints: Send + Sync + 'static {
    /// The `/stats/summary` body.
    type Summary: serde::Serialize;
    /// The `/status` body.
    type Status: serde::Serialize;
    /// The `/metrics` body, OpenMetrics text.
    fn metrics(&self) -> Result<String, std::fmt::Error>;
    /// Whether `/readyz` is ready, and its body.
    fn readiness(&self) -> (bool, String);
    fn summary(&self) -> Self::Summary;
    fn status(&self) -> Self::Status;
    /// Guards `/metrics` and `/stats/summary` (and keeps `/status` to loopback); `None`: open.
    fn auth(&self) -> Option<&auth::Guard>;
}

/// `None` when the request may have `access`; else the refusal to answer with.
async fn refused<S: Endpoints>(
    state: &S,
    headers: &HeaderMap,
    access: auth::Access,
) -> Option<Response> {
    let guard = state.auth()?;
    guard
        .check(headers, access)
        .await
        .err()
        .map(IntoResponse::into_response)
}

#[derive(Debug, Error)]
#[error("cannot listen on {addr}")]
pub struct BindError {
    pub(crate) addr: SocketAddr,
    #[source]
    pub(crate) source: std::io::Error,
}

pub(crate) fn router<S: Endpoints>(state: Arc<S>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz::<S>))
        .route("/stats/summary", get(summary_handler::<S>))
        .route("/status", get(status_handler::<S>))
        .with_state(state)
}

/// Binds `addr` (so a taken port is an error at start-up, not later) and serves until the
/// returned future is dropped, within the default [`ServeLimits`]. The tests' way in: the node
/// and cluster mode bind through [`serve::listen`] and [`serve_on`].
#[cfg(test)]
pub(crate) async fn bind<S: Endpoints>(
    addr: SocketAddr,
    state: Arc<S>,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), BindError> {
    bind_with(addr, state, ServeLimits::default()).await
}

/// [`bind`] within `limits`.
#[cfg(test)]
pub(crate) async fn bind_with<S: Endpoints>(
    addr: SocketAddr,
    state: Arc<S>,
    limits: ServeLimits,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), BindError> {
    let listener = serve::listen(addr).map_err(|source| BindError { addr, source })?;
    serve_on(listener, state, limits)
}

/// Serves on a listener bound already (the address stays bound from one server to the next).
pub(crate) fn serve_on<S: Endpoints>(
    listener: tokio::net::TcpListener,
    state: Arc<S>,
    limits: ServeLimits,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), BindError> {
    let local = listener.local_addr().map_err(|source| BindError {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let app = router(state);
    Ok((local, serve::serve(listener, app, limits)))
}

async fn metrics_handler<S: Endpoints>(
    State(state): State<Arc<S>>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = refused(&*state, &headers, auth::Access::Metrics).await {
        return refused;
    }
    match state.metrics() {
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

async fn readyz<S: Endpoints>(State(state): State<Arc<S>>) -> impl IntoResponse {
    let (ready, body) = state.readiness();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

async fn summary_handler<S: Endpoints>(
    State(state): State<Arc<S>>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = refused(&*state, &headers, auth::Access::Stats).await {
        return refused;
    }
    Json(state.summary()).into_response()
}

/// `qoslet status` asks from the node itself, without a token: with the endpoints guarded,
/// `/status` (the pods, their cgroups and qoslet's decisions) answers loopback peers as it is,
/// and any other address as `/metrics` is answered, for the non-resource URL `/status`.
async fn status_handler<S: Endpoints>(
    State(state): State<Arc<S>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
) -> Response {
    let loopback = peer.is_some_and(|Extension(Peer(ip))| ip.is_loopback());
    if !loopback && let Some(refused) = refused(&*state, &headers, auth::Access::Status).await {
        return refused;
    }
    Json(state.status()).into_response()
}

#[cfg(test)]
pub(crate) mod tests;
