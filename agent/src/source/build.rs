//! The pure part of loading: decoding, admission (`source/admit.rs`), immutability, validation
//! and the diff, for the manifest directory and the API alike. Invalid objects are reported
//! once, one line each (`file: Kind/namespace/name: rule: message`), and skipped while the rest
//! keep running; an update that breaks an immutability rule keeps the old object.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1 as core;

use super::{
    admit::{Admitted, AdmittedPod, admit, admit_typed, unique_uids},
    manifest::Loaded,
};
use crate::workload::{
    self, Forest, Object, ValidationOptions, apply_updates,
    problem::{Problem, Rule},
};

#[cfg(test)]
use super::podset::Diff;
use super::podset::{ManifestPod, ObjectKey, PodSet, object_key, pod_key};

/// The check of each admitted pod that the runtime running it makes at the door: qoslet's own
/// runtime needs what it runs (every container's `command`, among others:
/// `runtime::spec::run_check`); under the kubelet there is none (the image's entrypoint is the
/// kubelet's business). The mode gives it, so that the door knows no runtime.
pub(crate) type RunCheck = fn(&core::Pod) -> Result<(), Unrunnable>;

/// Why the runtime cannot run a pod: the field and the message of the pod's problem line.
#[derive(Debug)]
pub(crate) struct Unrunnable {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// [`build_set`] from `loaded` alone, and the diff from `previous`.
#[cfg(test)]
pub(crate) fn build(
    loaded: Loaded,
    previous: &PodSet,
    opts: &ValidationOptions,
    problems: BTreeSet<String>,
    run_check: Option<RunCheck>,
) -> (PodSet, Diff) {
    let next = build_set(Vec::new(), loaded, previous, opts, problems, run_check);
    let diff = super::podset::diff(previous, &next);
    (next, diff)
}

/// Decoding, admission, immutability and validation of `loaded` over `previous`; `run_check` is
/// the runtime's check of each pod, if it has one. `unchanged` are objects admitted before that
/// have not changed since (the API's, by uid and resourceVersion): kept as admitted, not decoded
/// or admitted again. Admission reads nothing but the object, so its answer stands until the
/// object changes; what relates objects (one pod per UID, immutability, the hierarchy's rules)
/// runs over all. The caller takes the diff once it has the whole next state.
pub(crate) fn build_set(
    unchanged: Vec<Admitted>,
    loaded: Loaded,
    previous: &PodSet,
    opts: &ValidationOptions,
    mut problems: BTreeSet<String>,
    run_check: Option<RunCheck>,
) -> PodSet {
    let mut broken_files = BTreeSet::new();
    for m in loaded.malformed {
        problems.insert(m.to_string());
        broken_files.insert(m.file);
    }
    // Admission (source/admit.rs), then a Pod has to be runnable by the runtime; one pod per UID.
    // What is unchanged passed both before.
    let mut admitted = unchanged;
    for raw in &loaded.objects {
        match admit(raw)
            .map_err(lines)
            .and_then(|a| runnable(a, run_check))
        {
            Ok(a) => admitted.push(a),
            Err(lines) => {
                problems.extend(lines);
                broken_files.insert(raw.file.clone());
            }
        }
    }
    for (origin, typed) in loaded.typed {
        match admit_typed(typed, origin)
            .map_err(lines)
            .and_then(|a| runnable(a, run_check))
        {
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
    let decoded: Vec<(Object, Option<AdmittedPod>)> =
        admitted.into_iter().map(|a| (a.object, a.pod)).collect();
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
    let mut api_pods: BTreeMap<ObjectKey, (Object, AdmittedPod)> = BTreeMap::new();
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
    // Collected, then built at once: a map filled key by key in ascending order leaves its nodes
    // half empty, and a node holds its pods whole (about 3 KB each).
    let mut pods = Vec::new();
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
                // leaves the old hierarchy view, so keep the old API object with it. Each key
                // comes here once (`seen`), so the admitted pod is moved, not copied.
                let entry = match api_pods.remove(&key) {
                    Some((new, a)) if new == o => ManifestPod {
                        pod: a.pod,
                        object: o,
                        view: a.view,
                        spec_hash: a.spec_hash,
                    },
                    _ => match old_pods.get(&key) {
                        Some(old) => (*old).clone(),
                        None => continue,
                    },
                };
                pods.push((pod_key(&entry), entry));
            }
            _ => {
                next.objects.insert(key, o);
            }
        }
    }
    next.pods = pods.into_iter().collect();
    for forest in Forest::by_namespace(next.workload_objects().cloned()).values() {
        for p in workload::validate(forest, opts) {
            problems.insert(p.to_string());
        }
    }
    next.problems = problems;
    next.broken_files = broken_files;
    next
}

fn lines(ps: Vec<Problem>) -> Vec<String> {
    ps.iter().map(ToString::to_string).collect()
}

