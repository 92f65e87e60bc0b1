//! Reading input files with bounds: manifests, the KubeletConfiguration and the
//! QosletConfiguration. A path that is a FIFO, a device or a socket is refused without blocking
//! (it is opened with `O_NONBLOCK`, then checked with `fstat` on the open descriptor, so nothing
//! can swap the file between the check and the read), and a file larger than the cap is refused
//! before it is read; the read itself stops at the cap too, for files whose size `fstat` does not
//! tell (procfs, a file still growing). Symlinks are followed: Kubernetes mounts ConfigMaps
//! through them.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _},
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::Path,
};

/// The default cap per file: 4 MiB, far above any manifest or configuration (the API server
/// refuses objects above 1.5 MiB), far below anything that could hurt the node.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 4 << 20;

/// Reads `path` as UTF-8 text: a regular file of at most `max_bytes` bytes.
pub(crate) fn read_bounded(path: &Path, max_bytes: u64) -> io::Result<String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what}, not a regular file"),
        ));
    }
    if meta.len() > max_bytes {
        return Err(too_large(meta.len(), max_bytes));
    }
    read_capped(file, max_bytes)
}

fn read_capped(file: File, max_bytes: u64) -> io::Result<String> {
    let mut buf = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut buf)?;
    if buf.len() as u64 > max_bytes {
        return Err(too_large(buf.len() as u64, max_bytes));
    }
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn too_large(len: u64, max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "{len} bytes or more, above the limit of {max} bytes (maxManifestBytes, --max-manifest-bytes)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::FileExt as _, sync::mpsc, time::Duration};

    use super::*;

    fn dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "qoslet-file-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn reads_a_small_file() {
        let d = dir();
        let f = d.join("a.yaml");
        std::fs::write(&f, "kind: Pod\n").unwrap();
        assert_eq!(read_bounded(&f, 100).unwrap(), "kind: Pod\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = dir();
        let fifo = d.join("fifo.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // On a thread, so a regression (a blocking open) fails the test instead of hanging it.
        let (tx, rx) = mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || tx.send(read_bounded(&path, DEFAULT_MAX_BYTES)));
        let r = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("opening a FIFO blocked");
        let e = r.expect_err("a FIFO was read");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(e.to_string(), "a FIFO, not a regular file");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn devices_are_refused() {
        let e = read_bounded(Path::new("/dev/zero"), DEFAULT_MAX_BYTES).unwrap_err();
        assert_eq!(e.to_string(), "a character device, not a regular file");
    }

    #[test]
    fn a_sparse_file_above_the_cap_is_refused_before_it_is_read() {
        let d = dir();
        let f = d.join("sparse.yaml");
        let file = File::create(&f).unwrap();
        // 8 GiB apparent size, one byte written: reading it would take gigabytes of memory.
        file.write_at(b"x", 8 << 30).unwrap();
        let e = read_bounded(&f, DEFAULT_MAX_BYTES).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        // Refused from its size alone (a read would have stopped at the cap, 4194305 bytes).
        assert!(
            e.to_string()
                .starts_with("8589934593 bytes or more, above the limit of 4194304"),
            "{e}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_read_stops_at_the_cap_when_the_size_is_unknown() {
        // procfs files report size 0; the read still stops at the cap.
        let e = read_capped(File::open("/proc/self/maps").unwrap(), 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    }
}
