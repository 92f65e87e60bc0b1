//! `qoslet recommend-reserved`: what `systemReserved` and `kubeReserved` should be, from what
//! the system and the kube daemons actually used over a window, beside OpenShift's fixed-formula
//! sizing, ending with the KubeletConfiguration fragment to paste.
//!
//! Samples are Summary API documents (`/stats/summary`): polled from a running agent
//! (`--from URL --window 10m --interval 10s`) or read from a file of JSON lines (`--samples`).
//! Which system containers count for what (the kubelet's names): `kubelet` and `runtime` are
//! kubeReserved; `misc` is systemReserved, or, without a `misc` container, whatever the node
//! uses beyond `pods`, `kubelet` and `runtime`. The I/O is here; the statistics are
//! crate::policy::reserved.

use std::{
    fmt::Write as _,
    fs,
    path::PathBuf,
    process::ExitCode,
    thread,
    time::{Duration, Instant},
};

use serde::Serialize;

use super::plan::{Output, machine_capacity, parse_capacity};
use crate::{
    config::CapacityOverride,
    exit,
    hub::{Summary, summary::ContainerStats},
    policy::{
        duration::parse_duration_nanos,
        reserved::{AutoSizing, Sized, openshift_auto_sizing, size},
    },
};

const MIB: u64 = 1 << 20;
/// usageNanoCores of one millicore.
const MILLICORE: u64 = 1_000_000;

#[derive(Debug, clap::Args)]
pub(crate) struct RecommendReservedArgs {
    /// A running agent to poll, e.g. `http://127.0.0.1:9479` (its `/stats/summary`).
    #[arg(long, value_name = "URL", conflicts_with = "samples")]
    pub(crate) from: Option<String>,
    /// Recorded samples instead: a file of Summary API documents, one JSON object a line.
    #[arg(long, value_name = "FILE")]
    pub(crate) samples: Option<PathBuf>,
    /// How long to poll (Go duration).
    #[arg(long, default_value = "10m")]
    pub(crate) window: String,
    /// How often to poll (Go duration).
    #[arg(long, default_value = "10s")]
    pub(crate) interval: String,
    /// Added to p99, in percent.
    #[arg(long, default_value_t = 10)]
    pub(crate) headroom_percent: u32,
    /// The node's capacity for the OpenShift formula, e.g. `cpu=4,memory=32Gi`; else this
    /// machine's.
    #[arg(long, value_name = "SPEC")]
    pub(crate) capacity: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) output: Output,
}

/// One sample: bytes of working set and nanocores, for the system and the kube daemons.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) system_memory: Option<u64>,
    pub(crate) system_cpu: Option<u64>,
    pub(crate) kube_memory: Option<u64>,
    pub(crate) kube_cpu: Option<u64>,
    /// The system figures are node - pods - kube (no `misc` container).
    pub(crate) system_derived: bool,
}

/// The kubelet's system container names: `kubelet` and `runtime` are the kube daemons, `misc`
/// the rest of the system, `pods` the pods (stats/v1alpha1 `SystemContainer*`).
pub(crate) fn sample(summary: &Summary) -> Sample {
    let containers = &summary.node.system_containers;
    let find = |name: &str| containers.iter().find(|c| c.name == name);
    let mem = |c: &ContainerStats| c.memory.as_ref().and_then(|m| m.working_set_bytes);
    let cpu = |c: &ContainerStats| c.cpu.as_ref().and_then(|c| c.usage_nano_cores);
    let sum = |f: &dyn Fn(&ContainerStats) -> Option<u64>| {
        ["kubelet", "runtime"]
            .iter()
            .filter_map(|n| find(n).and_then(f))
            .reduce(|a, b| a + b)
    };
    let (kube_memory, kube_cpu) = (sum(&mem), sum(&cpu));
    if let Some(misc) = find("misc") {
        return Sample {
            system_memory: mem(misc),
            system_cpu: cpu(misc),
            kube_memory,
            kube_cpu,
            system_derived: false,
        };
    }
    let pods = find("pods");
    let node_mem = summary
        .node
        .memory
        .as_ref()
        .and_then(|m| m.working_set_bytes);
    let node_cpu = summary.node.cpu.as_ref().and_then(|c| c.usage_nano_cores);
    let rest = |node: Option<u64>, pods: Option<u64>, kube: Option<u64>| {
        Some(
            node?
                .saturating_sub(pods?)
                .saturating_sub(kube.unwrap_or(0)),
        )
    };
    Sample {
        system_memory: rest(node_mem, pods.and_then(mem), kube_memory),
        system_cpu: rest(node_cpu, pods.and_then(cpu), kube_cpu),
        kube_memory,
        kube_cpu,
        system_derived: true,
    }
}

