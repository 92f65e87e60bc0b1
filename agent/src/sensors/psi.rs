//! PSI triggers: `some <stall µs> <window µs>` written to a `*.pressure` file (system-wide in
//! /proc/pressure or per cgroup v2), then POLLPRI when the stall in a window exceeds it.
//!
//! When the cgroup is removed the kernel destroys the trigger and the fd polls as POLLERR (its
//! kernfs node is no longer active); [`PsiTrigger::fired`] reports that as [`TriggerGone`] so
//! the task watching it ends by itself instead of waiting forever on a dead fd.
//!
//! A cgroup's `memory.pressure` is opened beneath the node root ([`CgroupBeneath`]): its
//! directory is named from a pod UID.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write as _},
    os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _},
    path::PathBuf,
    time::Duration,
};

use tokio::io::{Interest, unix::AsyncFd};

use crate::cgroup::CgroupBeneath;

pub const SYSTEM_MEMORY_PRESSURE: &str = "/proc/pressure/memory";

/// A memory pressure file a trigger is armed on.
#[derive(Debug, Clone)]
pub enum PressureFile {
    /// [`SYSTEM_MEMORY_PRESSURE`], a fixed path.
    System,
    /// A cgroup v2 directory's `memory.pressure`.
    Cgroup(CgroupBeneath),
}

impl PressureFile {
    /// The full path, for logs.
    pub(crate) fn display(&self) -> PathBuf {
        match self {
            Self::System => PathBuf::from(SYSTEM_MEMORY_PRESSURE),
            Self::Cgroup(dir) => dir.file_display("memory.pressure"),
        }
    }

    /// Opened for reading and writing (a trigger is written to it), non-blocking.
    pub(super) fn open(&self) -> io::Result<File> {
        match self {
            Self::System => OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(SYSTEM_MEMORY_PRESSURE),
            Self::Cgroup(d) => {
                d.fs.open_file(
                    d.tree,
                    &d.path,
                    "memory.pressure",
                    libc::O_RDWR | libc::O_NONBLOCK,
                )
                .map(File::from)
            }
        }
    }
}

/// One armed trigger; one per open file, as the kernel requires.
pub struct PsiTrigger {
    fd: AsyncFd<File>,
}

impl PsiTrigger {
    /// Arms a trigger on `file` (a `memory.pressure` or `/proc/pressure/memory`). Without
    /// CAP_SYS_RESOURCE, Linux 6.5+ takes only windows in whole multiples of 2 s (EINVAL
    /// otherwise): the window is then rounded up to one, which coarsens detection but keeps it.
    pub fn open(file: &PressureFile, stall: Duration, window: Duration) -> io::Result<Self> {
        const UNPRIVILEGED_STEP_US: u128 = 2_000_000;
        match Self::arm(file, stall, window) {
            Err(e)
                if e.raw_os_error() == Some(libc::EINVAL)
                    && !window.as_micros().is_multiple_of(UNPRIVILEGED_STEP_US) =>
            {
                let steps = window.as_micros().div_ceil(UNPRIVILEGED_STEP_US).max(1);
                let rounded = Duration::from_micros((steps * UNPRIVILEGED_STEP_US) as u64);
                tracing::debug!(path = %file.display().display(), window = ?rounded, "PSI window rounded up to a multiple of 2 s (no CAP_SYS_RESOURCE).");
                Self::arm(file, stall, rounded)
            }
            r => r,
        }
    }

    fn arm(file: &PressureFile, stall: Duration, window: Duration) -> io::Result<Self> {
        let mut file = file.open()?;
        // NUL-terminated: /proc/pressure/* overwrites the last byte written with a NUL
        // (`psi_write`), so without one "some 150000 1000000" arms as a 100 ms window and is
        // refused; a cgroup's kernfs file stops at the NUL the same way.
        file.write_all(format!("some {} {}\0", stall.as_micros(), window.as_micros()).as_bytes())?;
        // SAFETY: the File owns its fd, which stays open and unchanged until the AsyncFd (and
        // the File inside it) is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }?;
        Ok(Self { fd })
    }

    /// Waits until the trigger fires. An error of kind `NotFound` wrapping [`TriggerGone`] means
    /// the cgroup (and with it the trigger) was removed.
    pub async fn fired(&mut self) -> io::Result<()> {
        let mut guard = self.fd.ready(Interest::PRIORITY).await?;
        // The same wakeup carries POLLPRI for a removed cgroup; only poll(2) tells them apart.
        let gone = revents(self.fd.get_ref().as_raw_fd())? & libc::POLLERR != 0;
        guard.clear_ready();
        if gone {
            return Err(io::Error::new(io::ErrorKind::NotFound, TriggerGone));
        }
        Ok(())
    }
}

/// The trigger's cgroup was removed.
#[derive(Debug, thiserror::Error)]
#[error("the pressure file's cgroup was removed")]
pub(crate) struct TriggerGone;

/// Whether an error from [`PsiTrigger::fired`] means the cgroup is gone.
pub fn is_gone(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(<dyn std::error::Error + Send + Sync + 'static>::is::<TriggerGone>)
}

/// The fd's current poll events, without waiting.
fn revents(fd: i32) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    if unsafe { libc::poll(&mut p, 1, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p.revents)
}
