//! The gang hierarchies' rules on the real API server (#40). A differential test sends each case
//! of `gangs-corpus.yaml` to kube-apiserver (server-side dry run; real updates) and to `qoslet
//! validate` (its library function, the one the subcommand calls, so the code under test is this
//! tree's), and fails on every disagreement not listed in README.md's table of differences, and
//! on every listed one that no longer differs. A second test creates every example of
//! `deploy/examples` for real.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
};
use qoslet::{
    cli::validate::{Checked, check, options},
    source::manifest::{Loaded, parse_documents},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{TestNamespace, cluster, with_own_client};

/// Lets the namespace's PodGroups go when dropped (before the namespace, so declared after it):
/// the API server gives each the `scheduling.k8s.io/podgroup-protection` finalizer, which the
/// controller manager removes only once no running pod references the group, and the examples'
/// gated pods never run: the namespace would wait on them.
struct ReleasePodGroups {
    namespace: String,
    kubeconfig: PathBuf,
}

impl Drop for ReleasePodGroups {
    fn drop(&mut self) {
        let ns = self.namespace.clone();
        with_own_client(&self.kubeconfig, |client| async move {
            let gvk = GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", "PodGroup");
            let api: Api<DynamicObject> = Api::namespaced_with(
                client,
                &ns,
                &ApiResource::from_gvk_with_plural(&gvk, "podgroups"),
            );
            let Ok(list) = api.list(&Default::default()).await else {
                return;
            };
            let release = json!({"metadata": {"finalizers": null}});
            for pg in list.items.iter().filter_map(|p| p.metadata.name.as_deref()) {
                let _ = api
                    .patch(pg, &PatchParams::default(), &Patch::Merge(&release))
                    .await;
            }
        });
    }
}

impl ReleasePodGroups {
    fn of(ns: &TestNamespace) -> Self {
        Self {
            namespace: ns.name.clone(),
            kubeconfig: ns.kubeconfig.clone(),
        }
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One case of the corpus (its header says what each field means).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    objects: Vec<Value>,
    object: Value,
    #[serde(default)]
    patch: Option<Value>,
}

fn corpus() -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real_cluster/gangs-corpus.yaml");
    serde_yaml_ng::from_str(&fs::read_to_string(&path).expect("the corpus")).expect("the corpus")
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().expect("every object has a kind")
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"]
        .as_str()
        .expect("every object has a name")
}

/// The resource of one of the kinds the corpus and the examples hold.
fn resource(v: &Value) -> ApiResource {
    let (group, version) = v["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .split_once('/')
        .unwrap_or(("", "v1"));
    let plural = match kind(v) {
        "Pod" => "pods",
        "Workload" => "workloads",
        "PodGroup" => "podgroups",
        "CompositePodGroup" => "compositepodgroups",
        k => panic!("no resource for kind {k}"),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind(v)), plural)
}

fn in_namespace(v: &Value, ns: &str) -> Value {
    let mut v = v.clone();
    v["metadata"]["namespace"] = json!(ns);
    v
}

/// RFC 7386, as the API server applies a merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Accepted,
    Refused(String),
}

impl Verdict {
    fn accepted(&self) -> bool {
        *self == Verdict::Accepted
    }
}

/// The API server's answer: a 4xx refuses, anything else (5xx, no answer) is no verdict.
fn answer<T>(what: &str, r: Result<T, kube::Error>) -> Verdict {
    match r {
        Ok(_) => Verdict::Accepted,
        Err(kube::Error::Api(s)) if (400..500).contains(&s.code) => {
            Verdict::Refused(format!("{} {}: {}", s.code, s.reason, s.message))
        }
        Err(e) => panic!("{what}: no verdict from the API server: {e}"),
    }
}

async fn create(client: &Client, ns: &str, v: &Value, dry_run: bool) -> Verdict {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource(v));
    let obj: DynamicObject = serde_json::from_value(in_namespace(v, ns)).expect("an object");
    let pp = PostParams {
        dry_run,
        ..Default::default()
    };
    answer(name(v), api.create(&pp, &obj).await)
}

