//! Free space before the big writes. A disk that fills mid-build does not say so plainly: the
//! linker dies of SIGBUS on its memory-mapped output, and the next steps fail one after the other
//! with "No space left on device" (this is how a CI run on a shared disk ended). A warning at the
//! start names the filesystem, what is free and what the command writes, so the cause is the
//! first line to read. Only a warning: an already built `target/` needs far less than a clean one.

use std::{
    ffi::CString,
    mem::MaybeUninit,
    os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    path::{Path, PathBuf},
};

const GB: u64 = 1_000_000_000;

/// What one command writes, and where.
pub struct Need {
    pub path: PathBuf,
    /// Bytes a clean run writes beneath `path` (measured on a fresh clone; see the callers).
    pub bytes: u64,
    pub what: &'static str,
}

/// Prints a warning for each filesystem whose free space is below what the `needs` on it add up
/// to. Returns the warnings, for the caller's summary and for tests.
pub fn warn_if_short(needs: &[Need]) -> Vec<String> {
    let mut by_fs: Vec<(u64, u64, Vec<&Need>)> = Vec::new();
    for need in needs {
        let Some((dev, free)) = statvfs(&existing_ancestor(&need.path)) else {
            continue;
        };
        match by_fs.iter_mut().find(|(d, _, _)| *d == dev) {
            Some((_, _, list)) => list.push(need),
            None => by_fs.push((dev, free, vec![need])),
        }
    }
    let mut warnings = Vec::new();
    for (_, free, list) in by_fs {
        let bytes: u64 = list.iter().map(|n| n.bytes).sum();
        if free >= bytes {
            continue;
        }
        let what = list
            .iter()
            .map(|n| {
                format!(
                    "{} ({:.1} GB under {})",
                    n.what,
                    gb(n.bytes),
                    n.path.display()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let w = format!(
            "xtask: warning: {:.1} GB free where a clean run writes {:.1} GB: {what}. Less is \
             needed when they are already built; a disk that fills shows up as `No space left on \
             device` or a linker killed by SIGBUS",
            gb(free),
            gb(bytes)
        );
        eprintln!("{w}");
        warnings.push(w);
    }
    warnings
}

fn gb(bytes: u64) -> f64 {
    bytes as f64 / GB as f64
}

/// `path` or its nearest ancestor that exists (a clean clone has no `target/cluster` yet).
fn existing_ancestor(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

/// The device of the filesystem and the bytes an unprivileged writer may still use on it.
fn statvfs(path: &Path) -> Option<(u64, u64)> {
    let dev = std::fs::metadata(path).ok()?.dev();
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; statvfs only writes `st`.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some((dev, st.f_bavail.saturating_mul(st.f_frsize)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_only_when_the_needs_on_one_filesystem_exceed_its_free_space() {
        let (_, free) = statvfs(Path::new("/")).expect("statvfs /");
        let need = |bytes| Need {
            path: PathBuf::from("/nonexistent-qoslet/target"),
            bytes,
            what: "the test",
        };
        assert!(warn_if_short(&[need(1)]).is_empty());
        // Two needs that fit alone but not together are summed on their common filesystem.
        let half = free / 2 + 1;
        let warnings = warn_if_short(&[need(half), need(half)]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("/nonexistent-qoslet/target"),
            "{}",
            warnings[0]
        );
    }
}
