//! The ground floor: helpers every room may use and that use no other room (docs/architecture.md,
//! "Floors and rooms"): a poisoned mutex's data, an error's chain on one line, the privileges
//! qoslet needs, paths opened beneath a directory, an inotify descriptor for tokio.

pub(crate) mod beneath;
pub(crate) mod inotify;
pub(crate) mod privilege;

/// Locks a mutex even if a holder panicked: qoslet's mutexes guard plain data (maps, lists,
/// counters) that stays usable, and a node agent must keep running.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An error and its causes on one line (`what: why: errno text`), each cause once, with what to
/// do when the cause is a missing privilege. For messages at the binary's edge, where `{e}`
/// alone would hide the errno.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut denied = false;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            denied |= matches!(io.raw_os_error(), Some(libc::EACCES | libc::EPERM));
        }
        let text = c.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
        cause = c.source();
    }
    if denied {
        line.push_str(PRIVILEGE_HINT);
    }
    line
}

/// What to do about EACCES / EPERM on cgroup files and process placement.
pub(crate) const PRIVILEGE_HINT: &str = " (run qoslet as root, or give it CAP_SYS_ADMIN and CAP_DAC_OVERRIDE: it writes the cgroup filesystem)";

/// [`PRIVILEGE_HINT`] when `e` is a permission error, else nothing.
pub(crate) fn privilege_hint(e: &std::io::Error) -> &'static str {
    if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
        PRIVILEGE_HINT
    } else {
        ""
    }
}

#[cfg(test)]
mod error_tests {
    #[derive(Debug, thiserror::Error)]
    #[error("node root /x: cannot create")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_chain_names_the_errno_and_what_to_do() {
        let e = Outer(std::io::Error::from_raw_os_error(libc::EACCES));
        let line = super::error_chain(&e);
        assert!(
            line.starts_with("node root /x: cannot create: Permission denied (os error 13)"),
            "{line}"
        );
        assert!(line.ends_with(super::PRIVILEGE_HINT), "{line}");
        let e = Outer(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            super::error_chain(&e),
            "node root /x: cannot create: No such file or directory (os error 2)"
        );
    }
}
