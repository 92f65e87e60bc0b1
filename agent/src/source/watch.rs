//! The standalone source: a manifest directory watched with inotify, like the kubelet's static
//! pod directory. Each change (debounced) reloads the directory and yields a [`Diff`] of the
//! desired state: pods and workload objects added, changed and removed. Invalid objects are
//! reported once, one line each (`file: Kind/namespace/name: rule: message`), and skipped while
//! the rest keep running; an update that breaks an immutability rule keeps the old object.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1 as core;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use thiserror::Error;
use tokio::io::unix::AsyncFd;

use crate::inotify::InotifyFd;

use super::{
    admit::{Admitted, admit, unique_uids},
    file::{DEFAULT_MAX_BYTES, read_bounded},
    manifest::{Loaded, RawObject, expand, is_manifest_file, parse_documents},
};
use crate::{
    policy::pod::PodKey,
    runtime::spec::PodRuntimeSpec,
    workload::{
        self, Forest, Kind, Object, ValidationOptions, apply_updates,
        problem::{Problem, Rule},
    },
};

/// A workload object's identity: namespace, kind and name.
pub type ObjectKey = (String, Kind, String);

/// A pod read from the directory: the API object and its workload-hierarchy view.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestPod {
    pub pod: core::Pod,
    pub object: Object,
}

/// The valid objects of the directory, and the problems of the invalid ones.
#[derive(Debug, Clone, Default)]
pub struct PodSet {
    pub pods: BTreeMap<PodKey, ManifestPod>,
    /// Workloads, PodGroups and CompositePodGroups.
    pub objects: BTreeMap<ObjectKey, Object>,
    /// Every current problem line, sorted.
    pub problems: BTreeSet<String>,
    /// Files that could not be read or hold a document that does not parse or decode.
    pub broken_files: BTreeSet<PathBuf>,
    /// Broken files whose last good objects are kept in this state for the parse grace period.
    pub held_files: BTreeSet<PathBuf>,
}

/// What changed between two loads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub pods_added: Vec<PodKey>,
    pub pods_changed: Vec<PodKey>,
    pub pods_removed: Vec<PodKey>,
    pub objects_added: Vec<ObjectKey>,
    pub objects_changed: Vec<ObjectKey>,
    pub objects_removed: Vec<ObjectKey>,
    /// Problem lines that were not reported by the previous load.
    pub new_problems: Vec<String>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        *self == Diff::default()
    }
}

impl PodSet {
    /// Every workload object and pod, as the workload module reads them.
    pub fn workload_objects(&self) -> impl Iterator<Item = &Object> {
        self.objects
            .values()
            .chain(self.pods.values().map(|p| &p.object))
    }

