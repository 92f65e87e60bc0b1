//! Test helper: a latency-sensitive pod's process. Forever: sleep 1 ms, then 50 µs of work, so
//! it wakes about 950 times a second and each wake-up's wait on the run queue is what the
//! `sched_switch` sensor measures. Timer slack is 1 ns so the wake-ups are not batched.

use std::{
    thread,
    time::{Duration, Instant},
};

fn main() {
    // SAFETY: prctl with PR_SET_TIMERSLACK takes a plain integer.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    loop {
        thread::sleep(Duration::from_millis(1));
        let work = Instant::now();
        while work.elapsed() < Duration::from_micros(50) {
            std::hint::spin_loop();
        }
    }
}
