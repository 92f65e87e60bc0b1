//! Two cgroups competing for CPU 0 with very different CPU weights: the light one waits longer
//! on the run queue and runs less, as the scheduler program's per-cgroup stats show; and those
//! stats agree with what the kernel itself accounts to the same tasks in
//! `/proc/<pid>/schedstat`: the on-CPU time to 1%, the run-queue wait within the bound the
//! sensor keeps ([`WAIT_SEEN_AT_LEAST`]).

mod sensors_common;

use std::time::Duration;

use qoslet::sensors::cpu_usage::RunQueueWaits;
use qoslet::sensors::{CpuSource, SensorMode, SensorsConfig};
use qoslet_tests::require_root;
use sensors_common::{Cgroups, Script, start, status};

/// `/proc/<pid>/schedstat`: (time on CPU, time waiting on a run queue, in nanoseconds; times
/// it got a CPU).
fn schedstat(pid: u32) -> (u64, u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).expect("schedstat");
    let mut f = text
        .split_whitespace()
        .map(|v| v.parse::<u64>().expect("a number"));
    (
        f.next().expect("on-CPU"),
        f.next().expect("run delay"),
        f.next().expect("arrivals"),
    )
}

/// Waits until `pid` is in `state` (a letter of `/proc/PID/stat`) running `comm` (any when
/// `None`).
async fn wait_for_state(pid: u32, state: char, comm: Option<&str>) {
    for _ in 0..1000 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // `pid (comm) S ...`: the state follows the last ')'.
        let in_state = stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with(state));
        let running = comm.is_none_or(|c| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|s| s.trim() == c)
        });
        if in_state && running {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{pid} never reached state {state} in {comm:?}");
}

/// Stops `pid` and waits until it is stopped. A stopped task has no slice in progress: schedstat
/// counts a running slice before it ends, the program at the switch, so a snapshot taken while a
/// still-starting shell ran (seen on the 6.12 VM) started the two accounts apart.
async fn stopped(pid: u32) {
    // SAFETY: our own child.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    wait_for_state(pid, 'T', None).await;
}

/// Waits until `pid` runs `sleep` and sleeps in it. A task that blocks leaves the CPU through
/// `sched_switch` with no wait pending, so both accounts are final. A task stopped by a signal
/// while it waits on a run queue is dequeued without a switch: the kernel adds that wait to
/// `run_delay`, the program never sees it (seen on a loaded host: 20 ms apart).
async fn asleep(pid: u32) {
    wait_for_state(pid, 'S', Some("sleep")).await;
}

/// The part of the kernel's `run_delay` the program sees, at the least. On a quiet machine it sees
/// all of it, to the microsecond. The 6.18 development host's kernel fires no tracepoint while a
/// thread of its init (PID 1, the sandbox's agent) is the current task, and `sched_switch` fires
/// in the context of the task leaving the CPU: the arrival of a task right after such a thread
/// is counted by `sched_info_arrive` (`pcount`, `run_delay`) but reaches no probe. Beside
/// `stress-ng --cpu 1 --fork 1` (2026-12-03) the heavy task lost 1 to 11 arrivals in 31 of 48
/// runs, and at worst 82.2% of its wait was seen (79.8% and 77.6% in other series); an upstream
/// kernel reports every switch (docs/kernels.md, "Run-queue wait accuracy"). The bound stays
/// well under the worst seen: one lost arrival loses a whole wait, milliseconds behind a nice -10
/// thread, and a test that fails under a shared machine's load is a broken test.
const WAIT_SEEN_AT_LEAST: f64 = 0.6;

/// `a` within `pct` percent (and 2 ms) of `b`.
fn close(a: u64, b: u64, pct: f64) -> bool {
    (a as f64 - b as f64).abs() <= (b as f64 * pct / 100.0).max(2e6)
}

fn mean_wait_ns(s: &RunQueueWaits) -> f64 {
    s.total_ns as f64 / s.count.max(1) as f64
}

