//! Reading the eviction signals from cgroup files, fresh at every decision (REFERENCE §5;
//! pkg/kubelet/eviction/helpers.go `makeSignalObservations`). The only cgroup reads of the
//! eviction manager live here.
//!
//! - working set = usage - inactive_file, floor 0: v1 `memory.usage_in_bytes` minus
//!   `total_inactive_file` of `memory.stat`; v2 `memory.current` minus `inactive_file`.
//! - capacity of a node root (or kubepods) cgroup = its memory limit (v1
//!   `memory.limit_in_bytes`, v2 `memory.max`); an unlimited cgroup needs a capacity override.
//! - pid.available = pids.max - pids.current of the node root.
//! - the cgroup v2 root (the whole machine as the node) has no `memory.current`, `memory.max` nor
//!   `memory.events`: its usage is `MemTotal - MemFree` of `/proc/meminfo`, as cadvisor computes
//!   the root's usage on cgroup v2, it has no limit, and its OOM kills are `oom_kill` of
//!   `/proc/vmstat` (every kill on the machine).

use std::{
    io,
    path::{Path, PathBuf},
};

use thiserror::Error;

use crate::cgroup::value::flat_keyed;

/// v1 reports "no limit" as a page-rounded i64::MAX; anything at or above this is unlimited.
const V1_UNLIMITED: i64 = 1 << 62;

#[derive(Debug, Error)]
pub enum SignalError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: unexpected content {content:?}")]
    Parse { path: PathBuf, content: String },
    #[error("{path}: field {field} is missing")]
    MissingField { path: PathBuf, field: &'static str },
    #[error("{path} has no memory limit and no capacity was given")]
    NoCapacity { path: PathBuf },
}

/// A memory cgroup directory and the hierarchy version it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryCgroup {
    /// A directory of the v1 memory controller (`/sys/fs/cgroup/memory/...`).
    V1(PathBuf),
    /// A cgroup v2 directory with the memory controller enabled.
    V2(PathBuf),
}

/// One memory reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    pub usage_bytes: i64,
    pub inactive_file_bytes: i64,
    /// `None` when unlimited.
    pub limit_bytes: Option<i64>,
}

impl MemoryReading {
    /// usage - inactive_file, never negative (cadvisor's `setMemoryStats`).
    pub fn working_set(&self) -> i64 {
        (self.usage_bytes - self.inactive_file_bytes).max(0)
    }
}

impl MemoryCgroup {
    pub fn path(&self) -> &Path {
        match self {
            Self::V1(p) | Self::V2(p) => p,
        }
    }

    /// The file whose usage crossing a level the watchers wait for.
    pub fn usage_file(&self) -> PathBuf {
        match self {
            Self::V1(p) => p.join("memory.usage_in_bytes"),
            Self::V2(p) => p.join("memory.current"),
        }
    }

    /// Every file [`MemoryCgroup::read`] reads.
    pub fn files(&self) -> [PathBuf; 3] {
        match self {
            Self::V1(p) => [
                p.join("memory.usage_in_bytes"),
                p.join("memory.stat"),
                p.join("memory.limit_in_bytes"),
            ],
            Self::V2(p) => [
                p.join("memory.current"),
                p.join("memory.stat"),
                p.join("memory.max"),
            ],
        }
    }

    /// Usage only (one read), for the watchers' fast path.
    pub fn usage(&self) -> Result<i64, SignalError> {
        match read_i64(&self.usage_file()) {
            Err(e) if self.is_v2_root(&e) => meminfo_usage(),
            other => other,
        }
    }

    /// What the watchers compare with their level, in one read: the usage file; on the v2 root
    /// the working set itself, `MemTotal - MemFree - Inactive(file)` of `/proc/meminfo`. The
    /// root's usage counts the whole page cache, so on a node with a warm cache it would sit
    /// above any level and wake the manager at every check.
    pub fn level_usage(&self) -> Result<i64, SignalError> {
        match read_i64(&self.usage_file()) {
            Err(e) if self.is_v2_root(&e) => {
                let text = read(Path::new(MEMINFO))?;
                meminfo_working_set_of(&text).ok_or_else(|| SignalError::Parse {
                    path: MEMINFO.into(),
                    content: text,
                })
            }
            other => other,
        }
    }

