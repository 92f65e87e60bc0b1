//! The listener: an accept loop serving each connection with hyper (as `axum::serve` does), owned
//! by one task so that going down drops the listener and every open connection at once, and
//! coming back binds the same address again.

use std::{io, net::SocketAddr};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use tokio::{
    net::{TcpListener, TcpSocket},
    task::{JoinHandle, JoinSet},
};

/// Binds with SO_REUSEADDR so the port can be bound again right after going down, while the
/// closed connections sit in TIME_WAIT.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves until the returned task is aborted; aborting it closes the listener and drops every
/// connection (their tasks live in the task's `JoinSet`).
pub fn serve(listener: TcpListener, router: Router) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let service = TowerToHyperService::new(router.clone());
                        connections.spawn(async move {
                            // A client that goes away mid-request is not the fake's error.
                            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                        });
                    }
                    Err(err) => {
                        tracing::warn!(%err, "Fake API server failed to accept a connection.");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    })
}
