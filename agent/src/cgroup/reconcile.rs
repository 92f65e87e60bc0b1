//! The reconciler: desired state -> current files -> the minimal ordered writes -> results.
//! Directories are made (parents first) and, on cgroup v2, controllers enabled for the children
//! before any file is read, so a freshly created cgroup is compared like any other.

use std::{
    collections::{BTreeSet, HashSet},
    io,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use nix::sys::inotify::WatchDescriptor;

use tracing::{debug, info, warn};

use super::{
    changes::{ChangeFeed, Files, Key},
    desired::{DesiredCgroup, DesiredState, Role},
    diff::{FileState, PlannedWrite, plan_writes},
    files::{FileContext, V2_CONTROLLERS, files, has_managed_children},
    fs::{CgroupDir, CgroupFs},
    layout::{Controller, Tree},
    name::CgroupPath,
    report::{Mode, ReconcileError, ReconcileReport, WriteReport, WriteResult},
    value::{Value, parse_list},
};

/// Applies desired states to the node root's cgroups.
#[derive(Debug)]
pub struct Reconciler {
    fs: Arc<CgroupFs>,
    mode: Mode,
    /// With a change feed, a pass reads only the cgroups that may have changed (see
    /// [`super::changes`]); without one, every pass reads every file.
    feed: Option<Mutex<ChangeFeed>>,
}

/// What one pass needs besides the desired state.
struct PassContext<'a> {
    files: FileContext,
    feed: Option<&'a ChangeFeed>,
}

/// What surveying a run of cgroups found.
#[derive(Default)]
struct Survey {
    states: Vec<FileState>,
    /// Cgroups read in full without error: (index, tree, files), verified unless written.
    checked: Vec<(usize, Tree, Files)>,
    /// Watches placed in this run.
    watches: Vec<(Key, WatchDescriptor)>,
}

impl Survey {
    fn absorb(&mut self, other: Survey) {
        self.states.extend(other.states);
        self.checked.extend(other.checked);
        self.watches.extend(other.watches);
    }
}

fn vanished(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::ENODEV)
}

impl Reconciler {
    /// Takes the engine by value or shared (the eviction action opens pods' cgroups through it).
    pub fn new(fs: impl Into<Arc<CgroupFs>>, mode: Mode) -> Self {
        Self {
            fs: fs.into(),
            mode,
            feed: None,
        }
    }

    /// Reads only what may have changed since the last pass, from inotify events, and every
    /// file once per `full_every`.
    pub fn enable_change_feed(&mut self, full_every: Duration) -> io::Result<()> {
        self.feed = Some(Mutex::new(ChangeFeed::new(full_every)?));
        Ok(())
    }

