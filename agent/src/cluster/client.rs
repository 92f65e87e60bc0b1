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
//!   - a watch that the server ends within [`SHORT_WATCH`] without a byte, or whose stream is
//!     cut (the connection closed mid-body), holds back the next read of its path under a
//!     [`WatchBackoff`] of that path's own: client-go's reflector counts both as failures (its
//!     "very short watch") and backs off. kube-runtime sees neither as an error (kube logs a
//!     warning for a cut stream and ends it as if the server had) and watches again at once,
//!     held only by the spacing: two requests and two warnings a second, for good. The failure
//!     is noted for `/readyz` ([`Answered::watch_failing`]), where kube-runtime's watch would
//!     still read as synced.
//!   - a read answered 429 or 5xx with a `Retry-After` header holds back the next read of the
//!     same path until that time has passed (at most [`RETRY_AFTER_CAP`]): the API server sheds
//!     load (priority and fairness, a server shutting down) by saying when to come back, and
//!     kube-runtime's watcher only sees an error and retries under its own backoff, from
//!     800 ms. kube's own retry layer reads the header but retries inside the request, up to
//!     15 times, and is off here (the write queue sorts and retries its answers itself; it reads
//!     the same time from the `Status`'s `details.retryAfterSeconds`).
//!   - every request but a watch must answer within [`REQUEST_TIMEOUT`]: a list that never
//!     answers (a half-open connection, a hung server) fails and is retried under the backoff,
//!     instead of leaving the node unsynced for good. A watch has its own idle timeout in
//!     kube-runtime (its `timeoutSeconds` plus 5 s); kube's `read_timeout` would cut it.
//!
//! - [`connect`]: kube's client stack, built here around a connector with TCP keepalive (as
//!   client-go's dialer: the first probe after 30 s idle, then every 30 s), which kube's
//!   `ClientBuilder::try_from(Config)` does not set and has no option for: a watch whose peer
//!   vanished without a reset (a lost route, a load balancer that dropped the flow) is found dead
//!   by the kernel instead of waiting for kube-runtime's idle timeout, and a list whose answer
//!   stops mid-body is not left waiting for good.
//!
//! Written here because kube has none of these: its `StreamBackoff` resets on every item, and
//! its client has no per-resource spacing, no Retry-After outside its in-request retries, and
//! only a read timeout for every request alike.

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
pub(crate) const READ_SPACING: Duration = Duration::from_millis(500);

/// How long any request but a watch may take to answer (a list of a node's pods from the watch
/// cache takes milliseconds; one of every Workload in a namespace, less than a second).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A watch that ends sooner than this without a byte has failed (client-go's "very short watch":
/// under a second, no event).
pub(crate) const SHORT_WATCH: Duration = Duration::from_secs(1);

/// The longest `Retry-After` honoured: a server (or a proxy) that asks for hours would leave the
/// node blind that long. client-go caps nothing, but its reflector's own backoff tops out at
/// 30 s: 5 minutes is ten times that.
pub(crate) const RETRY_AFTER_CAP: Duration = Duration::from_secs(300);

/// TCP keepalive's idle time and probe interval, client-go's (`net.Dialer{KeepAlive: 30s}`).
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(30);

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// kube, built without its proxy features as qoslet is, refuses a proxy too.
    #[error("a proxy ({0}) is not supported: qoslet connects to the API server directly")]
    Proxy(http::Uri),
}

