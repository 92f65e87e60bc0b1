//! An inotify instance readable through tokio: nix's `Inotify` implements `AsFd` but not the
//! `AsRawFd` that `AsyncFd` wants.

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd, RawFd},
};

use nix::sys::inotify::Inotify;
use tokio::io::{Interest, unix::AsyncFd};

/// The inotify descriptor, owned.
pub(crate) struct InotifyFd(pub Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Registers `inotify` (made with `IN_NONBLOCK`) with the runtime for readability.
pub(crate) fn register(inotify: Inotify) -> io::Result<AsyncFd<InotifyFd>> {
    // SAFETY: `InotifyFd` owns the descriptor and always returns it; it stays open until the
    // AsyncFd is dropped.
    unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
