//! Opening files beneath a directory held open: `openat2(2)` with `RESOLVE_BENEATH`, so a path
//! built from input can neither climb out of its root (`..`, an absolute path) nor be redirected
//! by a symlink or a mount. The cgroup engine (`cgroup/fs.rs`) and the container logs
//! (`runtime/logs.rs`) both open through here. Neither nix nor rustix's `std` feature set in this
//! workspace exposes `openat2` with `open_how`, so this is the raw syscall, in one place.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

/// Beneath the directory, no symlinks, no magic links (`/proc/self/fd/N`), no mount crossings.
pub const RESOLVE_STRICT: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

/// `openat2(dir, path, flags | O_CLOEXEC | O_NOFOLLOW, mode, resolve)`. An empty path opens
/// `dir` itself. `mode` matters only with `O_CREAT`.
pub fn openat2(
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
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
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

/// Creates the directory `name` (one plain component) in `dir`; `Ok(false)` when it existed.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &str, mode: libc::mode_t) -> io::Result<bool> {
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
pub fn open_subdir(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
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
pub fn subdirs(dir: BorrowedFd<'_>) -> io::Result<Vec<String>> {
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
pub fn is_plain_component(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && !name.chars().any(|c| c == '/' || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

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
