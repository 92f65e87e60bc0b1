//! Starting a container's process inside its cgroups, and signalling the processes of those
//! cgroups (never any other).

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::{
        fd::{AsRawFd as _, OwnedFd, RawFd},
        unix::fs::OpenOptionsExt as _,
    },
    path::{Path, PathBuf},
    process::Stdio,
};

use nix::{sys::signal::Signal, unistd::Pid};
use thiserror::Error;
use tokio::process::{Child, Command};

use super::spec::{ContainerCgroups, ContainerSpec};

/// A container process could not be started.
#[derive(Debug, Error)]
pub enum ProcessError {
    #[error("{path}: cannot open to join the cgroup")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{log}: cannot create the log file")]
    Log {
        log: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start {command:?}")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
}

/// Starts the container's command with its environment and working directory, stdout and
/// stderr appended to `log`, already inside every cgroup of `spec.cgroups` when it execs.
pub fn spawn(spec: &ContainerSpec, log: &Path) -> Result<Child, ProcessError> {
    let procs = open_procs(&spec.cgroups)?;
    let log_err = |source| ProcessError::Log {
        log: log.to_path_buf(),
        source,
    };
    let out = super::logs::create(log).map_err(log_err)?;
    let err = out.try_clone().map_err(log_err)?;
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.working_dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group: a Ctrl-C at the agent's terminal must not reach the pods,
        // which are stopped gracefully instead.
        .process_group(0)
        .kill_on_drop(false);
    let fds: Vec<RawFd> = procs.iter().map(|f| f.as_raw_fd()).collect();
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

/// `cgroup.procs` of every directory, opened before the fork.
fn open_procs(cgroups: &ContainerCgroups) -> Result<Vec<OwnedFd>, ProcessError> {
    cgroups
        .dirs
        .iter()
        .map(|d| {
            let path = d.join("cgroup.procs");
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
                .map(|f: File| OwnedFd::from(f))
                .map_err(|source| ProcessError::Cgroup { path, source })
        })
        .collect()
}

/// The processes in the container's cgroups (the union over its hierarchies).
pub fn cgroup_pids(cgroups: &ContainerCgroups) -> Vec<u32> {
    let mut pids: Vec<u32> = cgroups
        .dirs
        .iter()
        .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|s| {
            s.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Sends `signal` to every process in the container's cgroups; returns how many there were.
/// Only pids read from those cgroups are signalled.
pub fn signal_cgroup(cgroups: &ContainerCgroups, signal: Signal) -> usize {
    let pids = cgroup_pids(cgroups);
    for &pid in &pids {
        if let Ok(pid) = i32::try_from(pid) {
            // ESRCH: it exited since the read; nothing else can fail for root.
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }
    pids.len()
}