/// One reservation's sizing; `None` where no sample had the figure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Reservation {
    pub(crate) memory_bytes: Option<Sized>,
    pub(crate) cpu_nano_cores: Option<Sized>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Recommendation {
    /// Where the samples came from (URL or file) and over how long.
    pub(crate) source: String,
    pub(crate) samples: usize,
    /// Seconds between the first and the last sample, when polled.
    pub(crate) window_secs: Option<f64>,
    pub(crate) headroom_percent: u32,
    pub(crate) system_reserved: Reservation,
    /// Derived as node - pods - kubelet - runtime (no `misc` system container).
    pub(crate) system_derived: bool,
    pub(crate) kube_reserved: Reservation,
    pub(crate) openshift_auto_sizing: AutoSizing,
}

/// The statistics over the samples (pure).
pub(crate) fn recommend(
    samples: &[Sample],
    headroom_percent: u32,
    auto: AutoSizing,
    source: String,
    window_secs: Option<f64>,
) -> Recommendation {
    let collect = |f: fn(&Sample) -> Option<u64>| samples.iter().filter_map(f).collect::<Vec<_>>();
    let reservation =
        |mem: fn(&Sample) -> Option<u64>, cpu: fn(&Sample) -> Option<u64>| Reservation {
            memory_bytes: size(&collect(mem), headroom_percent, MIB),
            cpu_nano_cores: size(&collect(cpu), headroom_percent, MILLICORE),
        };
    Recommendation {
        source,
        samples: samples.len(),
        window_secs,
        headroom_percent,
        system_reserved: reservation(|s| s.system_memory, |s| s.system_cpu),
        system_derived: samples.iter().any(|s| s.system_derived),
        kube_reserved: reservation(|s| s.kube_memory, |s| s.kube_cpu),
        openshift_auto_sizing: auto,
    }
}

struct Failure {
    status: u8,
    line: String,
}

fn fail(status: u8, line: String) -> Failure {
    Failure { status, line }
}

pub(crate) fn run(args: RecommendReservedArgs) -> ExitCode {
    match recommend_reserved(&args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("qoslet recommend-reserved: {}", f.line);
            ExitCode::from(f.status)
        }
    }
}

fn recommend_reserved(args: &RecommendReservedArgs) -> Result<String, Failure> {
    let capacity =
        match &args.capacity {
            Some(spec) => parse_capacity(spec)
                .map_err(|m| fail(exit::PROBLEMS, format!("--capacity: {m}")))?,
            None => machine_capacity(&CapacityOverride::default())
                .map_err(|m| fail(exit::UNREADABLE, m))?,
        };
    let auto = openshift_auto_sizing(
        (capacity.cpu_millis / 1000) as u64,
        (capacity.memory_bytes >> 30) as u64,
    );
    let (summaries, source, window_secs) = match (&args.samples, &args.from) {
        (Some(file), _) => (read_samples(file)?, file.display().to_string(), None),
        (None, from) => {
            let url = from.as_deref().unwrap_or("http://127.0.0.1:9479");
            let (summaries, secs) = poll(url, args)?;
            (summaries, url.to_owned(), Some(secs))
        }
    };
    if summaries.is_empty() {
        return Err(fail(exit::PROBLEMS, format!("{source}: no samples")));
    }
    let samples: Vec<Sample> = summaries.iter().map(sample).collect();
    let r = recommend(&samples, args.headroom_percent, auto, source, window_secs);
    Ok(match args.output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(&r)
                .map_err(|e| fail(exit::PROBLEMS, format!("cannot encode: {e}")))?;
            s.push('\n');
            s
        }
        Output::Table => render(&r),
    })
}

fn read_samples(file: &PathBuf) -> Result<Vec<Summary>, Failure> {
    let text = fs::read_to_string(file).map_err(|e| {
        fail(
            exit::UNREADABLE,
            format!("{}: cannot read: {e}", file.display()),
        )
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                fail(
                    exit::PROBLEMS,
                    format!("{}:{}: not a Summary: {e}", file.display(), i + 1),
                )
            })
        })
        .collect()
}

fn duration(flag: &str, text: &str) -> Result<Duration, Failure> {
    let ns =
        parse_duration_nanos(text).map_err(|e| fail(exit::PROBLEMS, format!("--{flag}: {e}")))?;
    Ok(Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64))
}

/// Polls at `interval` until `window` has passed: samples at 0, interval, 2*interval, ... up to
/// and including the window's end. Returns them and the seconds they span.
fn poll(url: &str, args: &RecommendReservedArgs) -> Result<(Vec<Summary>, f64), Failure> {
    let (addr, path) = super::http::parse_url(url, "/stats/summary")
        .map_err(|m| fail(exit::PROBLEMS, format!("--from: {m}")))?;
    let window = duration("window", &args.window)?;
    let interval = duration("interval", &args.interval)?;
    if interval.is_zero() {
        return Err(fail(exit::PROBLEMS, "--interval: must be positive".into()));
    }
    let start = Instant::now();
    let mut out = Vec::new();
    let mut tick = 0u32;
    loop {
        let s: Summary = super::http::get_json(addr, &path)
            .map_err(|e| fail(exit::PROBLEMS, format!("{url}{path}: {e}")))?;
        out.push(s);
        tick += 1;
        let next = interval * tick;
        if next > window {
            break;
        }
        thread::sleep(next.saturating_sub(start.elapsed()));
    }
    Ok((out, start.elapsed().as_secs_f64()))
}

