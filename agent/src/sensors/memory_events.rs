//! Fallback memcg events: deltas of `memory.events` (cgroup v2) or of `memory.failcnt` and
//! `memory.oom_control` (cgroup v1), read by a poller when no kernel hook reports them.

use std::{
    fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use super::event::{MemcgEventKind, SensorEvent};
use crate::cgroup::value::flat_keyed;

/// The counters of one memory cgroup, as last read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryCounts {
    pub high: u64,
    pub max: u64,
    pub oom: u64,
    pub oom_kill: u64,
    pub oom_group_kill: u64,
}

/// Reads the counters of `dir`, a v2 cgroup with `memory.events` or a v1 memory cgroup.
pub fn read_counts(dir: &Path) -> io::Result<MemoryCounts> {
    match fs::read_to_string(dir.join("memory.events")) {
        Ok(text) => Ok(parse_memory_events(&text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let failcnt = fs::read_to_string(dir.join("memory.failcnt"))?;
            let oom_control = fs::read_to_string(dir.join("memory.oom_control"))?;
            Ok(parse_v1(&failcnt, &oom_control))
        }
        Err(e) => Err(e),
    }
}

/// `memory.events`: `high N`, `max N`, `oom N`, `oom_kill N`, `oom_group_kill N`, ...
pub fn parse_memory_events(text: &str) -> MemoryCounts {
    let mut c = MemoryCounts::default();
    for (key, v) in flat_keyed(text) {
        match key {
            "high" => c.high = v,
            "max" => c.max = v,
            "oom" => c.oom = v,
            "oom_kill" => c.oom_kill = v,
            "oom_group_kill" => c.oom_group_kill = v,
            _ => {}
        }
    }
    c
}

/// v1: `memory.failcnt` counts charges that hit the limit (`max`); `memory.oom_control` has
/// `under_oom 0|1` and, since Linux 4.13, `oom_kill N`. `oom` counts being under OOM now.
pub fn parse_v1(failcnt: &str, oom_control: &str) -> MemoryCounts {
    let mut c = MemoryCounts {
        max: failcnt.trim().parse().unwrap_or(0),
        ..MemoryCounts::default()
    };
    for (key, v) in flat_keyed(oom_control) {
        match key {
            "under_oom" => c.oom = v,
            "oom_kill" => c.oom_kill = v,
            _ => {}
        }
    }
    c
}

/// One polled memory cgroup.
#[derive(Debug)]
pub struct MemoryEventsWatch {
    pub memcg_id: u64,
    pub dir: PathBuf,
    last: MemoryCounts,
}

impl MemoryEventsWatch {
    /// Starts from the current counts, so only later events are reported.
    pub fn new(dir: PathBuf) -> io::Result<Self> {
        let memcg_id = fs::metadata(&dir)?.ino();
        let last = read_counts(&dir)?;
        Ok(Self {
            memcg_id,
            dir,
            last,
        })
    }

    /// Appends one event per counter that grew since the last poll.
    pub fn poll(&mut self, boot_ns: u64, out: &mut Vec<SensorEvent>) -> io::Result<()> {
        let now = read_counts(&self.dir)?;
        let deltas = [
            (MemcgEventKind::High, now.high, self.last.high),
            (MemcgEventKind::Max, now.max, self.last.max),
            // v1 `under_oom` is a level (0 or 1), not a counter: a rise is one OOM.
            (MemcgEventKind::Oom, now.oom, self.last.oom),
            (MemcgEventKind::OomKill, now.oom_kill, self.last.oom_kill),
            (
                MemcgEventKind::OomGroupKill,
                now.oom_group_kill,
                self.last.oom_group_kill,
            ),
        ];
        for (kind, now, before) in deltas {
            if now > before {
                out.push(SensorEvent::Memcg {
                    memcg_id: self.memcg_id,
                    kind,
                    count: now - before,
                    pid: 0,
                    boot_ns,
                });
            }
        }
        self.last = now;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v2_and_v1_counters() {
        let v2 =
            parse_memory_events("low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n");
        assert_eq!(
            v2,
            MemoryCounts {
                high: 12,
                max: 3,
                oom: 1,
                oom_kill: 1,
                oom_group_kill: 0
            }
        );
        let v1 = parse_v1("42\n", "oom_kill_disable 0\nunder_oom 1\noom_kill 2\n");
        assert_eq!((v1.max, v1.oom, v1.oom_kill), (42, 1, 2));
    }
}
