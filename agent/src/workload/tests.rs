//! Corpus, unit and property tests of the workload model.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use proptest::prelude::*;

use super::{
    types::{Disruption, Meta, Origin, Policy, Scheduling, Template, WorkloadRef},
    *,
};
use crate::source::manifest::load_paths;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/workload")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

fn load_objects(path: &Path) -> Vec<Object> {
    let loaded = load_paths(
        &[path.to_path_buf()],
        crate::source::file::DEFAULT_MAX_BYTES,
    )
    .expect("corpus readable");
    assert!(
        loaded.malformed.is_empty(),
        "{}: {:?}",
        path.display(),
        loaded.malformed
    );
    loaded
        .objects
        .iter()
        .map(|r| {
            r.hierarchy_object()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

/// Every problem of a set, as `qoslet validate` sees them (validation and dangling references).
fn problems(objects: Vec<Object>, opts: &ValidationOptions) -> Vec<Problem> {
    Forest::by_namespace(objects)
        .values()
        .flat_map(|f| {
            let mut p = validate(f, opts);
            p.extend(dangling(f));
            p
        })
        .collect()
}

fn rule_names(p: &[Problem]) -> BTreeSet<&'static str> {
    p.iter().map(|p| p.rule.name()).collect()
}

/// `rule--variant.yaml` -> `rule`; `--gated` turns PodGroupPreemptionPolicy on.
fn case(path: &Path) -> (String, ValidationOptions) {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("utf-8 name");
    let opts = ValidationOptions {
        pod_group_preemption_policy: stem.ends_with("--gated"),
    };
    (stem.split("--").next().unwrap_or(stem).to_owned(), opts)
}

#[test]
fn valid_corpus_passes() {
    let files = yaml_files(&corpus().join("valid"));
    assert!(files.len() >= 4);
    for f in files {
        for gate in [false, true] {
            let opts = ValidationOptions {
                pod_group_preemption_policy: gate,
            };
            let p = problems(load_objects(&f), &opts);
            assert!(p.is_empty(), "{}: {p:#?}", f.display());
        }
    }
}

#[test]
fn each_invalid_set_fails_with_exactly_its_rule() {
    for f in yaml_files(&corpus().join("invalid")) {
        let (rule, opts) = case(&f);
        let p = problems(load_objects(&f), &opts);
        assert_eq!(
            rule_names(&p),
            BTreeSet::from([rule.as_str()]),
            "{}: {p:#?}",
            f.display()
        );
        if opts.pod_group_preemption_policy {
            // The same set is valid without the gate: the gate alone makes the difference.
            let p = problems(load_objects(&f), &ValidationOptions::default());
            assert!(p.is_empty(), "{}: {p:#?}", f.display());
        }
    }
}

#[test]
fn updates_reject_exactly_their_rule_and_keep_the_old_object() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus().join("update"))
        .expect("update corpus")
        .map(|e| e.expect("entry").path())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 5);
    for d in dirs {
        let (rule, _) = case(&d);
        let old = load_objects(&d.join("old.yaml"));
        let new = load_objects(&d.join("new.yaml"));
        assert!(problems(old.clone(), &ValidationOptions::default()).is_empty());
        let applied = apply_updates(old.clone(), new.clone());
        let rules: BTreeSet<&str> = applied
            .rejected
            .iter()
            .map(|r| r.problem.rule.name())
            .collect();
        if rule == "accepted" {
            assert!(rules.is_empty(), "{}: {rules:?}", d.display());
            for n in &new {
                assert!(
                    applied.objects.contains(n),
                    "{}: update not applied",
                    d.display()
                );
            }
        } else {
            assert_eq!(rules, BTreeSet::from([rule.as_str()]), "{}", d.display());
            assert_eq!(applied.objects, old, "{}: old objects kept", d.display());
        }
    }
}

#[test]
fn every_rule_has_a_breaking_case() {
    let mut covered: BTreeSet<String> = yaml_files(&corpus().join("invalid"))
        .iter()
        .map(|f| case(f).0)
        .collect();
    for d in std::fs::read_dir(corpus().join("update")).expect("update corpus") {
        covered.insert(case(&d.expect("entry").path()).0);
    }
    // kind-known, api-version, schema and unknown-field are the CLI's: tests/validate_cli.rs
    // covers them (unknown-field also source/fields.rs). The admission rules are checked before
    // the forest: source/admit/tests.rs covers them.
    for r in Rule::ALL {
        if matches!(
            r,
            Rule::KindKnown | Rule::ApiVersion | Rule::Schema | Rule::UnknownField
        ) || Rule::ADMISSION.contains(&r)
        {
            continue;
        }
        assert!(covered.contains(r.name()), "no corpus case breaks {r}");
    }
}

