//! `cargo xtask test --load N`: the suite with N CPU hogs beside it, as a shared machine has.
//! A timing test that passes only on a quiet machine is a broken test; this makes the load that
//! shows it repeatable. `stress-ng --cpu N` (Debian's) spins N workers at full load, outside
//! every cgroup the tests create, for the whole run. It stays in xtask's process group, so a
//! Ctrl-C at the terminal stops it with the suite.

use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, Result};

use crate::apt;

/// The hogs; stopped when dropped (stress-ng ends its workers on SIGTERM).
pub struct Load {
    child: Child,
    cpus: u32,
}

impl Load {
    /// Starts `cpus` spinning workers (stress-ng installed when missing).
    pub fn start(cpus: u32) -> Result<Self> {
        apt::ensure("load", &["stress-ng"])?;
        let child = Command::new("stress-ng")
            .args(["--cpu", &cpus.to_string(), "--cpu-method", "all", "--quiet"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting stress-ng")?;
        println!("xtask: {cpus} CPU hog(s) running beside the suite (stress-ng --cpu {cpus})");
        Ok(Self { child, cpus })
    }

    /// The report line.
    pub fn describe(&self) -> String {
        format!(
            "load: stress-ng --cpu {} ran beside the whole run",
            self.cpus
        )
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on the child this struct started and has not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }
}
