//! The one HTTP request the client commands make: `GET path` from the agent's own endpoint on
//! loopback, `Connection: close`, a JSON body. Our own few lines rather than an HTTP client
//! crate: the server is ours and answers HTTP/1.1 with a Content-Length and closes.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use serde::de::DeserializeOwned;

/// GETs `path` from `addr` and decodes the 200 response's JSON body.
pub fn get_json<T: DeserializeOwned>(addr: SocketAddr, path: &str) -> std::io::Result<T> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("malformed HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(
            head.lines().next().unwrap_or("").to_owned(),
        ));
    }
    serde_json::from_str(body).map_err(std::io::Error::other)
}
