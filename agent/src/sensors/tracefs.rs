//! tracefs: mounted when missing (classic tracepoints need it), and tracepoint record layouts
//! read from its `format` files, so no field offset is hard-coded for one kernel.

use std::{collections::HashMap, fs, io, path::Path};

use qoslet_common::LifecycleTracepointLayout;

use super::SensorError;

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// Returns the tracefs root, mounting tracefs at `/sys/kernel/tracing` when neither usual place
/// has it.
pub(crate) fn ensure_mounted() -> Result<&'static str, SensorError> {
    for root in [TRACEFS, DEBUGFS_TRACING] {
        if Path::new(root).join("events").is_dir() {
            return Ok(root);
        }
    }
    nix::mount::mount(
        Some("tracefs"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|errno| SensorError::Tracefs {
        path: TRACEFS.into(),
        source: io::Error::from(errno),
    })?;
    tracing::info!(path = TRACEFS, "Mounted tracefs.");
    Ok(TRACEFS)
}

/// A field of a tracepoint record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) offset: u32,
    pub(crate) size: u32,
}

/// Reads `events/<category>/<name>/format` under `root`.
pub(crate) fn read_format(
    root: &str,
    category: &str,
    name: &str,
) -> io::Result<HashMap<String, Field>> {
    let text = fs::read_to_string(
        Path::new(root)
            .join("events")
            .join(category)
            .join(name)
            .join("format"),
    )?;
    Ok(parse_format(&text))
}

/// Parses the `field:<decl>; offset:N; size:N; signed:N;` lines of a format file.
pub(crate) fn parse_format(text: &str) -> HashMap<String, Field> {
    let mut fields = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("field:") else {
            continue;
        };
        let mut parts = rest.split(';').map(str::trim);
        let Some(decl) = parts.next() else { continue };
        let mut offset = None;
        let mut size = None;
        for p in parts {
            if let Some(v) = p.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = p.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        // The name is the last identifier of the declaration, before any array suffix.
        let name = decl
            .split_whitespace()
            .last()
            .map(|n| n.split('[').next().unwrap_or(n).to_owned());
        if let (Some(name), Some(offset), Some(size)) = (name, offset, size) {
            fields.insert(name, Field { offset, size });
        }
    }
    fields
}

/// Offsets of the score, process and cgroup lifecycle tracepoints; a tracepoint whose format
/// cannot be read leaves its fields `ABSENT` (its program then does nothing).
pub(crate) fn lifecycle_layout(root: &str) -> LifecycleTracepointLayout {
    let mut l = LifecycleTracepointLayout::UNSET;
    let at = |fields: &HashMap<String, Field>, name: &str| {
        fields
            .get(name)
            .map_or(LifecycleTracepointLayout::ABSENT, |f| f.offset)
    };
    if let Ok(f) = read_format(root, "oom", "oom_score_adj_update") {
        l.score_pid = at(&f, "pid");
        l.score_comm = at(&f, "comm");
        l.score_adj = at(&f, "oom_score_adj");
    }
    if let Ok(f) = read_format(root, "sched", "sched_process_fork") {
        l.fork_parent_pid = at(&f, "parent_pid");
        l.fork_child_pid = at(&f, "child_pid");
    }
    if let Ok(f) = read_format(root, "sched", "sched_process_exec") {
        l.exec_pid = at(&f, "pid");
    }
    // mkdir and rmdir share one event class, so one format serves both.
    if let Ok(f) = read_format(root, "cgroup", "cgroup_mkdir") {
        l.cgroup_root = at(&f, "root");
        l.cgroup_level = at(&f, "level");
        l.cgroup_id = at(&f, "id");
        l.cgroup_path = at(&f, "path");
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK_VICTIM_6_18: &str = "name: mark_victim\nID: 609\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;\n\tfield:unsigned long anon_rss;\toffset:24;\tsize:8;\tsigned:0;\n\tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;\n";

    #[test]
    fn parses_field_offsets_of_a_real_format_file() {
        let fields = parse_format(MARK_VICTIM_6_18);
        assert_eq!(fields["pid"], Field { offset: 8, size: 4 });
        assert_eq!(
            fields["comm"],
            Field {
                offset: 12,
                size: 4
            }
        );
        assert_eq!(
            fields["anon_rss"],
            Field {
                offset: 24,
                size: 8
            }
        );
        assert_eq!(
            fields["oom_score_adj"],
            Field {
                offset: 64,
                size: 2
            }
        );
        assert!(!fields.contains_key("file_rss"));
    }
}
