//! Boots one kernel under QEMU (TCG) and collects its serial console with a deadline.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

/// The most lines of a panic's message echoed from the console (a test's assertion message can
/// carry what it saw, window by window).
const PANIC_MESSAGE_LINES: usize = 20;

/// Which console lines reach the terminal: our markers and failures. BIOS escape codes may
/// precede a marker. A panic's message follows its "panicked at" line, and a CI log that shows
/// only the location cannot say why, so up to [`PANIC_MESSAGE_LINES`] of it are shown too.
#[derive(Default)]
struct Echo {
    panic_lines: usize,
}

impl Echo {
    fn line<'a>(&mut self, line: &'a str) -> Option<&'a str> {
        if let Some(at) = line.find("QOSLET-VM") {
            self.panic_lines = 0;
            return Some(&line[at..]);
        }
        if line.contains("panicked") {
            self.panic_lines = PANIC_MESSAGE_LINES;
            return Some(line);
        }
        let in_message = self.panic_lines > 0 && !line.trim().is_empty();
        self.panic_lines = if in_message { self.panic_lines - 1 } else { 0 };
        (in_message || line.contains("FAILED")).then_some(line)
    }
}

/// What the serial console said before QEMU exited or was killed.
pub struct Boot {
    pub lines: Vec<String>,
    pub timed_out: bool,
    pub elapsed: Duration,
}

impl Boot {
    /// A driver's report: the lines carrying `prefix` (e.g. `QOSLET-VM-PEERS| `), without it.
    pub fn report(&self, prefix: &str) -> String {
        self.lines
            .iter()
            .filter_map(|l| l.find(prefix).map(|at| &l[at + prefix.len()..]))
            .fold(String::new(), |mut s, l| {
                s.push_str(l);
                s.push('\n');
                s
            })
    }
}

/// Kills QEMU when the harness returns early or panics, so no VM outlives xtask.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The emulated machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machine {
    /// `qemu-system-x86_64 -machine q35`, serial console on ttyS0.
    X86_64,
    /// `qemu-system-aarch64 -machine virt`, PL011 console on ttyAMA0.
    Aarch64,
}

impl Machine {
    fn qemu(self) -> &'static str {
        match self {
            Machine::X86_64 => "qemu-system-x86_64",
            Machine::Aarch64 => "qemu-system-aarch64",
        }
    }

    fn board(self) -> &'static str {
        match self {
            Machine::X86_64 => "q35",
            Machine::Aarch64 => "virt",
        }
    }

    fn console(self) -> &'static str {
        match self {
            Machine::X86_64 => "ttyS0",
            Machine::Aarch64 => "ttyAMA0",
        }
    }
}

/// Boots `vmlinuz` with `initrd` on `machine` and collects its console until it powers off or
/// `timeout` passes; `extra` are more QEMU arguments (devices, e.g. the peers bench's disk).
#[expect(
    clippy::too_many_arguments,
    reason = "the machine, its images and limits, and where the log goes: one call site each"
)]
pub fn boot(
    machine: Machine,
    vmlinuz: &Path,
    initrd: &Path,
    memory_mib: u32,
    timeout: Duration,
    log_path: &Path,
    label: &str,
    extra: &[String],
) -> Result<Boot> {
    let mut log = File::create(log_path).with_context(|| format!("creating {log_path:?}"))?;
    let mut cmd = Command::new(machine.qemu());
    cmd.args(["-machine", machine.board(), "-cpu", "max", "-smp", "2"])
        .args(["-m", &memory_mib.to_string()])
        // KVM is not usable on the CI machines: plain TCG, no -enable-kvm. Single-threaded TCG:
        // with one host thread per vCPU (MTTCG) on a loaded 2-core host, guests saw int3 oopses
        // while the kernel live-patched static keys and RCU stalls from starved vCPU timers.
        .args([
            "-accel",
            "tcg,thread=single",
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        // panic=-1 plus -no-reboot turns a kernel panic (e.g. init dying) into a QEMU exit.
        // mitigations=off: speculation mitigations only cost time under emulation; edd=off skips
        // a BIOS disk probe there is no disk for.
        .arg("-append")
        .arg(format!(
            "console={} panic=-1 loglevel=4 rdinit=/init cgroup_no_v1=all mitigations=off edd=off",
            machine.console()
        ))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = KillOnDrop(
        cmd.spawn()
            .with_context(|| format!("starting {}", machine.qemu()))?,
    );

    let (tx, rx) = mpsc::channel();
    let stdout = child.0.stdout.take().expect("piped");
    let stderr = child.0.stderr.take().expect("piped");
    for (stream, prefix) in [
        (Box::new(stdout) as Box<dyn std::io::Read + Send>, ""),
        (Box::new(stderr), "qemu: "),
    ] {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            // The console is not guaranteed UTF-8: read bytes, decode lossily.
            while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']);
                if tx.send(format!("{prefix}{line}")).is_err() {
                    break;
                }
                buf.clear();
            }
        });
    }
    drop(tx);

    let deadline = start + timeout;
    let mut lines = Vec::new();
    let mut timed_out = false;
    let mut echo = Echo::default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                writeln!(log, "{line}")?;
                if let Some(shown) = echo.line(&line) {
                    println!("[{label}] {shown}");
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                writeln!(log, "vm-test: timed out after {timeout:?}, killing QEMU")?;
                break;
            }
            // Both pipes closed: QEMU exited.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    drop(child);
    Ok(Boot {
        lines,
        timed_out,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_failures_and_a_panics_message_are_echoed() {
        let mut echo = Echo::default();
        let shown: Vec<_> = [
            "noise",
            "\u{1b}[0mQOSLET-VM-BINARY-START name=a",
            "[    1.0] kernel noise",
            "thread 't' (9) panicked at tests/tests/a.rs:1:2:",
            "not released: seen [(Some(2), 9.0)]",
            "  second line of the message",
            "",
            "after the message",
            "test result: FAILED. 1 passed; 1 failed",
        ]
        .into_iter()
        .filter_map(|l| echo.line(l))
        .collect();
        assert_eq!(
            shown,
            [
                "QOSLET-VM-BINARY-START name=a",
                "thread 't' (9) panicked at tests/tests/a.rs:1:2:",
                "not released: seen [(Some(2), 9.0)]",
                "  second line of the message",
                "test result: FAILED. 1 passed; 1 failed",
            ]
        );
    }

    #[test]
    fn the_report_is_the_prefixed_lines() {
        let boot = Boot {
            lines: vec![
                "noise".to_owned(),
                "\u{1b}[0mQOSLET-VM-PEERS| ## Peers".to_owned(),
                "QOSLET-VM-PEERS-RUN system=Qoslet".to_owned(),
                "QOSLET-VM-PEERS| | a | b |".to_owned(),
            ],
            timed_out: false,
            elapsed: Duration::ZERO,
        };
        assert_eq!(boot.report("QOSLET-VM-PEERS| "), "## Peers\n| a | b |\n");
    }
}
