use std::{collections::BTreeMap, path::Path};

use super::*;
use crate::source::manifest::{Loaded, parse_documents};

const UID_A: &str = "6f1e3c1a-0b7a-4c1e-9a51-2f8d3c4b5a60";

fn raws(text: &str) -> Vec<RawObject> {
    let mut loaded = Loaded::default();
    parse_documents(Path::new("t.yaml"), text, &mut loaded);
    assert!(loaded.malformed.is_empty(), "{:?}", loaded.malformed);
    loaded.objects
}

fn lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for raw in raws(text) {
        if let Err(ps) = admit(&raw) {
            out.extend(ps.iter().map(ToString::to_string));
        }
    }
    out
}

fn pod(meta: &str, spec: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{{meta}}}\nspec:\n{spec}")
}

const ONE: &str = "  containers: [{name: c, command: [sleep]}]\n";

#[test]
fn a_valid_pod_is_admitted_with_its_view() {
    let raw = &raws(&pod("name: p, namespace: ns", ONE))[0];
    let a = admit(raw).expect("admitted");
    let p = a.pod.expect("a pod");
    assert_eq!(
        (p.view.namespace.as_str(), p.view.name.as_str()),
        ("ns", "p")
    );
}

#[test]
fn names_namespaces_and_container_names_follow_the_api_server() {
    let spec = "  initContainers: [{name: init, command: [sh]}]\n  containers:\n  - {name: Web, command: [sleep]}\n  - {name: init, command: [sleep]}\n  - {name: ok, command: [sleep]}\n  - {name: ok, command: [sleep]}\n";
    let l = lines(&pod("name: Bad_Name, namespace: team.a", spec));
    assert_eq!(
        l,
        [
            "t.yaml: Pod/team.a/Bad_Name: name-dns-subdomain: metadata.name: \"Bad_Name\" is not a DNS subdomain",
            "t.yaml: Pod/team.a/Bad_Name: namespace-dns-label: metadata.namespace: \"team.a\" is not a DNS label",
            "t.yaml: Pod/team.a/Bad_Name: container-name-dns-label: spec.containers[0].name: \"Web\" is not a DNS label",
            "t.yaml: Pod/team.a/Bad_Name: container-name-unique: spec.containers[1].name: \"init\" is already the name of spec.initContainers[0]",
            "t.yaml: Pod/team.a/Bad_Name: container-name-unique: spec.containers[3].name: \"ok\" is already the name of spec.containers[2]",
        ]
    );
    // Lengths: a 253-character subdomain and a 63-character label pass, one more fails.
    let long = |n: usize| "a".repeat(n);
    assert!(lines(&pod(&format!("name: {}", long(253)), ONE)).is_empty());
    assert_eq!(lines(&pod(&format!("name: {}", long(254)), ONE)).len(), 1);
    let c = |n: usize| format!("  containers: [{{name: {}, command: [sleep]}}]\n", long(n));
    assert!(lines(&pod("name: p", &c(63))).is_empty());
    assert_eq!(lines(&pod("name: p", &c(64))).len(), 1);
}

#[test]
fn a_uid_must_be_a_uuid() {
    assert!(lines(&pod(&format!("name: p, uid: {UID_A}"), ONE)).is_empty());
    assert_eq!(
        lines(&pod("name: p, uid: ../../etc", ONE)),
        [
            "t.yaml: Pod/p: uid-format: metadata.uid: \"../../etc\" is not a UUID (8-4-4-4-12 hexadecimal digits), which the pod cgroup's name needs"
        ]
    );
}

#[test]
fn quantities_are_validated_as_the_api_server_does() {
    let spec = "  containers:\n  - name: c\n    command: [sleep]\n    resources:\n      requests: {cpu: \"2\", memory: -64Mi}\n      limits: {cpu: \"1\", ephemeral-storage: \"-1\"}\n  resources: {limits: {cpu: 5Ei}}\n";
    assert_eq!(
        lines(&pod("name: p", spec)),
        [
            "t.yaml: Pod/p: quantity-non-negative: spec.containers[0].resources.limits.ephemeral-storage: \"-1\": must be greater than or equal to 0",
            "t.yaml: Pod/p: quantity-non-negative: spec.containers[0].resources.requests.memory: \"-64Mi\": must be greater than or equal to 0",
            "t.yaml: Pod/p: request-within-limit: spec.containers[0].resources.requests.cpu: \"2\": must be less than or equal to cpu limit of 1",
            "t.yaml: Pod/p: quantity-range: spec.resources.limits.cpu: \"5Ei\": must be less than or equal to 9223372036854775807m",
        ]
    );
    // The largest cpu qoslet computes with passes; memory up to i64::MAX bytes too.
    let edge = "  containers:\n  - name: c\n    command: [sleep]\n    resources: {limits: {cpu: 9223372036854775807m, memory: \"9223372036854775807\"}}\n";
    assert!(lines(&pod("name: p", edge)).is_empty());
    let over = "  containers:\n  - name: c\n    command: [sleep]\n    resources: {limits: {memory: 8Ei}}\n";
    assert_eq!(lines(&pod("name: p", over)).len(), 1);
}

