//! Descriptors the eviction path keeps open, so that a process out of descriptors (a flood of
//! connections or manifests, a low `RLIMIT_NOFILE`) can still observe and evict: the node root's
//! memory files and, for every pod of the inventory, its memory files and its cgroup v2
//! `cgroup.procs` and `cgroup.kill`, opened when the pod enters the inventory ([`Manager`](super::Manager)) and
//! closed when it leaves. Reads of a held file are `pread` from offset 0 (cgroup files are
//! seq_files, which restart there); a held file that fails (its cgroup was removed and made
//! again) is dropped and the path opened as before.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{File, OpenOptions},
    io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex},
};

/// Whether a held file is read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
}

static HELD: LazyLock<Mutex<BTreeMap<PathBuf, Arc<File>>>> = LazyLock::new(Mutex::default);

/// Holds exactly `wanted` from now on: opens what is new, closes what is no longer wanted.
/// Returns the paths that could not be opened.
pub fn hold_only(wanted: &BTreeSet<(PathBuf, Access)>) -> Vec<(PathBuf, io::Error)> {
    hold_only_with(wanted, open)
}

/// [`hold_only`], opening each new file with `open` (a pod's files are opened beneath the node
/// root, through [`PodDir`](super::PodDir)).
pub fn hold_only_with(
    wanted: &BTreeSet<(PathBuf, Access)>,
    open: impl Fn(&Path, Access) -> io::Result<File>,
) -> Vec<(PathBuf, io::Error)> {
    let mut held = crate::lock(&HELD);
    let paths: BTreeSet<&Path> = wanted.iter().map(|(p, _)| p.as_path()).collect();
    held.retain(|p, _| paths.contains(p.as_path()));
    let mut failed = Vec::new();
    for (path, access) in wanted {
        if held.contains_key(path) {
            continue;
        }
        match open(path, *access) {
            Ok(f) => {
                held.insert(path.clone(), Arc::new(f));
            }
            // A file the kernel lacks (cgroup.kill before 5.14, a v1 hierarchy) is not needed.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => failed.push((path.clone(), e)),
        }
    }
    failed
}

/// Opens a file by its path.
pub fn open(path: &Path, access: Access) -> io::Result<File> {
    match access {
        Access::Read => File::open(path),
        Access::Write => OpenOptions::new().write(true).open(path),
    }
}

fn get(path: &Path) -> Option<Arc<File>> {
    crate::lock(&HELD).get(path).cloned()
}

fn forget(path: &Path) {
    crate::lock(&HELD).remove(path);
}

/// How many files are held (tests).
pub fn count() -> usize {
    crate::lock(&HELD).len()
}

/// Reads a whole file, through its held descriptor when there is one.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    match read_held(path) {
        Some(s) => Ok(s),
        None => std::fs::read_to_string(path),
    }
}

/// Reads a whole file through its held descriptor; `None` when it is not held (or failed).
pub fn read_held(path: &Path) -> Option<String> {
    let f = get(path)?;
    pread_all(&f).inspect_err(|_| forget(path)).ok()
}

fn pread_all(f: &File) -> io::Result<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = f.read_at(&mut buf, out.len() as u64)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes `value` in one write through the held descriptor; `false` when it is not held (or
/// failed).
pub fn write_held(path: &Path, value: &str) -> bool {
    let Some(f) = get(path) else {
        return false;
    };
    match f.write_at(value.as_bytes(), 0) {
        Ok(n) if n == value.len() => true,
        _ => {
            forget(path);
            false
        }
    }
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
        let wanted = BTreeSet::from([(file.clone(), Access::Read)]);
        assert!(hold_only(&wanted).is_empty());
        assert!(get(&file).is_some());
        // The same inode read again from offset 0 after a change.
        std::fs::write(&file, "8192\n").unwrap();
        assert_eq!(read_to_string(&file).unwrap(), "8192\n");
        assert!(hold_only(&BTreeSet::new()).is_empty());
        assert!(get(&file).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
