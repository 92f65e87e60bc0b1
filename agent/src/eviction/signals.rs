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
    sync::{Arc, OnceLock},
};

use thiserror::Error;

use super::held::HeldProc;
use crate::cgroup::{CgroupBeneath, Tree, fs::OpenRootError, value::flat_keyed};

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

/// A memory cgroup directory: of the v1 memory controller, or a cgroup v2 directory with the
/// memory controller enabled; its hierarchy says which. Every file is read through its held
/// descriptor or opened beneath the node root ([`CgroupBeneath::read_held_first`]).
#[derive(Debug, Clone)]
pub struct MemoryCgroup {
    dir: CgroupBeneath,
    /// Set once a read found this to be the root of a cgroup v2 hierarchy, which it stays: its
    /// reads then go to `/proc` at once, without the failing open of its usage file and the look
    /// for `cgroup.type` that found it (shared by the clones: the watcher's, the manager's).
    v2_root: Arc<OnceLock<()>>,
}

impl PartialEq for MemoryCgroup {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir
    }
}

impl Eq for MemoryCgroup {}

/// The files (and the `memory.stat` field) one hierarchy version reads.
struct Files {
    usage: &'static str,
    stat: &'static str,
    inactive_file: &'static str,
    limit: &'static str,
    oom: &'static str,
}

const V1_FILES: Files = Files {
    usage: "memory.usage_in_bytes",
    stat: "memory.stat",
    inactive_file: "total_inactive_file",
    limit: "memory.limit_in_bytes",
    oom: "memory.oom_control",
};

const V2_FILES: Files = Files {
    usage: "memory.current",
    stat: "memory.stat",
    inactive_file: "inactive_file",
    limit: "memory.max",
    oom: "memory.events",
};

