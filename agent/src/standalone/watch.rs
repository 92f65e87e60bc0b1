//! The standalone source: a manifest directory watched with inotify, like the kubelet's static
//! pod directory. Each change (debounced) reloads the directory and yields a [`Diff`] of the
//! desired state: pods and workload objects added, changed and removed (`source/build.rs`). A
//! reload that reads the texts the last one read stops there ([`Contents`]).
//! Standalone mode's `node::PodSource`, so it lives with its mode; the door it passes every
//! object through is `source/`.

use std::{
    collections::{BTreeMap, BTreeSet},
    hash::{BuildHasher as _, RandomState},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use thiserror::Error;
use tokio::io::unix::AsyncFd;

use crate::{
    cgroup::Runner,
    policy::pod::PodKey,
    runtime::spec::run_check,
    source::{
        admit::UnknownFields,
        build::{RunCheck, build_set},
        file::{DEFAULT_MAX_BYTES, read_bounded},
        manifest::{Loaded, expand, is_manifest_file, parse_documents},
        podset::{Diff, ManifestPod, ObjectKey, PodSet, diff},
    },
    support::inotify::InotifyFd,
    workload::{Object, Problem, ValidationOptions},
};

/// The directory could not be read or watched.
#[derive(Debug, Error)]
pub enum ManifestDirError {
    #[error("{dir}: cannot read the manifest directory: {source}")]
    Read {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{dir}: cannot watch the manifest directory: {source}")]
    Watch {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The unknown fields of the manifests (`source::admit::UnknownFields`), as `qoslet validate`
/// prints them, each with its line: a misspelt key (`resoures`) is dropped, as the API server
/// drops it, and said once. The texts are released.
fn warnings(loaded: &mut Loaded) -> BTreeSet<String> {
    let UnknownFields { mut found, more } = UnknownFields::of(&loaded.objects);
    let texts = std::mem::take(&mut loaded.texts);
    let mut all: Vec<&mut Problem> = found.iter_mut().collect();
    Loaded::locate(&texts, &mut all);
    found
        .iter()
        .map(ToString::to_string)
        .chain(more.iter().map(|(f, n)| UnknownFields::more_line(f, *n)))
        .collect()
}

/// Loads `dir` over `previous`: the new state. Files above `max_bytes`, FIFOs and devices are
/// problems (`source/file.rs`).
#[cfg(test)]
pub(crate) fn load_dir(
    dir: &Path,
    previous: &PodSet,
    opts: &ValidationOptions,
    runner: Runner,
    max_bytes: u64,
) -> Result<PodSet, ManifestDirError> {
    Ok(load_read(read_dir(dir, max_bytes)?, previous, opts, runner))
}

/// Each manifest file of `dir` with its text, or why it could not be read: a file may vanish or
/// be half-written between the listing and the read.
fn read_dir(
    dir: &Path,
    max_bytes: u64,
) -> Result<Vec<(PathBuf, io::Result<String>)>, ManifestDirError> {
    let files = expand(dir).map_err(|e| ManifestDirError::Read {
        dir: dir.to_path_buf(),
        source: e.source,
    })?;
    Ok(files
        .into_iter()
        .map(|file| {
            let text = read_bounded(&file, max_bytes);
            (file, text)
        })
        .collect())
}

/// The texts read by [`read_dir`] over `previous`: the new state. An unreadable file is a
/// problem; the next event reloads it.
fn load_read(
    read: Vec<(PathBuf, io::Result<String>)>,
    previous: &PodSet,
    opts: &ValidationOptions,
    runner: Runner,
) -> PodSet {
    let mut loaded = Loaded::default();
    let mut problems = BTreeSet::new();
    let mut unreadable = Vec::new();
    for (file, text) in read {
        match text {
            Ok(text) => {
                parse_documents(&file, &text, &mut loaded);
                loaded.texts.insert(file, text);
            }
            Err(e) => {
                problems.insert(format!("{}: cannot read: {e}", file.display()));
                unreadable.push(file);
            }
        }
    }
    let warnings = warnings(&mut loaded);
    // qoslet's own runtime checks at the door that it can run each pod; the kubelet's, nothing.
    let run_check = (runner == Runner::Qoslet).then_some(run_check as RunCheck);
    let mut next = build_set(Vec::new(), loaded, previous, opts, problems, run_check);
    next.warnings = warnings;
    next.broken_files.extend(unreadable);
    next
}

/// What a load read: each file with a hash of its text (none if unreadable). The same contents
/// load to the same state, so a reload that reads them again stops there.
type Contents = BTreeMap<PathBuf, Option<u64>>;

fn contents(read: &[(PathBuf, io::Result<String>)], keys: &RandomState) -> Contents {
    read.iter()
        .map(|(file, text)| (file.clone(), text.as_ref().ok().map(|t| keys.hash_one(t))))
        .collect()
}

/// How long a manifest file that stops parsing (an editor writing it half-way, a truncated
/// copy) keeps the objects it last held: they run on unchanged until the file parses again, or
/// are removed once this much time has passed. A file that is deleted, or that parses and no
/// longer holds an object, removes it at once.
pub(crate) const PARSE_GRACE: Duration = Duration::from_secs(30);

/// A burst of events is read as one change at most this long after its first event, however
/// long the burst lasts.
const MAX_SETTLE: Duration = Duration::from_secs(2);

/// Events on the directory itself and on its manifest files.
const DIR_EVENTS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

/// Events on the parent for the directory's name: it is removed, created or moved back.
const PARENT_EVENTS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_ONLYDIR);

/// A watched manifest directory.
///
/// [`ManifestWatch::changed`] is cancel-safe: what it has seen (events read, the debounce
/// deadline) lives in the struct, so a caller may poll it in a `select!` with other branches and
/// drop it at any await point without losing a change.
pub struct ManifestWatch {
    dir: PathBuf,
    fd: AsyncFd<InotifyFd>,
    /// The directory's own watch; `None` while the directory is missing.
    dir_wd: Option<WatchDescriptor>,
    /// The parent's watch, which sees the directory removed and created again.
    parent_wd: WatchDescriptor,
    /// The directory's name in its parent.
    dir_name: std::ffi::OsString,
    debounce: Duration,
    opts: ValidationOptions,
    runner: Runner,
    state: PodSet,
    /// A change was seen: reload at the first instant, or at the second (`MAX_SETTLE` after the
    /// burst's first event), whichever comes first.
    pending: Option<(Instant, Instant)>,
    parse_grace: Duration,
    /// Files that stopped parsing, since when.
    broken_since: BTreeMap<PathBuf, Instant>,
    max_bytes: u64,
    /// What the last load read; none before the first.
    contents: Option<Contents>,
    /// The keys of [`Contents`]' hashes, random per watch so that no file can be written to
    /// collide with another's.
    hash_keys: RandomState,
    /// How many reloads built a state (tests: a reload of unchanged files builds none).
    #[cfg(test)]
    loads: u64,
}

impl ManifestWatch {
    /// Starts watching `dir` for pods `runner` runs (the executor's); call
    /// [`ManifestWatch::reload`] for the initial load. A burst of events closer together than
    /// `debounce` causes one reload. Needs a tokio runtime.
    pub fn new(
        dir: &Path,
        debounce: Duration,
        opts: ValidationOptions,
        runner: Runner,
    ) -> Result<Self, ManifestDirError> {
        let watch_err = |source: io::Error| ManifestDirError::Watch {
            dir: dir.to_path_buf(),
            source,
        };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| watch_err(e.into()))?;
        let absolute = std::path::absolute(dir).map_err(watch_err)?;
        let (parent, dir_name) = match (absolute.parent(), absolute.file_name()) {
            (Some(p), Some(n)) => (p.to_path_buf(), n.to_os_string()),
            _ => return Err(watch_err(io::ErrorKind::InvalidInput.into())),
        };
        let parent_wd = inotify
            .add_watch(&parent, PARENT_EVENTS)
            .map_err(|e| watch_err(e.into()))?;
        let dir_wd = inotify
            .add_watch(dir, DIR_EVENTS)
            .map_err(|e| watch_err(e.into()))?;
        let fd = crate::support::inotify::register(inotify).map_err(watch_err)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            fd,
            dir_wd: Some(dir_wd),
            parent_wd,
            dir_name,
            debounce,
            opts,
            runner,
            state: PodSet::default(),
            pending: None,
            parse_grace: PARSE_GRACE,
            broken_since: BTreeMap::new(),
            max_bytes: DEFAULT_MAX_BYTES,
            contents: None,
            hash_keys: RandomState::new(),
            #[cfg(test)]
            loads: 0,
        })
    }

    /// The largest manifest file read (QosletConfiguration `maxManifestBytes`; default 4 MiB).
    pub(crate) fn with_max_manifest_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Overrides [`PARSE_GRACE`] (tests).
    #[cfg(test)]
    pub(crate) fn with_parse_grace(mut self, grace: Duration) -> Self {
        self.parse_grace = grace;
        self
    }

    /// The state of the last load.
    pub fn state(&self) -> &PodSet {
        &self.state
    }

    /// Reloads the directory now; the diff is against the last load. Objects of a file that no
    /// longer parses are kept for the parse grace period.
    pub fn reload(&mut self) -> Result<Diff, ManifestDirError> {
        let read = read_dir(&self.dir, self.max_bytes)?;
        let contents = contents(&read, &self.hash_keys);
        // The same texts and nothing held for a grace period (whose end changes the state with
        // no change of a file): the same state. An editor saving a file unchanged, or a tool
        // rewriting the directory as it was, costs the reads and nothing more.
        if self.state.broken_files.is_empty() && self.contents.as_ref() == Some(&contents) {
            return Ok(Diff::default());
        }
        #[cfg(test)]
        {
            self.loads += 1;
        }
        let mut next = load_read(read, &self.state, &self.opts, self.runner);
        self.contents = Some(contents);
        self.keep_broken(&mut next, Instant::now());
        let diff = diff(&self.state, &next);
        for line in &diff.new_problems {
            tracing::warn!(dir = %self.dir.display(), problem = %line, "Manifest skipped.");
        }
        for line in &diff.new_warnings {
            tracing::warn!(dir = %self.dir.display(), warning = %line, "Unknown field dropped.");
        }
        self.state = next;
        Ok(diff)
    }

    /// Carries the last good objects of each file that stopped parsing into `next`, while the
    /// file is within its grace period.
    fn keep_broken(&mut self, next: &mut PodSet, now: Instant) {
        self.broken_since
            .retain(|f, _| next.broken_files.contains(f));
        for file in &next.broken_files {
            let since = *self.broken_since.entry(file.clone()).or_insert(now);
            let from_file = |o: &Object| o.meta().origin.file == *file;
            let held_pods: Vec<(PodKey, ManifestPod)> = self
                .state
                .pods
                .iter()
                .filter(|(k, p)| from_file(&p.object) && !next.pods.contains_key(*k))
                .map(|(k, p)| (k.clone(), p.clone()))
                .collect();
            let held_objects: Vec<(ObjectKey, Object)> = self
                .state
                .objects
                .iter()
                .filter(|(k, o)| from_file(o) && !next.objects.contains_key(*k))
                .map(|(k, o)| (k.clone(), o.clone()))
                .collect();
            if held_pods.is_empty() && held_objects.is_empty() {
                continue;
            }
            if now.duration_since(since) >= self.parse_grace {
                tracing::warn!(file = %file.display(), grace_secs = self.parse_grace.as_secs_f64(), "Manifest still does not parse after the grace period; removing its objects.");
                continue;
            }
            if since == now {
                tracing::warn!(file = %file.display(), grace_secs = self.parse_grace.as_secs_f64(), "Manifest does not parse; its last good objects keep running for the grace period.");
            }
            next.pods.extend(held_pods);
            next.objects.extend(held_objects);
            next.held_files.insert(file.clone());
        }
    }

    /// When the parse grace of a file whose objects are held runs out.
    fn grace_deadline(&self) -> Option<Instant> {
        self.broken_since
            .iter()
            .filter(|(f, _)| self.state.held_files.contains(*f))
            .map(|(_, since)| *since + self.parse_grace)
            .min()
    }

    /// Waits for a change to a manifest file (or the end of a parse grace period), lets the
    /// burst settle, reloads and returns the diff (possibly empty when the files' contents did
    /// not change). Cancel-safe.
    pub async fn changed(&mut self) -> Result<Diff, ManifestDirError> {
        loop {
            let wake = match (self.pending, self.grace_deadline()) {
                (Some((quiet, cap)), grace) => {
                    Some(grace.map_or(quiet.min(cap), |g| quiet.min(cap).min(g)))
                }
                (None, grace) => grace,
            };
            let timer = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = self.relevant_events() => {
                    if r? {
                        let now = Instant::now();
                        let cap = self.pending.map_or(now + MAX_SETTLE, |(_, cap)| cap);
                        self.pending = Some((now + self.debounce, cap));
                    }
                }
                () = timer => {
                    self.pending = None;
                    return self.reload();
                }
            }
        }
    }

    /// Waits for inotify events; true when one concerns a manifest file or the directory.
    /// Re-adds the directory's watch when the directory comes back. Nothing is awaited after
    /// the events are read, so dropping the future loses none.
    async fn relevant_events(&mut self) -> Result<bool, ManifestDirError> {
        loop {
            let mut guard = self.fd.readable().await.map_err(|e| self.watch_err(e))?;
            let events =
                match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from)) {
                    Ok(Ok(events)) => events,
                    Ok(Err(e)) => return Err(self.watch_err(e)),
                    Err(_would_block) => continue,
                };
            let mut relevant = false;
            for e in &events {
                if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    relevant = true;
                } else if e.wd == self.parent_wd {
                    relevant |= e.name.as_deref() == Some(self.dir_name.as_os_str());
                } else if Some(e.wd) == self.dir_wd {
                    if e.mask.intersects(
                        AddWatchFlags::IN_DELETE_SELF
                            | AddWatchFlags::IN_MOVE_SELF
                            | AddWatchFlags::IN_IGNORED,
                    ) {
                        // Gone or moved away: a watch that followed it elsewhere must go too.
                        if let Some(wd) = self.dir_wd.take() {
                            let _ = self.fd.get_ref().0.rm_watch(wd);
                        }
                        relevant = true;
                    } else {
                        relevant |= e
                            .name
                            .as_ref()
                            .is_none_or(|n| is_manifest_file(Path::new(n)));
                    }
                }
            }
            if relevant && self.dir_wd.is_none() {
                // The directory may be back (created or moved in again); watch it anew. Files
                // written into it before this are read by the reload that follows.
                if let Ok(wd) = self.fd.get_ref().0.add_watch(&self.dir, DIR_EVENTS) {
                    self.dir_wd = Some(wd);
                }
            }
            return Ok(relevant);
        }
    }

    fn watch_err(&self, source: io::Error) -> ManifestDirError {
        ManifestDirError::Watch {
            dir: self.dir.clone(),
            source,
        }
    }
}

impl crate::node::PodSource for ManifestWatch {
    type Error = ManifestDirError;

    fn pods(&self) -> &PodSet {
        self.state()
    }

    fn changed(&mut self) -> impl Future<Output = Result<Diff, ManifestDirError>> + Send {
        ManifestWatch::changed(self)
    }
}

#[cfg(test)]
mod watch_tests;