#[test]
fn an_unparseable_quantity_is_a_schema_problem() {
    let spec = "  containers:\n  - name: c\n    command: [sleep]\n    resources: {limits: {nvidia.com/gpu: lots}}\n";
    assert_eq!(
        lines(&pod("name: p", spec)),
        [
            "t.yaml: Pod/p: schema: spec.containers[0].resources.limits.nvidia.com/gpu: quantity \"lots\": expected a number"
        ]
    );
}

#[test]
fn workload_objects_get_the_name_rules() {
    let group = "apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: G, namespace: ns}\nspec:\n  schedulingPolicy: {gang: {minCount: 1}}\n";
    assert_eq!(
        lines(group),
        ["t.yaml: PodGroup/ns/G: name-dns-subdomain: metadata.name: \"G\" is not a DNS subdomain"]
    );
}

fn admitted(text: &str) -> Vec<Admitted> {
    raws(text)
        .iter()
        .map(|r| admit(r).expect("admitted"))
        .collect()
}

fn names(a: &[Admitted]) -> Vec<String> {
    a.iter().map(|a| a.object.meta().name.clone()).collect()
}

#[test]
fn the_first_pod_keeps_a_uid_and_the_second_is_refused() {
    let text = format!(
        "{}---\n{}---\n{}",
        pod(&format!("name: a, uid: {UID_A}"), ONE),
        pod(&format!("name: b, uid: {UID_A}"), ONE),
        pod("name: c", ONE)
    );
    let mut a = admitted(&text);
    let p = unique_uids(&mut a, &BTreeMap::new());
    assert_eq!(names(&a), ["a", "c"]);
    assert_eq!(
        p.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [format!(
            "t.yaml: Pod/b: uid-unique: metadata.uid: \"{UID_A}\" is already Pod/default/a's: a UID names one pod cgroup"
        )]
    );
}

#[test]
fn the_running_holder_keeps_its_uid_against_an_earlier_file() {
    let text = format!(
        "{}---\n{}",
        pod(&format!("name: newcomer, uid: {UID_A}"), ONE),
        pod(&format!("name: running, uid: {UID_A}"), ONE)
    );
    let mut a = admitted(&text);
    let holders = BTreeMap::from([(UID_A.to_owned(), ("default".into(), "running".into()))]);
    let p = unique_uids(&mut a, &holders);
    assert_eq!(names(&a), ["running"]);
    assert_eq!(p.len(), 1);
    // A holder that left the set keeps nothing: the first remaining pod wins.
    let mut a = admitted(&text);
    let gone = BTreeMap::from([(UID_A.to_owned(), ("default".into(), "gone".into()))]);
    unique_uids(&mut a, &gone);
    assert_eq!(names(&a), ["newcomer"]);
}

#[test]
fn an_explicit_uid_equal_to_a_derived_one_is_refused() {
    let derived = crate::policy::pod::derived_uid("default", "a");
    let text = format!(
        "{}---\n{}",
        pod("name: a", ONE),
        pod(&format!("name: b, uid: {derived}"), ONE)
    );
    let mut a = admitted(&text);
    assert_eq!(unique_uids(&mut a, &BTreeMap::new()).len(), 1);
    assert_eq!(names(&a), ["a"]);
}

/// Every admission rule has a breaking case above: the rule list and these tests stay in step.
#[test]
fn every_admission_rule_is_exercised() {
    let cases = [
        pod("name: X", ONE),
        pod("name: p, namespace: X", ONE),
        pod("name: p", "  containers: [{name: X, command: [a]}]\n"),
        pod(
            "name: p",
            "  containers: [{name: c, command: [a]}, {name: c, command: [a]}]\n",
        ),
        pod("name: p, uid: x", ONE),
        pod(
            "name: p",
            "  containers: [{name: c, command: [a], resources: {limits: {cpu: \"-1\"}}}]\n",
        ),
        pod(
            "name: p",
            "  containers: [{name: c, command: [a], resources: {limits: {memory: 9Ei}}}]\n",
        ),
        pod(
            "name: p",
            "  containers: [{name: c, command: [a], resources: {limits: {cpu: \"1\"}, requests: {cpu: \"2\"}}}]\n",
        ),
        pod("name: p", "  containers: []\n"),
    ];
    let mut seen: BTreeSet<String> = cases
        .iter()
        .flat_map(|c| lines(c))
        .map(|l| l.split(": ").nth(2).unwrap_or_default().to_owned())
        .collect();
    let mut a = admitted(&format!(
        "{}---\n{}",
        pod(&format!("name: a, uid: {UID_A}"), ONE),
        pod(&format!("name: b, uid: {UID_A}"), ONE)
    ));
    for p in unique_uids(&mut a, &BTreeMap::new()) {
        seen.insert(p.rule.name().to_owned());
    }
    for rule in std::iter::once(Rule::NameDnsSubdomain).chain(Rule::ADMISSION) {
        assert!(
            seen.contains(rule.name()),
            "no case breaks {rule}: {seen:?}"
        );
    }
}
