//! The kernel table of docs/kernels.md: which hook each sensor runs on, per kernel, architecture and cgroup
//! layout, filled from the `QOSLET-SENSOR` lines that the root test
//! `each_sensor_runs_on_a_hook_of_the_table_or_its_fallback` (tests/tests/sensors_switches.rs)
//! prints on the host and in every VM of the matrix.

use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::Result;

/// The marker the test prints before each sensor's line.
pub const MARKER: &str = "QOSLET-SENSOR ";

/// One sensor on one kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SensorLine {
    pub kernel: String,
    pub arch: String,
    pub cgroup: String,
    pub sensor: String,
    /// `active`, `fallback` or `off`.
    pub mode: String,
    /// The hooks (comma-separated) or the fallback's description.
    pub source: String,
}

impl SensorLine {
    /// `QOSLET-SENSOR kernel=.. arch=.. cgroup=.. sensor=.. mode=.. source=<rest of the line>`,
    /// anywhere in `line` (console output may precede it).
    pub fn parse(line: &str) -> Option<Self> {
        let at = line.find(MARKER)?;
        let rest = &line[at + MARKER.len()..];
        let (fields, source) = rest.split_once(" source=")?;
        let field = |key: &str| {
            fields
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_owned)
        };
        Some(Self {
            kernel: field("kernel")?,
            arch: field("arch")?,
            cgroup: field("cgroup")?,
            sensor: field("sensor")?,
            mode: field("mode")?,
            source: source.trim().to_owned(),
        })
    }

    fn column(&self) -> (String, String, String) {
        (self.kernel.clone(), self.arch.clone(), self.cgroup.clone())
    }
}

/// Every sensor line of `lines`.
pub fn parse_all<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<SensorLine> {
    lines.into_iter().filter_map(SensorLine::parse).collect()
}

/// The markdown table: one row per sensor, one column per kernel run in the order first seen;
/// a cell is the hook(s) the sensor ran on, `fallback` or `off`.
pub fn markdown(lines: &[SensorLine], date: &str, command: &str) -> String {
    let mut columns: Vec<(String, String, String)> = Vec::new();
    let mut sensors: Vec<&str> = Vec::new();
    for l in lines {
        if !columns.contains(&l.column()) {
            columns.push(l.column());
        }
        if !sensors.contains(&l.sensor.as_str()) {
            sensors.push(&l.sensor);
        }
    }
    let mut out = format!(
        "Filled by `{command}` on {date} from the sensor lines of each run (`fallback`: the \
         sensor's fallback in the table above).\n\n| sensor |"
    );
    for (kernel, arch, cgroup) in &columns {
        let _ = write!(out, " {kernel} {arch} cgroup {cgroup} |");
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(columns.len()));
    out.push('\n');
    for sensor in sensors {
        let _ = write!(out, "| `{sensor}` |");
        for column in &columns {
            let cell = lines
                .iter()
                .find(|l| l.sensor == sensor && &l.column() == column)
                .map_or_else(|| "not run".to_owned(), cell);
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}

fn cell(line: &SensorLine) -> String {
    match line.mode.as_str() {
        "active" if line.source.contains('/') => format!("`{}`", compress(&line.source)),
        // memory_pressure: "PSI triggers".
        "active" => line.source.clone(),
        other => other.to_owned(),
    }
}

/// `a/b/p_x,a/b/p_y` -> `a/b/p_{x,y}`: hooks of one category in one cell.
fn compress(hooks: &str) -> String {
    let parts: Vec<&str> = hooks.split(',').collect();
    if parts.len() < 2 {
        return hooks.to_owned();
    }
    // The common prefix, cut after its last '/' or '_' so names stay whole words.
    let mut len = parts[0].len();
    for p in &parts[1..] {
        len = len.min(
            parts[0]
                .bytes()
                .zip(p.bytes())
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    let Some(cut) = parts[0][..len].rfind(['/', '_']).map(|i| i + 1) else {
        return hooks.to_owned();
    };
    let rests: Vec<&str> = parts.iter().map(|p| &p[cut..]).collect();
    format!("{}{{{}}}", &parts[0][..cut], rests.join(","))
}

/// Writes the table to `path` unless there is no sensor line; returns whether it did.
pub fn write(lines: &[SensorLine], command: &str, path: &Path) -> Result<bool> {
    if lines.is_empty() {
        return Ok(false);
    }
    std::fs::write(path, markdown(lines, &today(), command))?;
    Ok(true)
}

/// The UTC date, `2026-11-30`.
fn today() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "an unknown date".to_owned(), |d| d.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_and_fills_the_table() {
        let text = "\
[   9.1] noise\n\
test x ... QOSLET-SENSOR kernel=5.10.0-43-cloud-amd64 arch=x86_64 cgroup=v2 sensor=oom_victim mode=active source=tp_btf/mark_victim\n\
QOSLET-SENSOR kernel=5.10.0-43-cloud-amd64 arch=x86_64 cgroup=v2 sensor=memcg_events mode=fallback source=memory.events polling (v1: x)\n\
QOSLET-SENSOR kernel=6.12.1 arch=aarch64 cgroup=v2 sensor=oom_victim mode=active source=tracepoint/oom/mark_victim\n\
QOSLET-SENSOR kernel=6.12.1 arch=aarch64 cgroup=v2 sensor=process_lifecycle mode=active source=tracepoint/sched/sched_process_fork,tracepoint/sched/sched_process_exec\n";
        let lines = parse_all(text.lines());
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1].source, "memory.events polling (v1: x)");
        assert_eq!(lines[2].arch, "aarch64");
        let table = markdown(&lines, "2026-11-30", "cargo xtask vm-test");
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows[0],
            "| sensor | 5.10.0-43-cloud-amd64 x86_64 cgroup v2 | 6.12.1 aarch64 cgroup v2 |"
        );
        assert_eq!(
            rows[2],
            "| `oom_victim` | `tp_btf/mark_victim` | `tracepoint/oom/mark_victim` |"
        );
        assert_eq!(rows[3], "| `memcg_events` | fallback | not run |");
        assert_eq!(
            rows[4],
            "| `process_lifecycle` | not run | `tracepoint/sched/sched_process_{fork,exec}` |"
        );
        assert!(table.contains("on 2026-11-30"));
        assert_eq!(
            compress(
                "tracepoint/vmscan/mm_vmscan_memcg_reclaim_begin,tracepoint/vmscan/mm_vmscan_direct_reclaim_end"
            ),
            "tracepoint/vmscan/mm_vmscan_{memcg_reclaim_begin,direct_reclaim_end}"
        );
        assert_eq!(compress("tp_btf/a,fentry/b"), "tp_btf/a,fentry/b");
    }
}
