//! Descriptors the eviction path keeps open, so that a process out of descriptors (a flood of
//! connections or manifests, a low `RLIMIT_NOFILE`) can still observe and evict: the node root's
//! memory files and, for every pod of the inventory, its memory files, its containers' usage and
//! `memory.stat` (the eviction message's) and its cgroup v2 `cgroup.procs` and `cgroup.kill`,
//! opened when the pod enters the inventory ([`Manager`](super::Manager)) and
//! closed when it leaves. Reads of a held file are `pread` from offset 0 (cgroup files are
//! seq_files, which restart there); a held file that fails (its cgroup was removed and made
//! again) is dropped and the file opened beneath the node root as before. The node's statistics
//! hold the `cpu.stat` files they sample the same way, in a [`HeldFiles`] of their own, and the v2
//! root's signals `/proc/meminfo` ([`HeldProc`]).

use std::{
    collections::BTreeMap,
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use crate::cgroup::{Access, CgroupBeneath};

/// A set of files held open, keyed by their full paths, each read with one `pread` from offset
/// 0. The eviction path's is [`HELD`]; the node's statistics hold their own (`node/summary.rs`).
#[derive(Debug, Default)]
pub(crate) struct HeldFiles(Mutex<BTreeMap<PathBuf, Arc<File>>>);

static HELD: HeldFiles = HeldFiles::new();

impl HeldFiles {
    pub(crate) const fn new() -> Self {
        Self(Mutex::new(BTreeMap::new()))
    }

    /// Holds exactly the files of `wanted` (a directory, a file name, how it is used) from now
    /// on: opens what is new beneath the node root ([`CgroupBeneath::open_file`]), closes what
    /// is no longer wanted. Returns the paths that could not be opened.
    pub(crate) fn hold_only<'a>(
        &self,
        wanted: impl IntoIterator<Item = (&'a CgroupBeneath, &'a str, Access)>,
    ) -> Vec<(PathBuf, io::Error)> {
        let wanted: BTreeMap<PathBuf, (&CgroupBeneath, &str, Access)> = wanted
            .into_iter()
            .map(|w @ (dir, file, _)| (dir.file_display(file), w))
            .collect();
        let mut held = crate::support::lock(&self.0);
        held.retain(|p, _| wanted.contains_key(p));
        let mut failed = Vec::new();
        for (path, (dir, file, access)) in wanted {
            if held.contains_key(&path) {
                continue;
            }
            match dir.open_file(file, access) {
                Ok(f) => {
                    held.insert(path, Arc::new(f));
                }
                // A file the kernel lacks (cgroup.kill before 5.14, a v1 hierarchy) is not needed.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => failed.push((path, e)),
            }
        }
        failed
    }

    fn get(&self, path: &Path) -> Option<Arc<File>> {
        crate::support::lock(&self.0).get(path).cloned()
    }

    fn forget(&self, path: &Path) {
        crate::support::lock(&self.0).remove(path);
    }

    /// How many files are held (tests).
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        crate::support::lock(&self.0).len()
    }

    /// Reads a whole file through its held descriptor; `None` when it is not held (or failed:
    /// its cgroup was removed, and perhaps made again, so the caller opens it anew).
    pub(crate) fn read(&self, path: &Path) -> Option<String> {
        let f = self.get(path)?;
        pread_all(&f).inspect_err(|_| self.forget(path)).ok()
    }

    /// `file` of `dir` through its held descriptor, else opened beneath the node root.
    pub(crate) fn read_or_open(&self, dir: &CgroupBeneath, file: &str) -> io::Result<String> {
        match self.read(&dir.file_display(file)) {
            Some(text) => Ok(text),
            None => dir.read_file(file),
        }
    }

    /// Writes `value` in one write through the held descriptor; `false` when it is not held (or
    /// failed).
    pub(crate) fn write(&self, path: &Path, value: &str) -> bool {
        let Some(f) = self.get(path) else {
            return false;
        };
        match f.write_at(value.as_bytes(), 0) {
            Ok(n) if n == value.len() => true,
            _ => {
                self.forget(path);
                false
            }
        }
    }
}

/// A fixed `/proc` file (not input) held open from its first read and read with one `pread`
/// from offset 0, as a held cgroup file is (procfs's are seq_files too); reopened after a read
/// fails.
#[derive(Debug)]
pub(crate) struct HeldProc {
    path: &'static str,
    file: Mutex<Option<Arc<File>>>,
}

impl HeldProc {
    pub(crate) const fn new(path: &'static str) -> Self {
        Self {
            path,
            file: Mutex::new(None),
        }
    }

    pub(crate) fn read(&self) -> io::Result<String> {
        let held = crate::support::lock(&self.file).clone();
        let f = match held {
            Some(f) => f,
            None => {
                let f = Arc::new(File::open(self.path)?);
                *crate::support::lock(&self.file) = Some(f.clone());
                f
            }
        };
        pread_all(&f).inspect_err(|_| *crate::support::lock(&self.file) = None)
    }
}

/// Holds exactly the eviction path's files of `wanted` from now on ([`HeldFiles::hold_only`]).
pub(crate) fn hold_only<'a>(
    wanted: impl IntoIterator<Item = (&'a CgroupBeneath, &'a str, Access)>,
) -> Vec<(PathBuf, io::Error)> {
    HELD.hold_only(wanted)
}

/// Reads a whole file through the eviction path's held descriptor; `None` when it is not held
/// (or failed).
pub(crate) fn read_held(path: &Path) -> Option<String> {
    HELD.read(path)
}

fn pread_all(f: &File) -> io::Result<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = f.read_at(&mut buf, out.len() as u64)?;
        out.extend_from_slice(&buf[..n]);
        // A cgroup file is a seq_file, whose read returns as much as fits: a short read is its
        // end, so a file that fits is one pread, not a second that returns nothing.
        if n < buf.len() {
            break;
        }
    }
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes `value` in one write through the eviction path's held descriptor; `false` when it is
/// not held (or failed).
pub(crate) fn write_held(path: &Path, value: &str) -> bool {
    HELD.write(path, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_file_is_read_without_a_new_descriptor_and_released() {
        let dir = std::env::temp_dir().join(format!("qoslet-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("memory.current");
        std::fs::write(&file, "4096\n").unwrap();
        let cgroup = CgroupBeneath::own(&dir, crate::cgroup::Tree::V2).unwrap();
        assert!(hold_only([(&cgroup, "memory.current", Access::Read)]).is_empty());
        assert!(HELD.get(&file).is_some());
        // The same inode read again from offset 0 after a change.
        std::fs::write(&file, "8192\n").unwrap();
        assert_eq!(read_held(&file).unwrap(), "8192\n");
        assert!(hold_only([]).is_empty());
        assert!(HELD.get(&file).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A held `/proc` file answers each `pread` from offset 0 anew: the second read is whole and
    /// current, not the rest of the first.
    #[test]
    fn a_held_proc_file_is_read_whole_each_time() {
        let stat = HeldProc::new("/proc/self/stat");
        let first = stat.read().unwrap();
        let second = stat.read().unwrap();
        assert!(first.starts_with(&format!("{} ", std::process::id())));
        assert!(second.starts_with(&format!("{} ", std::process::id())));
        let meminfo = HeldProc::new("/proc/meminfo");
        for _ in 0..2 {
            assert!(meminfo.read().unwrap().starts_with("MemTotal:"));
        }
        assert!(HeldProc::new("/proc/no-such-file").read().is_err());
    }
}
