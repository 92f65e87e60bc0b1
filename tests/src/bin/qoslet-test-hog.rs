//! Test helper: waits for a line on stdin, then allocates and touches memory 1 MiB at a time up
//! to the cap given as the first argument (MiB), then sleeps until killed. An optional second
//! argument paces the allocation at that many MiB per second (default: as fast as it can); more
//! arguments are ignored (a test names the process with them). With `QOSLET_HOG_LISTEN=PORT` it
//! waits for a TCP connection on that port instead of the line (a pod of a workload controller
//! has no stdin a test can write); a number on the connection's first line, when the connection
//! sends one, is the cap instead of the argument (the test sizes a growth to what the node has
//! left at that moment).

use std::{
    io::BufRead as _,
    thread,
    time::{Duration, Instant},
};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut cap_mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let rate_mib_s: Option<f64> = args
        .next()
        .and_then(|a| a.parse().ok())
        .filter(|r| *r > 0.0);
    match std::env::var("QOSLET_HOG_LISTEN") {
        Ok(port) => {
            let listener = std::net::TcpListener::bind(("0.0.0.0", port.parse().unwrap_or(7000)))
                .expect("listen");
            if let Ok((stream, _)) = listener.accept() {
                // A trigger that sends nothing closes at once: its end is the end of the line.
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut line = String::new();
                let _ = std::io::BufReader::new(stream).read_line(&mut line);
                if let Ok(cap) = line.trim().parse() {
                    cap_mib = cap;
                }
            }
        }
        Err(_) => {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        }
    }
    let start = Instant::now();
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for i in 0..cap_mib {
        if let Some(rate) = rate_mib_s {
            // Pace by elapsed time, so the rate holds whatever a step costs.
            let due = Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                thread::sleep(wait);
            }
        }
        // Touch every page so the memory is really charged to the cgroup.
        blocks.push(vec![0x5a; 1 << 20]);
    }
    std::hint::black_box(&blocks);
    loop {
        thread::sleep(Duration::from_secs(60));
    }
}