/// The API client for `config`: kube's own stack (`ClientBuilder::try_from(Config)` in kube 5:
/// TLS and the server's name, base URI, authentication with token refresh, extra headers) over
/// a connector with TCP keepalive ([`KEEPALIVE`]), its requests passing `bounds`. Left out of
/// kube's stack: the tracing layer (its error lines for every 5xx and cut body would repeat what
/// the watches already say once per change), gzip (not built into qoslet), kube's retries (off:
/// see [`RequestBounds`]), and its read and write timeouts, which [`REQUEST_TIMEOUT`],
/// kube-runtime's watch idle timeout and keepalive cover.
pub(crate) fn connect(
    config: &kube::Config,
    bounds: &RequestBounds,
) -> Result<kube::Client, ConnectError> {
    use hyper_util::{
        client::legacy::{Client, connect::HttpConnector},
        rt::TokioExecutor,
    };
    use kube::client::{ClientBuilder, ConfigExt as _};

    if let Some(proxy) = &config.proxy_url {
        return Err(ConnectError::Proxy(proxy.clone()));
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    http.set_keepalive(Some(KEEPALIVE));
    http.set_keepalive_interval(Some(KEEPALIVE));
    let https = config.rustls_https_connector_with_connector(http)?;
    let hyper: Client<_, kube::client::Body> = Client::builder(TokioExecutor::new()).build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(
        ClientBuilder::new(service, config.default_namespace.clone())
            .with_layer(bounds)
            .build(),
    )
}

/// At most this many paths are remembered; a node reads a few dozen (its pods, its Node, the
/// workload objects they reference, its writes' targets), and an old entry only delays nothing.
const PATHS_KEPT: usize = 4096;

/// client-go's reflector backoff: kube-runtime's [`DefaultBackoff`] (800 ms doubling to 30 s,
/// with jitter, back to 800 ms once 2 minutes pass without a retry), never reset by the items of
/// the stream it guards.
#[derive(Default)]
pub(crate) struct WatchBackoff(DefaultBackoff);

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

/// What a named watch's failure that kube-runtime does not see is called on `/readyz`.
pub(crate) const WATCH_CUT: &str = "the watch stream was cut";
/// See [`WATCH_CUT`].
pub(crate) const WATCH_ENDED_AT_ONCE: &str = "the watch ended at once without an event";

/// What the reads of one resource path last did.
#[derive(Clone, Copy, Default)]
struct PathReads {
    /// The last read answered with a success (a watch at its answer's headers).
    read: Option<Instant>,
    /// The watch of this path open now: when it was answered.
    open: Option<Instant>,
    /// When a watch of this path last proved itself: open for [`SHORT_WATCH`] without a failure.
    proven: Option<Instant>,
    /// The last watch that failed without an error kube-runtime sees (cut, or ended at once):
    /// when, and how.
    failed: Option<(Instant, &'static str)>,
}

impl PathReads {
    /// When a watch of the path last proved itself, the one open now included.
    fn proven(&self, now: Instant) -> Option<Instant> {
        let open = self
            .open
            .map(|t| t + SHORT_WATCH)
            .filter(|proven| *proven <= now);
        self.proven.max(open)
    }

    /// The latest time in the record, for the oldest-first eviction.
    fn latest(&self) -> Option<Instant> {
        [self.read, self.open, self.proven, self.failed.map(|f| f.0)]
            .into_iter()
            .max()
            .flatten()
    }
}

/// When each resource path last answered a read with a success, and how its watches ended.
/// A watch that failed and is re-established yields nothing until an object changes, so its
/// success shows only here (`/readyz` clears a failing watch by it: a failure kube-runtime sees
/// in the body, as garbage, comes after the answer's headers and is said again); and a watch
/// that the server cuts or ends at once is no error to kube-runtime, so its failure shows only
/// here (`/readyz` names it failing until a watch of its path has lasted [`SHORT_WATCH`]
/// without failing so).
#[derive(Clone, Default)]
pub(crate) struct Answered(Arc<Mutex<HashMap<String, PathReads>>>);

impl Answered {
    /// Whether a read of `path` succeeded after `at`.
    pub(crate) fn since(&self, path: &str, at: Instant) -> bool {
        crate::support::lock(&self.0)
            .get(path)
            .and_then(|r| r.read)
            .is_some_and(|t| t > at)
    }

    /// How the last watch of `path` failed, when it failed without an error kube-runtime sees
    /// and no watch of the path has proved itself since.
    pub(crate) fn watch_failing(&self, path: &str) -> Option<&'static str> {
        let now = Instant::now();
        let paths = crate::support::lock(&self.0);
        let r = paths.get(path)?;
        let (at, how) = r.failed?;
        (r.proven(now) <= Some(at)).then_some(how)
    }

    fn update(&self, path: &str, f: impl FnOnce(&mut PathReads)) {
        let mut paths = crate::support::lock(&self.0);
        if paths.len() >= PATHS_KEPT && !paths.contains_key(path) {
            // Oldest first out: a node reads a few dozen paths, so this is a storm of names.
            if let Some(oldest) = paths
                .iter()
                .min_by_key(|(_, r)| r.latest())
                .map(|(p, _)| p.clone())
            {
                paths.remove(&oldest);
            }
        }
        f(paths.entry(path.to_owned()).or_default());
    }

    fn read(&self, path: &str) {
        self.update(path, |r| r.read = Some(Instant::now()));
    }

    pub(super) fn watch_opened(&self, path: &str, at: Instant) {
        self.update(path, |r| r.open = Some(at));
    }

    /// The watch of `path` answered at `opened` ended (or was dropped), `failure` if it failed.
    /// A watch opened after a failure that ends without failing so is the path's last word:
    /// the failure is over (an error in its body is kube-runtime's to see).
    pub(super) fn watch_ended(&self, path: &str, opened: Instant, failure: Option<&'static str>) {
        let now = Instant::now();
        self.update(path, |r| {
            if r.open == Some(opened) {
                r.open = None;
            }
            match failure {
                Some(how) => r.failed = Some((now, how)),
                None => {
                    if now >= opened + SHORT_WATCH {
                        r.proven = r.proven.max(Some(opened + SHORT_WATCH));
                    }
                    if r.failed.is_some_and(|(at, _)| opened >= at) {
                        r.failed = None;
                    }
                }
            }
        });
    }

    /// A watch of `path` was answered with an error status: kube-runtime sees that one (a
    /// `410 Gone` is its relist), so an earlier cut or short watch is no longer the path's state.
    fn watch_refused(&self, path: &str) {
        let mut paths = crate::support::lock(&self.0);
        if let Some(r) = paths.get_mut(path) {
            r.failed = None;
        }
    }
}

/// The layer that bounds the client's requests (see the module's doc).
#[derive(Clone, Default)]
pub struct RequestBounds {
    next_read: NextRead,
    watch_backoffs: WatchBackoffs,
    answered: Answered,
}

impl RequestBounds {
    /// The successes of the client's reads, by path.
    pub(crate) fn answered(&self) -> Answered {
        self.answered.clone()
    }
}

impl<S> Layer<S> for RequestBounds {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Bounded<S> {
        Bounded {
            inner,
            next_read: self.next_read.clone(),
            watch_backoffs: self.watch_backoffs.clone(),
            answered: self.answered.clone(),
        }
    }
}

pub struct Bounded<S> {
    inner: S,
    next_read: NextRead,
    watch_backoffs: WatchBackoffs,
    answered: Answered,
}

/// The error of a request that did not answer within [`REQUEST_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer within {REQUEST_TIMEOUT:?}")]
pub(crate) struct RequestTimedOut;

fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

/// How long an answer asks the client to wait before it asks again: its `Retry-After` on a 429
/// or a 5xx, in whole seconds, as client-go's `checkWait` reads it (the API server never sends
/// the header's HTTP-date form), capped at [`RETRY_AFTER_CAP`].
fn retry_after<R>(answer: &http::Response<R>) -> Option<Duration> {
    let status = answer.status();
    if status != http::StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let secs: u64 = answer
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(RETRY_AFTER_CAP))
}

