//! oom_score_adj for the processes of container cgroups: a scan over `cgroup.procs`, and a
//! per-process entry point the sensors call on fork/exec. Each process is handled through a
//! descriptor of its /proc directory, and its cgroup is checked through that same descriptor
//! before writing, so a reused pid never receives another container's score.

use std::{
    collections::HashMap,
    ffi::CString,
    fs::File,
    io::{self, Write as _},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use thiserror::Error;
use tracing::{debug, info, warn};

use super::{
    desired::DesiredState,
    fs::CgroupFs,
    layout::{Controller, Tree},
    name::CgroupPath,
    report::Mode,
};

/// The kubelet's and the runtime's own score (pkg/kubelet/qos/policy.go); qoslet's too.
pub(crate) const QOSLET_OOM_SCORE_ADJ: i32 = -999;

#[derive(Debug, Error)]
pub enum OomError {
    #[error("/proc/{pid}/oom_score_adj: cannot write {value}: {source}")]
    Write {
        pid: i32,
        value: i32,
        #[source]
        source: io::Error,
    },
    #[error("/proc/{pid}/{file}: cannot read: {source}")]
    Read {
        pid: i32,
        file: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{path}/cgroup.procs: cannot read: {source}")]
    Procs {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// The score of one process, changed or (observe mode) found different.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomWrite {
    pub pid: i32,
    pub(crate) cgroup: CgroupPath,
    pub old: i32,
    pub new: i32,
    /// False in observe mode.
    pub written: bool,
}

#[derive(Debug, Default)]
pub struct OomReport {
    pub writes: Vec<OomWrite>,
    pub errors: Vec<OomError>,
    /// Processes that exited (or moved) while being handled.
    pub(crate) gone: usize,
}

/// Which cgroup a process is in, as the caller knows it.
#[derive(Debug, Clone, Copy)]
pub enum CgroupRef<'a> {
    /// Relative to the node root.
    Path(&'a CgroupPath),
    /// The cgroup v2 id (kernfs inode in the v2 or unified tree), as the eBPF sensors report it.
    Id(u64),
}

/// The score each container cgroup's processes should have.
#[derive(Debug, Default)]
pub struct OomTargets {
    by_path: HashMap<CgroupPath, i32>,
    by_id: HashMap<u64, CgroupPath>,
}

impl OomTargets {
    /// Indexes the containers of `desired`; ids come from the v2/unified tree when there is one.
    pub fn new(fs: &CgroupFs, desired: &DesiredState) -> Self {
        let mut t = Self::default();
        let id_tree = fs.mounts().id_tree();
        for c in &desired.cgroups {
            let Some(score) = c.oom_score_adj else {
                continue;
            };
            t.by_path.insert(c.path.clone(), score);
            if let Some(tree) = id_tree
                && let Ok(id) = fs.inode(tree, &c.path)
            {
                t.by_id.insert(id, c.path.clone());
            }
        }
        t
    }

    pub(crate) fn lookup(&self, cgroup: CgroupRef<'_>) -> Option<(&CgroupPath, i32)> {
        let path = match cgroup {
            CgroupRef::Path(p) => p,
            CgroupRef::Id(id) => self.by_id.get(&id)?,
        };
        self.by_path.get_key_value(path).map(|(p, s)| (p, *s))
    }

    pub fn len(&self) -> usize {
        self.by_path.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_path.is_empty()
    }
}

/// Sets qoslet's own process to [`QOSLET_OOM_SCORE_ADJ`].
pub(crate) fn set_own_oom_score() -> io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", QOSLET_OOM_SCORE_ADJ.to_string())
}

/// Brings every process of every container cgroup to its container's score.
pub fn scan(fs: &CgroupFs, targets: &OomTargets, mode: Mode) -> OomReport {
    let mut report = OomReport::default();
    let Some(tree) = fs.mounts().procs_tree() else {
        return report;
    };
    for (path, score) in &targets.by_path {
        let procs = match fs.read(tree, path, "cgroup.procs") {
            Ok(p) => p,
            // Not started yet, or deleted meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(source) => {
                report.errors.push(OomError::Procs {
                    path: fs.display_path(tree, path).display().to_string(),
                    source,
                });
                continue;
            }
        };
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            set_score(fs, tree, pid, path, *score, mode, &mut report);
        }
    }
    report
}

/// For a process the sensors saw fork or exec in `cgroup`: gives it the container's score.
/// `Ok(None)` when the cgroup is not a container of ours, the score is already right, or the
/// process is gone.
pub fn apply_oom_score(
    fs: &CgroupFs,
    targets: &OomTargets,
    pid: i32,
    cgroup: CgroupRef<'_>,
    mode: Mode,
) -> Result<Option<OomWrite>, OomError> {
    let Some((path, score)) = targets.lookup(cgroup) else {
        return Ok(None);
    };
    let Some(tree) = fs.mounts().procs_tree() else {
        return Ok(None);
    };
    let mut report = OomReport::default();
    set_score(fs, tree, pid, path, score, mode, &mut report);
    if let Some(e) = report.errors.pop() {
        return Err(e);
    }
    Ok(report.writes.pop())
}