    fn feed(&self) -> Option<MutexGuard<'_, ChangeFeed>> {
        self.feed.as_ref().map(crate::support::lock)
    }

    /// A watch on a cgroup the feed does not watch yet; `None` when it does or the cgroup does
    /// not exist (yet).
    fn new_watch(
        &self,
        feed: &ChangeFeed,
        tree: Tree,
        path: &CgroupPath,
    ) -> Option<WatchDescriptor> {
        if feed.is_watched(tree, path) {
            return None;
        }
        feed.add_watch(&self.fs.display_path(tree, path)).ok()
    }

    /// Whether a managed cgroup was written or removed by someone since the last pass (the
    /// change feed's events), so a pass should run now to put it back. False without a feed.
    pub(crate) fn changed_since_pass(&self) -> bool {
        self.feed().is_some_and(|mut f| f.absorb_events())
    }

    /// Cgroup directories (per tree) the change feed watches; 0 without a feed.
    pub fn watched_cgroups(&self) -> usize {
        self.feed().map_or(0, |f| f.watch_count())
    }

    pub fn fs(&self) -> &Arc<CgroupFs> {
        &self.fs
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// One pass. Every problem is reported per pod, cgroup or file; nothing aborts the pass.
    pub fn reconcile(&self, desired: &DesiredState) -> ReconcileReport {
        let mut report = ReconcileReport::new();
        for p in &desired.refused_pods {
            // The node logs each refusal once when it plans (`node::pass`); every pass would
            // repeat it.
            tracing::debug!(pod = %format!("{}/{}", p.namespace, p.name), error = %p.source, "Pod refused: its cgroup names are not valid.");
            report.errors.push(p.clone().into());
        }
        for n in &desired.refused_node {
            warn!(cgroup = %n.name, error = %n.source, "Node cgroup refused: its name is not valid.");
            report.errors.push(n.clone().into());
        }
        let mut feed = self.feed();
        if let Some(f) = feed.as_mut() {
            f.begin_pass();
            // The node root's own watch sees kubepods (or a reserved cgroup) removed.
            let root = CgroupPath::root();
            for tree in self.fs.trees() {
                if let Some(wd) = self.new_watch(f, tree, &root) {
                    f.watching((tree, root.clone()), wd);
                }
            }
        }
        let ctx = PassContext {
            files: FileContext {
                node_mems: self.node_mems(),
            },
            feed: feed.as_deref(),
        };
        // Node cgroups (kubepods, tiers, reserved) first: they are the pods' parents. Then the
        // pod subtrees, which are independent of each other, on a few threads: a full pass is
        // thousands of small opens and reads that each cost the kernel a few microseconds.
        let (node, pods): (Vec<_>, Vec<_>) = desired
            .cgroups
            .iter()
            .enumerate()
            .partition(|(_, c)| c.pod_uid.is_none());
        let mut survey = self.survey(&node, &ctx, &mut report);
        let chunks = pod_chunks(&pods, survey_threads(pods.len()));
        let parts: Vec<(Survey, ReconcileReport)> = if chunks.len() <= 1 {
            let mut part = ReconcileReport::new();
            vec![(self.survey(&pods, &ctx, &mut part), part)]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = chunks
                    .iter()
                    .map(|chunk| {
                        let ctx = &ctx;
                        let mut part = ReconcileReport::new();
                        scope.spawn(move || (self.survey(chunk, ctx, &mut part), part))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                    .collect()
            })
        };
        for (part, part_report) in parts {
            survey.absorb(part);
            report.absorb(part_report);
        }
        let Survey {
            mut states,
            checked,
            watches,
        } = survey;
        // The order of a sequential pass: by cgroup, then tree, then file.
        states.sort_by_key(|s| s.cgroup);
        let writes = plan_writes(states, self.fs.page_size());
        if let Some(f) = feed.as_mut() {
            for (key, wd) in watches {
                f.watching(key, wd);
            }
            // Written cgroups are read again next pass (their own writes raise events anyway).
            let written: HashSet<(usize, Tree)> =
                writes.iter().map(|w| (w.cgroup, w.tree)).collect();
            for (i, tree, files) in checked {
                if !written.contains(&(i, tree)) {
                    f.verified(tree, &desired.cgroups[i].path, files);
                }
            }
            // The node root is watched as well as every desired cgroup.
            if f.cgroup_count() > desired.cgroups.len() + 1 {
                let root = CgroupPath::root();
                let mut keep: HashSet<&CgroupPath> =
                    desired.cgroups.iter().map(|c| &c.path).collect();
                keep.insert(&root);
                f.retain(&keep);
            }
        }
        drop(feed);
        for w in writes {
            let c = &desired.cgroups[w.cgroup];
            let r = self.apply(c, &w, &mut report);
            report.writes.push(r);
        }
        report
    }

    /// Makes the cgroups exist (parents first) and reads the current value of each of their
    /// files. `cgroups` is in depth-first pre-order with each cgroup's desired-state index.
    fn survey(
        &self,
        cgroups: &[(usize, &DesiredCgroup)],
        ctx: &PassContext,
        report: &mut ReconcileReport,
    ) -> Survey {
        let mut out = Survey::default();
        let mut open = OpenParents::default();
        for &(i, c) in cgroups {
            for Located {
                tree,
                dir,
                files,
                mut first,
                watch,
            } in self.ensure(c, ctx, &mut open, report)
            {
                if let Some(wd) = watch {
                    out.watches.push(((tree, c.path.clone()), wd));
                }
                report.read += 1;
                let copy = ctx.feed.is_some().then(|| files.clone());
                let mut complete = dir.is_some();
                let mut gone = false;
                for (file, want) in files {
                    let read = match (&dir, first.take()) {
                        (None, _) => None,
                        (Some(_), Some(r)) => Some(r),
                        (Some(d), None) => Some(d.read(file)),
                    };
                    let current = match read {
                        None => None,
                        Some(Ok(s)) => Some(s),
                        Some(Err(e))
                            if vanished(&e) && !self.fs.exists(tree, &c.path).unwrap_or(false) =>
                        {
                            complete = false;
                            gone = true;
                            break;
                        }
                        Some(Err(source)) => {
                            report.errors.push(ReconcileError::Read {
                                path: self.fs.display_path(tree, &c.path),
                                file,
                                source,
                            });
                            complete = false;
                            continue;
                        }
                    };
                    out.states.push(FileState {
                        cgroup: i,
                        depth: c.path.depth(),
                        tree,
                        file,
                        current,
                        want,
                    });
                }
                if dir.is_some() && !gone {
                    report.compared.push((c.path.clone(), tree));
                }
                if let Some(files) = copy.filter(|_| complete) {
                    out.checked.push((i, tree, files));
                }
                if let Some(dir) = dir.filter(|_| has_managed_children(c)) {
                    open.push(tree, c.path.clone(), dir);
                }
            }
        }
        out
    }

    /// The node root's memory nodes in a v1 cpuset hierarchy.
    fn node_mems(&self) -> Option<crate::policy::cpuset::CpuSet> {
        let tree = Tree::V1(Controller::Cpuset);
        self.fs
            .read(tree, &CgroupPath::root(), "cpuset.mems")
            .ok()
            .and_then(|s| parse_list(&s))
            .filter(|s| !s.is_empty())
    }

    /// Makes the cgroup exist in every tree it belongs to and prepares it for children: v2
    /// controllers enabled, v1 cpusets cloned into new children (`cgroup.clone_children`, so a
    /// new pod starts with the right cpuset instead of an empty one and needs no write). Returns
    /// the trees to manage files in with the directory (`None`: missing, observe mode).
    fn ensure(
        &self,
        c: &DesiredCgroup,
        ctx: &PassContext,
        open: &mut OpenParents,
        report: &mut ReconcileReport,
    ) -> Vec<Located> {
        let mut out = Vec::new();
        let trees: Vec<Tree> = self.fs.trees().collect();
        for tree in trees {
            if c.role == Role::Reserved && tree == Tree::Unified {
                continue;
            }
            let files = files(c, tree, &ctx.files);
            if ctx.feed.is_some_and(|f| f.unchanged(tree, &c.path, &files)) {
                continue;
            }
            // Watched before anything is read, so a write landing after the read is seen.
            let watch = ctx.feed.and_then(|f| self.new_watch(f, tree, &c.path));
            let probe = files.first().map(|(f, _)| *f);
            let (mut dir, first) = match open.open(&self.fs, tree, c, probe) {
                Ok(Some((d, first))) => (Some(d), first),
                Ok(None) => (None, None),
                Err(source) => {
                    let path = self.fs.display_path(tree, &c.path);
                    report.errors.push(ReconcileError::Create { path, source });
                    continue;
                }
            };
            if dir.is_none() {
                let path = self.fs.display_path(tree, &c.path);
                if c.role == Role::Reserved {
                    warn!(path = %path.display(), "Reserved cgroup missing; it is not written.");
                    report.errors.push(ReconcileError::ReservedMissing { path });
                    continue;
                }
                if !c.create {
                    continue;
                }
                if self.mode == Mode::Observe {
                    info!(path = %path.display(), "Cgroup missing (observe mode: not created).");
                    report.created.push(path);
                    out.push(Located {
                        tree,
                        dir: None,
                        files,
                        first: None,
                        watch,
                    });
                    continue;
                }
                match self
                    .fs
                    .mkdir(tree, &c.path)
                    .and_then(|_| self.fs.open_dir(tree, &c.path))
                {
                    Ok(Some(d)) => {
                        debug!(path = %path.display(), "Cgroup created.");
                        report.created.push(path);
                        dir = Some(d);
                    }
                    Ok(None) => continue,
                    Err(source) => {
                        warn!(path = %path.display(), error = %source, "Cgroup could not be created.");
                        report.errors.push(ReconcileError::Create { path, source });
                        continue;
                    }
                }
            }
            if has_managed_children(c) {
                match tree {
                    Tree::V2 if c.enables_controllers => {
                        self.enable_controllers(c, dir.as_ref(), report);
                    }
                    Tree::V1(Controller::Cpuset) if c.role == Role::Kubepods => {
                        // kubepods has no children yet when its cpuset is empty, so setting it
                        // now cannot narrow anything; the tiers and pods then clone it.
                        let cpus = dir.as_ref().and_then(|d| d.read("cpuset.cpus").ok());
                        if cpus.is_some_and(|e| e.trim().is_empty()) {
                            for (file, want) in &files {
                                let want = want.render();
                                self.ensure_file(c, tree, dir.as_ref(), file, &want, report);
                            }
                        }
                        let d = dir.as_ref();
                        self.ensure_file(c, tree, d, "cgroup.clone_children", "1", report);
                    }
                    _ => {}
                }
            }
            // A cgroup made in this pass is watched from now on, before its files are read.
            let watch = match (watch, ctx.feed) {
                (None, Some(f)) if dir.is_some() => self.new_watch(f, tree, &c.path),
                (w, _) => w,
            };
            out.push(Located {
                tree,
                dir,
                files,
                first,
                watch,
            });
        }
        out
    }

    fn enable_controllers(
        &self,
        c: &DesiredCgroup,
        dir: Option<&CgroupDir>,
        report: &mut ReconcileReport,
    ) {
        let tree = Tree::V2;
        let read = |file| dir.and_then(|d| d.read(file).ok());
        // A cgroup not created yet (observe mode) would get what its parent offers.
        let available = match read("cgroup.controllers") {
            Some(s) => s,
            None => {
                let parent = c.path.parent().unwrap_or_default();
                self.fs
                    .read(tree, &parent, "cgroup.subtree_control")
                    .unwrap_or_default()
            }
        };
        let enabled = read("cgroup.subtree_control").unwrap_or_default();
        let have: BTreeSet<&str> = enabled.split_whitespace().collect();
        let can: BTreeSet<&str> = available.split_whitespace().collect();
        let missing: Vec<String> = V2_CONTROLLERS
            .iter()
            .filter(|k| can.contains(*k) && !have.contains(*k))
            .map(|k| format!("+{k}"))
            .collect();
        if !missing.is_empty() {
            let new = missing.join(" ");
            self.write_direct(
                c,
                tree,
                dir,
                "cgroup.subtree_control",
                enabled.trim(),
                &new,
                report,
            );
        }
    }

    /// A file that must hold `want` before children are made (written at once, not ordered).
    fn ensure_file(
        &self,
        c: &DesiredCgroup,
        tree: Tree,
        dir: Option<&CgroupDir>,
        file: &'static str,
        want: &str,
        report: &mut ReconcileReport,
    ) {
        let current = dir.and_then(|d| d.read(file).ok()).unwrap_or_default();
        if current.trim() != want {
            self.write_direct(c, tree, dir, file, current.trim(), want, report);
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the write's context, passed through from two callers"
    )]
    fn write_direct(
        &self,
        c: &DesiredCgroup,
        tree: Tree,
        dir: Option<&CgroupDir>,
        file: &'static str,
        old: &str,
        new: &str,
        report: &mut ReconcileReport,
    ) {
        let path = self.fs.display_path(tree, &c.path);
        let result = match (self.mode, dir) {
            (Mode::Enforce, Some(d)) if c.writes.allows(file) => match d.write(file, new) {
                Ok(()) => WriteResult::Written,
                Err(e) => self.failed(&path, file, new, e, report),
            },
            _ => {
                debug!(path = %path.display(), file, old, new, "Cgroup file differs from the plan (observe mode or the kubelet's file: not written; the node logs and counts each difference once, when first seen).");
                WriteResult::Drift
            }
        };
        report.writes.push(WriteReport {
            cgroup: c.path.clone(),
            tree,
            path,
            file,
            old: Some(old.to_string()),
            new: new.to_string(),
            result,
        });
    }

    fn failed(
        &self,
        path: &std::path::Path,
        file: &'static str,
        value: &str,
        source: io::Error,
        report: &mut ReconcileReport,
    ) -> WriteResult {
        let errno = source.raw_os_error().unwrap_or(0);
        warn!(path = %path.display(), file, value, error = %source, "Cgroup file write failed.");
        report.errors.push(ReconcileError::Write {
            path: path.into(),
            file,
            value: value.into(),
            source,
        });
        WriteResult::Failed { errno }
    }

    fn apply(
        &self,
        c: &DesiredCgroup,
        w: &PlannedWrite,
        report: &mut ReconcileReport,
    ) -> WriteReport {
        let path = self.fs.display_path(w.tree, &c.path);
        let new = w.new.render();
        let result = if self.mode == Mode::Observe || !c.writes.allows(w.file) {
            debug!(path = %path.display(), file = w.file, old = ?w.old, new = %new, "Cgroup file differs from the plan (observe mode or the kubelet's file: not written; the node logs and counts each difference once, when first seen).");
            WriteResult::Drift
        } else {
            match self.fs.write(w.tree, &c.path, w.file, &new) {
                Ok(()) => {
                    debug!(path = %path.display(), file = w.file, old = ?w.old, new = %new, "Cgroup file written.");
                    WriteResult::Written
                }
                Err(e) if vanished(&e) && !self.fs.exists(w.tree, &c.path).unwrap_or(false) => {
                    debug!(path = %path.display(), "Cgroup vanished during the pass.");
                    WriteResult::Vanished
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && is_memory_limit(w) => {
                    self.retry_at_usage(c, w, &path, e, report)
                }
                Err(e) => self.failed(&path, w.file, &new, e, report),
            }
        };
        WriteReport {
            cgroup: c.path.clone(),
            tree: w.tree,
            path,
            file: w.file,
            old: w.old.clone(),
            new,
            result,
        }
    }

    /// qos_container_manager_linux.go retrySetMemoryReserve: usage above the wanted limit made
    /// the write fail; set the limit to the usage to stop further growth.
    fn retry_at_usage(
        &self,
        c: &DesiredCgroup,
        w: &PlannedWrite,
        path: &std::path::Path,
        first: io::Error,
        report: &mut ReconcileReport,
    ) -> WriteResult {
        let usage_file = match w.tree {
            Tree::V2 => "memory.current",
            _ => "memory.usage_in_bytes",
        };
        let usage = self
            .fs
            .read(w.tree, &c.path, usage_file)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok());
        let want = match &w.new {
            Value::Limit { value: Some(v), .. } => *v,
            _ => return self.failed(path, w.file, &w.new.render(), first, report),
        };
        match usage {
            Some(usage) if usage > want => {
                let written = match self.fs.write(w.tree, &c.path, w.file, &usage.to_string()) {
                    Ok(()) => true,
                    Err(e) => {
                        self.failed(path, w.file, &usage.to_string(), e, report);
                        false
                    }
                };
                warn!(path = %path.display(), file = w.file, wanted = want, usage, written, "Memory limit below usage; set to the usage instead, as the kubelet does.");
                WriteResult::RetriedAtUsage { usage, written }
            }
            _ => self.failed(path, w.file, &w.new.render(), first, report),
        }
    }
}