    /// Whether `e` (from reading one of its memory files) says this is the root of a cgroup v2
    /// hierarchy, which has none (only the root lacks `cgroup.type`).
    fn is_v2_root(&self, e: &SignalError) -> bool {
        matches!(self, Self::V2(_))
            && matches!(e, SignalError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
            && !self.path().join("cgroup.type").exists()
    }

    pub fn read(&self) -> Result<MemoryReading, SignalError> {
        self.read_with_stat().map(|(r, _)| r)
    }

    /// The reading and the `memory.stat` text it came from (the Summary API takes more fields
    /// from the same read).
    pub fn read_with_stat(&self) -> Result<(MemoryReading, String), SignalError> {
        let (usage, stat, field, limit) = match self {
            Self::V1(p) => (
                p.join("memory.usage_in_bytes"),
                p.join("memory.stat"),
                "total_inactive_file",
                p.join("memory.limit_in_bytes"),
            ),
            Self::V2(p) => (
                p.join("memory.current"),
                p.join("memory.stat"),
                "inactive_file",
                p.join("memory.max"),
            ),
        };
        let (usage_bytes, root) = match read_i64(&usage) {
            Err(e) if self.is_v2_root(&e) => (meminfo_usage()?, true),
            other => (other?, false),
        };
        let stat_text = read(&stat)?;
        let inactive_file_bytes =
            stat_field(&stat_text, field).ok_or(SignalError::MissingField { path: stat, field })?;
        let limit_bytes = if root {
            None
        } else {
            read_limit(&limit)?.filter(|&l| l < V1_UNLIMITED)
        };
        Ok((
            MemoryReading {
                usage_bytes,
                inactive_file_bytes,
                limit_bytes,
            },
            stat_text,
        ))
    }

    /// The kernel's OOM-kill count (v2 `memory.events` `oom_kill`, which includes descendants;
    /// v1 `memory.oom_control` `oom_kill`, which counts only kills charged to this memcg itself).
    pub fn oom_kills(&self) -> Result<u64, SignalError> {
        let file = match self {
            Self::V1(p) => p.join("memory.oom_control"),
            Self::V2(p) => p.join("memory.events"),
        };
        let text = match read(&file) {
            Err(e) if self.is_v2_root(&e) => read(Path::new(VMSTAT))?,
            other => other?,
        };
        stat_field(&text, "oom_kill")
            .map(|v| v.max(0) as u64)
            .ok_or(SignalError::MissingField {
                path: file,
                field: "oom_kill",
            })
    }
}

/// A pids cgroup directory (v1 `/sys/fs/cgroup/pids/...` or a v2 directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidsReading {
    pub current: i64,
    /// `None` for `max`.
    pub max: Option<i64>,
}

pub fn read_pids(dir: &Path) -> Result<PidsReading, SignalError> {
    Ok(PidsReading {
        current: read_i64(&dir.join("pids.current"))?,
        max: read_limit(&dir.join("pids.max"))?,
    })
}

/// The pids of a `cgroup.procs` text.
pub fn parse_procs(text: &str) -> impl Iterator<Item = i32> + '_ {
    text.lines().filter_map(|l| l.trim().parse().ok())
}

/// `/proc/sys/kernel/pid_max`: the capacity when the node root has no `pids.max`.
pub fn pid_max() -> Result<i64, SignalError> {
    read_i64(Path::new("/proc/sys/kernel/pid_max"))
}

/// One value of a `key value` file (memory.stat, memory.events, memory.oom_control).
pub fn stat_field(text: &str, key: &str) -> Option<i64> {
    flat_keyed(text).find_map(|(k, v)| (k == key).then_some(v))
}

const MEMINFO: &str = "/proc/meminfo";
const VMSTAT: &str = "/proc/vmstat";

/// `MemTotal - MemFree` of `/proc/meminfo`, in bytes: the v2 root's usage.
fn meminfo_usage() -> Result<i64, SignalError> {
    let text = read(Path::new(MEMINFO))?;
    meminfo_usage_of(&text).ok_or_else(|| SignalError::Parse {
        path: MEMINFO.into(),
        content: text,
    })
}

