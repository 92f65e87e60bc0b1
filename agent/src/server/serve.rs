//! The accept loop: a cap on open connections, a header-read timeout and an idle timeout, so a
//! client that opens connections and sends nothing (or trickles) cannot hold descriptors the
//! agent needs. `axum::serve` has none of these; hyper's HTTP/1 builder has the header-read
//! timeout, and the idle timeout is a deadline on the socket itself ([`Idle`]), reset by every
//! byte read or written, which also covers a keep-alive connection between requests.
//!
//! At the cap the loop stops accepting: further connections wait in the kernel's listen backlog
//! (holding no descriptor of ours) until a slot frees.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
    time::{Instant, Sleep, sleep},
};

/// Bounds on what clients may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// A request's headers must arrive within this.
    pub header_read_timeout: Duration,
    /// A connection with no byte read or written for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ServeLimits {
    /// Prometheus, `qoslet status` and a few probes need a handful of connections; 64 leaves
    /// room and bounds the descriptors a loopback client can take.
    fn default() -> Self {
        Self {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Serves `app` on `listener` within `limits` until dropped.
pub async fn serve(listener: TcpListener, app: Router, limits: ServeLimits) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut last_error_logged: Option<Instant> = None;
    loop {
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| io::Error::other("connection slots closed"))?;
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: the connection stays in the backlog; try again shortly
                // rather than spin. One line a minute at most.
                if last_error_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!(error = %e, "Accepting an HTTP connection failed; retrying.");
                    last_error_logged = Some(Instant::now());
                }
                sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let app = app.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(Idle::new(stream, limits.idle_timeout));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(io, TowerToHyperService::new(app));
            // A client that goes away or times out ends its connection; nothing to report.
            let _ = conn.await;
            drop(slot);
        });
    }
}

/// A socket that fails with `TimedOut` once nothing was read or written for `timeout`.
struct Idle {
    io: TcpStream,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Idle {
    fn new(io: TcpStream, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            deadline: Box::pin(sleep(timeout)),
        }
    }

    fn progressed(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.timeout);
    }

    /// On `Pending` from the socket: an error once the deadline passed, else `Pending` with the
    /// deadline's waker registered too.
    fn pending_or_timeout<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "idle connection closed",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Idle {
    /// A write's outcome: bytes written push the deadline back; `Pending` checks it.
    fn written(
        &mut self,
        r: Poll<io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    self.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.pending_or_timeout(cx),
        }
    }
}

impl AsyncRead for Idle {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.pending_or_timeout(cx),
        }
    }
}

impl AsyncWrite for Idle {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.written(r, cx)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.written(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
