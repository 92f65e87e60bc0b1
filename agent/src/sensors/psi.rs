//! PSI triggers: `some <stall µs> <window µs>` written to a `*.pressure` file (system-wide in
//! /proc/pressure or per cgroup v2), then POLLPRI when the stall in a window exceeds it.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
    time::Duration,
};

use tokio::io::{Interest, unix::AsyncFd};

pub const SYSTEM_MEMORY_PRESSURE: &str = "/proc/pressure/memory";

/// One armed trigger; one per open file, as the kernel requires.
pub struct PsiTrigger {
    fd: AsyncFd<File>,
}

impl PsiTrigger {
    /// Arms a trigger on `path` (a `memory.pressure` or `/proc/pressure/memory`).
    pub fn open(path: &Path, stall: Duration, window: Duration) -> io::Result<Self> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        file.write_all(format!("some {} {}", stall.as_micros(), window.as_micros()).as_bytes())?;
        // SAFETY: the File owns its fd, which stays open and unchanged until the AsyncFd (and
        // the File inside it) is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }?;
        Ok(Self { fd })
    }

    /// Waits until the trigger fires.
    pub async fn fired(&mut self) -> io::Result<()> {
        let mut guard = self.fd.ready(Interest::PRIORITY).await?;
        guard.clear_ready();
        Ok(())
    }
}
