//! Opening files beneath a directory held open: `openat2(2)` with `RESOLVE_BENEATH`, so a path
//! built from input can neither climb out of its root (`..`, an absolute path) nor be redirected
//! by a symlink or a mount. The cgroup engine (`cgroup/fs.rs`) and the container logs
//! (`runtime/logs.rs`) both open through here; files another root names (the kubelet's
//! configuration, `cluster/discover.rs`) are read inside that root with `RESOLVE_IN_ROOT`. Neither nix nor rustix's `std` feature set in this
//! workspace exposes `openat2` with `open_how`, so this is the raw syscall, in one place.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

/// Beneath the directory, no symlinks, no magic links (`/proc/self/fd/N`), no mount crossings.
pub(crate) const RESOLVE_STRICT: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

/// `openat2(dir, path, flags | O_CLOEXEC | O_NOFOLLOW, mode, resolve)`. An empty path opens
/// `dir` itself. `mode` matters only with `O_CREAT`.
pub(crate) fn openat2(
    dir: libc::c_int,
    path: &str,
    flags: libc::c_int,
    mode: libc::mode_t,
    resolve: u64,
) -> io::Result<OwnedFd> {
    openat2_following(dir, path, flags | libc::O_NOFOLLOW, mode, resolve)
}

/// [`openat2`] without `O_NOFOLLOW`: a symlink in the last component is followed too, as far as
/// `resolve` allows (with `RESOLVE_IN_ROOT`, only to a target inside the root).
fn openat2_following(
    dir: libc::c_int,
    path: &str,
    flags: libc::c_int,
    mode: libc::mode_t,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let cpath = CString::new(if path.is_empty() { "." } else { path })
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; zero is a valid value for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    if flags & libc::O_CREAT != 0 {
        how.mode = u64::from(mode);
    }
    how.resolve = resolve;
    // SAFETY: the pointers are valid for the call; the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            cpath.as_ptr(),
            &how as *const libc::open_how,
            size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Another root's view: `..`, absolute paths and symlinks (absolute ones included) resolve as if
/// `root` were `/`, so nothing outside it is reached; magic links (`/proc/self/root`) are refused.
/// For files named by another process's configuration, read beneath its root (or the host's).
pub(crate) const RESOLVE_ROOTED: u64 = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;

/// Opens `path` for reading inside `root` (a directory, `O_PATH` is enough) as that root's own
/// processes would see it ([`RESOLVE_ROOTED`]); symlinks are followed, inside the root.
pub(crate) fn open_in_root(
    root: BorrowedFd<'_>,
    path: &str,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    openat2_following(
        root.as_raw_fd(),
        path,
        libc::O_RDONLY | flags,
        0,
        RESOLVE_ROOTED,
    )
}

/// Reads the regular file at `path` inside `root` ([`open_in_root`]), at most `max` bytes: a
/// larger file is an error (`EFBIG`), not a truncated read.
pub(crate) fn read_in_root(root: BorrowedFd<'_>, path: &str, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let fd = open_in_root(root, path, 0)?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        // A FIFO would block, a device would not end.
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut buf = Vec::new();
    file.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    Ok(buf)
}

/// Creates the directory `name` (one plain component) in `dir`; `Ok(false)` when it existed.
pub(crate) fn mkdirat(dir: BorrowedFd<'_>, name: &str, mode: libc::mode_t) -> io::Result<bool> {
    if !is_plain_component(name) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let cname = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: mkdirat on a directory fd we borrow, with a single validated component.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), cname.as_ptr(), mode) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Opens the child directory `name` (one plain component) of `dir` for reading.
pub(crate) fn open_subdir(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    if !is_plain_component(name) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    openat2(
        dir.as_raw_fd(),
        name,
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
        RESOLVE_STRICT,
    )
}

/// The names of the child directories of `dir` (opened for reading) that are plain components.
pub(crate) fn subdirs(dir: BorrowedFd<'_>) -> io::Result<Vec<String>> {
    // A descriptor of its own: the listing consumes it and moves its offset.
    let listing = nix::dir::Dir::from_fd(dir.try_clone_to_owned()?)?;
    let mut out = Vec::new();
    for entry in listing.into_iter() {
        let entry = entry?;
        if entry.file_type() != Some(nix::dir::Type::Directory) {
            continue;
        }
        if let Ok(name) = entry.file_name().to_str()
            && is_plain_component(name)
        {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// One path component that names an entry of its directory and nothing else: not empty, not
/// `.` or `..`, no `/`, at most 255 bytes (NAME_MAX), and no control character (NUL ends a C
/// string early; a newline or escape in a file name forges lines in listings and logs).
pub(crate) fn is_plain_component(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && !name.chars().any(|c| c == '/' || c.is_control())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd as _;

    use super::*;

    #[test]
    fn read_in_root_sees_the_root_as_its_own_processes_do() {
        let base = std::env::temp_dir().join(format!("qoslet-beneath-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(base.join("secret"), "outside").unwrap();
        std::fs::write(root.join("etc/real"), "inside").unwrap();
        std::os::unix::fs::symlink("/etc/real", root.join("etc/abs")).unwrap();
        std::os::unix::fs::symlink("../../secret", root.join("etc/climb")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root/etc/passwd", root.join("etc/magic")).unwrap();
        let fd = std::fs::File::open(&root).unwrap();
        let read = |p: &str| read_in_root(fd.as_fd(), p, 6).map(|b| String::from_utf8(b).unwrap());
        assert_eq!(
            read("/etc/abs").unwrap(),
            "inside",
            "an absolute symlink stays inside"
        );
        assert_eq!(
            read("etc/../../../etc/real").unwrap(),
            "inside",
            "`..` stops at the root"
        );
        assert_eq!(
            read("etc/climb").unwrap_err().kind(),
            io::ErrorKind::NotFound,
            "no way to ../secret"
        );
        assert!(read("etc/magic").is_err(), "no magic links");
        std::fs::write(root.join("etc/real"), "toolong").unwrap();
        assert_eq!(
            read("/etc/real").unwrap_err().raw_os_error(),
            Some(libc::EFBIG)
        );
        assert_eq!(
            read("/etc").unwrap_err().raw_os_error(),
            Some(libc::EINVAL),
            "not a file"
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn plain_components() {
        for ok in ["a", "ns_web_u-1", "0.log", "..a", "a..", &"x".repeat(255)] {
            assert!(is_plain_component(ok), "{ok:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/abs",
            "x/../../esc",
            "a\0b",
            "a\nb",
            &"x".repeat(256),
        ] {
            assert!(!is_plain_component(bad), "{bad:?}");
        }
    }
}