fn mib(v: u64) -> String {
    format!("{}Mi", v.div_ceil(MIB))
}

fn millicores(v: u64) -> String {
    format!("{}m", v.div_ceil(MILLICORE))
}

fn row(out: &mut String, what: &str, s: &Option<Sized>, unit: fn(u64) -> String) {
    let _ = match s {
        Some(s) => writeln!(
            out,
            "  {what:<8} {:>9} {:>9} {:>9} {:>13}",
            unit(s.p50),
            unit(s.p99),
            unit(s.max),
            unit(s.recommended)
        ),
        None => writeln!(
            out,
            "  {what:<8} {:>9} {:>9} {:>9} {:>13}",
            "-", "-", "-", "-"
        ),
    };
}

fn render(r: &Recommendation) -> String {
    let mut out = String::new();
    let window = r
        .window_secs
        .map_or(String::new(), |w| format!(" over {w:.1}s"));
    let _ = writeln!(out, "{} samples{window} from {}", r.samples, r.source);
    let _ = writeln!(
        out,
        "\n{:<10} {:>9} {:>9} {:>9} {:>13}",
        "",
        "p50",
        "p99",
        "max",
        format!("p99+{}%", r.headroom_percent)
    );
    let derived = if r.system_derived {
        " (node - pods - kubelet - runtime: no misc system container)"
    } else {
        " (misc)"
    };
    for (label, res) in [
        (format!("systemReserved{derived}"), &r.system_reserved),
        (
            "kubeReserved (kubelet + runtime)".to_owned(),
            &r.kube_reserved,
        ),
    ] {
        let _ = writeln!(out, "{label}");
        row(&mut out, "memory", &res.memory_bytes, mib);
        row(&mut out, "cpu", &res.cpu_nano_cores, millicores);
    }
    let a = &r.openshift_auto_sizing;
    let _ = writeln!(
        out,
        "\nOpenShift automatic node sizing for {} CPUs and {} GiB (one systemReserved for all):\n  cpu {} ({}m), memory {}",
        a.cpus, a.memory_gib, a.cpu, a.cpu_millis, a.memory
    );
    let _ = writeln!(out, "\nKubeletConfiguration:");
    for (key, res) in [
        ("systemReserved", &r.system_reserved),
        ("kubeReserved", &r.kube_reserved),
    ] {
        let mem = res.memory_bytes.map(|s| mib(s.recommended));
        let cpu = res.cpu_nano_cores.map(|s| millicores(s.recommended));
        if mem.is_none() && cpu.is_none() {
            continue;
        }
        let _ = writeln!(out, "{key}:");
        if let Some(cpu) = cpu {
            let _ = writeln!(out, "  cpu: {cpu}");
        }
        if let Some(mem) = mem {
            let _ = writeln!(out, "  memory: {mem}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::summary::{CpuStats, MemoryStats, NodeStats};

    fn container(name: &str, mem: u64, cpu: u64) -> ContainerStats {
        ContainerStats {
            name: name.into(),
            memory: Some(MemoryStats {
                working_set_bytes: Some(mem),
                ..MemoryStats::default()
            }),
            cpu: Some(CpuStats {
                usage_nano_cores: Some(cpu),
                ..CpuStats::default()
            }),
            ..ContainerStats::default()
        }
    }

    fn summary(node: (u64, u64), containers: Vec<ContainerStats>) -> Summary {
        Summary {
            node: NodeStats {
                system_containers: containers,
                memory: Some(MemoryStats {
                    working_set_bytes: Some(node.0),
                    ..MemoryStats::default()
                }),
                cpu: Some(CpuStats {
                    usage_nano_cores: Some(node.1),
                    ..CpuStats::default()
                }),
                ..NodeStats::default()
            },
            pods: Vec::new(),
        }
    }

    #[test]
    fn system_containers_map_to_the_two_reservations() {
        let s = sample(&summary(
            (1000, 100),
            vec![
                container("pods", 500, 50),
                container("kubelet", 100, 10),
                container("runtime", 50, 5),
                container("misc", 200, 20),
            ],
        ));
        assert_eq!(
            s,
            Sample {
                system_memory: Some(200),
                system_cpu: Some(20),
                kube_memory: Some(150),
                kube_cpu: Some(15),
                system_derived: false,
            }
        );
        // No misc: the system is what the node uses beyond pods and the kube daemons.
        let s = sample(&summary(
            (1000, 100),
            vec![container("pods", 500, 50), container("kubelet", 100, 10)],
        ));
        assert_eq!(
            (s.system_memory, s.system_cpu, s.system_derived),
            (Some(400), Some(40), true)
        );
        // Only pods: no kube figures at all.
        let s = sample(&summary((1000, 100), vec![container("pods", 900, 90)]));
        assert_eq!((s.kube_memory, s.system_memory), (None, Some(100)));
    }
}
