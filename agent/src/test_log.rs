//! Tests of log lines: a tracing subscriber writing into a buffer the test reads back.

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

/// What the subscriber of [`LogBuffer::subscriber`] wrote.
#[derive(Clone, Default)]
pub(crate) struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    /// A plain-text subscriber at INFO and above writing here (for `with_default`).
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + use<> {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish()
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }

    /// How often `needle` occurs in the text.
    pub(crate) fn count(&self, needle: &str) -> usize {
        self.text().matches(needle).count()
    }
}