/// A `/proc/meminfo` field in KiB.
fn meminfo_kib(text: &str, key: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn meminfo_usage_of(text: &str) -> Option<i64> {
    let kib = |key| meminfo_kib(text, key);
    Some((kib("MemTotal")? - kib("MemFree")?) * 1024)
}

/// `MemTotal - MemFree - Inactive(file)`, never negative.
fn meminfo_working_set_of(text: &str) -> Option<i64> {
    let kib = |key| meminfo_kib(text, key);
    Some(((kib("MemTotal")? - kib("MemFree")? - kib("Inactive(file)")?) * 1024).max(0))
}

fn read(path: &Path) -> Result<String, SignalError> {
    super::held::read_to_string(path).map_err(|source| SignalError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_i64(path: &Path) -> Result<i64, SignalError> {
    let text = read(path)?;
    text.trim().parse().map_err(|_| SignalError::Parse {
        path: path.to_owned(),
        content: text,
    })
}

/// A number, or `max` (v2) as `None`.
fn read_limit(path: &Path) -> Result<Option<i64>, SignalError> {
    let text = read(path)?;
    match text.trim() {
        "max" => Ok(None),
        t => t.parse().map(Some).map_err(|_| SignalError::Parse {
            path: path.to_owned(),
            content: text,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn working_set_subtracts_inactive_file_with_a_floor_of_zero() {
        let r = |u, i| MemoryReading {
            usage_bytes: u,
            inactive_file_bytes: i,
            limit_bytes: None,
        };
        assert_eq!(r(100, 30).working_set(), 70);
        assert_eq!(r(100, 130).working_set(), 0);
    }

    #[test]
    fn stat_fields_are_found_by_exact_key() {
        let text = "inactive_anon 5\ninactive_file 42\ntotal_inactive_file 7\n";
        assert_eq!(stat_field(text, "inactive_file"), Some(42));
        assert_eq!(stat_field(text, "total_inactive_file"), Some(7));
        assert_eq!(stat_field(text, "active_file"), None);
    }

    #[test]
    fn files_of_both_versions_are_read() {
        let dir = std::env::temp_dir().join(format!("qoslet-signals-{}", std::process::id()));
        let v1 = dir.join("v1");
        let v2 = dir.join("v2");
        fs::create_dir_all(&v1).unwrap();
        fs::create_dir_all(&v2).unwrap();
        fs::write(v1.join("memory.usage_in_bytes"), "1000\n").unwrap();
        fs::write(
            v1.join("memory.stat"),
            "inactive_file 1\ntotal_inactive_file 300\n",
        )
        .unwrap();
        fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        fs::write(v2.join("memory.current"), "2000\n").unwrap();
        fs::write(v2.join("memory.stat"), "anon 5\ninactive_file 500\n").unwrap();
        fs::write(v2.join("memory.max"), "4096\n").unwrap();
        fs::write(v2.join("pids.current"), "3\n").unwrap();
        fs::write(v2.join("pids.max"), "max\n").unwrap();
        let r1 = MemoryCgroup::V1(v1).read().unwrap();
        assert_eq!((r1.working_set(), r1.limit_bytes), (700, None));
        let r2 = MemoryCgroup::V2(v2.clone()).read().unwrap();
        assert_eq!((r2.working_set(), r2.limit_bytes), (1500, Some(4096)));
        assert_eq!(
            read_pids(&v2).unwrap(),
            PidsReading {
                current: 3,
                max: None
            }
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_v2_root_reads_meminfo_and_vmstat_and_a_child_does_not() {
        assert_eq!(
            meminfo_usage_of(
                "MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable: 500 kB\n"
            ),
            Some(800 * 1024)
        );
        assert_eq!(meminfo_usage_of("MemFree: 1 kB\n"), None);
        // The watcher's level on the root: the working set, page cache on the inactive list out.
        assert_eq!(
            meminfo_working_set_of(
                "MemTotal:       1000 kB\nMemFree:         200 kB\nInactive(anon):   7 kB\nInactive(file):   300 kB\n"
            ),
            Some(500 * 1024)
        );
        assert_eq!(
            meminfo_working_set_of("MemTotal: 1000 kB\nMemFree: 200 kB\n"),
            None
        );
        let dir = std::env::temp_dir().join(format!("qoslet-signals-root-{}", std::process::id()));
        let root = dir.join("root");
        let child = dir.join("child");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&child).unwrap();
        fs::write(root.join("memory.stat"), "inactive_file 4096\n").unwrap();
        fs::write(child.join("memory.stat"), "inactive_file 4096\n").unwrap();
        // Only a non-root v2 cgroup has cgroup.type: a child missing memory.current is an error.
        fs::write(child.join("cgroup.type"), "domain\n").unwrap();
        let machine = meminfo_usage().unwrap();
        let r = MemoryCgroup::V2(root.clone()).read().unwrap();
        assert!(r.usage_bytes > 0 && r.limit_bytes.is_none());
        assert!((r.usage_bytes - machine).abs() < 1 << 30);
        assert!(MemoryCgroup::V2(root.clone()).usage().unwrap() > 0);
        assert!(MemoryCgroup::V2(root).oom_kills().is_ok());
        assert!(MemoryCgroup::V2(child.clone()).read().is_err());
        assert!(MemoryCgroup::V2(child).oom_kills().is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
