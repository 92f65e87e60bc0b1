//! Who may read `/metrics` and `/stats/summary` (QosletConfiguration `endpointAuth:
//! tokenReview`, cluster mode's default): the request's bearer token is authenticated by the API
//! server (a TokenReview) and the request authorized for that user (a SubjectAccessReview), as
//! kube-rbac-proxy does in front of node-exporter and as the kubelet guards its own port.
//! `/healthz` and `/readyz` stay open: the kubelet's probes carry no token. `/status` is open to
//! loopback (`qoslet status` on the node) and guarded for any other address.
//!
//! - No token, or one the API server does not authenticate: 401. Authenticated but not allowed:
//!   403. The API server unreachable or refusing the review (qoslet's RBAC lacks it): 503, and
//!   nothing is served (fail closed), with a log line a minute at most.
//! - Answers are kept for a short time in caches of bounded size, with the kubelet's webhook
//!   defaults (KubeletConfiguration `authentication.webhook.cacheTTL` 2m,
//!   `authorization.webhook.cacheAuthorizedTTL` 5m and `cacheUnauthorizedTTL` 30s; the
//!   delegating authenticator and authorizer kube-rbac-proxy uses have the same): a scrape every
//!   15 s sends one TokenReview and one SubjectAccessReview every few minutes, not two requests
//!   a scrape. Tokens are kept as their SHA-256 only; a flood of distinct bad tokens replaces
//!   the oldest entries and cannot grow memory, and at most [`REVIEWS_IN_FLIGHT`] reviews are
//!   under way at once (the others wait), so it cannot flood the API server either.
//! - Errors are not kept: the next request asks again.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::Duration,
};

use axum::{
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::future::BoxFuture;
use serde::Serialize;
use tokio::{sync::Semaphore, time::Instant};

/// What a request asks to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub(crate) enum Access {
    /// `/metrics`: the non-resource URL `/metrics`, verb `get` (kube-rbac-proxy's attributes for
    /// node-exporter's `/metrics`).
    Metrics,
    /// `/stats/summary`: `get` on the `stats` subresource of this node's Node, as the kubelet
    /// authorizes its own `/stats/` paths.
    Stats,
    /// `/status` from another address than loopback (`qoslet status` on the node asks from
    /// loopback, without a token): the non-resource URL `/status`, verb `get`.
    Status,
}

impl Access {
    /// The non-resource URL a SubjectAccessReview names for this access, if it is one.
    pub(crate) fn non_resource_path(self) -> Option<&'static str> {
        match self {
            Self::Metrics => Some("/metrics"),
            Self::Status => Some("/status"),
            Self::Stats => None,
        }
    }
}

/// The user a TokenReview found (authentication.k8s.io/v1 `UserInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct User {
    pub(crate) username: String,
    pub(crate) uid: String,
    pub(crate) groups: Vec<String>,
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

/// The API server did not answer a review (unreachable, timed out, refused it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ReviewError(pub String);

/// Asks the API server (cluster mode's [`crate::cluster::review::ApiReviewer`]; tests' fakes).
pub(crate) trait Reviewer: Send + Sync + 'static {
    /// A TokenReview of `token`: its user, or `None` when it is not authenticated.
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<User>, ReviewError>>;

    /// A SubjectAccessReview of `access` for `user`: whether it is allowed.
    fn authorize<'a>(
        &'a self,
        user: &'a User,
        access: Access,
    ) -> BoxFuture<'a, Result<bool, ReviewError>>;
}

/// The longest token read from the `Authorization` header; a longer one is not authenticated.
/// A service account token is about a kilobyte, an OIDC ID token a few.
pub(crate) const MAX_TOKEN_BYTES: usize = 16 << 10;

/// How long a TokenReview's answer, authenticated or not, is kept.
pub(crate) const TOKEN_TTL: Duration = Duration::from_secs(120);
/// How long an allowing SubjectAccessReview is kept.
pub(crate) const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denying SubjectAccessReview is kept.
pub(crate) const DENIED_TTL: Duration = Duration::from_secs(30);
/// Entries each cache keeps; past that the one closest to expiry goes. A node's scrapers are a
/// handful of service accounts.
pub(crate) const CACHE_ENTRIES: usize = 1024;
/// Reviews under way at once.
pub(crate) const REVIEWS_IN_FLIGHT: usize = 4;

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denial {
    /// 401: no bearer token, or one the API server does not authenticate.
    Unauthenticated,
    /// 403: the user may not read this.
    Forbidden,
    /// 503: the API server could not be asked.
    Unavailable,
}

impl IntoResponse for Denial {
    fn into_response(self) -> Response {
        match self {
            Self::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))],
                "Unauthorized: a bearer token the API server authenticates is needed\n",
            )
                .into_response(),
            Self::Forbidden => (
                StatusCode::FORBIDDEN,
                "Forbidden: the API server does not allow this user to read this\n",
            )
                .into_response(),
            Self::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, HeaderValue::from_static("5"))],
                "Service Unavailable: the API server could not review the request\n",
            )
                .into_response(),
        }
    }
}

