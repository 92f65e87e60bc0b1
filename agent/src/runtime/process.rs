//! Starting a container's process inside its cgroups (never outside them), and signalling the
//! processes of those cgroups (never any other). Their files are opened beneath the node root.

use std::{
    fs::File,
    io::{self, Write as _},
    os::fd::{AsRawFd as _, OwnedFd, RawFd},
    path::{Path, PathBuf},
    process::Stdio,
};

use nix::{sys::signal::Signal, unistd::Pid};
use thiserror::Error;
use tokio::process::{Child, Command};

use super::{
    logs::LogError,
    spec::{ContainerCgroups, ContainerSpec},
};
use crate::{
    cgroup::CgroupBeneath,
    support::beneath::{self, RESOLVE_STRICT},
};

/// A container process could not be started.
#[derive(Debug, Error)]
pub(crate) enum ProcessError {
    #[error("the container has no cgroup of its own; it is not started outside the node's cgroups")]
    NoCgroup,
    #[error("cgroup {path} is shared with another container of the node; it is not started in it")]
    SharedCgroup { path: PathBuf },
    #[error("{path}: cannot open to join the cgroup: {source}{hint}", hint = crate::support::privilege_hint(.source))]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a cgroup directory; the container is not started")]
    NotCgroup { path: PathBuf },
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("log file {path} is in use by another container; the container is not started")]
    SharedLog { path: PathBuf },
    #[error("cannot start {command:?}: {source}{hint}", hint = crate::support::privilege_hint(.source))]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
}

impl ProcessError {
    /// The container could not be created (placement, log): the kubelet's
    /// `CreateContainerError`. Otherwise its command failed to start (`StartError`).
    pub(crate) fn is_create_error(&self) -> bool {
        !matches!(self, Self::Spawn { .. })
    }
}

/// Starts the container's command with its environment and working directory, stdout and
/// stderr going to `log`, already inside every cgroup of `spec.cgroups` when it execs: the
/// child writes its own pid into each `cgroup.procs` between fork and exec (`pre_exec`), so
/// nothing it runs or forks ever exists outside them. A container without cgroups, or whose
/// cgroups cannot be opened, is not started.
pub(crate) fn spawn(
    spec: &ContainerSpec,
    log: File,
    log_path: &Path,
) -> Result<Child, ProcessError> {
    let procs = open_procs(&spec.cgroups)?;
    let log_err = |source: io::Error| {
        ProcessError::Log(LogError::Create {
            path: log_path.to_path_buf(),
            source,
        })
    };
    let err = log.try_clone().map_err(log_err)?;
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.working_dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        // Its own process group: a Ctrl-C at the agent's terminal must not reach the pods,
        // which are stopped gracefully instead.
        .process_group(0)
        .kill_on_drop(false);
    let fds: Vec<RawFd> = procs.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    // SAFETY: the closure runs between fork and exec; it only calls write(2) on descriptors
    // opened above (kept open by `procs` until spawn returns) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                // "0" moves the writing process itself into the cgroup.
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
        command: spec.argv.join(" "),
        source,
    });
    drop(procs);
    child
}

/// cgroupfs magic numbers (`include/uapi/linux/magic.h`).
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// `cgroup.procs` of every directory, opened before the fork.
fn open_procs(cgroups: &ContainerCgroups) -> Result<Vec<OwnedFd>, ProcessError> {
    if cgroups.dirs.is_empty() {
        return Err(ProcessError::NoCgroup);
    }
    cgroups
        .dirs
        .iter()
        .map(|d| open_cgroup_file(d, "cgroup.procs"))
        .collect()
}

/// Opens `file` of the cgroup directory `dir` for writing. The directory must exist and be a
/// cgroup (checked on the open descriptor, so nothing can swap it after the check), reached
/// beneath the node root without symlinks; the file is opened beneath it and never created.
fn open_cgroup_file(dir: &CgroupBeneath, file: &str) -> Result<OwnedFd, ProcessError> {
    let err = |source| ProcessError::Cgroup {
        path: dir.display(),
        source,
    };
    let fd = dir.open().map_err(err)?;
    let fs_type = fstatfs(&fd).map_err(err)?;
    if fs_type != CGROUP_SUPER_MAGIC && fs_type != CGROUP2_SUPER_MAGIC {
        return Err(ProcessError::NotCgroup {
            path: dir.display(),
        });
    }
    beneath::openat2(fd.as_raw_fd(), file, libc::O_WRONLY, 0, RESOLVE_STRICT).map_err(err)
}

fn fstatfs(fd: &OwnedFd) -> io::Result<i64> {
    // SAFETY: statfs is plain data the kernel fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid out pointer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // `f_type` is i64 on glibc x86_64 and u64 on musl; the magic numbers fit either.
    Ok(st.f_type as i64)
}

/// The processes in the container's cgroups (the union over its hierarchies).
pub(crate) fn cgroup_pids(cgroups: &ContainerCgroups) -> Vec<u32> {
    let mut pids: Vec<u32> = cgroups
        .dirs
        .iter()
        .filter_map(|d| d.procs().ok())
        .flatten()
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Kills every process in the container's cgroups: `cgroup.kill` where the kernel has it (cgroup
/// v2, 5.14+; it also reaches processes forking at that moment), then SIGKILL to each pid read
/// from `cgroup.procs`. Returns how many processes were still listed; call again until none.
pub(crate) fn kill_cgroups(cgroups: &ContainerCgroups) -> usize {
    for d in &cgroups.dirs {
        // Fails on a v1 hierarchy, an older kernel, or when the cgroup is gone; the sweep
        // follows either way.
        if let Ok(fd) = open_cgroup_file(d, "cgroup.kill") {
            let _ = File::from(fd).write_all(b"1");
        }
    }
    signal_cgroup(cgroups, Signal::SIGKILL)
}

/// Sends `signal` to every process in the container's cgroups; returns how many there were.
/// Only pids read from those cgroups are signalled.
pub(crate) fn signal_cgroup(cgroups: &ContainerCgroups, signal: Signal) -> usize {
    let pids = cgroup_pids(cgroups);
    for &pid in &pids {
        if let Ok(pid) = i32::try_from(pid) {
            // ESRCH: it exited since the read; nothing else can fail for root.
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }
    pids.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container's cgroup replaced by a symlink out of the node root is neither joined nor
    /// read: no pids (so nothing outside is signalled), and the start refuses it. The control,
    /// a real directory, lists its pids.
    #[test]
    fn a_container_cgroup_replaced_by_a_symlink_out_of_the_root_is_not_opened() {
        let t = crate::cgroup::beneath::RootWithLink::new("process-beneath");
        t.write("cgroup.procs", "7\n8\n", "9\n");
        let cgroups = |path: &str| ContainerCgroups {
            dirs: vec![t.dir(path)],
        };
        assert_eq!(cgroup_pids(&cgroups("/real")), [7, 8]);
        assert_eq!(cgroup_pids(&cgroups("/link")), Vec::<u32>::new());
        let e = open_procs(&cgroups("/link")).unwrap_err();
        assert!(
            matches!(&e, ProcessError::Cgroup { source, .. }
                if matches!(source.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))),
            "{e:?}"
        );
    }
}
