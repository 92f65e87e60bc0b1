//! What one node may ask of the API server, whatever the server does: the bounds a thousand
//! nodes need so that a server coming back from an outage is not flooded by them.
//!
//! - [`WatchBackoff`]: client-go's reflector backoff (`pkg/util/wait` `NewExponentialBackoffManager`
//!   with 800 ms, 30 s, factor 2, jitter, reset after 2 minutes without a retry). kube-runtime's
//!   `default_backoff()` has the same numbers but is reset by every item its stream yields,
//!   `Event::Init` included, which the watcher yields before each relist: a server that fails
//!   every list was asked again every 0.8 to 1.6 s, for good.
//! - [`RequestBounds`], a layer of the client's service stack:
//!   - reads of one resource (list, get, watch: a `GET` of one path) go out at most once every
//!     [`READ_SPACING`]. A watch the server ends at once without an error (kube-runtime then
//!     watches again at once, with no backoff and no log line) or a relist after every `410
//!     Gone` is held to two requests a second, and each path keeps its own pace, so one
//!     resource's storm delays no other's reads. Writes are not spaced: an eviction's status and
//!     annotation go out back to back.
//!   - every request but a watch must answer within [`REQUEST_TIMEOUT`]: a list that never
//!     answers (a half-open connection, a hung server) fails and is retried under the backoff,
//!     instead of leaving the node unsynced for good. A watch has its own idle timeout in
//!     kube-runtime (its `timeoutSeconds` plus 5 s); kube's `read_timeout` would cut it.
//!
//! Written here because kube has neither: its `StreamBackoff` resets on every item, and its
//! client has no per-resource spacing and only a read timeout for every request alike.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use http::{Method, Request};
use kube::runtime::{utils::Backoff, watcher::DefaultBackoff};
use tokio::time::Instant;
use tower::{Layer, Service};

/// The shortest time between two reads of one resource path: two a second.
pub const READ_SPACING: Duration = Duration::from_millis(500);

/// How long any request but a watch may take to answer (a list of a node's pods from the watch
/// cache takes milliseconds; one of every Workload in a namespace, less than a second).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// At most this many paths are remembered; a node reads a few dozen (its pods, its Node, the
/// workload objects they reference, its writes' targets), and an old entry only delays nothing.
const PATHS_KEPT: usize = 4096;

/// client-go's reflector backoff: kube-runtime's [`DefaultBackoff`] (800 ms doubling to 30 s,
/// with jitter, back to 800 ms once 2 minutes pass without a retry), never reset by the items of
/// the stream it guards.
#[derive(Default)]
pub struct WatchBackoff(DefaultBackoff);

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.0.next()
    }
}

impl Backoff for WatchBackoff {
    /// `StreamBackoff` calls this on every item, the `Init` before each relist included. The
    /// backoff goes back to its start only after 2 minutes without a retry (in `next`).
    fn reset(&mut self) {}
}

/// When each resource path last answered a read with a success. A watch that failed and is
/// re-established yields nothing until an object changes, so its success shows only here
/// (`/readyz` clears a failing watch by it).
#[derive(Clone, Default)]
pub struct Answered(Arc<Mutex<HashMap<String, Instant>>>);

impl Answered {
    /// Whether a read of `path` succeeded after `at`.
    pub fn since(&self, path: &str, at: Instant) -> bool {
        crate::lock(&self.0).get(path).is_some_and(|t| *t > at)
    }

    fn record(&self, path: String) {
        let mut paths = crate::lock(&self.0);
        if paths.len() >= PATHS_KEPT && !paths.contains_key(&path) {
            // Oldest first out: a node reads a few dozen paths, so this is a storm of names.
            if let Some(oldest) = paths
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(p, _)| p.clone())
            {
                paths.remove(&oldest);
            }
        }
        paths.insert(path, Instant::now());
    }
}

/// The layer that bounds the client's requests (see the module's doc).
#[derive(Clone, Default)]
pub struct RequestBounds {
    next_read: Arc<Mutex<HashMap<String, Instant>>>,
    answered: Answered,
}

impl RequestBounds {
    /// The successes of the client's reads, by path.
    pub fn answered(&self) -> Answered {
        self.answered.clone()
    }
}

impl<S> Layer<S> for RequestBounds {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Bounded<S> {
        Bounded {
            inner,
            next_read: self.next_read.clone(),
            answered: self.answered.clone(),
        }
    }
}

pub struct Bounded<S> {
    inner: S,
    next_read: Arc<Mutex<HashMap<String, Instant>>>,
    answered: Answered,
}

/// The error of a request that did not answer within [`REQUEST_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer within {REQUEST_TIMEOUT:?}")]
pub struct RequestTimedOut;

fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