type Key = [u8; 32];

fn sha256(bytes: &[u8]) -> Key {
    let mut key = [0; 32];
    key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    key
}

/// Answers by key until they expire, at most `max` of them.
struct TtlCache<V> {
    entries: HashMap<Key, (Instant, V)>,
    max: usize,
}

impl<V: Clone> TtlCache<V> {
    fn new(max: usize) -> Self {
        Self {
            entries: HashMap::new(),
            max: max.max(1),
        }
    }

    fn get(&mut self, key: &Key) -> Option<V> {
        let now = Instant::now();
        match self.entries.get(key) {
            Some((expires, v)) if *expires > now => Some(v.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&mut self, key: Key, value: V, ttl: Duration) {
        let now = Instant::now();
        if self.entries.len() >= self.max && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (expires, _)| *expires > now);
            if self.entries.len() >= self.max
                && let Some(first) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&first);
            }
        }
        self.entries.insert(key, (now + ttl, value));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The bearer token of `headers`' `Authorization`, when there is one of a sane size.
pub(crate) fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.len() <= MAX_TOKEN_BYTES)
        .then_some(token)
}

/// Authenticates and authorizes requests through a [`Reviewer`], with caches.
pub(crate) struct Guard {
    reviewer: Box<dyn Reviewer>,
    tokens: Mutex<TtlCache<Option<User>>>,
    decisions: Mutex<TtlCache<bool>>,
    in_flight: Semaphore,
    error_logged: Mutex<Option<Instant>>,
}

impl Guard {
    pub(crate) fn new(reviewer: impl Reviewer) -> Self {
        Self {
            reviewer: Box::new(reviewer),
            tokens: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            decisions: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            in_flight: Semaphore::new(REVIEWS_IN_FLIGHT),
            error_logged: Mutex::new(None),
        }
    }

    /// Whether the request with `headers` may have `access`.
    pub(crate) async fn check(&self, headers: &HeaderMap, access: Access) -> Result<(), Denial> {
        let token = bearer_token(headers).ok_or(Denial::Unauthenticated)?;
        let user = self
            .user(token)
            .await
            .map_err(|e| self.unavailable(access, &e))?
            .ok_or(Denial::Unauthenticated)?;
        if self
            .allowed(&user, access)
            .await
            .map_err(|e| self.unavailable(access, &e))?
        {
            Ok(())
        } else {
            Err(Denial::Forbidden)
        }
    }

    async fn user(&self, token: &str) -> Result<Option<User>, ReviewError> {
        let key = sha256(token.as_bytes());
        if let Some(user) = crate::support::lock(&self.tokens).get(&key) {
            return Ok(user);
        }
        let _permit = self.in_flight.acquire().await;
        let user = self.reviewer.authenticate(token).await?;
        crate::support::lock(&self.tokens).insert(key, user.clone(), TOKEN_TTL);
        Ok(user)
    }

    async fn allowed(&self, user: &User, access: Access) -> Result<bool, ReviewError> {
        let key = sha256(&serde_json::to_vec(&(user, access)).unwrap_or_default());
        if let Some(allowed) = crate::support::lock(&self.decisions).get(&key) {
            return Ok(allowed);
        }
        let _permit = self.in_flight.acquire().await;
        let allowed = self.reviewer.authorize(user, access).await?;
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        crate::support::lock(&self.decisions).insert(key, allowed, ttl);
        Ok(allowed)
    }

    fn unavailable(&self, access: Access, e: &ReviewError) -> Denial {
        let mut logged = crate::support::lock(&self.error_logged);
        if logged.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
            tracing::warn!(error = %e, ?access, "The API server could not review a request to qoslet's endpoints; answering 503 (a line a minute at most).");
            *logged = Some(Instant::now());
        }
        Denial::Unavailable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_token_is_read_within_bounds() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            bearer_token(&h).map(str::to_owned)
        };
        assert_eq!(bearer_token(&HeaderMap::new()), None);
        assert_eq!(with("Bearer abc").as_deref(), Some("abc"));
        assert_eq!(with("bearer  abc ").as_deref(), Some("abc"));
        assert_eq!(with("Basic YWJj"), None);
        assert_eq!(with("Bearer "), None);
        assert_eq!(
            with(&format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1))),
            None
        );
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_what_expired() {
        let mut c = TtlCache::new(3);
        for i in 0..10u8 {
            c.insert(sha256(&[i]), i, Duration::from_secs(60 + u64::from(i)));
            assert!(c.len() <= 3);
        }
        // The newest stay; the ones closest to expiry went.
        assert_eq!(c.get(&sha256(&[9])), Some(9));
        assert_eq!(c.get(&sha256(&[0])), None);
        c.insert(sha256(b"gone"), 1, Duration::ZERO);
        assert_eq!(c.get(&sha256(b"gone")), None);
    }
}