/// When the next read of each path may go out.
type NextRead = Arc<Mutex<HashMap<String, Instant>>>;

/// How long a read of `path` must wait before it goes out; claims its slot.
fn wait_for(next_read: &NextRead, path: &str) -> Duration {
    let now = Instant::now();
    let mut next = crate::support::lock(next_read);
    if next.len() >= PATHS_KEPT {
        next.retain(|_, at| *at > now);
    }
    let slot = next.entry(path.to_owned()).or_insert(now);
    let at = (*slot).max(now);
    *slot = at + READ_SPACING;
    at - now
}

/// Each path's backoff for its watches that failed without an error kube-runtime sees.
type WatchBackoffs = Arc<Mutex<HashMap<String, WatchBackoff>>>;

/// A response's body; a successful watch's notes how its stream ends ([`SHORT_WATCH`]).
pub struct BoundedBody<B> {
    inner: B,
    watch: Option<WatchEnd>,
}

impl<B> std::fmt::Debug for BoundedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedBody")
            .field("watch", &self.watch.as_ref().map(|w| &w.path))
            .finish_non_exhaustive()
    }
}

/// A watch's stream, watched for its end.
struct WatchEnd {
    path: String,
    started: Instant,
    data: bool,
    next_read: NextRead,
    backoffs: WatchBackoffs,
    answered: Answered,
    /// [`WatchEnd::ended`] ran: the drop has nothing to note.
    ended: bool,
}

