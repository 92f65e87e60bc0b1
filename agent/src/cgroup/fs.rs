//! Safe access to cgroup files: every open is `openat2` beneath the node root's directory in
//! that hierarchy with symlinks, magic links and mount crossings refused, so a path can neither
//! escape the node root nor be redirected. Files are written with one `write(2)`, as the kernel
//! expects, and never created or truncated.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    ffi::CString,
    fs::File,
    io::{self, Read as _, Write as _},
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
};

use thiserror::Error;

use super::{
    layout::{Mounts, Tree},
    name::CgroupPath,
};

#[derive(Debug, Error)]
#[error("cannot open the node root {path}: {source}{hint}", hint = crate::support::privilege_hint(.source))]
pub struct OpenRootError {
    pub(crate) path: PathBuf,
    #[source]
    pub(crate) source: io::Error,
}

/// One cgroup directory: held open, or named relative to an open ancestor (`prefix`, ending in
/// `/`). Pods and containers are the latter: a no-op pass over a thousand pods would otherwise
/// open and close ten thousand directories on a hybrid host, and every open and close is a few
/// microseconds of kernel time. Files are opened beneath the ancestor either way.
#[derive(Debug, Clone)]
pub(crate) struct CgroupDir {
    fd: Arc<OwnedFd>,
    prefix: String,
}

impl CgroupDir {
    fn opened(fd: OwnedFd) -> Self {
        Self {
            fd: Arc::new(fd),
            prefix: String::new(),
        }
    }

    fn path_of<'a>(&'a self, file: &'a str) -> Cow<'a, str> {
        if self.prefix.is_empty() {
            Cow::Borrowed(file)
        } else {
            Cow::Owned(format!("{}{file}", self.prefix))
        }
    }

    pub(crate) fn read(&self, file: &str) -> io::Result<String> {
        let path = self.path_of(file);
        read_small(openat2(
            self.fd.as_raw_fd(),
            &path,
            libc::O_RDONLY,
            RESOLVE,
        )?)
    }

    pub(crate) fn write(&self, file: &str, value: &str) -> io::Result<()> {
        let path = self.path_of(file);
        let fd = openat2(self.fd.as_raw_fd(), &path, libc::O_WRONLY, RESOLVE)?;
        write_once(File::from(fd), value)
    }

    /// Opens a descendant (`relative`: validated components joined by `/`); `None` when it does
    /// not exist. A one-component walk from here is much cheaper than one from the node root.
    pub(crate) fn open_descendant(&self, relative: &str) -> io::Result<Option<CgroupDir>> {
        open_dir_beneath(self.fd.as_raw_fd(), &self.path_of(relative))
    }

    /// A descendant named relative to this directory's open ancestor, without opening it; `None`
    /// when it does not exist. With a `probe` file, reading it is the existence check and its
    /// result comes back too (the caller needs it anyway); otherwise, or when the probe is
    /// missing, one `fstatat`. fstatat cannot refuse symlinks on the way as openat2 does, which
    /// is harmless: cgroupfs holds no symlinks and nothing is opened through that check.
    pub(crate) fn descendant(
        &self,
        relative: &str,
        probe: Option<&str>,
    ) -> io::Result<Option<(CgroupDir, Option<io::Result<String>>)>> {
        let dir = CgroupDir {
            fd: Arc::clone(&self.fd),
            prefix: format!("{}{relative}/", self.prefix),
        };
        let probed = probe.map(|file| dir.read(file));
        let dir_missing = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::ENOENT));
        if let Some(r) = probed.as_ref()
            && !r.as_ref().is_err_and(dir_missing)
        {
            return Ok(Some((dir, probed)));
        }
        let cpath = CString::new(dir.prefix.trim_end_matches('/'))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: stat is plain data the kernel fills; the path is a valid C string.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor, a NUL-terminated path and a valid out pointer.
        let rc = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                cpath.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return if dir_missing(&e) { Ok(None) } else { Err(e) };
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(Some((dir, probed)))
    }
}

