//! The kernel programs' diagnostics (`ebpf.kernelDiagnostics`) reach the agent's `tracing` log
//! through aya-log, and say nothing when off.
//!
//! The rare path provoked: a watched cgroup that finds every CPU slot taken keeps its statistics
//! in the `CPU_STATS` hash, which `sched_switch` reports once per CPU. The slots are filled with
//! watched ids no cgroup has.

mod sensors_common;

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use qoslet::sensors::{SensorMode, Sensors, SensorsConfig, WatchedCgroup, kernel_log};
use qoslet_common::sched::CPU_SLOTS;
use qoslet_tests::require_root;
use sensors_common::{Cgroups, Script, start, status};

/// Everything the process logs through `tracing`, as the agent's formatter writes it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines_with(&self, needle: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned();
        text.lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

/// The process-wide subscriber, installed once.
fn captured() -> Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Captured::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        log
    })
    .clone()
}

/// Watches ids no cgroup has until every CPU slot is taken.
fn fill_slots(sensors: &Sensors) {
    let taken = || {
        sensors
            .with_ebpf(|e| e.slot_index_entries())
            .expect("eBPF loaded")
            .expect("reading SLOT_INDEX")
    };
    // Far above any real cgroup id; two ids may share both index places, so more than
    // CPU_SLOTS may be needed.
    for i in 0..4 * u64::from(CPU_SLOTS) {
        if i >= u64::from(CPU_SLOTS) && taken() == CPU_SLOTS as usize {
            return;
        }
        sensors.watch(WatchedCgroup {
            id: (1 << 48) + i,
            v2_dir: None,
            memory_dir: None,
            cpu_dir: None,
        });
    }
    assert_eq!(taken(), CPU_SLOTS as usize, "every CPU slot taken");
}

/// Runs a task that sleeps and wakes in a watched cgroup without a slot until the scheduler
/// program has counted it, then gives a kernel record time to reach the log. Returns the log
/// lines naming the cgroup, and the size of `sched_switch` after the verifier.
async fn overflow_cgroup_logs(diagnostics: bool) -> Option<(Vec<String>, u32)> {
    let log = captured();
    let (sensors, _rx) = start(SensorsConfig {
        kernel_diagnostics: diagnostics,
        ..SensorsConfig::default()
    });
    let s = status(&sensors, "cpu_runqueue");
    assert_eq!(s.mode, SensorMode::Active, "sched_switch attached: {s:?}");
    let (size, _) = sensors
        .with_ebpf(|e| e.program_size("sched_switch"))
        .flatten()
        .expect("sched_switch's size");
    if !diagnostics {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u32;
        assert_eq!(
            sensors
                .with_ebpf(|e| e.ring_bytes(kernel_log::RING))
                .flatten(),
            Some(page),
            "off, aya-log's ring buffer is one page"
        );
    }
    // Off, the agent runs no reader: start one, so that a record written anyway is seen.
    let _off_reader = (!diagnostics).then(|| {
        let reader = sensors
            .with_ebpf(qoslet::sensors::EbpfSensors::kernel_log_reader)
            .expect("eBPF loaded")
            .expect("AYA_LOGS opened");
        tokio::spawn(reader.run())
    });
    let cg = Cgroups::create(&[])?;
    fill_slots(&sensors);
    sensors.watch(cg.watched());
    let mut script = Script::spawn("i=0; while [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done");
    cg.add(script.pid());
    script.release();
    let id = cg.id();
    let needle = format!("Watched cgroup {id} has no CPU slot");
    let counted = || {
        sensors
            .cpu_stats(id)
            .expect("reading CPU_STATS")
            .and_then(|u| u.runq)
            .is_some_and(|r| r.count > 5)
    };
    for _ in 0..200 {
        if counted() && (!diagnostics || !log.lines_with(&needle).is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counted(), "sched_switch counted the cgroup's switches");
    // A record is read as soon as it is written; leave the reader time anyway.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lines = log.lines_with(&needle);
    drop(script);
    drop(sensors);
    Some((lines, size))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_diagnostics_reach_the_log_only_when_switched_on() {
    require_root();
    let Some((off, size_off)) = overflow_cgroup_logs(false).await else {
        return;
    };
    assert!(off.is_empty(), "diagnostics off logged: {off:?}");

    let Some((on, size_on)) = overflow_cgroup_logs(true).await else {
        return;
    };
    eprintln!(
        "sched_switch after the verifier: {size_off} bytes off, {size_on} on; {} lines, first: {:?}",
        on.len(),
        on.first()
    );
    // Off, the verifier removed the logging branches it proved dead.
    assert!(
        size_off < size_on,
        "sched_switch is {size_off} bytes off, {size_on} on"
    );
    assert!(!on.is_empty(), "no kernel diagnostic logged for the cgroup");
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    for line in &on {
        assert!(
            line.contains(" WARN ") && line.contains(kernel_log::TARGET),
            "a warning under {}: {line}",
            kernel_log::TARGET
        );
        assert!(line.contains("sched.rs:"), "names its source: {line}");
    }
    // Once per CPU while its copy has recorded nothing; a copy the switch touched but did not
    // add to (a task switched out before it ever arrived) may say it again.
    assert!(
        on.len() <= 4 * cpus,
        "{} lines for {cpus} CPUs: {on:?}",
        on.len()
    );
}