/// One memory reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    pub(crate) usage_bytes: i64,
    pub(crate) inactive_file_bytes: i64,
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
    /// The memory directory `dir` (of the v2 tree, or of v1's memory controller).
    pub(crate) fn new(dir: CgroupBeneath) -> Self {
        Self {
            dir,
            v2_root: Arc::default(),
        }
    }

    /// `dir` as a node root of its own ([`CgroupBeneath::own`]; tests and benches).
    pub fn own(dir: &Path, tree: Tree) -> Result<Self, OpenRootError> {
        CgroupBeneath::own(dir, tree).map(Self::new)
    }

    pub fn dir(&self) -> &CgroupBeneath {
        &self.dir
    }

    /// Whether this is a cgroup v2 directory (else v1's memory controller).
    pub(crate) fn is_v2(&self) -> bool {
        self.dir.tree == Tree::V2
    }

    /// The full path, for reports.
    pub(crate) fn display(&self) -> PathBuf {
        self.dir.display()
    }

    fn names(&self) -> &'static Files {
        if self.is_v2() { &V2_FILES } else { &V1_FILES }
    }

    /// The file whose usage crossing a level the watchers wait for.
    pub(crate) fn usage_file(&self) -> &'static str {
        self.names().usage
    }

    /// Every file [`MemoryCgroup::read`] reads, by its directory.
    pub(crate) fn files(&self) -> [(&CgroupBeneath, &'static str); 3] {
        let f = self.names();
        [f.usage, f.stat, f.limit].map(|file| (&self.dir, file))
    }

    /// The files [`MemoryCgroup::working_set`] reads.
    pub(crate) fn working_set_files(&self) -> [(&CgroupBeneath, &'static str); 2] {
        let f = self.names();
        [f.usage, f.stat].map(|file| (&self.dir, file))
    }

    /// Usage only (one read), for the watchers' fast path.
    pub fn usage(&self) -> Result<i64, SignalError> {
        match self.own_usage()? {
            Some(usage) => Ok(usage),
            None => meminfo_usage(),
        }
    }

    /// The usage file's value; `None` on the v2 root, which has none.
    fn own_usage(&self) -> Result<Option<i64>, SignalError> {
        self.own_file(|| self.read_i64(self.usage_file()))
    }

    /// `read` of one of this directory's own files; `None` on the root of a cgroup v2 hierarchy,
    /// which has none: found by the first read that fails there, then known without a read.
    fn own_file<T>(
        &self,
        read: impl FnOnce() -> Result<T, SignalError>,
    ) -> Result<Option<T>, SignalError> {
        if self.v2_root.get().is_some() {
            return Ok(None);
        }
        match read() {
            Err(e) if self.is_v2_root(&e) => {
                let _ = self.v2_root.set(());
                Ok(None)
            }
            other => other.map(Some),
        }
    }

    /// What the watchers compare with their level, in one read: the usage file; on the v2 root
    /// the working set itself, `MemTotal - MemFree - Inactive(file)` of `/proc/meminfo`. The
    /// root's usage counts the whole page cache, so on a node with a warm cache it would sit
    /// above any level and wake the manager at every check.
    pub(crate) fn level_usage(&self) -> Result<i64, SignalError> {
        match self.own_usage()? {
            Some(usage) => Ok(usage),
            None => {
                let text = read_meminfo()?;
                meminfo_working_set_of(&text).ok_or_else(|| SignalError::Parse {
                    path: MEMINFO.into(),
                    content: text,
                })
            }
        }
    }

    /// Whether `e` (from reading one of its memory files) says this is the root of a cgroup v2
    /// hierarchy, which has none (only the root lacks `cgroup.type`).
    fn is_v2_root(&self, e: &SignalError) -> bool {
        self.is_v2()
            && matches!(e, SignalError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
            && self.dir.has_file("cgroup.type").is_ok_and(|has| !has)
    }

    pub fn read(&self) -> Result<MemoryReading, SignalError> {
        self.read_with_stat().map(|(r, _)| r)
    }

    /// The working set alone: the usage and `memory.stat`, not the limit (one read fewer, for
    /// the eviction manager's ranking and messages).
    pub(crate) fn working_set(&self) -> Result<i64, SignalError> {
        self.reading_without_limit().map(|r| r.working_set())
    }

    /// The usage and `inactive_file` of `memory.stat`; the limit is not read (`None`).
    pub(crate) fn reading_without_limit(&self) -> Result<MemoryReading, SignalError> {
        self.usage_and_stat().map(|(r, _, _)| r)
    }

    /// The usage (and whether this is the v2 root, which has none of its own) and `memory.stat`;
    /// the limit left at `None`.
    fn usage_and_stat(&self) -> Result<(MemoryReading, bool, String), SignalError> {
        let f = self.names();
        let (usage_bytes, root) = match self.own_usage()? {
            Some(usage) => (usage, false),
            None => (meminfo_usage()?, true),
        };
        let stat_text = self.read_file(f.stat)?;
        let inactive_file_bytes =
            stat_field(&stat_text, f.inactive_file).ok_or_else(|| SignalError::MissingField {
                path: self.dir.file_display(f.stat),
                field: f.inactive_file,
            })?;
        let reading = MemoryReading {
            usage_bytes,
            inactive_file_bytes,
            limit_bytes: None,
        };
        Ok((reading, root, stat_text))
    }

    /// The reading and the `memory.stat` text it came from (the Summary API takes more fields
    /// from the same read).
    pub(crate) fn read_with_stat(&self) -> Result<(MemoryReading, String), SignalError> {
        let (reading, root, stat_text) = self.usage_and_stat()?;
        let limit_bytes = if root { None } else { self.limit()? };
        Ok((
            MemoryReading {
                limit_bytes,
                ..reading
            },
            stat_text,
        ))
    }

    /// The memory limit alone (one read); `None` when unlimited.
    pub(crate) fn limit(&self) -> Result<Option<i64>, SignalError> {
        Ok(self
            .read_limit(self.names().limit)?
            .filter(|&l| l < V1_UNLIMITED))
    }

    /// The kernel's OOM-kill count (v2 `memory.events` `oom_kill`, which includes descendants;
    /// v1 `memory.oom_control` `oom_kill`, which counts only kills charged to this memcg itself).
    pub fn oom_kills(&self) -> Result<u64, SignalError> {
        let file = self.names().oom;
        let text = match self.own_file(|| self.read_file(file))? {
            Some(text) => text,
            None => read_proc(Path::new(VMSTAT))?,
        };
        stat_field(&text, "oom_kill")
            .map(|v| v.max(0) as u64)
            .ok_or_else(|| SignalError::MissingField {
                path: self.dir.file_display(file),
                field: "oom_kill",
            })
    }

    fn read_file(&self, file: &str) -> Result<String, SignalError> {
        read_beneath(&self.dir, file)
    }

    fn read_i64(&self, file: &str) -> Result<i64, SignalError> {
        read_i64_beneath(&self.dir, file)
    }

    fn read_limit(&self, file: &str) -> Result<Option<i64>, SignalError> {
        read_limit_beneath(&self.dir, file)
    }
}

/// A pids cgroup directory (v1 `/sys/fs/cgroup/pids/...` or a v2 directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PidsReading {
    pub(crate) current: i64,
    /// `None` for `max`.
    pub(crate) max: Option<i64>,
}

/// `pids.current` and `pids.max` of a pids cgroup (v1's pids controller or a v2 directory).
pub(crate) fn read_pids(dir: &CgroupBeneath) -> Result<PidsReading, SignalError> {
    Ok(PidsReading {
        current: read_i64_beneath(dir, "pids.current")?,
        max: read_limit_beneath(dir, "pids.max")?,
    })
}

/// The kubelet's pid capacity (pkg/kubelet/stats/pidlimit): the lower of `kernel.pid_max` and
/// `kernel.threads-max`, both system-wide limits on tasks; the capacity when the node root has no
/// `pids.max`. threads-max follows the memory: on a 2 GiB VM it was 15619 under a pid_max of
/// 4194304, and the kubelet's kubepods pids.max was 15619.
pub(crate) fn task_max() -> Result<i64, SignalError> {
    let path = Path::new("/proc/sys/kernel/pid_max");
    let pid_max = parse_i64(path.to_owned(), read_proc(path)?)?;
    // As the kubelet, a threads-max it cannot read or parse is left out.
    let threads_max = read_proc(Path::new("/proc/sys/kernel/threads-max"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    Ok(lower_task_limit(pid_max, threads_max))
}

fn lower_task_limit(pid_max: i64, threads_max: Option<i64>) -> i64 {
    threads_max.map_or(pid_max, |t| t.min(pid_max))
}

/// One value of a `key value` file (memory.stat, memory.events, memory.oom_control).
pub(crate) fn stat_field(text: &str, key: &str) -> Option<i64> {
    flat_keyed(text).find_map(|(k, v)| (k == key).then_some(v))
}

const MEMINFO: &str = "/proc/meminfo";
const VMSTAT: &str = "/proc/vmstat";

/// `/proc/meminfo`, held open from its first read: the v2 root's level check reads it every
/// 10 ms near the level and each pass once, one `pread` each.
static MEMINFO_HELD: HeldProc = HeldProc::new(MEMINFO);

fn read_meminfo() -> Result<String, SignalError> {
    MEMINFO_HELD.read().map_err(|source| SignalError::Read {
        path: MEMINFO.into(),
        source,
    })
}

/// `MemTotal - MemFree` of `/proc/meminfo`, in bytes: the v2 root's usage.
fn meminfo_usage() -> Result<i64, SignalError> {
    let text = read_meminfo()?;
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

/// A file of `dir`, held or opened beneath the node root.
fn read_beneath(dir: &CgroupBeneath, file: &str) -> Result<String, SignalError> {
    dir.read_held_first(file)
        .map_err(|source| SignalError::Read {
            path: dir.file_display(file),
            source,
        })
}

/// A number in a file of `dir`.
fn read_i64_beneath(dir: &CgroupBeneath, file: &str) -> Result<i64, SignalError> {
    parse_i64(dir.file_display(file), read_beneath(dir, file)?)
}

/// A limit in a file of `dir`: a number, or `max` as `None`.
fn read_limit_beneath(dir: &CgroupBeneath, file: &str) -> Result<Option<i64>, SignalError> {
    parse_limit(dir.file_display(file), read_beneath(dir, file)?)
}

/// A file of `/proc` (a fixed path, not input).
fn read_proc(path: &Path) -> Result<String, SignalError> {
    std::fs::read_to_string(path).map_err(|source| SignalError::Read {
        path: path.to_owned(),
        source,
    })
}

fn parse_i64(path: PathBuf, text: String) -> Result<i64, SignalError> {
    text.trim().parse().map_err(|_| SignalError::Parse {
        path,
        content: text,
    })
}

/// A number, or `max` (v2) as `None`.
fn parse_limit(path: PathBuf, text: String) -> Result<Option<i64>, SignalError> {
    match text.trim() {
        "max" => Ok(None),
        t => t.parse().map(Some).map_err(|_| SignalError::Parse {
            path,
            content: text,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, sync::Arc};

    use super::*;
    use crate::cgroup::{CgroupFs, CgroupPath, LayoutKind, Mounts, layout::Controller};

    const V1_MEMORY: Tree = Tree::V1(Controller::Memory);

    #[test]
    fn the_task_capacity_is_the_lower_of_pid_max_and_threads_max() {
        // A 2 GiB Debian VM (6.12): the kubelet's kubepods pids.max was threads-max.
        assert_eq!(lower_task_limit(4_194_304, Some(15_619)), 15_619);
        // The development host: pid_max is the lower.
        assert_eq!(lower_task_limit(32_768, Some(192_739)), 32_768);
        assert_eq!(lower_task_limit(32_768, None), 32_768);
    }

    struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// The files of a memory and pids cgroup of either version, as the kernel shows them.
    fn memory_files(dir: &Path) {
        fs::create_dir_all(dir).unwrap();
        for (file, text) in [
            ("memory.usage_in_bytes", "1000\n"),
            ("memory.limit_in_bytes", "4096\n"),
            ("memory.oom_control", "oom_kill 3\n"),
            ("memory.current", "1000\n"),
            ("memory.max", "4096\n"),
            ("memory.events", "oom_kill 3\n"),
            (
                "memory.stat",
                "inactive_file 100\ntotal_inactive_file 100\n",
            ),
            ("cgroup.type", "domain\n"),
            ("pids.current", "3\n"),
            ("pids.max", "max\n"),
        ] {
            fs::write(dir.join(file), text).unwrap();
        }
    }

    /// A node root whose memory cgroup directory, an ancestor of it, or one of its files, was
    /// replaced by a symlink to a directory outside the root holding readable memory and pids
    /// files: nothing is read there, and nothing falls back to `/proc` as the v2 root would.
    #[test]
    fn a_memory_cgroup_replaced_by_a_symlink_out_of_the_root_is_not_read() {
        let t = TempDir(
            std::env::temp_dir().join(format!("qoslet-signals-beneath-{}", std::process::id())),
        );
        let _ = fs::remove_dir_all(&t.0);
        let (root, outside) = (t.0.join("root"), t.0.join("outside"));
        memory_files(&root.join("kubepods/real"));
        memory_files(&outside);
        std::os::unix::fs::symlink(&outside, root.join("podlink")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("kubelink")).unwrap();
        fs::create_dir_all(root.join("filelink")).unwrap();
        for file in ["memory.current", "memory.usage_in_bytes", "pids.current"] {
            std::os::unix::fs::symlink(outside.join(file), root.join("filelink").join(file))
                .unwrap();
        }
        for tree in [Tree::V2, V1_MEMORY] {
            let fs = Arc::new(
                CgroupFs::open(
                    Mounts {
                        kind: LayoutKind::Unified,
                        trees: [(tree, root.clone())].into(),
                    },
                    CgroupPath::root(),
                )
                .unwrap(),
            );
            let dir = |path: &str| CgroupBeneath {
                fs: fs.clone(),
                tree,
                path: CgroupPath::parse(path).unwrap(),
            };
            // The control: a real directory is read, all of it.
            let real = MemoryCgroup::new(dir("/kubepods/real"));
            let r = real.read().unwrap();
            assert_eq!((r.working_set(), r.limit_bytes), (900, Some(4096)));
            assert_eq!(real.usage().unwrap(), 1000);
            assert_eq!(real.level_usage().unwrap(), 1000);
            assert_eq!(real.oom_kills().unwrap(), 3);
            assert_eq!(read_pids(real.dir()).unwrap().current, 3);
            assert!(real.dir().exists());
            assert!(real.dir().inode().is_ok());

            for path in ["/podlink", "/kubelink/x", "/kubelink", "/filelink"] {
                let m = MemoryCgroup::new(dir(path));
                let refused = |e: &SignalError| {
                    matches!(e, SignalError::Read { source, .. }
                        if matches!(source.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)))
                };
                let e = m.usage().expect_err(path);
                assert!(refused(&e), "{tree:?} {path}: {e:?}");
                let e = m.level_usage().expect_err(path);
                assert!(refused(&e), "{tree:?} {path}: {e:?}");
                let e = m.read().expect_err(path);
                assert!(refused(&e), "{tree:?} {path}: {e:?}");
                let e = read_pids(m.dir()).expect_err(path);
                assert!(refused(&e), "{tree:?} {path}: {e:?}");
                let usage = m
                    .dir()
                    .open_file(m.usage_file(), crate::cgroup::Access::Read);
                assert!(usage.is_err(), "{tree:?} {path}");
                assert!(m.dir().has_file(m.usage_file()).is_err(), "{tree:?} {path}");
                if path != "/filelink" {
                    assert!(m.oom_kills().is_err(), "{tree:?} {path}");
                    assert!(!m.dir().exists(), "{tree:?} {path}");
                    assert!(m.dir().inode().is_err(), "{tree:?} {path}");
                }
            }
        }
    }

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
        let r1 = MemoryCgroup::own(&v1, V1_MEMORY).unwrap().read().unwrap();
        assert_eq!((r1.working_set(), r1.limit_bytes), (700, None));
        let r2 = MemoryCgroup::own(&v2, Tree::V2).unwrap().read().unwrap();
        assert_eq!((r2.working_set(), r2.limit_bytes), (1500, Some(4096)));
        assert_eq!(
            read_pids(&CgroupBeneath::own(&v2, Tree::V2).unwrap()).unwrap(),
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
        let (root, child) = (
            MemoryCgroup::own(&root, Tree::V2).unwrap(),
            MemoryCgroup::own(&child, Tree::V2).unwrap(),
        );
        let r = root.read().unwrap();
        assert!(r.usage_bytes > 0 && r.limit_bytes.is_none());
        assert!((r.usage_bytes - machine).abs() < 1 << 30);
        assert!(root.usage().unwrap() > 0);
        assert!(root.oom_kills().is_ok());
        assert!(child.read().is_err());
        assert!(child.oom_kills().is_err());
        // Found to be the root, it stays the root: a `memory.current` there now (none appears on
        // a real root) is not looked at, the machine's usage still is.
        let level = root.level_usage().unwrap();
        fs::write(dir.join("root/memory.current"), "1\n").unwrap();
        assert!(root.usage().unwrap() > 1);
        assert!(root.clone().level_usage().unwrap() > 1);
        assert!((root.level_usage().unwrap() - level).abs() < 1 << 30);
        assert!(child.usage().is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
