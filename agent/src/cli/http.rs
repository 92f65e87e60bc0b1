//! The one HTTP request the client commands make: `GET path` from the agent's own endpoint on
//! loopback, `Connection: close`, a JSON body. Our own few lines rather than an HTTP client
//! crate: the server is ours and answers HTTP/1.1 with a Content-Length and closes.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, ToSocketAddrs},
    time::Duration,
};

use serde::de::DeserializeOwned;

/// GETs `path` from `addr` and decodes the 200 response's JSON body.
pub(crate) fn get_json<T: DeserializeOwned>(addr: SocketAddr, path: &str) -> std::io::Result<T> {
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

/// `http://host:port[/path]` -> the address and the path (`default_path` when none).
pub(crate) fn parse_url(url: &str, default_path: &str) -> Result<(SocketAddr, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?}: only http:// URLs (the agent's own endpoint)"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let path = if path.is_empty() || path == "/" {
        default_path.to_owned()
    } else {
        path.to_owned()
    };
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("{url:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url:?}: no address"))?;
    Ok((addr, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_agent_and_default_the_path() {
        let (addr, path) = parse_url("http://127.0.0.1:9479", "/stats/summary").unwrap();
        assert_eq!((addr.port(), path.as_str()), (9479, "/stats/summary"));
        let (_, path) = parse_url("http://127.0.0.1:1/stats/summary?x=1", "/").unwrap();
        assert_eq!(path, "/stats/summary?x=1");
        assert!(parse_url("https://127.0.0.1:1", "/").is_err());
    }
}
