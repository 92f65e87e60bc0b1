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

/// The problem, pending and warning lines: stderr, as `plan`'s.
fn stderr_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The verdict: the one line on stdout.
fn verdict(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
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
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let objects = fs::read_dir(&dir)
        .expect("examples")
        .map(|e| fs::read_to_string(e.expect("entry").path()).expect("example"))
        .map(|t| t.matches("\nkind: ").count() + usize::from(t.starts_with("kind: ")))
        .sum::<usize>();
    assert_eq!(verdict(&o), format!("valid: {objects} objects\n"));
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
        String::from_utf8_lossy(&gated.stderr)
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
            "{d}/01-simple-gang.yaml:2: Workload/team-a/simple: min-count-positive: template \"workers\": gang minCount is 0, must be at least 1"
        ),
        format!(
            "{d}/01-simple-gang.yaml:10: PodGroup/team-a/simple-workers: min-count-positive: gang minCount is 0, must be at least 1"
        ),
        format!(
            "{d}/02-serving-depth2.yaml:79: Pod/team-a/decode-0: scheduler-name-consistent: schedulerName \"volcano\" differs from the hierarchy's \"default-scheduler\""
        ),
        format!(
            "{d}/99-extra.yaml:1: Frobnicator/team-a/f: kind-known: example.com/v1 Frobnicator is not a kind qoslet reads"
        ),
        format!(
            "{d}/99-extra.yaml:5: Workload/team-a/old: api-version: apiVersion scheduling.k8s.io/v1alpha1 is not served for Workload; expected scheduling.k8s.io/v1beta1"
        ),
        format!(
            "{d}/99-extra.yaml:12: KubeletConfiguration: api-version: apiVersion: expected kubelet.config.k8s.io/v1beta1, got \"kubelet.config.k8s.io/v1\""
        ),
    ];
    assert_eq!(verdict(&o), "invalid: 7 problems\n");
    let lines = stderr_lines(&o);
    let (schema, rest): (Vec<String>, Vec<String>) =
        lines.into_iter().partition(|l| l.contains(": schema: "));
    assert_eq!(rest, expected);
    assert_eq!(schema.len(), 1, "{schema:?}");
    assert!(
        schema[0].starts_with(&format!(
            "{d}/99-extra.yaml:18: PodGroup/team-a/bad: schema: spec.schedulingPolicy: "
        )),
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
    assert_eq!(verdict(&o), "invalid: 1 problem\n");
    assert_eq!(
        stderr_lines(&o),
        vec![format!(
            "{}/change.yaml:1: PodGroup/team-a/serving-decode: immutable-disruption-mode: disruptionMode cannot change (Single -> All)",
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
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(verdict(&o), "valid: 1 object\n");
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
        stderr_lines(&o),
        vec![format!(
            "{}/m.yaml:6: document 1: schema: not a Kubernetes object (expected a mapping)",
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
        stderr_lines(&o),
        vec![format!(
            "{}/q.yaml:3: QosletConfiguration: schema: ebpf.sensors: unknown sensor \"sched\" (the eBPF sensors are oom_victim, memcg_events, reclaim_stall, reclaim_wake, cpu_runqueue, oom_score_adj, process_lifecycle, cgroup_lifecycle)",
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
    assert_eq!(verdict(&o), "valid: 1 object, 1 pending\n");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .collect::<Vec<_>>(),
        vec![format!(
            "pending: {}/pod.yaml:5: Pod/team-a/p: reference-exists: PodGroup/later does not exist",
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
        stderr_lines(&o),
        vec![format!(
            "{}/pod.yaml:5: Pod/team-a/p: reference-name: spec.schedulingGroup.podGroupName: \"Later_1\" is not a valid name",
            s.path()
        )]
    );
    assert_eq!(verdict(&o), "invalid: 1 problem\n");
}

#[test]
fn misspelt_pod_keys_are_warnings_with_line_path_and_suggestion() {
    let s = Scratch::new("misspelt");
    fs::write(
        s.0.join("pod.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-a}\n\
         spec:\n  containers:\n  - name: main\n    image: busybox\n    resoures: {limits: {cpu: \"1\"}}\n  \
         nodeSelectr: {disk: ssd}\n  colour: blue\n",
    )
    .expect("write");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(verdict(&o), "valid: 1 object, 3 warnings\n");
    let f = format!("{}/pod.yaml", s.path());
    let warnings = vec![
        format!("warning: {f}:10: Pod/team-a/p: unknown-field: spec.colour: unknown field"),
        format!(
            "warning: {f}:8: Pod/team-a/p: unknown-field: spec.containers[0].resoures: unknown field (did you mean `resources`?)"
        ),
        format!(
            "warning: {f}:9: Pod/team-a/p: unknown-field: spec.nodeSelectr: unknown field (did you mean `nodeSelector`?)"
        ),
    ];
    assert_eq!(stderr_lines(&o), warnings);

    // plan reads the same pod and warns the same way, on stderr.
    let kubelet =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/kubelet-config.yaml");
    let p = qoslet(&[
        "plan",
        "--kubelet-config",
        kubelet.to_str().expect("utf-8"),
        "--capacity",
        "cpu=4,memory=8Gi",
        &f,
    ]);
    assert_eq!(
        p.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&p.stderr)
    );
    let plan_warnings: Vec<String> = stderr_lines(&p)
        .into_iter()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    assert_eq!(plan_warnings, warnings);
}

#[test]
fn warnings_are_bounded_and_long_keys_shortened() {
    let s = Scratch::new("many-unknown");
    let mut spec = String::from("spec:\n  containers: [{name: main, image: busybox}]\n");
    for i in 0..30 {
        spec.push_str(&format!("  extra{i:02}: 1\n"));
    }
    // An explicit key: YAML limits an implicit one to 1024 characters.
    spec.push_str(&format!("  ? {}\n  : 1\n", "k".repeat(100_000)));
    fs::write(
        s.0.join("pod.yaml"),
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\n{spec}"),
    )
    .expect("write");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(o.status.code(), Some(0));
    let lines = stderr_lines(&o);
    assert_eq!(lines.len(), 21, "{lines:?}");
    assert_eq!(
        lines[20],
        format!("warning: {}/pod.yaml: and 11 more unknown fields", s.path())
    );
    assert!(lines.iter().all(|l| l.len() < 400), "{lines:?}");
    assert_eq!(verdict(&o), "valid: 1 object, 31 warnings\n");
}

#[test]
fn every_problem_of_a_configuration_has_its_line_and_field() {
    let s = Scratch::new("config-errors");
    fs::write(
        s.0.join("q.yaml"),
        "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\n\
         metricsAdress: 127.0.0.1:9479\nhousekeepingInterval: 5x\n\
         cpuPressure:\n  latencyTarget: soon\ncapacity: {memory: -1Gi}\n",
    )
    .expect("write");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(verdict(&o), "invalid: 4 problems\n");
    let f = format!("{}/q.yaml", s.path());
    assert_eq!(
        stderr_lines(&o),
        vec![
            format!(
                "{f}:7: QosletConfiguration: schema: capacity.memory: \"-1Gi\": must be greater than or equal to 0"
            ),
            format!(
                "{f}:6: QosletConfiguration: schema: cpuPressure.latencyTarget: invalid duration \"soon\""
            ),
            format!(
                "{f}:4: QosletConfiguration: schema: housekeepingInterval: invalid duration \"5x\""
            ),
            format!(
                "{f}:3: QosletConfiguration: unknown-field: metricsAdress: unknown field (did you mean `metricsAddress`?)"
            ),
        ]
    );

    // A KubeletConfiguration's every value error too, each with its line.
    fs::remove_file(s.0.join("q.yaml")).expect("remove");
    fs::write(
        s.0.join("kc.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         evictionPressureTransitionPeriod: 5x\ncgroupDriver: bogus\n\
         systemReserved:\n  memory: -1Gi\ncpuCFSQuotaPeriod: soon\n",
    )
    .expect("write");
    let o = qoslet(&["validate", s.path()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(verdict(&o), "invalid: 4 problems\n");
    let f = format!("{}/kc.yaml", s.path());
    assert_eq!(
        stderr_lines(&o),
        vec![
            format!(
                "{f}:4: KubeletConfiguration: schema: cgroupDriver: \"bogus\": expected cgroupfs or systemd"
            ),
            format!(
                "{f}:7: KubeletConfiguration: schema: cpuCFSQuotaPeriod: \"soon\": invalid duration \"soon\""
            ),
            format!(
                "{f}:3: KubeletConfiguration: schema: evictionPressureTransitionPeriod: \"5x\": invalid duration \"5x\""
            ),
            format!(
                "{f}:6: KubeletConfiguration: schema: systemReserved.memory: \"-1Gi\": must not be negative"
            ),
        ]
    );
}
