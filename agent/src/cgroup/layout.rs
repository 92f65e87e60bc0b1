//! How the host mounts cgroups, read from /proc/self/mountinfo: pure cgroup v2, hybrid (v1
//! controllers and a controller-less v2 tree) or pure v1, and which hierarchies qoslet writes.

use std::{collections::BTreeMap, fs, io, path::PathBuf};

use thiserror::Error;

/// A v1 controller qoslet writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    Cpu,
    Cpuset,
    Memory,
    Pids,
}

impl Controller {
    pub(crate) const ALL: [Controller; 4] = [
        Controller::Cpu,
        Controller::Cpuset,
        Controller::Memory,
        Controller::Pids,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Cpuset => "cpuset",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
        }
    }
}

/// The host's cgroup layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayoutKind {
    /// cgroup2 with controllers (production nodes, the VM matrix).
    Unified,
    /// v1 controllers plus a controller-less cgroup2 tree (the development machines).
    Hybrid,
    /// v1 only.
    Legacy,
}

/// One hierarchy qoslet touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tree {
    /// A v1 controller hierarchy.
    V1(Controller),
    /// The cgroup2 tree with controllers.
    V2,
    /// The controller-less cgroup2 tree of a hybrid host: pods get an id, PSI and cgroup.kill.
    Unified,
}

/// Mount points per hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounts {
    pub(crate) kind: LayoutKind,
    /// Every hierarchy qoslet uses and where it is mounted.
    pub trees: BTreeMap<Tree, PathBuf>,
}

#[derive(Debug, Error)]
pub enum LayoutError {
    #[error("cannot read {file}: {source}")]
    Mountinfo {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "no cgroup hierarchy with the cpu or memory controller, nor a cgroup2 mount, is mounted"
    )]
    NoCgroups,
}

impl Mounts {
    /// Reads the layout of the running host.
    pub fn detect() -> Result<Self, LayoutError> {
        let file = PathBuf::from("/proc/self/mountinfo");
        let text = fs::read_to_string(&file).map_err(|source| LayoutError::Mountinfo {
            file: file.clone(),
            source,
        })?;
        Self::parse(&text).ok_or(LayoutError::NoCgroups)
    }