async fn server_verdict(client: &Client, ns: &str, case: &Case) -> Verdict {
    for o in &case.objects {
        let v = create(client, ns, o, false).await;
        assert!(v.accepted(), "{}: context {}: {v:?}", case.name, name(o));
    }
    let Some(patch) = &case.patch else {
        return create(client, ns, &case.object, true).await;
    };
    let v = create(client, ns, &case.object, false).await;
    assert!(v.accepted(), "{}: the object to update: {v:?}", case.name);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource(&case.object));
    answer(
        &case.name,
        api.patch(
            name(&case.object),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await,
    )
}

fn loaded(file: &str, docs: &[Value], ns: &str) -> Loaded {
    let mut l = Loaded::default();
    for (i, d) in docs.iter().enumerate() {
        // JSON is YAML: each document as the manifest reader parses a file.
        let text = serde_json::to_string(&in_namespace(d, ns)).expect("json");
        parse_documents(Path::new(&format!("{file}/{i}.yaml")), &text, &mut l);
    }
    l
}

fn qoslet_check(case: &Case, ns: &str) -> Checked {
    let opts = options(&[]).expect("no gates");
    let mut all = case.objects.clone();
    all.push(case.object.clone());
    match &case.patch {
        None => check(loaded(&case.name, &all, ns), None, &opts),
        Some(p) => {
            let mut new = case.object.clone();
            merge(&mut new, p);
            let previous = loaded(&format!("{}-previous", case.name), &all, ns);
            check(loaded(&case.name, &[new], ns), Some(previous), &opts)
        }
    }
}

fn qoslet_verdict(case: &Case, ns: &str) -> Verdict {
    let context = check(
        loaded(&case.name, &case.objects, ns),
        None,
        &options(&[]).expect("no gates"),
    );
    assert!(
        context.problems.is_empty(),
        "{}: the context alone: {:?}",
        case.name,
        context.problems
    );
    let c = qoslet_check(case, ns);
    if c.problems.is_empty() {
        Verdict::Accepted
    } else {
        Verdict::Refused(c.problems.join("; "))
    }
}

/// One row of README.md's table of known differences.
struct Known {
    qoslet_refuses: bool,
}

/// The rows of README.md's table "Where `qoslet validate` and the API server differ": the
/// first cell names the case, the second says what `qoslet validate` does (refuses / accepts).
fn known_differences() -> BTreeMap<String, Known> {
    let readme = fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme
        .split("\n### Where `qoslet validate` and the API server differ\n")
        .nth(1)
        .expect("README.md has the table of differences");
    let section = section.split("\n#").next().unwrap_or(section);
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_owned();
        let qoslet_refuses = match cells[2] {
            c if c.starts_with("refuses") => true,
            c if c.starts_with("accepts") => false,
            c => panic!("README.md row {name}: qoslet column {c:?} is neither refuses nor accepts"),
        };
        assert!(
            cells.get(4).is_some_and(|r| !r.is_empty()),
            "README.md row {name} gives no reason"
        );
        out.insert(name, Known { qoslet_refuses });
    }
    out
}