#[test]
fn dns_names() {
    assert!(validate::is_dns_subdomain("a.b-c.d0"));
    assert!(!validate::is_dns_subdomain("A"));
    assert!(!validate::is_dns_subdomain("a..b"));
    assert!(!validate::is_dns_subdomain("-a"));
    assert!(!validate::is_dns_subdomain(&"a".repeat(254)));
    assert!(validate::is_dns_label("leaf-1"));
    assert!(!validate::is_dns_label("leaf.1"));
    assert!(!validate::is_dns_label(&"a".repeat(64)));
}

// ---------------------------------------------------------------------------------------------
// Small builders for hand-made forests.

fn meta(name: &str) -> Meta {
    Meta {
        name: name.into(),
        namespace: "ns".into(),
        uid: None,
        owners: Vec::new(),
        origin: Origin::default(),
    }
}

fn sched(policy: Policy, all: bool) -> Scheduling {
    Scheduling {
        policy,
        disruption: if all {
            Disruption::All
        } else {
            Disruption::Single
        },
        priority: None,
        priority_class_name: None,
        preemption_policy: None,
    }
}

fn group(kind: Kind, name: &str, parent: Option<&str>, policy: Policy, all: bool) -> Object {
    Object::Group(Group {
        meta: meta(name),
        kind,
        parent: parent.map(str::to_owned),
        workload_ref: None,
        scheduling: sched(policy, all),
    })
}

fn cpg(name: &str, parent: Option<&str>, policy: Policy, all: bool) -> Object {
    let mut o = group(Kind::CompositePodGroup, name, parent, policy, all);
    if let Object::Group(g) = &mut o {
        // workloadRef is required on composites; no Workload in these forests means "held".
        g.workload_ref = None;
    }
    o
}

fn pg(name: &str, parent: Option<&str>, policy: Policy, all: bool) -> Object {
    group(Kind::PodGroup, name, parent, policy, all)
}

fn pod(name: &str, group: &str, phase: Option<&str>) -> Object {
    Object::Pod(Pod {
        meta: meta(name),
        pod_group: Some(group.into()),
        scheduler_name: None,
        priority: None,
        priority_class_name: None,
        preemption_policy: None,
        phase: phase.map(str::to_owned),
    })
}

fn r(kind: Kind, name: &str) -> ObjRef {
    ObjRef::new(kind, name)
}

fn gang(min: i32) -> Policy {
    Policy::Gang { min }
}

/// root (gang 2) -> a (PodGroup gang 2, all), b (PodGroup basic).
fn two_leaves() -> Vec<Object> {
    let mut v = vec![
        cpg("root", None, gang(2), false),
        pg("a", Some("root"), gang(2), true),
        pg("b", Some("root"), Policy::Basic, false),
        pod("a0", "a", Some("Running")),
        pod("a1", "a", Some("Running")),
        pod("b0", "b", Some("Running")),
    ];
    for o in &mut v {
        if let Object::Group(g) = o {
            g.workload_ref = Some(WorkloadRef {
                workload_name: "w".into(),
                template_name: g.meta.name.clone(),
            });
        }
    }
    v.push(Object::Workload(Workload {
        meta: meta("w"),
        controller_ref: None,
        templates: vec![Template {
            name: "root".into(),
            kind: Kind::CompositePodGroup,
            scheduling: sched(gang(2), false),
            children: vec![
                Template {
                    name: "a".into(),
                    kind: Kind::PodGroup,
                    scheduling: sched(gang(2), true),
                    children: vec![],
                },
                Template {
                    name: "b".into(),
                    kind: Kind::PodGroup,
                    scheduling: sched(Policy::Basic, false),
                    children: vec![],
                },
            ],
        }],
    }));
    v
}

