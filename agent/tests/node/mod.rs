//! Helpers shared by the tests that run the real `qoslet` daemon (standalone.rs, hardening.rs):
//! a free port, plain HTTP/1.1 GETs, polling with a deadline, and the `/status` table.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(200));
    }
}

pub fn status(addr: SocketAddr) -> Option<Value> {
    let (code, body) = get(addr, "/status")?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

pub fn phase(status: &Value, name: &str) -> Option<String> {
    status["pods"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["phase"].as_str().map(str::to_owned))
}
