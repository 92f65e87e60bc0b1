//! The kernel programs' diagnostics (`agent-ebpf/src/diag.rs`), read with aya-log and written to
//! the agent's `tracing` log under the target `qoslet::kernel`.
//!
//! Off by default (`ebpf.kernelDiagnostics` in the QosletConfiguration): the programs are then
//! loaded with aya-log's level global at 0 and the verifier removes their logging, and no reader
//! runs. aya-log hands each record to a [`log::Log`]; [`TracingLog`] turns it into a `tracing`
//! event at the same level, so no process-wide `log` logger is installed.

use aya_log::EbpfLogger;
use tokio::io::{Interest, unix::AsyncFd};

use super::SensorError;

/// aya-log-ebpf's ring buffer (its name is private to aya-log).
pub const RING: &str = "AYA_LOGS";

/// The `tracing` target of every kernel diagnostic.
pub const TARGET: &str = "qoslet::kernel";

/// aya-log's level global when diagnostics are on: every level the programs use (warn, debug).
pub(crate) const LEVEL_ON: u8 = aya_log::Level::Debug as u8;
/// Off: no level is enabled, and the verifier prunes every logging branch.
pub(crate) const LEVEL_OFF: u8 = 0;

/// Forwards aya-log records to `tracing`. The message is the program's own sentence; `source` is
/// where in `agent-ebpf/src` it was logged.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let source = format!(
            "{}:{}",
            record.file().unwrap_or("?"),
            record.line().unwrap_or(0)
        );
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: TARGET, source, "{message}"),
            log::Level::Warn => tracing::warn!(target: TARGET, source, "{message}"),
            log::Level::Info => tracing::info!(target: TARGET, source, "{message}"),
            log::Level::Debug => tracing::debug!(target: TARGET, source, "{message}"),
            log::Level::Trace => tracing::trace!(target: TARGET, source, "{message}"),
        }
    }

    fn flush(&self) {}
}

/// Reads the programs' `AYA_LOGS` ring buffer as records arrive.
pub struct KernelLogReader {
    fd: AsyncFd<EbpfLogger<TracingLog>>,
}

impl KernelLogReader {
    /// Takes `AYA_LOGS` from the loaded object. Call inside a tokio runtime.
    pub(crate) fn new(ebpf: &mut aya::Ebpf) -> Result<Self, SensorError> {
        let logger =
            EbpfLogger::init_with_logger(ebpf, TracingLog).map_err(SensorError::KernelLog)?;
        // SAFETY: the logger owns the ring buffer's map fd, which stays open and unchanged until
        // the AsyncFd (and the logger inside it) is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) }
            .map_err(|e| SensorError::Intake(e.into()))?;
        Ok(Self { fd })
    }

    /// Forwards records until the ring buffer's fd fails (never, while the programs are
    /// loaded). aya-log 0.3.0 panics on a record it cannot parse, which only a program built
    /// against another aya-log-ebpf could write: the versions are pinned together.
    pub async fn run(mut self) {
        loop {
            let mut guard = match self.fd.readable_mut().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "Kernel diagnostics reader failed; no more kernel diagnostics.");
                    return;
                }
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use log::Log as _;

    use super::*;

    #[test]
    fn a_kernel_record_becomes_a_tracing_event_at_its_level_under_the_kernel_target() {
        let buffer = crate::test_log::LogBuffer::default();
        tracing::subscriber::with_default(buffer.subscriber(), || {
            for (level, text) in [
                (log::Level::Warn, "A map is full."),
                (log::Level::Debug, "Below the subscriber's level."),
            ] {
                TracingLog.log(
                    &log::Record::builder()
                        .level(level)
                        .file(Some("agent-ebpf/src/sched.rs"))
                        .line(Some(7))
                        .args(format_args!("{text}"))
                        .build(),
                );
            }
        });
        let out = buffer.text();
        assert!(
            out.contains(
                r#" WARN qoslet::kernel: A map is full. source="agent-ebpf/src/sched.rs:7""#
            ),
            "{out}"
        );
        assert!(!out.contains("Below"), "{out}");
    }
}
