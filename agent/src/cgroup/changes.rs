//! Which managed cgroups may have changed since the reconciler last found them as planned.
//!
//! Every write to a cgroup interface file goes through `vfs_write`, which raises an inotify
//! `IN_MODIFY` on the file's directory, whoever the writer is; a removed cgroup raises
//! `IN_DELETE` on its parent's directory (kernfs sends no `IN_DELETE_SELF`), so the node root is
//! watched too. So once a cgroup was read and found right, with a watch on its directory
//! placed *before* that read, it needs no reading again until an event names it or its desired
//! files change. A no-op pass over a thousand pods then reads nothing, where reading every file
//! costs ~10k opens (tens of milliseconds of kernel time on hybrid hosts).
//!
//! What inotify cannot see: a value the kernel changes on its own (v1 `cpuset.cpus` losing an
//! unplugged CPU). A full pass every `full_every` covers that, and an event-queue overflow forces
//! one at once.

use std::{
    collections::{HashMap, HashSet},
    io,
    path::Path,
    time::{Duration, Instant},
};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::{layout::Tree, name::CgroupPath, value::Value};

pub(crate) type Key = (Tree, CgroupPath);

/// The files and values a cgroup held in one tree when it was last found as planned.
pub(crate) type Files = Vec<(&'static str, Value)>;

/// What is known of one cgroup in one tree.
#[derive(Debug)]
struct Entry {
    tree: Tree,
    wd: WatchDescriptor,
    /// Set when the cgroup was last read and found as planned; cleared by an event.
    verified: Option<Files>,
}

/// Inotify watches on the managed cgroups and what each held when last verified.
#[derive(Debug)]
pub(crate) struct ChangeFeed {
    inotify: Inotify,
    by_wd: HashMap<WatchDescriptor, Key>,
    // By path, then tree: lookups borrow the desired cgroup's path instead of cloning it.
    entries: HashMap<CgroupPath, Vec<Entry>>,
    full_every: Duration,
    last_full: Option<Instant>,
    /// Events were lost since the last pass: the next pass reads everything.
    overflowed: bool,
}

/// Files the kernel itself notifies on (event counters, populated state): their changes are not
/// someone else's writes.
fn kernel_notified(name: &str) -> bool {
    name.ends_with(".events") || name.ends_with(".events.local") || name == "memory.oom_control"
}

impl ChangeFeed {
    pub(crate) fn new(full_every: Duration) -> io::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        Ok(Self {
            inotify,
            by_wd: HashMap::new(),
            entries: HashMap::new(),
            full_every,
            last_full: None,
            overflowed: false,
        })
    }

    fn entry(&self, tree: Tree, path: &CgroupPath) -> Option<&Entry> {
        self.entries.get(path)?.iter().find(|e| e.tree == tree)
    }

    fn entry_mut(&mut self, tree: Tree, path: &CgroupPath) -> Option<&mut Entry> {
        self.entries
            .get_mut(path)?
            .iter_mut()
            .find(|e| e.tree == tree)
    }

    fn forget(&mut self, tree: Tree, path: &CgroupPath) -> Option<WatchDescriptor> {
        let list = self.entries.get_mut(path)?;
        let i = list.iter().position(|e| e.tree == tree)?;
        let wd = list.swap_remove(i).wd;
        if list.is_empty() {
            self.entries.remove(path);
        }
        self.by_wd.remove(&wd);
        Some(wd)
    }

    /// Reads the pending inotify events: forgets the verification of every cgroup an event
    /// names, and every cgroup removed. True when something a pass must look at happened (a
    /// write by anyone, a removal, an overflow); kernel notifications do not count.
    pub(crate) fn absorb_events(&mut self) -> bool {
        let mut touched = false;
        while let Ok(events) = self.inotify.read_events() {
            if events.is_empty() {
                break;
            }
            for e in events {
                if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    self.overflowed = true;
                    touched = true;
                    continue;
                }
                let Some((tree, path)) = self.by_wd.get(&e.wd).cloned() else {
                    continue;
                };
                if e.mask.contains(AddWatchFlags::IN_IGNORED) {
                    // The watch is gone: forget the cgroup entirely.
                    self.forget(tree, &path);
                    touched = true;
                    continue;
                }
                if e.mask.contains(AddWatchFlags::IN_DELETE) {
                    // A child cgroup removed: it (and its subtree, whose own events follow or
                    // already came) must be made again.
                    let child = e.name.as_deref().and_then(|n| n.to_str());
                    if let Some(child) = child.and_then(|n| path.join(n).ok())
                        && let Some(wd) = self.forget(tree, &child)
                    {
                        let _ = self.inotify.rm_watch(wd);
                        touched = true;
                    }
                    continue;
                }
                let noise = e
                    .name
                    .as_deref()
                    .and_then(|n| n.to_str())
                    .is_some_and(kernel_notified);
                if !noise && let Some(entry) = self.entry_mut(tree, &path) {
                    entry.verified = None;
                    touched = true;
                }
            }
        }
        touched
    }

    /// Starts a pass: reads the pending events, and forgets every verification when this pass
    /// must read everything (first pass, overflow, or a full pass is due).
    pub(crate) fn begin_pass(&mut self) {
        self.absorb_events();
        let full = std::mem::take(&mut self.overflowed)
            || self
                .last_full
                .is_none_or(|t| t.elapsed() >= self.full_every);
        if full {
            for entry in self.entries.values_mut().flatten() {
                entry.verified = None;
            }
            self.last_full = Some(Instant::now());
        }
    }

    /// Whether the cgroup was found holding exactly `files` in `tree` and nothing has touched
    /// it since.
    pub(crate) fn unchanged(&self, tree: Tree, path: &CgroupPath, files: &Files) -> bool {
        self.entry(tree, path)
            .and_then(|e| e.verified.as_ref())
            .is_some_and(|v| v == files)
    }

    pub(crate) fn is_watched(&self, tree: Tree, path: &CgroupPath) -> bool {
        self.entry(tree, path).is_some()
    }

    /// Watches a cgroup directory (its full path on this host). Call before reading its files,
    /// so that a write landing after the read is seen. The watch only tells what to read again;
    /// nothing is read or written through this path (files are opened with openat2 beneath the
    /// node root), so a redirected path could cost a read, never a wrong write. Safe from several threads; the returned
    /// descriptor goes to [`ChangeFeed::watching`] afterwards.
    pub(crate) fn add_watch(&self, dir: &Path) -> io::Result<WatchDescriptor> {
        let flags = AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_ONLYDIR
            | AddWatchFlags::IN_DONT_FOLLOW;
        Ok(self.inotify.add_watch(dir, flags)?)
    }

    pub(crate) fn watching(&mut self, (tree, path): Key, wd: WatchDescriptor) {
        if self.is_watched(tree, &path) {
            return;
        }
        self.by_wd.insert(wd, (tree, path.clone()));
        self.entries.entry(path).or_default().push(Entry {
            tree,
            wd,
            verified: None,
        });
    }

    /// Records that the cgroup holds `files` as planned in `tree`.
    pub(crate) fn verified(&mut self, tree: Tree, path: &CgroupPath, files: Files) {
        if let Some(entry) = self.entry_mut(tree, path) {
            entry.verified = Some(files);
        }
    }

    /// Drops the watches of cgroups no longer desired.
    pub(crate) fn retain(&mut self, desired: &HashSet<&CgroupPath>) {
        let gone: Vec<CgroupPath> = self
            .entries
            .keys()
            .filter(|k| !desired.contains(k))
            .cloned()
            .collect();
        for path in gone {
            for entry in self.entries.remove(&path).unwrap_or_default() {
                self.by_wd.remove(&entry.wd);
                let _ = self.inotify.rm_watch(entry.wd);
            }
        }
    }

    /// Watches held, one per managed cgroup and tree.
    pub(crate) fn watch_count(&self) -> usize {
        self.by_wd.len()
    }

    /// Cgroups with at least one watch.
    pub(crate) fn cgroup_count(&self) -> usize {
        self.entries.len()
    }
}