fn open_dir_beneath(dir: libc::c_int, relative: &str) -> io::Result<Option<CgroupDir>> {
    match openat2(dir, relative, libc::O_PATH | libc::O_DIRECTORY, RESOLVE) {
        Ok(fd) => Ok(Some(CgroupDir::opened(fd))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads a whole interface file. `File::read_to_string` would first `statx` and `lseek` for a
/// size hint (meaningless on kernfs: every file is 4096 bytes) and then read twice; a no-op
/// reconcile reads thousands of files, so read into a stack buffer and stop at the first short
/// read, which on a seq_file means the end.
pub(crate) fn read_small(fd: OwnedFd) -> io::Result<String> {
    let mut f = File::from(fd);
    let mut buf = [0u8; 512];
    let mut out = Vec::new();
    loop {
        let n = match f.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.extend_from_slice(&buf[..n]);
        if n < buf.len() {
            break;
        }
    }
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Interface files take a value in one write(2).
fn write_once(mut f: File, value: &str) -> io::Result<()> {
    let n = f.write(value.as_bytes())?;
    if n != value.len() {
        return Err(io::Error::from(io::ErrorKind::WriteZero));
    }
    Ok(())
}

/// The node root opened in every hierarchy qoslet uses.
#[derive(Debug)]
pub struct CgroupFs {
    mounts: Mounts,
    node_root: CgroupPath,
    roots: BTreeMap<Tree, OwnedFd>,
    page: i64,
}

const RESOLVE: u64 = crate::support::beneath::RESOLVE_STRICT;

fn openat2(dir: libc::c_int, path: &str, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    crate::support::beneath::openat2(dir, path, flags, 0, resolve)
}

impl CgroupFs {
    /// Opens `node_root` in every hierarchy of `mounts`; it must exist in each of them.
    pub fn open(mounts: Mounts, node_root: CgroupPath) -> Result<Self, OpenRootError> {
        let mut roots = BTreeMap::new();
        for (tree, mount) in &mounts.trees {
            let full = mount.join(node_root.relative());
            let err = |source| OpenRootError {
                path: full.clone(),
                source,
            };
            let m = mount
                .to_str()
                .ok_or_else(|| err(io::ErrorKind::InvalidInput.into()))?;
            let mount_fd = openat2(
                libc::AT_FDCWD,
                m,
                libc::O_PATH | libc::O_DIRECTORY,
                libc::RESOLVE_NO_SYMLINKS,
            )
            .map_err(err)?;
            let fd = openat2(
                mount_fd.as_raw_fd(),
                &node_root.relative(),
                libc::O_PATH | libc::O_DIRECTORY,
                RESOLVE,
            )
            .map_err(err)?;
            roots.insert(*tree, fd);
        }
        // SAFETY: sysconf has no preconditions.
        let page = i64::from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as i32).max(4096);
        Ok(Self {
            mounts,
            node_root,
            roots,
            page,
        })
    }

    pub(crate) fn mounts(&self) -> &Mounts {
        &self.mounts
    }

    pub fn node_root(&self) -> &CgroupPath {
        &self.node_root
    }

    pub(crate) fn page_size(&self) -> i64 {
        self.page
    }

    /// The hierarchies qoslet uses.
    pub(crate) fn trees(&self) -> impl Iterator<Item = Tree> + '_ {
        self.roots.keys().copied()
    }

    /// The full path of a cgroup (or one of its files) in a hierarchy, for reports.
    pub(crate) fn display_path(&self, tree: Tree, cgroup: &CgroupPath) -> PathBuf {
        let mount = self.mounts.trees.get(&tree).map(PathBuf::as_path);
        let mut p = mount
            .unwrap_or(Path::new("/"))
            .join(self.node_root.relative());
        if cgroup.depth() > 0 {
            p.push(cgroup.relative());
        }
        p
    }

    fn root(&self, tree: Tree) -> io::Result<libc::c_int> {
        self.roots
            .get(&tree)
            .map(std::os::fd::AsRawFd::as_raw_fd)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn file_path(cgroup: &CgroupPath, file: &str) -> String {
        if cgroup.depth() == 0 {
            file.into()
        } else {
            format!("{}/{file}", cgroup.relative())
        }
    }

    pub(crate) fn exists(&self, tree: Tree, cgroup: &CgroupPath) -> io::Result<bool> {
        self.open_dir(tree, cgroup).map(|d| d.is_some())
    }

    /// Opens the cgroup directory; `None` when it does not exist.
    pub(crate) fn open_dir(
        &self,
        tree: Tree,
        cgroup: &CgroupPath,
    ) -> io::Result<Option<CgroupDir>> {
        open_dir_beneath(self.root(tree)?, &cgroup.relative())
    }

    /// Opens the cgroup directory itself for reading (its entries, its extended attributes,
    /// files relative to it), where [`CgroupFs::open_dir`]'s `O_PATH` descriptor cannot serve.
    pub fn open_dir_fd(&self, tree: Tree, cgroup: &CgroupPath) -> io::Result<OwnedFd> {
        openat2(
            self.root(tree)?,
            &cgroup.relative(),
            libc::O_RDONLY | libc::O_DIRECTORY,
            RESOLVE,
        )
    }

    /// The cgroup id: the kernfs inode of the directory.
    pub fn inode(&self, tree: Tree, cgroup: &CgroupPath) -> io::Result<u64> {
        let fd = openat2(
            self.root(tree)?,
            &cgroup.relative(),
            libc::O_PATH | libc::O_DIRECTORY,
            RESOLVE,
        )?;
        use std::os::unix::fs::MetadataExt as _;
        File::from(fd).metadata().map(|m| m.ino())
    }

    /// Creates the cgroup directory; its parent must exist. `Ok(false)` when it already did.
    pub(crate) fn mkdir(&self, tree: Tree, cgroup: &CgroupPath) -> io::Result<bool> {
        let (Some(parent), Some(last)) = (cgroup.parent(), cgroup.components().last()) else {
            return Ok(false);
        };
        let dir = openat2(
            self.root(tree)?,
            &parent.relative(),
            libc::O_PATH | libc::O_DIRECTORY,
            RESOLVE,
        )?;
        crate::support::beneath::mkdirat(dir.as_fd(), last.as_str(), 0o755)
    }

    /// Removes the cgroup directory (it must have no children and no processes). `Ok(false)`
    /// when it did not exist. The node root itself is never removed here.
    pub(crate) fn rmdir(&self, tree: Tree, cgroup: &CgroupPath) -> io::Result<bool> {
        let (Some(parent), Some(last)) = (cgroup.parent(), cgroup.components().last()) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        let dir = match openat2(
            self.root(tree)?,
            &parent.relative(),
            libc::O_PATH | libc::O_DIRECTORY,
            RESOLVE,
        ) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(e),
        };
        let name = CString::new(last.as_str())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: unlinkat on a directory fd we hold with a validated single component.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOENT) {
            Ok(false)
        } else {
            Err(e)
        }
    }

    pub(crate) fn read(&self, tree: Tree, cgroup: &CgroupPath, file: &str) -> io::Result<String> {
        read_small(self.open_file(tree, cgroup, file, libc::O_RDONLY)?)
    }

    /// Opens one of the cgroup's files with `flags` (`O_RDONLY` or `O_WRONLY`), beneath the node
    /// root. Not `O_PATH`: with it `O_NOFOLLOW` opens a trailing symlink itself instead of
    /// refusing it (openat2(2)).
    pub(crate) fn open_file(
        &self,
        tree: Tree,
        cgroup: &CgroupPath,
        file: &str,
        flags: libc::c_int,
    ) -> io::Result<OwnedFd> {
        openat2(
            self.root(tree)?,
            &Self::file_path(cgroup, file),
            flags,
            RESOLVE,
        )
    }

    pub(crate) fn write(
        &self,
        tree: Tree,
        cgroup: &CgroupPath,
        file: &str,
        value: &str,
    ) -> io::Result<()> {
        let fd = self.open_file(tree, cgroup, file, libc::O_WRONLY)?;
        write_once(File::from(fd), value)
    }
}
