//! Per-container log files: `<dir>/<namespace>_<name>_<uid>/<container>/<restart>.log`, the
//! layout of the kubelet's `/var/log/pods`.
//!
//! qoslet runs as root and the names come from manifests, so the log directory is opened once
//! and everything below it is made and opened relative to that descriptor: directories with
//! `mkdirat`, files with `openat2` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (`crate::support::beneath`).
//! A name that is not one plain path component (`..`, `x/../../esc`, an absolute path, a
//! control character, over 255 bytes) is refused, never rewritten: two pods must not be
//! sanitised into one log directory.

use std::{
    fs::{self, File},
    io,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use thiserror::Error;

use crate::{
    policy::pod::PodKey,
    support::beneath::{self, RESOLVE_STRICT},
};

/// A log file could not be made.
#[derive(Debug, Error)]
pub(crate) enum LogError {
    #[error(
        "{what} {value:?} is not a plain file name (no '/', '.', '..', control characters, at most 255 bytes); refusing to build a log path from it"
    )]
    Name { what: &'static str, value: String },
    #[error("{path}: cannot open the log directory: {source}{hint}", hint = crate::support::privilege_hint(.source))]
    OpenDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: cannot create the log file: {source}{hint}", hint = crate::support::privilege_hint(.source))]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The log directory, opened at its first use and then held open.
#[derive(Debug)]
pub(crate) struct LogDir {
    path: PathBuf,
    fd: Mutex<Option<Arc<OwnedFd>>>,
}

impl LogDir {
    /// The log directory `path` (the operator's `--log-dir`, trusted); nothing is opened yet.
    pub(crate) fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            fd: Mutex::new(None),
        }
    }

    /// The directory's descriptor, created and opened on first use; a failure is retried by the
    /// next call.
    fn fd(&self) -> Result<Arc<OwnedFd>, LogError> {
        let mut fd = crate::support::lock(&self.fd);
        if let Some(fd) = fd.as_ref() {
            return Ok(fd.clone());
        }
        let err = |source| LogError::OpenDir {
            path: self.path.clone(),
            source,
        };
        fs::create_dir_all(&self.path).map_err(err)?;
        let p = self
            .path
            .to_str()
            .ok_or_else(|| err(io::Error::from_raw_os_error(libc::EINVAL)))?;
        let opened = Arc::new(
            beneath::openat2(
                libc::AT_FDCWD,
                p,
                libc::O_PATH | libc::O_DIRECTORY,
                0,
                libc::RESOLVE_NO_MAGICLINKS,
            )
            .map_err(err)?,
        );
        *fd = Some(opened.clone());
        Ok(opened)
    }

    /// The directory of a container's logs, `<namespace>_<name>_<uid>/<container>` beneath this
    /// one, every name checked: what a container's log claim names.
    pub(crate) fn container_dir(&self, key: &PodKey, container: &str) -> Result<PathBuf, LogError> {
        self.checked_dir(key, container).map(|(_, dir)| dir)
    }

    /// The pod's directory name and the container's log directory, once every name they are
    /// built from is checked.
    fn checked_dir(&self, key: &PodKey, container: &str) -> Result<(String, PathBuf), LogError> {
        let pod = pod_dir_name(key)?;
        check("container name", container)?;
        let dir = self.path.join(&pod).join(container);
        Ok((pod, dir))
    }

    /// Creates (or truncates) the log file of one run of a container, making its directories;
    /// every name is checked first and every step stays beneath the log directory. Returns the
    /// file and its path (for messages).
    pub(crate) fn create(
        &self,
        key: &PodKey,
        container: &str,
        restart: u32,
    ) -> Result<(File, PathBuf), LogError> {
        let (pod, dir) = self.checked_dir(key, container)?;
        let path = dir.join(format!("{restart}.log"));
        let err = |source| LogError::Create {
            path: path.clone(),
            source,
        };
        let root = self.fd()?;
        beneath::mkdirat(root.as_fd(), &pod, 0o755).map_err(err)?;
        let pod_fd = open_dir(&root, &pod).map_err(err)?;
        beneath::mkdirat(pod_fd.as_fd(), container, 0o755).map_err(err)?;
        let fd = beneath::openat2(
            root.as_raw_fd(),
            &format!("{pod}/{container}/{restart}.log"),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o640,
            RESOLVE_STRICT,
        )
        .map_err(err)?;
        Ok((File::from(fd), path))
    }
}

