//! Two cgroups competing for CPU 0 with very different CPU weights: the light one waits longer
//! on the run queue and runs less, as the scheduler programs' per-cgroup stats show.

mod sensors_common;

use std::time::Duration;

use qoslet::sensors::cpu_usage::RunQueueWaits;
use qoslet::sensors::{CpuSource, SensorMode, SensorsConfig};
use qoslet_tests::require_root;
use sensors_common::{Cgroups, Script, start, status};

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
    let mut spinners = Vec::new();
    for cg in [&heavy, &light] {
        let s = Script::spawn("while :; do :; done");
        // Pin after joining: on Linux 6.1 a cgroup v2 cpuset attach resets the affinity.
        cg.add(s.pid());
        s.pin_to_cpu0();
        spinners.push(s);
    }
    for s in &mut spinners {
        s.release();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(spinners);

    let stats = |id: u64| {
        let u = sensors
            .cpu_stats(id)
            .expect("reading CPU_STATS")
            .expect("stats for a watched cgroup");
        assert_eq!(u.source, CpuSource::Ebpf);
        let waits = u.runq.clone().expect("eBPF fills the run-queue waits");
        (u, waits)
    };
    let (h, hw) = stats(heavy.id());
    let (l, lw) = stats(light.id());
    eprintln!(
        "heavy: on-CPU {} ms, {} waits, mean {:.0} µs, median bucket {}; light: on-CPU {} ms, {} waits, mean {:.0} µs, median bucket {}",
        h.usage_ns / 1_000_000,
        hw.count,
        mean_wait_ns(&hw) / 1e3,
        median_bucket(&hw),
        l.usage_ns / 1_000_000,
        lw.count,
        mean_wait_ns(&lw) / 1e3,
        median_bucket(&lw)
    );
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
