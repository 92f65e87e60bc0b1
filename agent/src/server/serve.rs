//! The accept loop: a cap on open connections, a header-read timeout and an idle timeout, so a
//! client that opens connections and sends nothing (or trickles) cannot hold descriptors the
//! agent needs. `axum::serve` has none of these; hyper's HTTP/1 builder has the header-read
//! timeout, and the idle timeout is a deadline on the socket itself ([`Idle`]), reset by every
//! byte read or written, which also covers a keep-alive connection between requests.
//!
//! At the cap the loop stops accepting: further connections wait in the kernel's listen backlog
//! (holding no descriptor of ours) until a slot frees.
//!
//! One peer address may hold only [`ServeLimits::max_connections_per_peer`] of the slots; a
//! connection past that is closed as soon as it is accepted. The kubelet's probes come from the
//! node's own address and any other pod from its own, so a pod that opens a thousand silent
//! connections (as fast as they close) holds a few slots and the probes are answered at once;
//! to fill every slot takes `max_connections / max_connections_per_peer` addresses.

use std::{
    collections::HashMap,
    io,
    net::IpAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
    time::{Instant, Sleep, sleep},
};

/// Bounds on what clients may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServeLimits {
    /// Connections open at once; more wait in the listen backlog.
    pub(crate) max_connections: usize,
    /// Connections one peer address may hold at once; more from it are closed at once.
    pub(crate) max_connections_per_peer: usize,
    /// A request's headers must arrive within this.
    pub(crate) header_read_timeout: Duration,
    /// A connection with no byte read or written for this long is closed.
    pub(crate) idle_timeout: Duration,
}

impl Default for ServeLimits {
    /// Prometheus, `qoslet status` and the kubelet's probes need a handful of connections each;
    /// 256 in all bounds the descriptors clients can take (`qoslet run` raises its soft limit to
    /// the hard one), and 8 a peer takes 32 addresses to fill.
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_connections_per_peer: 8,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The listen backlog asked for (the kernel caps it at `net.core.somaxconn`, 4,096 by default):
/// a client that reconnects as fast as its connections past the per-peer cap are closed must not
/// fill the backlog, or the kernel drops the next probe's SYN and the probe waits a second for
/// its retransmit.
const BACKLOG: i32 = 4096;

/// The address a request came from (a request extension every request of [`serve`] carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer(pub IpAddr);

/// Binds `addr` as a listener for [`serve`]: address reuse as `TcpListener::bind` sets it, and a
/// backlog of [`BACKLOG`] (tokio's `bind` asks for 1,024).
///
/// `[::]` (IPv6's every address, the default where the endpoints are authorized) is bound
/// dual-stack (`IPV6_V6ONLY` off, whatever `net.ipv6.bindv6only` says), so IPv4 and IPv6
/// clients reach it alike, on IPv6-only clusters too, where `0.0.0.0` would not be reached. On
/// a node without IPv6 (`ipv6.disable=1`: no IPv6 socket, or no IPv6 address to bind) it falls
/// back to `0.0.0.0`, the same port. Any other address is bound as given.
pub(crate) fn listen(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    match bind_socket(addr) {
        Err(e) if addr.ip() == IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) && no_ipv6(&e) => {
            let v4 = std::net::SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
            tracing::info!(error = %e, %v4, "No IPv6 on this node; listening on IPv4 only.");
            bind_socket(v4)
        }
        bound => bound,
    }
}

/// Whether binding failed for want of IPv6 on the node.
fn no_ipv6(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL | libc::EPROTONOSUPPORT)
    )
}

fn bind_socket(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// Serves `app` on `listener` within `limits` until dropped.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let peers = Peers::default();
    let mut last_error_logged: Option<Instant> = None;
    let mut refusals_logged: Option<Instant> = None;
    loop {
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| io::Error::other("connection slots closed"))?;
        let (stream, peer) = match listener.accept().await {
            Ok((s, a)) => (s, a.ip().to_canonical()),
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
        let Some(peer_slot) = PeerSlot::take(&peers, peer, limits.max_connections_per_peer) else {
            // Closed at once (dropping the stream), its slot free again.
            if refusals_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                tracing::warn!(%peer, max = limits.max_connections_per_peer, "An HTTP client holds its most connections; closing its new ones (a line a minute at most).");
                refusals_logged = Some(Instant::now());
            }
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(Idle::new(stream, limits.idle_timeout));
            let service =
                hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(Peer(peer));
                    // The router is always ready; each request gets its own handle.
                    tower::Service::call(&mut app.clone(), req)
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(io, service);
            // A client that goes away or times out ends its connection; nothing to report.
            let _ = conn.await;
            drop(peer_slot);
            drop(slot);
        });
    }
}

/// Open connections by peer address.
type Peers = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One of a peer's connections, given back when dropped.
struct PeerSlot {
    peers: Peers,
    peer: IpAddr,
}

impl PeerSlot {
    fn take(peers: &Peers, peer: IpAddr, max: usize) -> Option<Self> {
        let mut open = crate::support::lock(peers);
        let n = open.entry(peer).or_default();
        if *n >= max.max(1) {
            return None;
        }
        *n += 1;
        Some(Self {
            peers: peers.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = crate::support::lock(&self.peers);
        if let Some(n) = open.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
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
