//! A cgroup directory named beneath the node root of one hierarchy: the engine, the hierarchy,
//! the path. Every file of it is opened there (`openat2` beneath that root, no symlinks) when it
//! is needed: a pod's path comes from its manifest and a container's from its runtime id, and a
//! directory may be replaced between the pass that named it and the read. The eviction path
//! (which also reads through its held descriptors, `eviction/held.rs`), the sensors and the
//! standalone runtime all name their cgroups this way.

use std::{
    fs::File,
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Arc,
};

use super::{CgroupFs, CgroupPath, Tree, fs::OpenRootError};

/// Whether a file is opened to be read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Access {
    Read,
    Write,
}

#[derive(Debug, Clone)]
pub struct CgroupBeneath {
    pub fs: Arc<CgroupFs>,
    pub tree: Tree,
    pub path: CgroupPath,
}

impl PartialEq for CgroupBeneath {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.fs, &other.fs) && self.tree == other.tree && self.path == other.path
    }
}

impl Eq for CgroupBeneath {}

impl CgroupBeneath {
    /// The cgroup `path` of `tree`, beneath the node root `fs` was opened at.
    pub(crate) fn new(fs: &Arc<CgroupFs>, tree: Tree, path: &CgroupPath) -> Self {
        Self {
            fs: fs.clone(),
            tree,
            path: path.clone(),
        }
    }

    /// `dir` as a node root of its own (tests; a directory outside any known layout).
    pub fn own(dir: &Path, tree: Tree) -> Result<Self, OpenRootError> {
        let mounts = super::Mounts {
            kind: super::LayoutKind::Unified,
            trees: [(tree, dir.to_path_buf())].into(),
        };
        Ok(Self {
            fs: Arc::new(CgroupFs::open(mounts, CgroupPath::root())?),
            tree,
            path: CgroupPath::root(),
        })
    }

    /// The full path, for reports and the held descriptors' keys.
    pub(crate) fn display(&self) -> PathBuf {
        self.fs.display_path(self.tree, &self.path)
    }

    /// The full path of one of its files: the key of its held descriptor, and what errors name.
    pub(crate) fn file_display(&self, file: &str) -> PathBuf {
        self.display().join(file)
    }

    /// The directory, opened for reading beneath the node root.
    pub(crate) fn open(&self) -> io::Result<OwnedFd> {
        self.fs.open_dir_fd(self.tree, &self.path)
    }

    /// Whether the directory exists (and is reached beneath the node root).
    pub(crate) fn exists(&self) -> bool {
        self.fs.exists(self.tree, &self.path).unwrap_or(false)
    }

    /// The cgroup id: the inode of the directory, from a descriptor opened beneath the root.
    pub(crate) fn inode(&self) -> io::Result<u64> {
        self.fs.inode(self.tree, &self.path)
    }

    /// One of the directory's files, opened beneath the node root.
    pub(crate) fn open_file(&self, file: &str, access: Access) -> io::Result<File> {
        let flags = match access {
            Access::Read => libc::O_RDONLY,
            Access::Write => libc::O_WRONLY,
        };
        self.fs
            .open_file(self.tree, &self.path, file, flags)
            .map(File::from)
    }

    /// One of the directory's files read whole, opened beneath the node root.
    pub(crate) fn read_file(&self, file: &str) -> io::Result<String> {
        self.fs.read(self.tree, &self.path, file)
    }

    /// One of the directory's files written in one write, opened beneath the node root.
    pub(crate) fn write_file(&self, file: &str, value: &str) -> io::Result<()> {
        self.fs.write(self.tree, &self.path, file, value)
    }

    /// The pids its `cgroup.procs` lists, opened beneath the node root.
    pub(crate) fn procs<T: FromStr>(&self) -> io::Result<Vec<T>> {
        Ok(parse_procs(&self.read_file("cgroup.procs")?).collect())
    }

    /// Whether the directory has `file` (opened beneath the root; a symlink is an error).
    pub(crate) fn has_file(&self, file: &str) -> io::Result<bool> {
        match self.open_file(file, Access::Read) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The pids of a `cgroup.procs` text, one per line; the eviction path signals them as `pid_t`,
/// the runtime and the executor report them as `u32`.
pub(crate) fn parse_procs<T: FromStr>(text: &str) -> impl Iterator<Item = T> + '_ {
    text.lines().filter_map(|l| l.trim().parse().ok())
}

/// Tests of the opens beneath the node root: a fresh node root in the temporary directory, with
/// a directory `outside` it and a symlink `/link` in it that leads there.
#[cfg(test)]
pub(crate) struct RootWithLink {
    base: PathBuf,
    pub(crate) root: PathBuf,
    pub(crate) outside: PathBuf,
    dir: CgroupBeneath,
}

#[cfg(test)]
impl RootWithLink {
    pub(crate) fn new(tag: &str) -> Self {
        let base = std::env::temp_dir().join(format!("qoslet-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, outside) = (base.join("root"), base.join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let dir = CgroupBeneath::own(&root, Tree::V2).unwrap();
        Self {
            base,
            root,
            outside,
            dir,
        }
    }

    /// Writes `file` into `/real` (a directory of the root, made here) and into `outside`.
    pub(crate) fn write(&self, file: &str, real: &str, outside: &str) {
        std::fs::create_dir_all(self.root.join("real")).unwrap();
        std::fs::write(self.root.join("real").join(file), real).unwrap();
        std::fs::write(self.outside.join(file), outside).unwrap();
    }

    /// `path` (`/real`, `/link`) named beneath the root.
    pub(crate) fn dir(&self, path: &str) -> CgroupBeneath {
        CgroupBeneath {
            path: CgroupPath::parse(path).unwrap(),
            ..self.dir.clone()
        }
    }
}

#[cfg(test)]
impl Drop for RootWithLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procs_are_read_beneath_the_root_only() {
        let root = RootWithLink::new("beneath-procs");
        root.write("cgroup.procs", "12\n 34\nnot a pid\n", "99\n");
        assert_eq!(root.dir("/real").procs::<u32>().unwrap(), [12, 34]);
        assert_eq!(root.dir("/real").procs::<i32>().unwrap(), [12, 34]);
        assert!(root.dir("/link").procs::<u32>().is_err());
    }
}