/// Highest histogram bucket with half of the waits at or below it.
fn median_bucket(s: &RunQueueWaits) -> usize {
    let total: u64 = s.hist.iter().sum();
    let mut acc = 0;
    for (i, n) in s.hist.iter().enumerate() {
        acc += n;
        if acc * 2 >= total {
            return i;
        }
    }
    0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lighter_cgroup_waits_longer_on_the_run_queue() {
    require_root();
    let (sensors, _rx) = start(SensorsConfig::default());
    let status = status(&sensors, "cpu_runqueue");
    assert_eq!(
        status.mode,
        SensorMode::Active,
        "tp_btf sched programs on every supported kernel: {status:?}"
    );
    let (Some(heavy), Some(light)) = (Cgroups::create(&["cpu"]), Cgroups::create(&["cpu"])) else {
        return;
    };
    if heavy.is_v1() {
        heavy.of("cpu").write("cpu.shares", "10240");
        light.of("cpu").write("cpu.shares", "128");
    } else {
        heavy.v2.write("cpu.weight", "1000");
        light.v2.write("cpu.weight", "10");
    }
    sensors.watch(heavy.watched());
    sensors.watch(light.watched());
    let done = std::env::temp_dir().join(format!("qoslet-sensors-cpu-{}", std::process::id()));
    let _ = std::fs::remove_file(&done);
    let mut spinners = Vec::new();
    for cg in [&heavy, &light] {
        let s = Script::spawn(&format!(
            "while [ ! -e '{}' ]; do :; done; exec sleep 600",
            done.display()
        ));
        // Pin after joining: on Linux 6.1 a cgroup v2 cpuset attach resets the affinity.
        cg.add(s.pid());
        s.pin_to_cpu0();
        spinners.push(s);
    }
    let stats = |id: u64| {
        let u = sensors
            .cpu_stats(id)
            .expect("reading CPU_STATS")
            .expect("stats for a watched cgroup");
        assert_eq!(u.source, CpuSource::Ebpf);
        let waits = u.runq.clone().expect("eBPF fills the run-queue waits");
        (u, waits)
    };
    // Both spinners stopped: nothing of theirs is pending in either account.
    for s in &spinners {
        stopped(s.pid()).await;
    }
    let before: Vec<_> = [&heavy, &light].iter().map(|c| stats(c.id())).collect();
    let kernel_before: Vec<_> = spinners.iter().map(|s| schedstat(s.pid())).collect();
    for s in &mut spinners {
        // SAFETY: our own child.
        unsafe { libc::kill(s.pid() as i32, libc::SIGCONT) };
        s.release();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Asleep, they leave the run queue for good: both accounts are final.
    std::fs::write(&done, "").expect("writing the stop file");
    for s in &spinners {
        asleep(s.pid()).await;
    }
    let kernel: Vec<_> = spinners
        .iter()
        .zip(&kernel_before)
        .map(|(s, b)| {
            let a = schedstat(s.pid());
            (a.0 - b.0, a.1 - b.1, a.2 - b.2)
        })
        .collect();
    let after: Vec<_> = [&heavy, &light].iter().map(|c| stats(c.id())).collect();
    drop(spinners);
    let _ = std::fs::remove_file(&done);
    let [(h, hw), (l, lw)] = [0, 1].map(|i| {
        let ((u0, w0), (u1, w1)) = (&before[i], &after[i]);
        let mut u = u1.clone();
        u.usage_ns -= u0.usage_ns;
        let mut w = w1.clone();
        w.count -= w0.count;
        w.total_ns -= w0.total_ns;
        for (a, b) in w.hist.iter_mut().zip(w0.hist) {
            *a -= b;
        }
        (u, w)
    });
    for (name, (u, w), (oncpu, delay, arrivals)) in [
        ("heavy", (&h, &hw), kernel[0]),
        ("light", (&l, &lw), kernel[1]),
    ] {
        eprintln!(
            "{name}: eBPF on-CPU {} µs, waited {} µs in {} waits; schedstat on-CPU {} µs, run \
             delay {} µs in {arrivals} arrivals",
            u.usage_ns / 1000,
            w.total_ns / 1000,
            w.count,
            oncpu / 1000,
            delay / 1000
        );
        assert!(
            w.total_ns <= delay + 2_000_000 && w.count <= arrivals,
            "{name}: never more run-queue wait than the kernel's own run_delay"
        );
        assert!(
            w.total_ns as f64 >= delay as f64 * WAIT_SEEN_AT_LEAST,
            "{name}: at least {WAIT_SEEN_AT_LEAST} of the kernel's run_delay"
        );
        assert!(
            close(u.usage_ns, oncpu, 1.0),
            "{name}: on-CPU time as the kernel's own sum_exec_runtime"
        );
    }
    assert!(hw.count > 0 && lw.count > 0, "both waited");
    assert!(
        h.usage_ns > 3 * l.usage_ns,
        "the heavy cgroup ran much longer"
    );
    assert!(
        mean_wait_ns(&lw) > 3.0 * mean_wait_ns(&hw),
        "the light cgroup waited much longer per wait"
    );
    assert!(
        median_bucket(&lw) > median_bucket(&hw),
        "the light cgroup's histogram sits in higher buckets"
    );
}
