//! The standalone source: a manifest directory watched with inotify, like the kubelet's static
//! pod directory. Each change (debounced) reloads the directory and yields a [`Diff`] of the
//! desired state: pods and workload objects added, changed and removed. Invalid objects are
//! reported once, one line each (`file: Kind/namespace/name: rule: message`), and skipped while
//! the rest keep running; an update that breaks an immutability rule keeps the old object.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    os::fd::{AsFd as _, AsRawFd, RawFd},
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1 as core;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use thiserror::Error;
use tokio::io::{Interest, unix::AsyncFd};

use super::{
    admit::{Admitted, admit, unique_uids},
    file::{DEFAULT_MAX_BYTES, read_bounded},
    manifest::{Loaded, RawObject, expand, is_manifest_file, parse_documents},
};
use crate::{
    runtime::spec::{PodKey, PodRuntimeSpec},
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
    #[error("{dir}: cannot read the manifest directory")]
    Read {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{dir}: cannot watch the manifest directory")]
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
    for file in files {
        // A file may vanish or be half-written between the listing and the read: report it,
        // the next event reloads it.
        match read_bounded(&file, max_bytes) {
            Ok(text) => parse_documents(&file, &text, &mut loaded),
            Err(e) => {
                problems.insert(format!("{}: cannot read: {e}", file.display()));
            }
        }
    }
    let (next, diff) = build(loaded, previous, opts, problems);
    Ok((next, diff))
}

/// The pure part of [`load_dir`]: decoding, immutability, validation and the diff.
pub fn build(
    loaded: Loaded,
    previous: &PodSet,
    opts: &ValidationOptions,
    mut problems: BTreeSet<String>,
) -> (PodSet, Diff) {
    for m in loaded.malformed {
        problems.insert(m.to_string());
    }
    // Admission (source/admit.rs), then a Pod has to be runnable by the runtime; one pod per UID.
    let mut admitted = Vec::new();
    for raw in &loaded.objects {
        match decode(raw) {
            Ok(a) => admitted.push(a),
            Err(lines) => problems.extend(lines),
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
    let diff = diff(previous, &next);
    (next, diff)
}

/// Admission, and for a Pod, a spec the process runtime can run.
fn decode(raw: &RawObject) -> Result<Admitted, Vec<String>> {
    let lines = |ps: Vec<Problem>| ps.iter().map(ToString::to_string).collect::<Vec<_>>();
    let a = admit(raw).map_err(lines)?;
    if let Some(p) = &a.pod {
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

/// The inotify descriptor, readable through tokio.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A watched manifest directory.
pub struct ManifestWatch {
    dir: PathBuf,
    fd: AsyncFd<InotifyFd>,
    debounce: Duration,
    opts: ValidationOptions,
    state: PodSet,
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
        let flags = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        inotify
            .add_watch(dir, flags)
            .map_err(|e| watch_err(e.into()))?;
        // SAFETY: `InotifyFd` owns the descriptor and always returns it; it stays open until
        // the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE) }
            .map_err(|e| watch_err(e.into()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            fd,
            debounce,
            opts,
            state: PodSet::default(),
            max_bytes: DEFAULT_MAX_BYTES,
        })
    }

    /// The largest manifest file read (QosletConfiguration `maxManifestBytes`; default 4 MiB).
    pub fn with_max_manifest_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The state of the last load.
    pub fn state(&self) -> &PodSet {
        &self.state
    }

    /// Reloads the directory now; the diff is against the last load.
    pub fn reload(&mut self) -> Result<Diff, WatchError> {
        let (next, diff) = load_dir(&self.dir, &self.state, &self.opts, self.max_bytes)?;
        for line in &diff.new_problems {
            tracing::warn!(dir = %self.dir.display(), problem = %line, "Manifest skipped.");
        }
        self.state = next;
        Ok(diff)
    }

    /// Waits for a change to a manifest file, lets the burst settle, reloads and returns the
    /// diff (possibly empty when the files' contents did not change).
    pub async fn changed(&mut self) -> Result<Diff, WatchError> {
        while !self.relevant_events().await? {}
        loop {
            tokio::select! {
                r = self.relevant_events() => { r?; }
                _ = tokio::time::sleep(self.debounce) => break,
            }
        }
        self.reload()
    }

    /// Waits for inotify events; true when one concerns a manifest file or the directory.
    async fn relevant_events(&self) -> Result<bool, WatchError> {
        loop {
            let mut guard = self.fd.readable().await.map_err(|e| self.watch_err(e))?;
            match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from)) {
                Ok(Ok(events)) => {
                    return Ok(events.iter().any(|e| {
                        e.name
                            .as_ref()
                            .is_none_or(|n| is_manifest_file(Path::new(n)))
                    }));
                }
                Ok(Err(e)) => return Err(self.watch_err(e)),
                Err(_would_block) => continue,
            }
        }
    }

    fn watch_err(&self, source: io::Error) -> WatchError {
        WatchError::Watch {
            dir: self.dir.clone(),
            source,
        }
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
