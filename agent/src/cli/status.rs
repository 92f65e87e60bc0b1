//! `qoslet status`: a live table of a running agent, refreshed in place.

use std::{fmt::Write as _, io::Write as _, net::SocketAddr, process::ExitCode, time::Duration};

use crate::hub::StatusSnapshot;

/// Where the agent listens by default (QosletConfiguration `metricsAddress`).
pub(crate) const DEFAULT_ADDR: &str = "127.0.0.1:9479";

#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// Address of the agent's HTTP endpoint.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub(crate) addr: SocketAddr,
    /// Print the table once and exit (for scripts and tests).
    #[arg(long)]
    pub(crate) once: bool,
}

pub(crate) fn run(args: StatusArgs) -> ExitCode {
    loop {
        match fetch(args.addr) {
            Ok(snapshot) => {
                let table = render(&snapshot);
                if args.once {
                    print!("{table}");
                    return ExitCode::SUCCESS;
                }
                // Clear the screen and move home, then draw: a refresh in place.
                print!("\x1b[2J\x1b[H{table}");
                let _ = std::io::stdout().flush();
            }
            Err(e) => {
                eprintln!("qoslet status: no agent answering on {}: {e}", args.addr);
                return ExitCode::FAILURE;
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn fetch(addr: SocketAddr) -> std::io::Result<StatusSnapshot> {
    super::http::get_json(addr, "/status")
}

/// Bytes as an operator reads them: `Mi` from 1 MiB up, `Ki` below (a small working set is
/// not `0Mi`), `-` when unknown.
fn mib(v: Option<i64>) -> String {
    match v {
        None => "-".into(),
        Some(b) if b.unsigned_abs() >= 1 << 20 => format!("{}Mi", b >> 20),
        Some(b) => format!("{}Ki", b >> 10),
    }
}

pub(crate) fn render(s: &StatusSnapshot) -> String {
    let mut out = String::new();
    let n = &s.node;
    let _ = writeln!(
        out,
        "qoslet ({}), memory available {}, MemoryPressure={} PIDPressure={}",
        n.mode,
        mib(n.memory_available_bytes),
        n.memory_pressure,
        n.pid_pressure
    );
    let _ = writeln!(out, "sensors: {}", n.sensors.join(", "));
    let _ = writeln!(
        out,
        "\n{:<32} {:<11} {:<18} {:>6} {:<24} {:>9} {:>9} {:>9} {:>10} {:>4}",
        "POD",
        "CLASS",
        "PHASE",
        "WEIGHT",
        "OOM_SCORE_ADJ",
        "WSS",
        "REQUEST",
        "LIMIT",
        "RUNQ p99",
        "RST"
    );
    for p in &s.pods {
        let _ = writeln!(
            out,
            "{:<32} {:<11} {:<18} {:>6} {:<24} {:>9} {:>9} {:>9} {:>10} {:>4}",
            format!("{}/{}", p.namespace, p.name),
            p.qos_class,
            p.phase,
            p.cpu_weight.map_or("-".into(), |w| w.to_string()),
            p.oom_score_adj.join(","),
            mib(p.working_set_bytes.map(|v| v as i64)),
            mib(p.memory_request_bytes),
            mib(p.memory_limit_bytes),
            p.runqueue_p99_seconds
                .map_or("-".into(), |v| format!("{:.2}ms", v * 1000.0)),
            p.restarts
        );
    }
    for p in s.pods.iter().filter(|p| p.message.is_some()) {
        let message = p.message.as_deref().unwrap_or_default();
        let _ = writeln!(out, "  {}/{}: {message}", p.namespace, p.name);
    }
    let _ = writeln!(out, "\nlast events:");
    for e in s.events.iter().rev().take(10) {
        let _ = writeln!(out, "  {} {} {}", e.time, e.pod, e.message);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::status::{EventRow, PodRow};

    #[test]
    fn renders_one_row_per_pod_and_the_newest_events_first() {
        let mut s = StatusSnapshot::default();
        s.node.mode = "observe".into();
        s.pods.push(PodRow {
            namespace: "shop".into(),
            name: "web".into(),
            qos_class: "Burstable".into(),
            phase: "Running".into(),
            cpu_weight: Some(30),
            oom_score_adj: vec!["app=321".into()],
            memory_request_bytes: Some(256 << 20),
            ..Default::default()
        });
        for i in 0..2 {
            s.events.push(EventRow {
                time: format!("t{i}"),
                pod: "shop/web".into(),
                message: format!("event {i}"),
            });
        }
        let table = render(&s);
        let row = table
            .lines()
            .find(|l| l.starts_with("shop/web"))
            .expect("pod row");
        assert!(row.contains("Burstable") && row.contains("app=321") && row.contains("256Mi"));
        let events: Vec<&str> = table.lines().filter(|l| l.contains("event ")).collect();
        assert_eq!(events, ["  t1 shop/web event 1", "  t0 shop/web event 0"]);
    }

    #[test]
    fn a_held_pod_says_why_under_the_table() {
        let mut s = StatusSnapshot::default();
        s.pods.push(PodRow {
            namespace: "ml".into(),
            name: "worker-0".into(),
            phase: "Pending (SchedulingGated)".into(),
            message: Some("waiting for PodGroup/train to exist".into()),
            ..Default::default()
        });
        let table = render(&s);
        assert!(
            table
                .lines()
                .any(|l| l == "  ml/worker-0: waiting for PodGroup/train to exist"),
            "{table}"
        );
    }

    #[test]
    fn sizes_below_a_mebibyte_are_shown_in_kibibytes() {
        assert_eq!(mib(Some(300 << 10)), "300Ki");
        assert_eq!(mib(Some(3 << 20)), "3Mi");
        assert_eq!(mib(None), "-");
        let mut s = StatusSnapshot::default();
        s.node.memory_available_bytes = Some(512 << 20);
        assert!(render(&s).contains("memory available 512Mi"));
    }
}