/// A Pod the runtime's check refuses is a problem line, at the field it names.
fn runnable(a: Admitted, run_check: Option<RunCheck>) -> Result<Admitted, Vec<String>> {
    if let (Some(check), Some(p)) = (run_check, &a.pod) {
        check(&p.pod).map_err(|e| {
            lines(vec![Problem::on(
                &a.object,
                Rule::Schema,
                format!("{}: {}", e.field, e.message),
            )])
        })?;
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{
        policy::pod::{PodKey, PodSpecView},
        source::{manifest::parse_documents, podset::spec_hash},
        workload::Origin,
    };

    /// A runtime's check as the mode gives it: every container needs a `command`.
    fn needs_commands(pod: &core::Pod) -> Result<(), Unrunnable> {
        let containers = pod.spec.iter().flat_map(|s| &s.containers);
        match containers.enumerate().find(|(_, c)| c.command.is_none()) {
            Some((i, _)) => Err(Unrunnable {
                field: format!("spec.containers[{i}].command"),
                message: "required: this runtime runs commands".into(),
            }),
            None => Ok(()),
        }
    }

    fn load(files: &[(&str, &str)], prev: &PodSet) -> (PodSet, Diff) {
        let mut loaded = Loaded::default();
        for (name, text) in files {
            parse_documents(Path::new(name), text, &mut loaded);
        }
        build(
            loaded,
            prev,
            &ValidationOptions::default(),
            BTreeSet::new(),
            Some(needs_commands),
        )
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
                "bad.yaml: Pod/bad: schema: spec.containers[0].command: required: this runtime runs commands"
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
        // A forward reference is held, as the scheduler holds it, and says so.
        assert_eq!(
            s1.held_pods(&ValidationOptions::default())
                .into_values()
                .collect::<Vec<_>>(),
            ["waiting for PodGroup/g to exist"]
        );
        assert!(d1.new_problems.is_empty(), "{:?}", d1.new_problems);
        let (s2, d2) = load(&[("g.yaml", group), ("m1.yaml", &member("m1"))], &s1);
        assert_eq!(d2.objects_added.len(), 1);
        assert!(
            s2.startable_pods(&ValidationOptions::default()).is_empty(),
            "gang of 2 with 1 pod"
        );
        assert_eq!(
            s2.held_pods(&ValidationOptions::default())
                .into_values()
                .collect::<Vec<_>>(),
            ["waiting for PodGroup/g to reach its minimum"]
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

    /// The API's pods go to admission typed, with no document in between; the views are
    /// computed there once and carried, and a manifest's pod decodes to the same thing.
    #[test]
    fn typed_pods_are_admitted_as_they_are_and_carry_their_views() {
        let uid = "6f1e3c1a-0b7a-4c1e-9a51-2f8d3c4b5a60";
        let doc = |name: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: {uid}}}\nspec:\n  containers: [{{name: c, command: [sleep], resources: {{requests: {{memory: 64Mi}}}}}}]\n"
            )
        };
        let typed = |name: &str| -> k8s_openapi::api::core::v1::Pod {
            serde_yaml_ng::from_str(&doc(name)).unwrap()
        };
        let api = |run_check: Option<RunCheck>| {
            let mut loaded = Loaded::default();
            for (index, name) in ["a", "Bad_Name"].into_iter().enumerate() {
                let origin = Origin {
                    file: "api".into(),
                    index,
                };
                loaded
                    .typed
                    .push((origin, workload::Typed::Pod(Box::new(typed(name)))));
            }
            build(
                loaded,
                &PodSet::default(),
                &ValidationOptions::default(),
                BTreeSet::new(),
                run_check,
            )
        };

        let (set, diff) = api(None);
        assert_eq!(names(&diff.pods_added), ["a"]);
        assert_eq!(diff.new_problems.len(), 1, "{:?}", diff.new_problems);
        assert!(
            diff.new_problems[0].starts_with("api: Pod/default/Bad_Name: name-dns-subdomain"),
            "{:?}",
            diff.new_problems
        );
        assert!(set.broken_files.is_empty(), "the API has no file to hold");
        let a = set.pods.values().next().unwrap();
        assert_eq!(a.pod, typed("a"));
        assert_eq!(a.view, PodSpecView::from_pod(&typed("a")).unwrap());
        assert_eq!(a.spec_hash, spec_hash(&typed("a")));

        // The runtime's check refuses a pod at the door, with its field.
        let (set, diff) = api(Some(|_| {
            Err(Unrunnable {
                field: "spec".into(),
                message: "refused".into(),
            })
        }));
        assert!(set.pods.is_empty());
        assert!(
            diff.new_problems
                .contains(&"api: Pod/default/a: schema: spec: refused".to_owned()),
            "{:?}",
            diff.new_problems
        );

        let (manifest, _) = load(&[("a.yaml", &doc("a"))], &PodSet::default());
        let m = manifest.pods.values().next().unwrap();
        assert_eq!(
            (&m.pod, &m.view, m.spec_hash),
            (&a.pod, &a.view, a.spec_hash)
        );
    }
}