impl WatchEnd {
    /// The stream ended (`cut`: with an error): a failure holds back the path's next read, and
    /// is noted for `/readyz`.
    fn ended(&mut self, cut: bool) {
        self.ended = true;
        let failure = if cut {
            Some(WATCH_CUT)
        } else if !self.data && self.started.elapsed() < SHORT_WATCH {
            Some(WATCH_ENDED_AT_ONCE)
        } else {
            None
        };
        self.answered.watch_ended(&self.path, self.started, failure);
        if failure.is_none() {
            return;
        }
        let wait = {
            let mut backoffs = crate::support::lock(&self.backoffs);
            if backoffs.len() >= PATHS_KEPT && !backoffs.contains_key(&self.path) {
                // A storm of names: each backoff starts again.
                backoffs.clear();
            }
            let backoff = backoffs.entry(self.path.clone()).or_default();
            backoff.next().unwrap_or(SHORT_WATCH)
        };
        not_before(&self.next_read, self.path.clone(), Instant::now() + wait);
    }
}

impl Drop for WatchEnd {
    /// A watch dropped before its end (its watcher gave up on it) did not fail.
    fn drop(&mut self) {
        if !self.ended {
            self.answered.watch_ended(&self.path, self.started, None);
        }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for BoundedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        match &frame {
            Poll::Ready(Some(Ok(f))) => {
                if let (Some(w), Some(d)) = (self.watch.as_mut(), f.data_ref()) {
                    w.data |= hyper::body::Buf::has_remaining(d);
                }
            }
            Poll::Ready(end) => {
                if let Some(mut w) = self.watch.take() {
                    w.ended(end.is_some());
                }
            }
            Poll::Pending => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// No read of `path` goes out before `at`.
fn not_before(next_read: &NextRead, path: String, at: Instant) {
    let mut next = crate::support::lock(next_read);
    let slot = next.entry(path).or_insert(at);
    *slot = (*slot).max(at);
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B, R> Service<Request<B>> for Bounded<S>
where
    S: Service<Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<BoundedBody<R>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Reads (a `GET` of one path) are spaced and their successes noted; writes go at once.
        let read = (req.method() == Method::GET).then(|| req.uri().path().to_owned());
        let wait = read
            .as_deref()
            .map_or(Duration::ZERO, |p| wait_for(&self.next_read, p));
        let watch = is_watch(&req);
        let timeout = (!watch).then_some(REQUEST_TIMEOUT);
        let answered = self.answered.clone();
        let next_read = self.next_read.clone();
        let backoffs = self.watch_backoffs.clone();
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
            let answer: http::Response<R> = answer?;
            let mut end = None;
            if let Some(path) = read {
                if answer.status().is_success() {
                    let started = Instant::now();
                    answered.read(&path);
                    if watch {
                        answered.watch_opened(&path, started);
                    }
                    end = watch.then(|| WatchEnd {
                        path,
                        started,
                        data: false,
                        next_read,
                        backoffs,
                        answered,
                        ended: false,
                    });
                } else {
                    if watch {
                        answered.watch_refused(&path);
                    }
                    if let Some(wait) = retry_after(&answer) {
                        not_before(&next_read, path, Instant::now() + wait);
                    }
                }
            }
            Ok(answer.map(|inner| BoundedBody { inner, watch: end }))
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

    /// A test answer's body: some text, or a stream cut after it.
    enum Text {
        Whole(String),
        Cut(Option<String>),
    }

    impl hyper::body::Body for Text {
        type Data = hyper::body::Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
            let data = |t: String| hyper::body::Frame::data(hyper::body::Bytes::from(t));
            Poll::Ready(match &mut *self {
                Text::Whole(t) if t.is_empty() => None,
                Text::Whole(t) => Some(Ok(data(std::mem::take(t)))),
                Text::Cut(t) => match t.take() {
                    Some(t) => Some(Ok(data(t))),
                    None => Some(Err(std::io::ErrorKind::UnexpectedEof.into())),
                },
            })
        }
    }

    type Answer = http::Response<Text>;

    /// Reads a body to its end; whether it ended with an error.
    async fn drain<B: hyper::body::Body + Unpin>(mut body: B) -> bool {
        loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                Some(Ok(_)) => {}
                Some(Err(_)) => return true,
                None => return false,
            }
        }
    }