#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn validate_agrees_with_the_api_server() {
    let c = cluster().await;
    let cases = corpus();
    let known = known_differences();
    // Names are unique per kind across the corpus: the cases share one namespace.
    let mut names = BTreeSet::new();
    for case in &cases {
        for o in case.objects.iter().chain([&case.object]) {
            assert!(
                names.insert((kind(o).to_owned(), name(o).to_owned())),
                "{}: {} {} is another case's too",
                case.name,
                kind(o),
                name(o)
            );
        }
    }
    let ns = TestNamespace::create(&c, "qoslet-gangs").await;
    let _release = ReleasePodGroups::of(&ns);
    let t = Instant::now();
    let mut failures = Vec::new();
    // Per kind of the object under test: (accepted, refused) by the API server.
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut disagree = 0;
    for case in &cases {
        let server = server_verdict(&c.client, &ns.name, case).await;
        let qoslet = qoslet_verdict(case, &ns.name);
        let n = counts.entry(kind(&case.object).to_owned()).or_default();
        if server.accepted() {
            n.0 += 1;
        } else {
            n.1 += 1;
        }
        let differs = server.accepted() != qoslet.accepted();
        let mark = match (differs, known.get(&case.name)) {
            (false, None) => "agree",
            (true, Some(k)) if k.qoslet_refuses != qoslet.accepted() => "known",
            (true, Some(_)) => {
                failures.push(format!("{}: README.md's row says the other way", case.name));
                "WRONG"
            }
            (true, None) => {
                failures.push(format!(
                    "{}: qoslet {qoslet:?}, API server {server:?}",
                    case.name
                ));
                "DIFFER"
            }
            (false, Some(_)) => {
                failures.push(format!(
                    "{}: listed in README.md but both say {server:?}",
                    case.name
                ));
                "STALE"
            }
        };
        disagree += usize::from(differs);
        println!(
            "{mark:6} {:45} server {:8} qoslet {:8}{}",
            case.name,
            if server.accepted() {
                "accepts"
            } else {
                "refuses"
            },
            if qoslet.accepted() {
                "accepts"
            } else {
                "refuses"
            },
            match (&server, &qoslet) {
                (Verdict::Refused(m), _) | (_, Verdict::Refused(m)) if differs => format!(" ({m})"),
                _ => String::new(),
            }
        );
    }
    for name in known.keys() {
        if !cases.iter().any(|c| &c.name == name) {
            failures.push(format!("README.md lists {name}, which is no case"));
        }
    }
    println!(
        "{} cases ({:?} accepted/refused by the API server per kind), {disagree} known differences, in {:.1?}",
        cases.len(),
        counts,
        t.elapsed()
    );
    assert!(cases.len() >= 60, "{} cases", cases.len());
    for k in ["Workload", "PodGroup", "CompositePodGroup", "Pod"] {
        let (a, r) = counts.get(k).copied().unwrap_or_default();
        assert!(a > 0 && r > 0, "{k}: {a} accepted, {r} refused: not both");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every API object of `deploy/examples` (the configuration files are no API objects), each
/// example namespace mapped to a test namespace of its own.
fn examples() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    let mut dirs = vec![repo().join("deploy/examples")];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).expect("examples") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).expect("example");
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).expect("an example document");
            if v.is_null() {
                continue;
            }
            match kind(&v) {
                "KubeletConfiguration" | "QosletConfiguration" => {}
                _ => out.push((f.clone(), v)),
            }
        }
    }
    out
}

#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn every_example_is_created_for_real() {
    let c = cluster().await;
    let objects = examples();
    let t = Instant::now();
    let mut namespaces: BTreeMap<String, TestNamespace> = BTreeMap::new();
    for (_, v) in &objects {
        let ns = v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        if let std::collections::btree_map::Entry::Vacant(e) = namespaces.entry(ns) {
            let test_ns = TestNamespace::create(&c, &format!("qoslet-ex-{}", e.key())).await;
            e.insert(test_ns);
        }
    }
    let _release: Vec<ReleasePodGroups> = namespaces.values().map(ReleasePodGroups::of).collect();
    let mut refused = Vec::new();
    for (file, v) in &objects {
        let ns = &namespaces[v["metadata"]["namespace"].as_str().unwrap_or("default")].name;
        let mut v = v.clone();
        // Stored, admitted and validated as written, but never bound: the node is shared with the
        // eviction tests, and the examples' images and requests are not for it.
        if kind(&v) == "Pod" {
            merge(
                &mut v,
                &json!({"spec": {"schedulingGates": [{"name": "qoslet.dev/example"}]}}),
            );
        }
        if let Verdict::Refused(m) = create(&c.client, ns, &v, false).await {
            refused.push(format!(
                "{}: {} {}: {m}",
                file.display(),
                kind(&v),
                name(&v)
            ));
        }
    }
    assert!(refused.is_empty(), "{}", refused.join("\n"));
    // What the API server holds is what was sent: a pod's spec.schedulingGroup among it.
    for (_, v) in objects.iter().filter(|(_, v)| kind(v) == "Pod") {
        let ns = &namespaces[v["metadata"]["namespace"].as_str().unwrap_or("default")].name;
        let pod = Api::<Pod>::namespaced(c.client.clone(), ns)
            .get(name(v))
            .await
            .expect("the example pod is stored");
        let group = pod
            .spec
            .and_then(|s| s.scheduling_group)
            .and_then(|g| g.pod_group_name);
        assert_eq!(
            group.as_deref(),
            v["spec"]["schedulingGroup"]["podGroupName"].as_str(),
            "{}",
            name(v)
        );
    }
    println!(
        "{} example objects in {} namespaces created in {:.1?}",
        objects.len(),
        namespaces.len(),
        t.elapsed()
    );
}