fn proc_dir(pid: i32) -> io::Result<OwnedFd> {
    let p = CString::new(format!("/proc/{pid}"))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a plain open of a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_in(dir: &OwnedFd, file: &str, flags: libc::c_int) -> io::Result<File> {
    let f = CString::new(file).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: openat relative to a directory descriptor we hold.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            f.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH))
}

/// Whether /proc/<pid>/cgroup puts the process in `expected` in `tree`.
fn in_cgroup(text: &str, tree: Tree, expected: &str) -> bool {
    text.lines().any(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let right_tree = match tree {
            Tree::V1(c) => ctrls.split(',').any(|x| x == c.name()),
            _ => ctrls.is_empty(),
        };
        right_tree && path == expected
    })
}

fn set_score(
    fs: &CgroupFs,
    tree: Tree,
    pid: i32,
    path: &CgroupPath,
    score: i32,
    mode: Mode,
    report: &mut OomReport,
) {
    // Not `read_to_string`, whose size hint costs a statx and an lseek per file of every process
    // the scan visits.
    let read = |dir: &OwnedFd, file: &'static str| -> Result<String, io::Error> {
        super::fs::read_small(open_in(dir, file, libc::O_RDONLY)?.into())
    };
    let dir = match proc_dir(pid) {
        Ok(d) => d,
        Err(e) if gone(&e) => {
            report.gone += 1;
            return;
        }
        Err(source) => {
            report.errors.push(OomError::Read {
                pid,
                file: "",
                source,
            });
            return;
        }
    };
    let mut expected = fs.node_root().clone();
    for c in path.components() {
        expected = expected.join(c).unwrap_or_else(|_| expected.clone());
    }
    let expected = expected.to_string();
    let check_tree = if tree == Tree::V1(Controller::Memory) {
        tree
    } else {
        Tree::V2
    };
    for file in ["cgroup", "oom_score_adj"] {
        let text = match read(&dir, file) {
            Ok(t) => t,
            Err(e) if gone(&e) => {
                report.gone += 1;
                return;
            }
            Err(source) => {
                report.errors.push(OomError::Read { pid, file, source });
                return;
            }
        };
        if file == "cgroup" {
            if !in_cgroup(&text, check_tree, &expected) {
                report.gone += 1;
                return;
            }
            continue;
        }
        let Ok(old) = text.trim().parse::<i32>() else {
            return;
        };
        if old == score {
            return;
        }
        let written = mode == Mode::Enforce;
        if written {
            let r = open_in(&dir, "oom_score_adj", libc::O_WRONLY)
                .and_then(|mut f| f.write_all(score.to_string().as_bytes()));
            match r {
                Ok(()) => debug!(pid, old, new = score, cgroup = %path, "oom_score_adj set."),
                Err(e) if gone(&e) => {
                    report.gone += 1;
                    return;
                }
                Err(source) => {
                    // Retried every scan; said once per process and value.
                    if first_time(&FAILED, pid, score) {
                        warn!(pid, value = score, error = %source, "oom_score_adj could not be set.");
                    }
                    report.errors.push(OomError::Write {
                        pid,
                        value: score,
                        source,
                    });
                    return;
                }
            }
        } else {
            // Compared every scan; said once per process and value.
            if first_time(&OBSERVED, pid, score) {
                info!(pid, old, new = score, cgroup = %path, "oom_score_adj differs from the plan (observe mode: not written).");
            }
        }
        report.writes.push(OomWrite {
            pid,
            cgroup: path.clone(),
            old,
            new: score,
            written,
        });
    }
}

/// The (pid, value) pairs already said, for a message that would otherwise repeat every scan.
type Said = std::sync::Mutex<Option<std::collections::HashSet<(i32, i32)>>>;
/// Writes that failed.
static FAILED: Said = std::sync::Mutex::new(None);
/// Differences seen in observe mode.
static OBSERVED: Said = std::sync::Mutex::new(None);

/// Whether this (pid, value) is new to `said`. Bounded: forgets everything past 4096 entries.
fn first_time(said: &Said, pid: i32, value: i32) -> bool {
    use std::collections::HashSet;
    let mut guard = crate::support::lock(said);
    let seen: &mut HashSet<(i32, i32)> = guard.get_or_insert_with(HashSet::new);
    if seen.len() > 4096 {
        seen.clear();
    }
    seen.insert((pid, value))
}

/// CAP_SYS_RESOURCE is what lets a process lower another's oom_score_adj below 0 (the kernel's
/// `oom_score_adj_min` check); without it Guaranteed (-997) and qoslet's own -999 cannot be set.
pub(crate) fn can_lower_scores() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    crate::support::privilege::effective_capabilities() & (1 << CAP_SYS_RESOURCE) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_membership_per_hierarchy() {
        let text = "12:pids:/a\n4:memory:/n/kubepods/pod1/c1\n0::/n/kubepods/pod1/c1\n";
        assert!(in_cgroup(
            text,
            Tree::V1(Controller::Memory),
            "/n/kubepods/pod1/c1"
        ));
        assert!(in_cgroup(text, Tree::V2, "/n/kubepods/pod1/c1"));
        assert!(!in_cgroup(
            text,
            Tree::V1(Controller::Memory),
            "/n/kubepods/pod1"
        ));
        assert!(!in_cgroup("4:memory:/x\n", Tree::V2, "/x"));
    }
}