/// Threads for surveying `pods` cgroups: one below a few hundred (spawning costs more than it
/// saves), else one per CPU up to four.
fn survey_threads(pods: usize) -> usize {
    if pods < 256 {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Splits pod cgroups (pre-order) into about `n` runs of equal length, cutting only where a pod
/// begins so that each pod's subtree stays in one run.
fn pod_chunks<'a>(
    pods: &[(usize, &'a DesiredCgroup)],
    n: usize,
) -> Vec<Vec<(usize, &'a DesiredCgroup)>> {
    let target = pods.len().div_ceil(n.max(1)).max(1);
    let mut chunks: Vec<Vec<(usize, &DesiredCgroup)>> = vec![Vec::new()];
    for &(i, c) in pods {
        let last = chunks.last_mut().expect("never empty");
        if last.len() >= target && c.role == Role::Pod {
            chunks.push(vec![(i, c)]);
        } else {
            last.push((i, c));
        }
    }
    chunks
}

/// The open directories of the cgroups on the path to the current one, per tree. Desired state
/// comes in depth-first pre-order, so each cgroup is opened by a one-component walk from its
/// parent and at most one branch of fds (kubepods, tier, pod) is held at a time.
#[derive(Default)]
struct OpenParents(Vec<(Tree, Vec<(CgroupPath, CgroupDir)>)>);

impl OpenParents {
    fn branch(&mut self, tree: Tree) -> &mut Vec<(CgroupPath, CgroupDir)> {
        let i = match self.0.iter().position(|(t, _)| *t == tree) {
            Some(i) => i,
            None => {
                self.0.push((tree, Vec::new()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }

    fn push(&mut self, tree: Tree, path: CgroupPath, dir: CgroupDir) {
        self.branch(tree).push((path, dir));
    }

    /// Finds `c` from its nearest open ancestor (or the node root), dropping the branch entries
    /// that are not its ancestors. Node cgroups are opened; pod and container cgroups are named
    /// relative to the nearest opened one (see `CgroupDir`), and their existence is learnt by
    /// reading `probe`, their first file, whose result is returned with them.
    fn open(
        &mut self,
        fs: &CgroupFs,
        tree: Tree,
        c: &DesiredCgroup,
        probe: Option<&str>,
    ) -> io::Result<Option<(CgroupDir, Option<io::Result<String>>)>> {
        let path = &c.path;
        let opened = |d: Option<CgroupDir>| d.map(|d| (d, None));
        let branch = self.branch(tree);
        while let Some((p, _)) = branch.last() {
            if p.depth() < path.depth() && path.starts_with(p) {
                break;
            }
            branch.pop();
        }
        if c.pod_uid.is_none() {
            return match branch.last() {
                Some((p, dir)) => dir
                    .open_descendant(&path.components()[p.depth()..].join("/"))
                    .map(opened),
                None => fs.open_dir(tree, path).map(opened),
            };
        }
        if branch.is_empty() {
            // The first pod of a run: open its parent (kubepods or a tier) once for the run.
            let Some(parent) = path.parent().filter(|p| p.depth() > 0) else {
                return fs.open_dir(tree, path).map(opened);
            };
            let Some(dir) = fs.open_dir(tree, &parent)? else {
                return Ok(None);
            };
            branch.push((parent, dir));
        }
        let (p, dir) = branch.last().expect("pushed above");
        dir.descendant(&path.components()[p.depth()..].join("/"), probe)
    }
}

/// A cgroup in one tree, ready to have its files read.
struct Located {
    tree: Tree,
    dir: Option<CgroupDir>,
    files: Vec<(&'static str, Value)>,
    /// The first file's content, when reading it is how the cgroup was found.
    first: Option<io::Result<String>>,
    /// A watch placed on it in this pass (change feed).
    watch: Option<WatchDescriptor>,
}

fn is_memory_limit(w: &PlannedWrite) -> bool {
    matches!(w.file, "memory.limit_in_bytes" | "memory.max")
}