#[test]
fn forest_lookups() {
    let f = Forest::new(two_leaves());
    let a = r(Kind::PodGroup, "a");
    let root = r(Kind::CompositePodGroup, "root");
    assert_eq!(f.parent(&a).map(|g| g.meta.name.as_str()), Some("root"));
    assert_eq!(f.children(&root), vec![a.clone(), r(Kind::PodGroup, "b")]);
    assert_eq!(f.pods_of(&a).len(), 2);
    assert_eq!(f.root(&a), Some(root.clone()));
    assert_eq!(f.depth(&a), Some(2));
    assert_eq!(f.depth(&root), Some(1));
    assert_eq!(f.pods_below(&root).len(), 3);
    assert!(validate(&f, &ValidationOptions::default()).is_empty());
}

/// A chain to judge the depth of: p (a PodGroup) under c1 under c2 ... under c`composites`,
/// which names `top_parent` (a root without).
fn depth_chain(composites: usize, top_parent: Option<&str>) -> Vec<Object> {
    let name = |i: usize| format!("c{i}");
    let mut v = vec![pg("p", Some("c1"), gang(1), false)];
    for i in 1..=composites {
        let parent = if i == composites {
            top_parent.map(str::to_owned)
        } else {
            Some(name(i + 1))
        };
        v.push(cpg(&name(i), parent.as_deref(), gang(1), false));
    }
    v
}

/// The `depth-limit` lines of a forest, as validation writes them.
fn depth_lines(f: &Forest) -> Vec<String> {
    validate(f, &ValidationOptions::default())
        .iter()
        .filter(|p| matches!(p.rule, Rule::DepthLimit | Rule::NoCycles))
        .map(|p| format!("{}: {}: {}", p.id, p.rule, p.message))
        .collect()
}

#[test]
fn a_chain_at_the_limit_is_not_too_deep_whether_its_top_is_there_or_not() {
    let p = r(Kind::PodGroup, "p");
    // p, c1, c2, c3 and the root c3 names: four levels, the last one not there yet.
    let f = Forest::new(depth_chain(3, None));
    assert_eq!(f.depth(&p), Some(validate::MAX_DEPTH));
    assert_eq!(depth_lines(&f), Vec::<String>::new());
    let f = Forest::new(depth_chain(2, Some("c3")));
    assert_eq!(f.depth(&p), Some(validate::MAX_DEPTH));
    assert_eq!(depth_lines(&f), Vec::<String>::new());
}

#[test]
fn a_parent_named_past_the_limit_is_a_level_though_absent() {
    let p = r(Kind::PodGroup, "p");
    // p, c1, c2, c3, and c4 named by c3 but absent: five levels at least.
    let f = Forest::new(depth_chain(3, Some("c4")));
    assert_eq!(f.depth(&p), Some(5));
    assert_eq!(f.depth(&r(Kind::CompositePodGroup, "c3")), Some(2));
    assert_eq!(
        depth_lines(&f),
        ["PodGroup/ns/p: depth-limit: at depth 5 or more, at most 4"]
    );
    // Once there, the parent says how deep: a root at depth 1, p at 5, said alike.
    let mut objs = depth_chain(3, Some("c4"));
    objs.push(cpg("c4", None, gang(1), false));
    let f = Forest::new(objs);
    assert_eq!(f.depth(&p), Some(5));
    assert_eq!(
        depth_lines(&f),
        ["PodGroup/ns/p: depth-limit: at depth 5, at most 4"]
    );
}

#[test]
fn a_loop_has_no_depth_and_is_one_rule_not_the_depth_limit() {
    // p under c1 under c2 under c3, whose parent is c1.
    let f = Forest::new(depth_chain(3, Some("c1")));
    for g in f.groups.keys() {
        assert_eq!(f.depth(g), None, "{g}");
    }
    let lines = depth_lines(&f);
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.contains(": no-cycles: ")),
        "{lines:?}"
    );
}

#[test]
fn gate_holds_until_ancestors_exist_and_names_them() {
    let objs: Vec<Object> = two_leaves()
        .into_iter()
        .filter(|o| o.obj_ref() != r(Kind::CompositePodGroup, "root"))
        .collect();
    let f = Forest::new(objs);
    let g = gate(&f, &ValidationOptions::default());
    let missing = Gate::Held(HoldReason::Missing {
        ancestor: r(Kind::CompositePodGroup, "root"),
    });
    assert_eq!(g[&r(Kind::PodGroup, "a")], missing);
    assert_eq!(g[&r(Kind::Pod, "b0")], missing);
    assert!(startable(&f, &ValidationOptions::default()).is_empty());

    let f = Forest::new(vec![pod("x", "nope", None)]);
    let g = gate(&f, &ValidationOptions::default());
    assert_eq!(
        g[&r(Kind::Pod, "x")],
        Gate::Held(HoldReason::Missing {
            ancestor: r(Kind::PodGroup, "nope")
        })
    );
}