fn open_dir(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    beneath::openat2(
        dir.as_raw_fd(),
        name,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        RESOLVE_STRICT,
    )
}

fn check(what: &'static str, value: &str) -> Result<(), LogError> {
    if beneath::is_plain_component(value) {
        Ok(())
    } else {
        Err(LogError::Name {
            what,
            value: value.to_owned(),
        })
    }
}

/// `<namespace>_<name>_<uid>`, each part and the whole a plain component.
pub(crate) fn pod_dir_name(key: &PodKey) -> Result<String, LogError> {
    check("namespace", &key.namespace)?;
    check("pod name", &key.name)?;
    check("pod uid", &key.uid)?;
    let name = format!("{}_{}_{}", key.namespace, key.name, key.uid);
    check("pod log directory", &name)?;
    Ok(name)
}

/// The log file of one run of a container (`restart` counts from 0), for display and tests.
pub fn container_log_path(log_dir: &Path, key: &PodKey, container: &str, restart: u32) -> PathBuf {
    log_dir
        .join(format!("{}_{}_{}", key.namespace, key.name, key.uid))
        .join(container)
        .join(format!("{restart}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str, uid: &str) -> PodKey {
        PodKey {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn follows_the_kubelet_layout() {
        assert_eq!(
            container_log_path(
                Path::new("/var/log/qoslet"),
                &key("ns", "web", "u-1"),
                "app",
                2
            ),
            Path::new("/var/log/qoslet/ns_web_u-1/app/2.log")
        );
    }

    #[test]
    fn names_that_are_not_one_component_are_refused() {
        for k in [
            key("..", "a", "u"),
            key("ns", "x/../../../../esc", "u"),
            key("ns", "a", "/etc"),
            key("ns", "a\nb", "u"),
            key("ns", &"n".repeat(252), "u"),
        ] {
            assert!(pod_dir_name(&k).is_err(), "{k:?}");
        }
        assert!(pod_dir_name(&key("ns", "a", "u")).is_ok());
    }

    #[test]
    fn files_stay_beneath_the_log_dir() {
        let base = std::env::temp_dir().join(format!("qoslet-logs-{}", std::process::id()));
        let logs = base.join("logs");
        let dir = LogDir::new(&logs);
        let k = key("ns", "web", "u-1");
        dir.create(&k, "app", 0).unwrap();
        assert!(logs.join("ns_web_u-1/app/0.log").is_file());
        for c in ["../../esc", "..", "/tmp/esc", "a\0b"] {
            assert!(
                matches!(dir.create(&k, c, 0), Err(LogError::Name { .. })),
                "{c:?}"
            );
            // The claim's path is refused for the same names.
            assert!(
                matches!(dir.container_dir(&k, c), Err(LogError::Name { .. })),
                "{c:?}"
            );
        }
        assert_eq!(
            dir.container_dir(&k, "app").unwrap(),
            logs.join("ns_web_u-1/app")
        );
        // A symlink planted where a container's directory goes is not followed.
        std::os::unix::fs::symlink(&base, logs.join("ns_web_u-1/evil")).unwrap();
        let e = dir.create(&k, "evil", 0).unwrap_err();
        assert!(matches!(e, LogError::Create { .. }), "{e}");
        assert!(!base.join("0.log").exists());
        fs::remove_dir_all(&base).unwrap();
    }
}
