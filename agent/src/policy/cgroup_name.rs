//! Cgroup names per driver (pkg/kubelet/cm/cgroup_manager_linux.go).

use super::settings::CgroupDriver;

/// A cgroup as components below the root, e.g. `["kubepods", "burstable", "pod<uid>"]`.
pub(crate) fn render(driver: CgroupDriver, root: &str, components: &[&str]) -> String {
    match driver {
        CgroupDriver::Cgroupfs => {
            let mut path = root.trim_end_matches('/').to_string();
            for c in components {
                path.push('/');
                path.push_str(c);
            }
            if path.is_empty() { "/".into() } else { path }
        }
        CgroupDriver::Systemd => {
            // Each component escapes `-` to `_`, slices nest by joining with `-`.
            let mut all: Vec<String> = systemd_root(root);
            all.extend(components.iter().map(|c| c.replace('-', "_")));
            let mut path = String::new();
            let mut prefix = String::new();
            for c in &all {
                if !prefix.is_empty() {
                    prefix.push('-');
                }
                prefix.push_str(c);
                path.push('/');
                path.push_str(&prefix);
                path.push_str(".slice");
            }
            if path.is_empty() { "/".into() } else { path }
        }
    }
}

/// `ParseSystemdToCgroupName`: the last slice names the whole chain,
/// `/foo.slice/foo-bar.slice` -> `["foo", "bar"]`; `_` unescapes to `-`.
fn systemd_root(root: &str) -> Vec<String> {
    let base = root.rsplit('/').find(|c| !c.is_empty()).unwrap_or("");
    let base = base.strip_suffix(".slice").unwrap_or(base);
    base.split('-')
        .filter(|c| !c.is_empty())
        .map(|c| c.replace('_', "-"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_driver() {
        let c = ["kubepods", "burstable", "pod1234-abcd"];
        assert_eq!(
            render(CgroupDriver::Cgroupfs, "/", &c),
            "/kubepods/burstable/pod1234-abcd"
        );
        assert_eq!(
            render(CgroupDriver::Systemd, "/", &c),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice"
        );
        assert_eq!(
            render(CgroupDriver::Cgroupfs, "/node1/", &["kubepods"]),
            "/node1/kubepods"
        );
        assert_eq!(
            render(CgroupDriver::Systemd, "/node.slice", &["kubepods"]),
            "/node.slice/node-kubepods.slice"
        );
        assert_eq!(
            render(CgroupDriver::Cgroupfs, "/", &["system.slice"]),
            "/system.slice"
        );
    }
}
