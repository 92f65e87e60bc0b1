//! Descriptors the eviction path keeps open, so that a process out of descriptors (a flood of
//! connections or manifests, a low `RLIMIT_NOFILE`) can still observe and evict: the node root's
//! memory files and, for every pod of the inventory, its memory files and its cgroup v2
//! `cgroup.procs` and `cgroup.kill`, opened when the pod enters the inventory ([`Manager`](super::Manager)) and
//! closed when it leaves. Reads of a held file are `pread` from offset 0 (cgroup files are
//! seq_files, which restart there); a held file that fails (its cgroup was removed and made
//! again) is dropped and the file opened beneath the node root as before.

use std::{
    collections::BTreeMap,
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex},
};

use crate::cgroup::{Access, CgroupBeneath};

static HELD: LazyLock<Mutex<BTreeMap<PathBuf, Arc<File>>>> = LazyLock::new(Mutex::default);

/// Holds exactly the files of `wanted` (a directory, a file name, how it is used) from now on:
/// opens what is new beneath the node root ([`CgroupBeneath::open_file`]), closes what is no
/// longer wanted. Held files are keyed by their full paths. Returns the paths that could not be
/// opened.
pub fn hold_only<'a>(
    wanted: impl IntoIterator<Item = (&'a CgroupBeneath, &'a str, Access)>,
) -> Vec<(PathBuf, io::Error)> {
    let wanted: BTreeMap<PathBuf, (&CgroupBeneath, &str, Access)> = wanted
        .into_iter()
        .map(|w @ (dir, file, _)| (dir.file_display(file), w))
        .collect();
    let mut held = crate::lock(&HELD);
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
        let cgroup = CgroupBeneath::own(&dir, crate::cgroup::Tree::V2).unwrap();
        assert!(hold_only([(&cgroup, "memory.current", Access::Read)]).is_empty());
        assert!(get(&file).is_some());
        // The same inode read again from offset 0 after a change.
        std::fs::write(&file, "8192\n").unwrap();
        assert_eq!(read_held(&file).unwrap(), "8192\n");
        assert!(hold_only([]).is_empty());
        assert!(get(&file).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
