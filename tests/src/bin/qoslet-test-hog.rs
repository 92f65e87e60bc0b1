//! Test helper: waits for a line on stdin, then allocates and touches memory 1 MiB at a time up
//! to the cap given as the first argument (MiB), then sleeps until killed.

use std::{io::BufRead as _, thread, time::Duration};

fn main() {
    let cap_mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(64);
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..cap_mib {
        // Touch every page so the memory is really charged to the cgroup.
        blocks.push(vec![0x5a; 1 << 20]);
    }
    std::hint::black_box(&blocks);
    loop {
        thread::sleep(Duration::from_secs(60));
    }
}