    /// The pods workload gating lets start now (`workload::startable`, per namespace).
    pub fn startable_pods(&self, opts: &ValidationOptions) -> BTreeSet<PodKey> {
        let mut names: BTreeSet<(String, String)> = BTreeSet::new();
        for (ns, forest) in Forest::by_namespace(self.workload_objects().cloned()) {
            for name in workload::startable(&forest, opts) {
                names.insert((ns.clone(), name));
            }
        }
        self.pods
            .iter()
            .filter(|(_, p)| {
                let m = p.object.meta();
                names.contains(&(m.namespace.clone(), m.name.clone()))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// The directory could not be read or watched.
#[derive(Debug, Error)]
pub enum WatchError {
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

/// Loads `dir` over `previous`: the new state and what changed. Files above `max_bytes`, FIFOs
/// and devices are problems (`source/file.rs`).
pub fn load_dir(
    dir: &Path,
    previous: &PodSet,
    opts: &ValidationOptions,
    max_bytes: u64,
) -> Result<(PodSet, Diff), WatchError> {
    let files = expand(dir).map_err(|e| WatchError::Read {
        dir: dir.to_path_buf(),
        source: e.source,
    })?;
    let mut loaded = Loaded::default();
    let mut problems = BTreeSet::new();
    let mut unreadable = Vec::new();
    for file in files {
        // A file may vanish or be half-written between the listing and the read: report it,
        // the next event reloads it.
        match read_bounded(&file, max_bytes) {
            Ok(text) => parse_documents(&file, &text, &mut loaded),
            Err(e) => {
                problems.insert(format!("{}: cannot read: {e}", file.display()));
                unreadable.push(file);
            }
        }
    }
    let (mut next, _) = build(loaded, previous, opts, problems);
    next.broken_files.extend(unreadable);
    let diff = diff(previous, &next);
    Ok((next, diff))
}

/// Who runs the pods a source yields, which decides one check at the door: qoslet's own runtime
/// needs every container's `command` (it has no images); under the kubelet the image's
/// entrypoint is the kubelet's business. Every other check is the same for both sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    Qoslet,
    Kubelet,
}

/// The pure part of [`load_dir`]: decoding, immutability, validation and the diff.
pub fn build(
    loaded: Loaded,
    previous: &PodSet,
    opts: &ValidationOptions,
    problems: BTreeSet<String>,
) -> (PodSet, Diff) {
    build_for(loaded, previous, opts, problems, Runner::Qoslet)
}

/// [`build`] for pods run by `runner`.
pub fn build_for(
    loaded: Loaded,
    previous: &PodSet,
    opts: &ValidationOptions,
    mut problems: BTreeSet<String>,
    runner: Runner,
) -> (PodSet, Diff) {
    let mut broken_files = BTreeSet::new();
    for m in loaded.malformed {
        problems.insert(m.to_string());
        broken_files.insert(m.file);
    }
    // Admission (source/admit.rs), then a Pod has to be runnable by the runtime; one pod per UID.
    let mut admitted = Vec::new();
    for raw in &loaded.objects {
        match decode(raw, runner) {
            Ok(a) => admitted.push(a),
            Err(lines) => {
                problems.extend(lines);
                broken_files.insert(raw.file.clone());
            }
        }
    }
    let holders = previous
        .pods
        .keys()
        .map(|k| (k.uid.clone(), (k.namespace.clone(), k.name.clone())))
        .collect();
    problems.extend(
        unique_uids(&mut admitted, &holders)
            .iter()
            .map(ToString::to_string),
    );
    let decoded: Vec<(Object, Option<core::Pod>)> = admitted
        .into_iter()
        .map(|a| (a.object, a.pod.map(|p| p.pod)))
        .collect();
    // Immutability: only objects still present can be updated; the rest are removals.
    let new_keys: BTreeSet<ObjectKey> = decoded.iter().map(|(o, _)| object_key(o)).collect();
    let old: Vec<Object> = previous
        .workload_objects()
        .filter(|o| new_keys.contains(&object_key(o)))
        .cloned()
        .collect();
    let applied = apply_updates(old, decoded.iter().map(|(o, _)| o.clone()).collect());
    for r in &applied.rejected {
        problems.insert(format!("{} (the previous object is kept)", r.problem));
    }
    let mut api_pods: BTreeMap<ObjectKey, (Object, core::Pod)> = BTreeMap::new();
    for (o, p) in decoded {
        if let Some(p) = p {
            api_pods.entry(object_key(&o)).or_insert((o, p));
        }
    }
    let old_pods: BTreeMap<ObjectKey, &ManifestPod> = previous
        .pods
        .values()
        .map(|p| (object_key(&p.object), p))
        .collect();
    let mut next = PodSet::default();
    let mut seen: BTreeSet<ObjectKey> = BTreeSet::new();
    for o in applied.objects {
        let key = object_key(&o);
        if !seen.insert(key.clone()) {
            problems.insert(
                Problem::on(
                    &o,
                    Rule::NameUnique,
                    "a second object with this name is ignored",
                )
                .to_string(),
            );
            continue;
        }
        match &o {
            Object::Pod(_) => {
                // An accepted update (or addition) is the new decoded object; a rejected one
                // leaves the old hierarchy view, so keep the old API object with it.
                let entry = match api_pods.get(&key) {
                    Some((new, pod)) if *new == o => ManifestPod {
                        pod: pod.clone(),
                        object: o,
                    },
                    _ => match old_pods.get(&key) {
                        Some(old) => (*old).clone(),
                        None => continue,
                    },
                };
                next.pods.insert(pod_key(&entry), entry);
            }
            _ => {
                next.objects.insert(key, o);
            }
        }
    }
    for forest in Forest::by_namespace(next.workload_objects().cloned()).values() {
        for p in workload::validate(forest, opts) {
            problems.insert(p.to_string());
        }
    }
    next.problems = problems;
    next.broken_files = broken_files;
    let diff = diff(previous, &next);
    (next, diff)
}

/// Admission, and for a Pod that qoslet's own runtime runs, a spec that runtime can run.
fn decode(raw: &RawObject, runner: Runner) -> Result<Admitted, Vec<String>> {
    let lines = |ps: Vec<Problem>| ps.iter().map(ToString::to_string).collect::<Vec<_>>();
    let a = admit(raw).map_err(lines)?;
    if runner == Runner::Qoslet
        && let Some(p) = &a.pod
    {
        PodRuntimeSpec::from_pod(&p.pod).map_err(|e| {
            lines(vec![Problem::on(
                &a.object,
                Rule::Schema,
                format!("{}: {}", e.field, e.message),
            )])
        })?;
    }
    Ok(a)
}

fn object_key(o: &Object) -> ObjectKey {
    let m = o.meta();
    (m.namespace.clone(), o.kind(), m.name.clone())
}

fn pod_key(p: &ManifestPod) -> PodKey {
    let m = &p.pod.metadata;
    let namespace = m.namespace.clone().unwrap_or_else(|| "default".into());
    let name = m.name.clone().unwrap_or_default();
    let uid = m
        .uid
        .clone()
        .unwrap_or_else(|| crate::policy::pod::derived_uid(&namespace, &name));
    PodKey {
        namespace,
        name,
        uid,
    }
}

/// What changed from `old` to `new`.
pub fn diff(old: &PodSet, new: &PodSet) -> Diff {
    fn split<K: Ord + Clone, V: PartialEq>(
        old: &BTreeMap<K, V>,
        new: &BTreeMap<K, V>,
    ) -> (Vec<K>, Vec<K>, Vec<K>) {
        let added = new
            .keys()
            .filter(|k| !old.contains_key(*k))
            .cloned()
            .collect();
        let changed = new
            .iter()
            .filter(|(k, v)| old.get(*k).is_some_and(|o| o != *v))
            .map(|(k, _)| k.clone())
            .collect();
        let removed = old
            .keys()
            .filter(|k| !new.contains_key(*k))
            .cloned()
            .collect();
        (added, changed, removed)
    }
    let (pods_added, pods_changed, pods_removed) = split(&old.pods, &new.pods);
    let (objects_added, objects_changed, objects_removed) = split(&old.objects, &new.objects);
    Diff {
        pods_added,
        pods_changed,
        pods_removed,
        objects_added,
        objects_changed,
        objects_removed,
        new_problems: new.problems.difference(&old.problems).cloned().collect(),
    }
}

/// How long a manifest file that stops parsing (an editor writing it half-way, a truncated
/// copy) keeps the objects it last held: they run on unchanged until the file parses again, or
/// are removed once this much time has passed. A file that is deleted, or that parses and no
/// longer holds an object, removes it at once.
pub const PARSE_GRACE: Duration = Duration::from_secs(30);

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
    state: PodSet,
    /// A change was seen: reload at the first instant, or at the second (`MAX_SETTLE` after the
    /// burst's first event), whichever comes first.
    pending: Option<(Instant, Instant)>,
    parse_grace: Duration,
    /// Files that stopped parsing, since when.
    broken_since: BTreeMap<PathBuf, Instant>,
    max_bytes: u64,
}

impl ManifestWatch {
    /// Starts watching `dir`; call [`ManifestWatch::reload`] for the initial load. A burst of
    /// events closer together than `debounce` causes one reload. Needs a tokio runtime.
    pub fn new(
        dir: &Path,
        debounce: Duration,
        opts: ValidationOptions,
    ) -> Result<Self, WatchError> {
        let watch_err = |source: io::Error| WatchError::Watch {
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
        let fd = crate::inotify::register(inotify).map_err(watch_err)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            fd,
            dir_wd: Some(dir_wd),
            parent_wd,
            dir_name,
            debounce,
            opts,
            state: PodSet::default(),
            pending: None,
            parse_grace: PARSE_GRACE,
            broken_since: BTreeMap::new(),
            max_bytes: DEFAULT_MAX_BYTES,
        })
    }

    /// The largest manifest file read (QosletConfiguration `maxManifestBytes`; default 4 MiB).
    pub fn with_max_manifest_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Overrides [`PARSE_GRACE`] (tests).
    pub fn with_parse_grace(mut self, grace: Duration) -> Self {
        self.parse_grace = grace;
        self
    }

    /// The state of the last load.
    pub fn state(&self) -> &PodSet {
        &self.state
    }

    /// Reloads the directory now; the diff is against the last load. Objects of a file that no
    /// longer parses are kept for the parse grace period.
    pub fn reload(&mut self) -> Result<Diff, WatchError> {
        let (mut next, _) = load_dir(&self.dir, &self.state, &self.opts, self.max_bytes)?;
        self.keep_broken(&mut next, Instant::now());
        let diff = diff(&self.state, &next);
        for line in &diff.new_problems {
            tracing::warn!(dir = %self.dir.display(), problem = %line, "Manifest skipped.");
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
    pub async fn changed(&mut self) -> Result<Diff, WatchError> {
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
    async fn relevant_events(&mut self) -> Result<bool, WatchError> {
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

    fn watch_err(&self, source: io::Error) -> WatchError {
        WatchError::Watch {
            dir: self.dir.clone(),
            source,
        }
    }
}

impl crate::node::PodSource for ManifestWatch {
    type Error = WatchError;

    fn pods(&self) -> &PodSet {
        self.state()
    }

    fn changed(&mut self) -> impl Future<Output = Result<Diff, WatchError>> + Send {
        ManifestWatch::changed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(files: &[(&str, &str)], prev: &PodSet) -> (PodSet, Diff) {
        let mut loaded = Loaded::default();
        for (name, text) in files {
            parse_documents(Path::new(name), text, &mut loaded);
        }
        build(loaded, prev, &ValidationOptions::default(), BTreeSet::new())
    }

    fn pod(name: &str, cmd: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: c, command: [{cmd}]}}]\n"
        )
    }

    fn names(keys: &[PodKey]) -> Vec<&str> {
        keys.iter().map(|k| k.name.as_str()).collect()
    }

    #[test]
    fn pods_are_added_changed_and_removed() {
        let (s1, d1) = load(
            &[
                ("a.yaml", &pod("a", "sleep")),
                ("b.yaml", &pod("b", "sleep")),
            ],
            &PodSet::default(),
        );
        assert_eq!(names(&d1.pods_added), ["a", "b"]);
        assert!(d1.new_problems.is_empty(), "{:?}", d1.new_problems);
        let (s2, d2) = load(&[("a.yaml", &pod("a", "cat"))], &s1);
        assert_eq!(names(&d2.pods_changed), ["a"]);
        assert_eq!(names(&d2.pods_removed), ["b"]);
        assert!(d2.pods_added.is_empty());
        let (_, d3) = load(&[("a.yaml", &pod("a", "cat"))], &s2);
        assert!(d3.is_empty(), "{d3:?}");
    }

    #[test]
    fn a_broken_pod_is_reported_once_and_skipped() {
        let broken = "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  containers: [{name: c, image: x}]\n";
        let files = [
            ("a.yaml", pod("a", "sleep")),
            ("bad.yaml", broken.to_owned()),
        ];
        let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
        let (s1, d1) = load(&files, &PodSet::default());
        assert_eq!(names(&d1.pods_added), ["a"]);
        assert_eq!(
            d1.new_problems,
            [
                "bad.yaml: Pod/bad: schema: spec.containers[0].command: required: qoslet runs commands on the host and has no image entrypoint"
            ]
        );
        let (_, d2) = load(&files, &s1);
        assert!(d2.is_empty(), "reported again: {d2:?}");
    }

    #[test]
    fn pods_refused_at_the_door_are_not_in_the_set() {
        let uid = "6f1e3c1a-0b7a-4c1e-9a51-2f8d3c4b5a60";
        let with = |meta: &str, container: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{{meta}}}\nspec:\n  containers: [{container}]\n"
            )
        };
        let c = "{name: c, command: [sleep]}";
        let files = [
            ("a.yaml", with("name: Bad_Name", c)),
            ("b.yaml", with("name: b, uid: not-a-uuid", c)),
            ("c.yaml", with("name: c", "{name: C_1, command: [sleep]}")),
            ("d.yaml", with("name: d", &format!("{c}, {c}"))),
            (
                "e.yaml",
                with(
                    "name: e",
                    "{name: c, command: [sleep], resources: {limits: {cpu: \"-2\"}}}",
                ),
            ),
            ("f.yaml", with(&format!("name: f, uid: {uid}"), c)),
            ("g.yaml", with(&format!("name: g, uid: {uid}"), c)),
        ];
        let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
        let (s1, d1) = load(&files, &PodSet::default());
        assert_eq!(names(&d1.pods_added), ["f"], "{:?}", d1.new_problems);
        let rules: Vec<&str> = d1
            .new_problems
            .iter()
            .map(|l| l.split(": ").nth(2).unwrap_or_default())
            .collect();
        assert_eq!(
            rules,
            [
                "name-dns-subdomain",
                "uid-format",
                "container-name-dns-label",
                "container-name-unique",
                "quantity-non-negative",
                "uid-unique",
            ]
        );
        // Reported once: the same files again change nothing.
        let (_, d2) = load(&files, &s1);
        assert!(d2.is_empty(), "{d2:?}");
    }

