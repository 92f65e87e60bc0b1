//! `qoslet validate` end to end: exit status and output lines (the contract in docs/usage.md).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

fn qoslet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("qoslet runs")
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/workloads")
}

fn stdout_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A scratch directory removed on drop, also when the test fails.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("qoslet-validate-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn examples_are_valid() {
    let dir = examples();
    let o = qoslet(&["validate", dir.to_str().expect("utf-8")]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(o.stdout.is_empty());
    let gated = qoslet(&[
        "validate",
        "--feature-gates",
        "PodGroupPreemptionPolicy=true",
        dir.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        gated.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&gated.stdout)
    );
}

#[test]
fn broken_copy_prints_one_sorted_line_per_problem() {
    let s = Scratch::new("broken");
    for e in fs::read_dir(examples()).expect("examples") {
        let p = e.expect("entry").path();
        let text = fs::read_to_string(&p).expect("example");
        let name = p.file_name().expect("file name");
        let text = if name == "01-simple-gang.yaml" {
            text.replace("minCount: 2", "minCount: 0")
        } else if name == "02-serving-depth2.yaml" {
            text.replace(
                "schedulingGroup: {podGroupName: serving-decode}",
                "schedulingGroup: {podGroupName: serving-decode}\n  schedulerName: volcano",
            )
        } else {
            text
        };
        fs::write(s.0.join(name), text).expect("write copy");
    }
    fs::write(
        s.0.join("99-extra.yaml"),
        "apiVersion: example.com/v1\nkind: Frobnicator\nmetadata: {name: f, namespace: team-a}\n\
         ---\napiVersion: scheduling.k8s.io/v1alpha1\nkind: Workload\nmetadata: {name: old, namespace: team-a}\n\
         ---\napiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         ---\napiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n\
         ---\napiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: bad, namespace: team-a}\nspec: {schedulingPolicy: oops}\n",
    )
    .expect("write extra");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(o.status.code(), Some(1));
    let d = s.path();
    let expected = vec![
        format!(
            "{d}/01-simple-gang.yaml: Workload/team-a/simple: min-count-positive: template \"workers\": gang minCount is 0, must be at least 1"
        ),
        format!(
            "{d}/01-simple-gang.yaml: PodGroup/team-a/simple-workers: min-count-positive: gang minCount is 0, must be at least 1"
        ),
        format!(
            "{d}/02-serving-depth2.yaml: Pod/team-a/decode-0: scheduler-name-consistent: schedulerName \"volcano\" differs from the hierarchy's \"default-scheduler\""
        ),
        format!(
            "{d}/99-extra.yaml: Frobnicator/team-a/f: kind-known: example.com/v1 Frobnicator is not a kind qoslet reads"
        ),
        format!(
            "{d}/99-extra.yaml: Workload/team-a/old: api-version: apiVersion scheduling.k8s.io/v1alpha1 is not served for Workload; expected scheduling.k8s.io/v1beta1"
        ),
        format!(
            "{d}/99-extra.yaml: KubeletConfiguration: api-version: apiVersion: expected kubelet.config.k8s.io/v1beta1, got \"kubelet.config.k8s.io/v1\""
        ),
    ];
    let lines = stdout_lines(&o);
    let (schema, rest): (Vec<String>, Vec<String>) =
        lines.into_iter().partition(|l| l.contains(": schema: "));
    assert_eq!(rest, expected);
    assert_eq!(schema.len(), 1, "{schema:?}");
    assert!(
        schema[0].starts_with(&format!("{d}/99-extra.yaml: PodGroup/team-a/bad: schema: ")),
        "{schema:?}"
    );
}

#[test]
fn previous_rejects_immutable_changes() {
    let s = Scratch::new("previous");
    fs::write(
        s.0.join("change.yaml"),
        "apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\n\
         metadata: {name: serving-decode, namespace: team-a}\n\
         spec:\n  parentCompositePodGroupName: serving\n  workloadRef: {workloadName: serving, templateName: decode}\n  \
         schedulingPolicy: {basic: {}}\n  disruptionMode: {all: {}}\n",
    )
    .expect("write change");
    let prev = examples();
    let o = qoslet(&[
        "validate",
        "--previous",
        prev.to_str().expect("utf-8"),
        s.path(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        stdout_lines(&o),
        vec![format!(
            "{}/change.yaml: PodGroup/team-a/serving-decode: immutable-disruption-mode: disruptionMode cannot change (Single -> All)",
            s.path()
        )]
    );

    // A mutable change (minCount of a PodGroup) passes.
    fs::write(
        s.0.join("change.yaml"),
        "apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\n\
         metadata: {name: serving-prefill, namespace: team-a}\n\
         spec:\n  parentCompositePodGroupName: serving\n  workloadRef: {workloadName: serving, templateName: prefill}\n  \
         schedulingPolicy: {gang: {minCount: 1}}\n",
    )
    .expect("write change");
    let o = qoslet(&[
        "validate",
        "--previous",
        prev.to_str().expect("utf-8"),
        s.path(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn malformed_document_is_a_problem_line() {
    let s = Scratch::new("malformed");
    fs::write(
        s.0.join("m.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: x}]}\n---\n- not a mapping\n",
    )
    .expect("write");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout_lines(&o),
        vec![format!(
            "{}/m.yaml: document 1: schema: not a Kubernetes object (expected a mapping)",
            s.path()
        )]
    );
}

#[test]
fn an_unknown_ebpf_sensor_is_a_problem_line() {
    let s = Scratch::new("sensors");
    fs::write(
        s.0.join("q.yaml"),
        "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nebpf: {sensors: {cpu_runqueue: false, sched: false}}\n",
    )
    .expect("write");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout_lines(&o),
        vec![format!(
            "{}/q.yaml: QosletConfiguration: schema: ebpf.sensors: unknown sensor \"sched\" (the eBPF sensors are oom_victim, memcg_events, reclaim_stall, reclaim_wake, cpu_runqueue, oom_score_adj, process_lifecycle, cgroup_lifecycle)",
            s.path()
        )]
    );
}

#[test]
fn unreadable_input_exits_2() {
    let o = qoslet(&["validate", "/nonexistent/qoslet/manifests.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/qoslet/manifests.yaml"));

    let dir = examples();
    let o = qoslet(&[
        "validate",
        "--previous",
        "/nonexistent/qoslet/previous",
        dir.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));

    let o = qoslet(&[
        "validate",
        "--feature-gates",
        "PodGroupPreemptionPolicy=maybe",
        dir.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_forward_reference_is_pending_not_a_problem() {
    let s = Scratch::new("pending");
    fs::write(
        s.0.join("pod.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-a}\n\
         spec:\n  schedulingGroup: {podGroupName: later}\n  containers: [{name: main, image: busybox}]\n",
    )
    .expect("write");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(o.status.code(), Some(0));
    assert!(o.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .collect::<Vec<_>>(),
        vec![format!(
            "pending: {}/pod.yaml: Pod/team-a/p: reference-exists: PodGroup/later does not exist",
            s.path()
        )]
    );

    // An invalid name is no forward reference: the API server refuses it.
    fs::write(
        s.0.join("pod.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-a}\n\
         spec:\n  schedulingGroup: {podGroupName: Later_1}\n  containers: [{name: main, image: busybox}]\n",
    )
    .expect("write");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout_lines(&o),
        vec![format!(
            "{}/pod.yaml: Pod/team-a/p: reference-name: spec.schedulingGroup.podGroupName: \"Later_1\" is not a valid name",
            s.path()
        )]
    );
    assert!(o.stderr.is_empty());
}