#[test]
fn invalid_hierarchy_is_held_as_a_whole() {
    let mut objs = two_leaves();
    for o in &mut objs {
        if let Object::Pod(p) = o
            && p.meta.name == "b0"
        {
            p.scheduler_name = Some("other".into());
        }
    }
    let f = Forest::new(objs);
    let g = gate(&f, &ValidationOptions::default());
    for (k, v) in &g {
        assert!(
            matches!(
                v,
                Gate::Held(HoldReason::Invalid {
                    rule: Rule::SchedulerNameConsistent,
                    ..
                })
            ),
            "{k}: {v:?}"
        );
    }
    assert_eq!(g.len(), 6);
}

#[test]
fn gang_root_admits_nothing_until_admissible() {
    let opts = ValidationOptions::default();
    // Only a0: leaf a (gang 2) not admissible, so root (gang 2) has only b admissible.
    let objs: Vec<Object> = two_leaves()
        .into_iter()
        .filter(|o| o.obj_ref() != r(Kind::Pod, "a1"))
        .collect();
    let f = Forest::new(objs);
    assert!(!admissible(&f, &r(Kind::PodGroup, "a")));
    assert!(admissible(&f, &r(Kind::PodGroup, "b")));
    assert!(!admissible(&f, &r(Kind::CompositePodGroup, "root")));
    assert!(
        startable(&f, &opts).is_empty(),
        "b0 waits for the gang root"
    );

    let f = Forest::new(two_leaves());
    assert!(admissible(&f, &r(Kind::CompositePodGroup, "root")));
    let all: BTreeSet<String> = ["a0", "a1", "b0"].map(String::from).into();
    assert_eq!(startable(&f, &opts), all);
}

#[test]
fn cascade_from_workload_and_bottom_up_finalisation() {
    let f = Forest::new(two_leaves());
    let gone = cascade_delete(&f, &r(Kind::Workload, "w"));
    assert_eq!(gone.len(), 7, "{gone:?}");
    assert_eq!(gone[0], r(Kind::Workload, "w"));

    let deleting: BTreeSet<ObjRef> = gone.into_iter().collect();
    let fin = finalise(&f, &deleting);
    assert!(fin.removable.is_empty(), "running pods hold everything");
    assert_eq!(fin.waiting.len(), 7);

    let mut objs = two_leaves();
    for o in &mut objs {
        if let Object::Pod(p) = o
            && p.meta.name != "a1"
        {
            p.phase = Some("Succeeded".into());
        }
    }
    let f = Forest::new(objs);
    let fin = finalise(&f, &deleting);
    let removed: BTreeSet<ObjRef> = fin.removable.iter().cloned().collect();
    assert!(removed.contains(&r(Kind::PodGroup, "b")));
    assert!(!removed.contains(&r(Kind::PodGroup, "a")), "a1 still runs");
    assert!(!removed.contains(&r(Kind::CompositePodGroup, "root")));
    let pos = |x: &ObjRef| fin.removable.iter().position(|y| y == x);
    assert!(pos(&r(Kind::Pod, "b0")) < pos(&r(Kind::PodGroup, "b")));
}

#[test]
fn cascade_follows_owner_references() {
    let mut objs = two_leaves();
    if let Some(Object::Pod(p)) = objs.iter_mut().find(|o| o.obj_ref() == r(Kind::Pod, "b0")) {
        p.pod_group = None;
        p.meta.owners.push(types::OwnerRef {
            kind: "PodGroup".into(),
            name: "a".into(),
            uid: String::new(),
        });
    }
    let f = Forest::new(objs);
    let gone = cascade_delete(&f, &r(Kind::PodGroup, "a"));
    assert!(gone.contains(&r(Kind::Pod, "b0")));
    assert!(gone.contains(&r(Kind::Pod, "a0")));
    assert!(!gone.contains(&r(Kind::PodGroup, "b")));
}