impl<S> Bounded<S> {
    /// How long a read of `path` must wait before it goes out; claims its slot.
    fn wait_for(&self, path: &str) -> Duration {
        let now = Instant::now();
        let mut next = crate::lock(&self.next_read);
        if next.len() >= PATHS_KEPT {
            next.retain(|_, at| *at > now);
        }
        let slot = next.entry(path.to_owned()).or_insert(now);
        let at = (*slot).max(now);
        *slot = at + READ_SPACING;
        at - now
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B, R> Service<Request<B>> for Bounded<S>
where
    S: Service<Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Reads (a `GET` of one path) are spaced and their successes noted; writes go at once.
        let read = (req.method() == Method::GET).then(|| req.uri().path().to_owned());
        let wait = read.as_deref().map_or(Duration::ZERO, |p| self.wait_for(p));
        let timeout = (!is_watch(&req)).then_some(REQUEST_TIMEOUT);
        let answered = self.answered.clone();
        let response = self.inner.call(req);
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let answer = match timeout {
                Some(t) => tokio::time::timeout(t, response)
                    .await
                    .map_err(|_| Box::new(RequestTimedOut) as BoxError)?
                    .map_err(Into::into),
                None => response.await.map_err(Into::into),
            };
            if let (Some(path), Ok(a)) = (read, &answer)
                && a.status().is_success()
            {
                answered.record(path);
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    fn get(path: &str) -> Request<()> {
        Request::get(path).body(()).unwrap()
    }

    type Answer = http::Response<()>;

    /// A service that answers at once, noting when each request reached it: 503 for a path
    /// under `/down`, 200 for any other.
    #[derive(Clone, Default)]
    struct Server(Arc<Mutex<Vec<(String, Instant)>>>);

    impl Service<Request<()>> for Server {
        type Response = Answer;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<()>) -> Self::Future {
            let seen = self.0.clone();
            let path = req.uri().to_string();
            let status = if path.starts_with("/down") { 503 } else { 200 };
            Box::pin(async move {
                seen.lock().unwrap().push((path, Instant::now()));
                let mut answer = Answer::default();
                *answer.status_mut() = http::StatusCode::from_u16(status).unwrap();
                Ok(answer)
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reads_of_one_path_go_out_twice_a_second_and_writes_and_other_paths_at_once() {
        let seen = Server::default();
        let mut svc = RequestBounds::default().layer(seen.clone());
        let start = Instant::now();
        let mut calls = Vec::new();
        for _ in 0..5 {
            calls.push(svc.call(get(
                "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn",
            )));
        }
        calls.push(svc.call(get("/api/v1/nodes?fieldSelector=metadata.name%3Dn")));
        calls.push(
            svc.call(
                Request::patch("/api/v1/namespaces/a/pods/p/status")
                    .body(())
                    .unwrap(),
            ),
        );
        futures::future::join_all(calls).await;
        let seen = seen.0.lock().unwrap().clone();
        let at = |p: &str| -> Vec<Duration> {
            seen.iter()
                .filter(|(s, _)| s.starts_with(p))
                .map(|(_, t)| *t - start)
                .collect()
        };
        assert_eq!(
            at("/api/v1/pods"),
            (0..5).map(|i| READ_SPACING * i).collect::<Vec<_>>()
        );
        assert_eq!(at("/api/v1/nodes"), [Duration::ZERO]);
        assert_eq!(at("/api/v1/namespaces"), [Duration::ZERO]);
    }

    /// A service that never answers.
    struct Hangs;

    impl Service<Request<()>> for Hangs {
        type Response = Answer;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_never_answers_fails_after_the_timeout_and_a_watch_waits() {
        let mut svc = RequestBounds::default().layer(Hangs);
        let start = Instant::now();
        let e = svc.call(get("/api/v1/pods")).await.unwrap_err();
        assert!(e.is::<RequestTimedOut>(), "{e}");
        assert_eq!(Instant::now() - start, REQUEST_TIMEOUT);
        let watch = svc.call(get("/api/v1/nodes?watch=true"));
        assert!(
            tokio::time::timeout(REQUEST_TIMEOUT * 10, watch)
                .await
                .is_err(),
            "a watch is not cut by the request timeout"
        );
    }

    /// A read's success is noted by path, after the time asked about; a failure, a write and
    /// another path are not.
    #[tokio::test(start_paused = true)]
    async fn a_successful_read_is_answered_for_its_path_only() {
        let bounds = RequestBounds::default();
        let answered = bounds.answered();
        let mut svc = bounds.layer(Server::default());
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        svc.call(get("/down/pods?watch=true")).await.unwrap();
        svc.call(Request::patch("/api/v1/nodes/n").body(()).unwrap())
            .await
            .unwrap();
        assert!(!answered.since("/down/pods", before));
        assert!(!answered.since("/api/v1/nodes/n", before));
        svc.call(get("/api/v1/pods?watch=true&resourceVersion=5"))
            .await
            .unwrap();
        assert!(answered.since("/api/v1/pods", before));
        assert!(!answered.since("/api/v1/pods", Instant::now()));
        assert!(!answered.since("/api/v1/nodes", before));
    }

    #[tokio::test(start_paused = true)]
    async fn the_watch_backoff_grows_to_its_cap_whatever_resets_it_and_restarts_after_quiet() {
        let mut b = WatchBackoff::default();
        let mut waits = Vec::new();
        for _ in 0..8 {
            // The Init before each relist resets kube's backoff; not this one.
            b.reset();
            let w = b.next().unwrap();
            waits.push(w);
            tokio::time::advance(w).await;
        }
        // 800 ms doubling, with up to 100% jitter: each wait at least the unjittered one, and at
        // most 30 s plus jitter at the cap.
        for (i, w) in waits.iter().enumerate() {
            let base = Duration::from_millis(800) * 2u32.pow(i as u32);
            let base = base.min(Duration::from_secs(30));
            assert!(
                *w >= base && *w <= base * 2,
                "wait {i}: {w:?} (base {base:?})"
            );
        }
        // Two quiet minutes: back to the start.
        tokio::time::advance(Duration::from_secs(121)).await;
        let w = b.next().unwrap();
        assert!(w < Duration::from_millis(1600), "{w:?}");
    }
}