    /// Parses mountinfo text. Of several mounts of one hierarchy, a writable one under
    /// `/sys/fs/cgroup` wins, then any writable one, then the first; of several cgroup2 mounts,
    /// `/sys/fs/cgroup` (or `/sys/fs/cgroup/unified`) first. A container that mounts the host's
    /// `/` (cluster mode's `/host`, read-only) sees each hierarchy twice, and the copy under it
    /// can come first: writing there fails.
    pub(crate) fn parse(mountinfo: &str) -> Option<Self> {
        let mut v1: BTreeMap<Controller, (PathBuf, (bool, bool))> = BTreeMap::new();
        let mut v2: Vec<(PathBuf, (bool, bool))> = Vec::new();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mut l = left.split(' ').skip(4);
            let (Some(point), mount_opts) = (l.next(), l.next().unwrap_or("")) else {
                continue;
            };
            let mut r = right.split(' ');
            let (fstype, _source, opts) = (r.next(), r.next(), r.next().unwrap_or(""));
            let point = PathBuf::from(unescape(point));
            let writable = !mount_opts.split(',').any(|o| o == "ro");
            let rank = (writable && point.starts_with("/sys/fs/cgroup"), writable);
            match fstype {
                Some("cgroup2") => v2.push((point, rank)),
                Some("cgroup") => {
                    for c in Controller::ALL {
                        if opts.split(',').any(|o| o == c.name())
                            && v1.get(&c).is_none_or(|(_, best)| rank > *best)
                        {
                            v1.insert(c, (point.clone(), rank));
                        }
                    }
                }
                _ => {}
            }
        }
        let v1: BTreeMap<Controller, PathBuf> = v1.into_iter().map(|(c, (p, _))| (c, p)).collect();
        let preferred = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
        let unified = preferred
            .iter()
            .map(PathBuf::from)
            .find(|p| v2.iter().any(|(v, (_, writable))| v == p && *writable))
            .or_else(|| {
                // The best-ranked, the first among equals (`max_by_key` takes the last).
                let best = v2.iter().map(|(_, r)| *r).max()?;
                v2.iter().find(|(_, r)| *r == best).map(|(p, _)| p.clone())
            });
        let has_v1 = v1.contains_key(&Controller::Cpu) || v1.contains_key(&Controller::Memory);
        let mut trees = BTreeMap::new();
        let kind = match (has_v1, unified) {
            (false, None) => return None,
            (false, Some(u)) => {
                trees.insert(Tree::V2, u);
                LayoutKind::Unified
            }
            (true, u) => {
                for (c, p) in v1 {
                    trees.insert(Tree::V1(c), p);
                }
                match u {
                    Some(u) => {
                        trees.insert(Tree::Unified, u);
                        LayoutKind::Hybrid
                    }
                    None => LayoutKind::Legacy,
                }
            }
        };
        Some(Self { kind, trees })
    }

    /// Where processes are listed for the oom_score_adj scan: the v2 tree, else the v1 memory
    /// hierarchy (the one memory limits and the OOM killer act on; runtimes always join it).
    pub fn procs_tree(&self) -> Option<Tree> {
        [Tree::V2, Tree::V1(Controller::Memory)]
            .into_iter()
            .find(|t| self.trees.contains_key(t))
    }

    /// The tree whose directory inode is the cgroup id (the v2 or unified tree).
    pub fn id_tree(&self) -> Option<Tree> {
        [Tree::V2, Tree::Unified]
            .into_iter()
            .find(|t| self.trees.contains_key(t))
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v as char);
            i += 4;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_hosts_use_v1_controllers_and_the_unified_tree() {
        let m = Mounts::parse(HYBRID).unwrap();
        assert_eq!(m.kind, LayoutKind::Hybrid);
        assert_eq!(
            m.trees[&Tree::V1(Controller::Cpu)],
            PathBuf::from("/sys/fs/cgroup/cpu")
        );
        assert_eq!(
            m.trees[&Tree::Unified],
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        assert_eq!(m.procs_tree(), Some(Tree::V1(Controller::Memory)));
        assert_eq!(m.id_tree(), Some(Tree::Unified));
    }

    /// The host's `/` mounted read-only at `/host` before the pod's own `/sys/fs/cgroup` (the
    /// runtime mounts shallow paths first): the writable mounts under `/sys/fs/cgroup` win.
    #[test]
    fn a_read_only_copy_of_the_hosts_cgroups_is_not_taken() {
        let host = HYBRID
            .lines()
            .map(|l| {
                l.replace(" /sys/fs/cgroup", " /host/sys/fs/cgroup")
                    .replacen(" rw,", " ro,", 1)
            })
            .collect::<Vec<_>>()
            .join("\n");
        let m = Mounts::parse(&format!("{host}\n{HYBRID}")).unwrap();
        assert_eq!(
            m.trees[&Tree::V1(Controller::Memory)],
            PathBuf::from("/sys/fs/cgroup/memory")
        );
        assert_eq!(
            m.trees[&Tree::Unified],
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        let v2 = "30 23 0:26 / /host/sys/fs/cgroup ro - cgroup2 cgroup2 rw\n31 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            Mounts::parse(v2).unwrap().trees[&Tree::V2],
            PathBuf::from("/sys/fs/cgroup")
        );
    }

    #[test]
    fn pure_v2_and_pure_v1() {
        let v2 = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let m = Mounts::parse(v2).unwrap();
        assert_eq!(m.kind, LayoutKind::Unified);
        assert_eq!(m.trees.len(), 1);
        let v1 = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let m = Mounts::parse(v1).unwrap();
        assert_eq!(m.kind, LayoutKind::Legacy);
        assert_eq!(
            m.trees[&Tree::V1(Controller::Cpu)],
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert!(Mounts::parse("1 0 0:1 / / rw - ext4 /dev/sda rw\n").is_none());
    }
}