#[test]
fn disruption_units() {
    let f = Forest::new(two_leaves());
    let u = disruption_unit(&f, "b0").expect("pod exists");
    assert_eq!(u.root, UnitRoot::Pod("b0".into()));
    let u = disruption_unit(&f, "a0").expect("pod exists");
    assert_eq!(u.root, UnitRoot::Group(r(Kind::PodGroup, "a")));
    assert_eq!(u.pods, vec!["a0".to_string(), "a1".to_string()]);

    // An `all` chain: the highest `all` ancestor is the unit.
    let objs = vec![
        cpg("top", None, gang(1), true),
        cpg("mid", Some("top"), gang(1), true),
        pg("leaf", Some("mid"), gang(1), true),
        pg("other", Some("top"), gang(1), true),
        pod("p", "leaf", None),
        pod("q", "other", None),
        pod("done", "other", Some("Failed")),
    ];
    let f = Forest::new(objs);
    let u = disruption_unit(&f, "p").expect("pod exists");
    assert_eq!(u.root, UnitRoot::Group(r(Kind::CompositePodGroup, "top")));
    assert_eq!(u.pods, vec!["p".to_string(), "q".to_string()]);
    assert!(disruption_unit(&f, "ghost").is_none());
}

#[test]
fn breaking_gangs_recursively() {
    let f = Forest::new(two_leaves());
    assert!(
        breaks_gang(&f, &["b0".to_string()])
            .iter()
            .all(|b| b.group.kind != Kind::PodGroup)
    );
    // b0 gone: b not admissible, root (gang 2) loses a child.
    let b = breaks_gang(&f, &["b0".to_string()]);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].group, r(Kind::CompositePodGroup, "root"));
    assert_eq!((b[0].before, b[0].after), (2, 1));
    // a0 gone: a falls below minCount 2, and the root with it.
    let b = breaks_gang(&f, &["a0".to_string()]);
    let groups: Vec<ObjRef> = b.iter().map(|x| x.group.clone()).collect();
    assert_eq!(
        groups,
        vec![r(Kind::CompositePodGroup, "root"), r(Kind::PodGroup, "a")]
    );
    assert!(breaks_gang(&f, &[]).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Property tests over random trees.

/// A random group tree; each node becomes a template and one group.
#[derive(Debug, Clone)]
struct TNode {
    /// `None` basic, `Some(n)` gang with min n.
    gang: Option<i32>,
    all: bool,
    priority: Option<i32>,
    /// Leaves only: (schedulerName, priority, preemptionPolicy) per pod.
    pods: Vec<(Option<&'static str>, Option<i32>, Option<&'static str>)>,
    children: Vec<TNode>,
    /// Root only.
    preemption: Option<&'static str>,
}

fn tree(valid: bool) -> impl Strategy<Value = TNode> {
    let gang = if valid {
        prop_oneof![Just(None), (1..=2i32).prop_map(Some)].boxed()
    } else {
        prop_oneof![6 => Just(None), 6 => (1..=2i32).prop_map(Some), 1 => Just(Some(0))].boxed()
    };
    let flag = if valid {
        Just(false).boxed()
    } else {
        prop::bool::weighted(0.1).boxed()
    };
    let prio = if valid {
        Just(None).boxed()
    } else {
        prop_oneof![40 => Just(None), 1 => Just(Some(0)), 1 => Just(Some(1))].boxed()
    };
    let sched = if valid {
        Just(None).boxed()
    } else {
        prop_oneof![30 => Just(None), 1 => Just(Some("default-scheduler")), 1 => Just(Some("other"))]
            .boxed()
    };
    let pre = if valid {
        Just(None).boxed()
    } else {
        prop_oneof![30 => Just(None), 1 => Just(Some("PreemptLowerPriority")), 1 => Just(Some("Never"))]
            .boxed()
    };
    let pods = prop::collection::vec((sched, prio.clone(), pre.clone()), 0..=3);
    let leaf = (gang.clone(), flag.clone(), prio.clone(), pods, pre.clone()).prop_map(
        |(gang, all, priority, pods, preemption)| TNode {
            gang,
            all,
            priority,
            pods,
            children: vec![],
            preemption,
        },
    );
    let depth = if valid { 3 } else { 6 };
    leaf.prop_recursive(depth, 40, 2, move |inner| {
        (
            gang.clone(),
            flag.clone(),
            prio.clone(),
            prop::collection::vec(inner, 1..=2),
            pre.clone(),
        )
            .prop_map(|(gang, all, priority, children, preemption)| TNode {
                gang,
                all,
                priority,
                pods: vec![],
                children,
                preemption,
            })
    })
}

/// The objects of a tree: a Workload `w`, groups `g0..`, templates `t0..`, pods `gN-pM`. Also
/// returns every object's ancestors (Workload, parents, PodGroup) by an independent walk.
fn objects(root: &TNode) -> (Vec<Object>, BTreeMap<ObjRef, Vec<ObjRef>>) {
    fn walk(
        n: &TNode,
        parent: Option<(String, Vec<ObjRef>)>,
        next: &mut usize,
        objs: &mut Vec<Object>,
        anc: &mut BTreeMap<ObjRef, Vec<ObjRef>>,
    ) -> Template {
        let id = *next;
        *next += 1;
        let name = format!("g{id}");
        let composite = !n.children.is_empty();
        let kind = if composite {
            Kind::CompositePodGroup
        } else {
            Kind::PodGroup
        };
        let scheduling = Scheduling {
            policy: n.gang.map_or(Policy::Basic, |min| Policy::Gang { min }),
            disruption: if n.all {
                Disruption::All
            } else {
                Disruption::Single
            },
            priority: n.priority,
            priority_class_name: None,
            preemption_policy: if parent.is_none() {
                n.preemption.map(String::from)
            } else {
                None
            },
        };
        let mut my_anc = vec![r(Kind::Workload, "w")];
        if let Some((p, pa)) = &parent {
            my_anc.push(r(Kind::CompositePodGroup, p));
            my_anc.extend(pa.iter().cloned());
        }
        my_anc.sort();
        my_anc.dedup();
        let me = r(kind, &name);
        anc.insert(me.clone(), my_anc.clone());
        objs.push(Object::Group(Group {
            meta: meta(&name),
            kind,
            parent: parent.as_ref().map(|(p, _)| p.clone()),
            workload_ref: Some(WorkloadRef {
                workload_name: "w".into(),
                template_name: format!("t{id}"),
            }),
            scheduling: scheduling.clone(),
        }));
        for (i, (s, p, pre)) in n.pods.iter().enumerate() {
            let pname = format!("{name}-p{i}");
            let mut a = my_anc.clone();
            a.push(me.clone());
            anc.insert(r(Kind::Pod, &pname), a);
            objs.push(Object::Pod(Pod {
                meta: meta(&pname),
                pod_group: Some(name.clone()),
                scheduler_name: s.map(String::from),
                priority: *p,
                priority_class_name: None,
                preemption_policy: pre.map(String::from),
                phase: None,
            }));
        }
        let mut sub = my_anc.clone();
        sub.push(me.clone());
        let children = n
            .children
            .iter()
            .map(|c| walk(c, Some((name.clone(), sub.clone())), next, objs, anc))
            .collect();
        Template {
            name: format!("t{id}"),
            kind,
            scheduling,
            children,
        }
    }
    let mut objs = Vec::new();
    let mut anc = BTreeMap::new();
    let t = walk(root, None, &mut 0, &mut objs, &mut anc);
    objs.insert(
        0,
        Object::Workload(Workload {
            meta: meta("w"),
            controller_ref: None,
            templates: vec![t],
        }),
    );
    anc.insert(r(Kind::Workload, "w"), vec![]);
    (objs, anc)
}

/// The rules, restated over the generated tree.
fn satisfies_rules(root: &TNode, gate_on: bool) -> bool {
    fn nodes<'a>(
        n: &'a TNode,
        depth: usize,
        parent_all: bool,
        out: &mut Vec<(&'a TNode, usize, bool)>,
    ) {
        out.push((n, depth, parent_all));
        for c in &n.children {
            nodes(c, depth + 1, n.all, out);
        }
    }
    let mut all = Vec::new();
    nodes(root, 1, false, &mut all);
    let pods: Vec<_> = all.iter().flat_map(|(n, _, _)| n.pods.iter()).collect();
    let depth_ok = all.iter().all(|(_, d, _)| *d <= 4);
    let mins_ok = all.iter().all(|(n, _, _)| n.gang.is_none_or(|m| m >= 1));
    let basic_all_ok = all
        .iter()
        .all(|(n, _, _)| !(n.children.is_empty() && n.gang.is_none() && n.all));
    let inherit_ok = all.iter().all(|(n, _, pa)| !*pa || n.all);
    let mut prios: BTreeSet<i32> = all
        .iter()
        .map(|(n, _, _)| n.priority.unwrap_or(0))
        .collect();
    prios.extend(pods.iter().map(|p| p.1.unwrap_or(0)));
    let scheds: BTreeSet<&str> = pods
        .iter()
        .map(|p| p.0.unwrap_or("default-scheduler"))
        .collect();
    let pres: BTreeSet<&str> = pods
        .iter()
        .map(|p| p.2.unwrap_or("PreemptLowerPriority"))
        .collect();
    let root_pre = root.preemption.unwrap_or("PreemptLowerPriority");
    let pre_ok = pres.len() <= 1 && (!gate_on || pres.is_empty() || pres.contains(root_pre));
    // priority-class: with no class, a priority set is 0 and a pod's preemptionPolicy the default;
    // priority-consistent within the Workload: every template says the same.
    let class_ok = all
        .iter()
        .filter_map(|(n, _, _)| n.priority)
        .chain(pods.iter().filter_map(|p| p.1))
        .all(|p| p == 0)
        && pods
            .iter()
            .all(|p| p.2.is_none_or(|x| x == "PreemptLowerPriority"));
    let templates_ok = all.iter().all(|(n, _, _)| n.priority == root.priority);
    depth_ok
        && class_ok
        && templates_ok
        && mins_ok
        && basic_all_ok
        && inherit_ok
        && prios.len() == 1
        && scheds.len() <= 1
        && pre_ok
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn validation_accepts_exactly_the_valid_trees(t in tree(false), gate_on in any::<bool>()) {
        let (objs, _) = objects(&t);
        let f = Forest::new(objs);
        let opts = ValidationOptions { pod_group_preemption_policy: gate_on };
        let p = validate(&f, &opts);
        prop_assert!(dangling(&f).is_empty());
        prop_assert_eq!(p.is_empty(), satisfies_rules(&t, gate_on), "{:#?}", p);
    }

    #[test]
    fn gating_releases_once_all_ancestors_exist(
        (t, order) in tree(true).prop_flat_map(|t| {
            let n = objects(&t).0.len();
            (Just(t), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
        })
    ) {
        let (objs, anc) = objects(&t);
        prop_assert!(satisfies_rules(&t, false));
        let opts = ValidationOptions::default();
        let mut present: Vec<Object> = Vec::new();
        for i in order {
            present.push(objs[i].clone());
            let f = Forest::new(present.clone());
            let have: BTreeSet<ObjRef> = present.iter().map(Object::obj_ref).collect();
            for (obj, g) in gate(&f, &opts) {
                let all_there = anc[&obj].iter().all(|a| have.contains(a));
                match &g {
                    Gate::Released => prop_assert!(all_there, "{} released early", obj),
                    Gate::Held(HoldReason::Missing { ancestor }) => {
                        prop_assert!(!all_there, "{} held though complete", obj);
                        prop_assert!(anc[&obj].contains(ancestor) && !have.contains(ancestor));
                    }
                    Gate::Held(other) => prop_assert!(false, "{}: {:?}", obj, other),
                }
            }
        }
        let f = Forest::new(objs);
        prop_assert!(gate(&f, &opts).values().all(|g| *g == Gate::Released));
    }
}

/// The generator must produce both outcomes often, or the property above proves little.
#[test]
fn random_trees_are_often_valid_and_often_invalid() {
    use proptest::{strategy::ValueTree, test_runner::TestRunner};
    let mut runner = TestRunner::deterministic();
    let strategy = tree(false);
    let (mut valid, mut deep) = (0, 0);
    for _ in 0..400 {
        let t = strategy
            .new_tree(&mut runner)
            .expect("tree generation")
            .current();
        valid += usize::from(satisfies_rules(&t, false));
        let (objs, _) = objects(&t);
        let f = Forest::new(objs);
        deep += usize::from(f.groups.keys().any(|g| f.depth(g).is_some_and(|d| d > 4)));
    }
    assert!((40..=360).contains(&valid), "{valid} valid of 400");
    assert!(deep >= 20, "{deep} trees deeper than 4 of 400");
}
