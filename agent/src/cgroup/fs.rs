//! Safe access to cgroup files: every open is `openat2` beneath the node root's directory in
//! that hierarchy with symlinks, magic links and mount crossings refused, so a path can neither
//! escape the node root nor be redirected. Files are written with one `write(2)`, as the kernel
//! expects, and never created or truncated.

use std::{
    collections::BTreeMap,
    ffi::CString,
    fs::File,
    io::{self, Read as _, Write as _},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use thiserror::Error;

use super::{
    layout::{Mounts, Tree},
    name::CgroupPath,
};

#[derive(Debug, Error)]
#[error("cannot open the node root {path}")]
pub struct OpenRootError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// One cgroup directory, held open so its files are opened by a single component.
#[derive(Debug)]
pub struct CgroupDir(OwnedFd);

impl CgroupDir {
    pub fn read(&self, file: &str) -> io::Result<String> {
        let fd = openat2(self.0.as_raw_fd(), file, libc::O_RDONLY, RESOLVE)?;
        let mut s = String::new();
        File::from(fd).read_to_string(&mut s)?;
        Ok(s)
    }

    pub fn write(&self, file: &str, value: &str) -> io::Result<()> {
        let fd = openat2(self.0.as_raw_fd(), file, libc::O_WRONLY, RESOLVE)?;
        write_once(File::from(fd), value)
    }
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

const RESOLVE: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

fn openat2(dir: libc::c_int, path: &str, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    let cpath = CString::new(if path.is_empty() { "." } else { path })
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; zero is a valid value for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    how.resolve = resolve;
    // SAFETY: the pointers are valid for the call; the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            cpath.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
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

    pub fn mounts(&self) -> &Mounts {
        &self.mounts
    }

    pub fn node_root(&self) -> &CgroupPath {
        &self.node_root
    }

    pub fn page_size(&self) -> i64 {
        self.page
    }

    /// The hierarchies qoslet uses.
    pub fn trees(&self) -> impl Iterator<Item = Tree> + '_ {
        self.roots.keys().copied()
    }

    /// The full path of a cgroup (or one of its files) in a hierarchy, for reports.
    pub fn display_path(&self, tree: Tree, cgroup: &CgroupPath) -> PathBuf {
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
            .map(|fd| fd.as_raw_fd())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn file_path(cgroup: &CgroupPath, file: &str) -> String {
        if cgroup.depth() == 0 {
            file.into()
        } else {
            format!("{}/{file}", cgroup.relative())
        }
    }

    pub fn exists(&self, tree: Tree, cgroup: &CgroupPath) -> io::Result<bool> {
        self.open_dir(tree, cgroup).map(|d| d.is_some())
    }

    /// Opens the cgroup directory; `None` when it does not exist.
    pub fn open_dir(&self, tree: Tree, cgroup: &CgroupPath) -> io::Result<Option<CgroupDir>> {
        match openat2(
            self.root(tree)?,
            &cgroup.relative(),
            libc::O_PATH | libc::O_DIRECTORY,
            RESOLVE,
        ) {
            Ok(fd) => Ok(Some(CgroupDir(fd))),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
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
    pub fn mkdir(&self, tree: Tree, cgroup: &CgroupPath) -> io::Result<bool> {
        let (Some(parent), Some(last)) = (cgroup.parent(), cgroup.components().last()) else {
            return Ok(false);
        };
        let dir = openat2(
            self.root(tree)?,
            &parent.relative(),
            libc::O_PATH | libc::O_DIRECTORY,
            RESOLVE,
        )?;
        let name = CString::new(last.as_str())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: mkdirat on a directory fd we hold with a validated single component.
        if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            Ok(false)
        } else {
            Err(e)
        }
    }

    pub fn read(&self, tree: Tree, cgroup: &CgroupPath, file: &str) -> io::Result<String> {
        let fd = openat2(
            self.root(tree)?,
            &Self::file_path(cgroup, file),
            libc::O_RDONLY,
            RESOLVE,
        )?;
        let mut s = String::new();
        File::from(fd).read_to_string(&mut s)?;
        Ok(s)
    }

    pub fn write(
        &self,
        tree: Tree,
        cgroup: &CgroupPath,
        file: &str,
        value: &str,
    ) -> io::Result<()> {
        let fd = openat2(
            self.root(tree)?,
            &Self::file_path(cgroup, file),
            libc::O_WRONLY,
            RESOLVE,
        )?;
        write_once(File::from(fd), value)
    }
}
