//! Per-container log files: `<dir>/<namespace>_<name>_<uid>/<container>/<restart>.log`, the
//! layout of the kubelet's `/var/log/pods`.

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
};

use crate::policy::pod::PodKey;

/// The directory holding a pod's container logs.
pub fn pod_log_dir(log_dir: &Path, key: &PodKey) -> PathBuf {
    log_dir.join(format!("{}_{}_{}", key.namespace, key.name, key.uid))
}

/// The log file of one run of a container (`restart` counts from 0).
pub fn container_log_path(log_dir: &Path, key: &PodKey, container: &str, restart: u32) -> PathBuf {
    pod_log_dir(log_dir, key)
        .join(container)
        .join(format!("{restart}.log"))
}

/// Creates the log file (and its directories) that a run's stdout and stderr go to.
pub fn create(path: &Path) -> io::Result<File> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    File::create(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_kubelet_layout() {
        let key = PodKey {
            namespace: "ns".into(),
            name: "web".into(),
            uid: "u-1".into(),
        };
        assert_eq!(
            container_log_path(Path::new("/var/log/qoslet"), &key, "app", 2),
            Path::new("/var/log/qoslet/ns_web_u-1/app/2.log")
        );
    }
}