    /// A service that answers at once, noting when each request reached it: 503 for a path
    /// under `/down`; 429 with `Retry-After: 7` under `/busy`; 503 with `Retry-After: 86400`
    /// under `/away`; 200 for any other, with an empty body under `/short`, half a line then
    /// cut under `/cut`, and a line for any other.
    #[derive(Clone, Default)]
    struct Server(Arc<Mutex<Vec<(String, Instant)>>>);

    impl Server {
        /// When each request for `path` (its query aside) arrived.
        fn arrivals(&self, path: &str) -> Vec<Instant> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .filter(|(s, _)| s.split('?').next() == Some(path))
                .map(|(_, t)| *t)
                .collect()
        }
    }

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
            let (status, retry_after) = match path.split('/').nth(1) {
                Some("down") => (503, None),
                Some("busy") => (429, Some("7")),
                Some("away") => (503, Some("86400")),
                _ => (200, None),
            };
            let body = match path.split('/').nth(1) {
                Some("short") => Text::Whole(String::new()),
                Some("cut") => Text::Cut(Some("{\"type\":".into())),
                _ => Text::Whole("{}\n".into()),
            };
            Box::pin(async move {
                seen.lock().unwrap().push((path, Instant::now()));
                let mut answer = Answer::new(body);
                *answer.status_mut() = http::StatusCode::from_u16(status).unwrap();
                if let Some(secs) = retry_after {
                    answer.headers_mut().insert(
                        http::header::RETRY_AFTER,
                        http::HeaderValue::from_static(secs),
                    );
                }
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
        let at = |p: &str| -> Vec<Duration> {
            seen.arrivals(p).into_iter().map(|t| t - start).collect()
        };
        assert_eq!(
            at("/api/v1/pods"),
            (0..5).map(|i| READ_SPACING * i).collect::<Vec<_>>()
        );
        assert_eq!(at("/api/v1/nodes"), [Duration::ZERO]);
        assert_eq!(at("/api/v1/namespaces/a/pods/p/status"), [Duration::ZERO]);
    }

    /// A read answered with a Retry-After holds back the next read of its path that long (at
    /// most the cap); a write to it and reads of other paths go at once, and a 503 without the
    /// header only spaces reads.
    #[tokio::test(start_paused = true)]
    async fn a_retry_after_holds_back_the_next_read_of_its_path_only_and_is_capped() {
        let seen = Server::default();
        let mut svc = RequestBounds::default().layer(seen.clone());
        let start = Instant::now();
        for path in ["/busy/pods?watch=true", "/away/nodes", "/down/leases"] {
            svc.call(get(path)).await.unwrap();
        }
        let calls = vec![
            svc.call(get("/busy/pods")),
            svc.call(get("/away/nodes?watch=true")),
            svc.call(get("/down/leases")),
            svc.call(get("/api/v1/pods")),
            svc.call(Request::patch("/busy/pods/p").body(()).unwrap()),
        ];
        futures::future::join_all(calls).await;
        let at = |p: &str| -> Vec<Duration> {
            seen.arrivals(p).into_iter().map(|t| t - start).collect()
        };
        assert_eq!(at("/busy/pods/p"), [Duration::ZERO], "a write is not held");
        assert_eq!(at("/busy/pods"), [Duration::ZERO, Duration::from_secs(7)]);
        assert_eq!(at("/away/nodes"), [Duration::ZERO, RETRY_AFTER_CAP]);
        assert_eq!(at("/down/leases"), [Duration::ZERO, READ_SPACING]);
        assert_eq!(at("/api/v1/pods"), [Duration::ZERO]);
    }

    /// The `tr` (timer) and `tm->when` (in USER_HZ ticks) fields of the IPv4 TCP socket from
    /// `local` to `remote` in `/proc/net/tcp`.
    fn tcp_timer(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> Option<(u8, u64)> {
        let hex = |a: std::net::SocketAddr| match a.ip() {
            std::net::IpAddr::V4(ip) => {
                format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), a.port())
            }
            std::net::IpAddr::V6(_) => String::new(),
        };
        let text = std::fs::read_to_string("/proc/net/tcp").ok()?;
        text.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(1)? != &hex(local) || f.get(2)? != &hex(remote) {
                return None;
            }
            let (tr, when) = f.get(5)?.split_once(':')?;
            Some((
                u8::from_str_radix(tr, 16).ok()?,
                u64::from_str_radix(when, 16).ok()?,
            ))
        })
    }

    /// The client's connections to the API server have TCP keepalive on: an open connection
    /// waiting for its answer runs the keepalive timer (`tr` 2 in `/proc/net/tcp`), its first
    /// probe due within [`KEEPALIVE`].
    #[tokio::test]
    async fn the_clients_connections_have_tcp_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        let config = kube::Config::new(format!("http://{server}").parse().unwrap());
        let client = connect(&config, &RequestBounds::default()).unwrap();
        let asking = tokio::spawn(async move { client.list_api_groups().await });
        let (mut conn, peer) = listener.accept().await.unwrap();
        // The request read: the client's bytes are acknowledged, the connection is idle.
        let mut buf = [0u8; 1024];
        let n = tokio::io::AsyncReadExt::read(&mut conn, &mut buf)
            .await
            .unwrap();
        assert!(buf[..n].starts_with(b"GET /apis "), "{:?}", &buf[..n]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let timer = loop {
            let timer = tcp_timer(peer, server);
            if matches!(timer, Some((2, _))) || Instant::now() > deadline {
                break timer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (tr, when) = timer.expect("the client's socket in /proc/net/tcp");
        assert_eq!(tr, 2, "the keepalive timer runs");
        // USER_HZ is 100 on every Linux architecture qoslet runs on.
        let when = Duration::from_millis(when * 10);
        assert!(
            when <= KEEPALIVE && when > KEEPALIVE - Duration::from_secs(5),
            "first probe in {when:?}"
        );
        asking.abort();
    }

    /// A watch that ends at once without a byte, or is cut, holds its path's next read back
    /// under the backoff, growing; one that had data and ended is watched again at the spacing.
    #[tokio::test(start_paused = true)]
    async fn a_watch_that_ends_at_once_or_is_cut_is_asked_again_under_the_backoff() {
        let seen = Server::default();
        let mut svc = RequestBounds::default().layer(seen.clone());
        let start = Instant::now();
        for path in ["/short/pods", "/cut/pods", "/api/v1/pods"] {
            for _ in 0..4 {
                let answer = svc.call(get(&format!("{path}?watch=true"))).await.unwrap();
                assert_eq!(drain(answer.into_body()).await, path == "/cut/pods");
            }
        }
        let gaps = |p: &str| -> Vec<Duration> {
            seen.arrivals(p).windows(2).map(|w| w[1] - w[0]).collect()
        };
        for p in ["/short/pods", "/cut/pods"] {
            // 800 ms doubling, with up to 100% jitter.
            for (i, gap) in gaps(p).into_iter().enumerate() {
                let base = Duration::from_millis(800) * 2u32.pow(i as u32);
                assert!(gap >= base && gap <= base * 2, "{p}: wait {i}: {gap:?}");
            }
        }
        assert_eq!(gaps("/api/v1/pods"), [READ_SPACING; 3]);
        assert!(Instant::now() - start > Duration::from_secs(10));
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

    /// A watch the server cuts, or ends at once without a byte, names its path failing (no
    /// error reaches kube-runtime for either), also while the next watch of the path is open
    /// for less than SHORT_WATCH; a watch of the path that lasts SHORT_WATCH clears it. A
    /// watch that had data and ended is no failure.
    #[tokio::test(start_paused = true)]
    async fn a_cut_or_short_watch_names_its_path_failing_until_a_watch_of_it_lasts() {
        let bounds = RequestBounds::default();
        let answered = bounds.answered();
        let mut svc = bounds.layer(Server::default());
        for (path, how) in [
            ("/cut/pods", WATCH_CUT),
            ("/short/pods", WATCH_ENDED_AT_ONCE),
        ] {
            let answer = svc.call(get(&format!("{path}?watch=true"))).await.unwrap();
            assert_eq!(answered.watch_failing(path), None, "{path}: open");
            drain(answer.into_body()).await;
            assert_eq!(answered.watch_failing(path), Some(how), "{path}: ended");
            let failed = Instant::now();
            // The next watch: failing until it has lasted SHORT_WATCH.
            answered.watch_opened(path, failed);
            tokio::time::advance(SHORT_WATCH / 2).await;
            assert_eq!(answered.watch_failing(path), Some(how), "{path}: reopened");
            tokio::time::advance(SHORT_WATCH / 2).await;
            assert_eq!(answered.watch_failing(path), None, "{path}: lasted");
            // Cut again after it lasted: failing again.
            answered.watch_ended(path, failed, Some(how));
            assert_eq!(answered.watch_failing(path), Some(how), "{path}: cut again");
        }
        let answer = svc.call(get("/api/v1/pods?watch=true")).await.unwrap();
        assert!(!drain(answer.into_body()).await);
        assert_eq!(answered.watch_failing("/api/v1/pods"), None);
    }

    /// The path's last watch is its state: after a cut, a watch that had data and ended within
    /// SHORT_WATCH (a `410` ERROR event), or a watch answered with an error status (a `410
    /// Gone`, a 503: kube-runtime sees those), clears the failure; a watch opened before the
    /// cut and ending after it does not.
    #[tokio::test(start_paused = true)]
    async fn a_later_watch_that_does_not_fail_silently_clears_a_cut() {
        let bounds = RequestBounds::default();
        let answered = bounds.answered();
        let mut svc = bounds.layer(Server::default());
        let path = "/api/v1/pods";
        let old = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        answered.watch_ended(path, Instant::now(), Some(WATCH_CUT));
        answered.watch_ended(path, old, None);
        assert_eq!(answered.watch_failing(path), Some(WATCH_CUT), "older watch");
        let answer = svc.call(get(&format!("{path}?watch=true"))).await.unwrap();
        assert!(!drain(answer.into_body()).await);
        assert_eq!(
            answered.watch_failing(path),
            None,
            "a short watch with data"
        );

        let path = "/down/pods";
        answered.watch_ended(path, Instant::now(), Some(WATCH_ENDED_AT_ONCE));
        assert_eq!(answered.watch_failing(path), Some(WATCH_ENDED_AT_ONCE));
        let answer = svc.call(get(&format!("{path}?watch=true"))).await.unwrap();
        assert_eq!(answer.status(), 503);
        assert_eq!(answered.watch_failing(path), None, "refused");
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