    #[test]
    fn the_running_pod_keeps_its_uid_when_an_earlier_file_claims_it() {
        let uid = "6f1e3c1a-0b7a-4c1e-9a51-2f8d3c4b5a60";
        let p = |name: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: {uid}}}\nspec:\n  containers: [{{name: c, command: [sleep]}}]\n"
            )
        };
        let (s1, _) = load(&[("z.yaml", &p("running"))], &PodSet::default());
        let (s2, d2) = load(
            &[("a.yaml", &p("newcomer")), ("z.yaml", &p("running"))],
            &s1,
        );
        assert!(
            d2.pods_added.is_empty() && d2.pods_removed.is_empty(),
            "{d2:?}"
        );
        assert_eq!(d2.new_problems.len(), 1, "{:?}", d2.new_problems);
        assert!(d2.new_problems[0].starts_with("a.yaml: Pod/newcomer: uid-unique"));
        assert_eq!(
            s2.pods.keys().next().map(|k| k.name.as_str()),
            Some("running")
        );
    }

    #[test]
    fn an_immutable_change_keeps_the_old_pod() {
        let with_group = |g: &str, cmd: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  schedulingGroup: {{podGroupName: {g}}}\n  containers: [{{name: c, command: [{cmd}]}}]\n"
            )
        };
        let (s1, _) = load(
            &[("p.yaml", &with_group("g1", "sleep"))],
            &PodSet::default(),
        );
        let (s2, d2) = load(&[("p.yaml", &with_group("g2", "cat"))], &s1);
        assert!(d2.pods_changed.is_empty(), "{d2:?}");
        assert_eq!(d2.new_problems.len(), 1, "{:?}", d2.new_problems);
        assert!(d2.new_problems[0].contains("immutable-scheduling-group"));
        let kept = s2.pods.values().next().unwrap();
        let cmd = &kept.pod.spec.as_ref().unwrap().containers[0].command;
        assert_eq!(cmd.as_deref(), Some(&["sleep".to_owned()][..]));
    }

    #[test]
    fn workload_objects_are_diffed_and_gate_their_pods() {
        let group = "apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: g}\nspec:\n  schedulingPolicy: {gang: {minCount: 2}}\n";
        let member = |n: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {n}}}\nspec:\n  schedulingGroup: {{podGroupName: g}}\n  containers: [{{name: c, command: [sleep]}}]\n"
            )
        };
        let (s1, d1) = load(&[("m1.yaml", &member("m1"))], &PodSet::default());
        assert!(
            s1.startable_pods(&ValidationOptions::default()).is_empty(),
            "held without its group"
        );
        let (s2, d2) = load(&[("g.yaml", group), ("m1.yaml", &member("m1"))], &s1);
        assert_eq!(d2.objects_added.len(), 1);
        assert!(
            s2.startable_pods(&ValidationOptions::default()).is_empty(),
            "gang of 2 with 1 pod"
        );
        let (s3, _) = load(
            &[
                ("g.yaml", group),
                ("m1.yaml", &member("m1")),
                ("m2.yaml", &member("m2")),
            ],
            &s2,
        );
        assert_eq!(s3.startable_pods(&ValidationOptions::default()).len(), 2);
        let (_, d4) = load(&[("m1.yaml", &member("m1"))], &s3);
        assert_eq!(d4.objects_removed.len(), 1);
        assert_eq!(names(&d4.pods_removed), ["m2"]);
        assert_eq!(names(&d1.pods_added), ["m1"]);
    }
}

#[cfg(test)]
mod watch_tests;
