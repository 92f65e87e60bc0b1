//! Hostile input through the real binary (issue "Hardening"): arithmetic that cannot panic,
//! negative quantities, `validate` refusing what `plan` refuses, FIFOs, devices and huge files,
//! KubeletConfiguration fields qoslet does not implement, and `podPidsLimit` in the plan.

use std::{
    fs,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

const CAPACITY: &str = "cpu=4,memory=32Gi,pids=4194304";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples")
}

fn kubelet_config() -> String {
    examples().join("kubelet-config.yaml").display().to_string()
}

/// Runs qoslet and kills it after 60 s: a hang fails the test instead of blocking the suite.
fn qoslet(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qoslet starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("qoslet {args:?} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn plan(kubelet: &str, paths: &[&str]) -> Output {
    let mut args = vec!["plan", "--kubelet-config", kubelet, "--capacity", CAPACITY];
    args.extend(paths);
    qoslet(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("qoslet-hostile-{name}-{}", std::process::id()));
        fs::remove_dir_all(&d).ok();
        fs::create_dir_all(&d).unwrap();
        Self(d)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        fs::remove_dir_all(&self.0).ok();
    }
}

fn pod(name: &str, uid: Option<&str>, containers: &str) -> String {
    let uid = uid.map(|u| format!(", uid: {u}")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}{uid}}}\nspec:\n  containers:\n{containers}"
    )
}

fn container(name: &str, resources: &str) -> String {
    format!("  - {{name: {name}, command: [sleep, '1'], resources: {resources}}}\n")
}

#[test]
fn huge_limits_exit_1_with_a_line_not_a_panic() {
    let d = TempDir::new("overflow");
    let huge = container("c", "{limits: {cpu: 5Ei}}");
    let a = d.file("a.yaml", &pod("a", None, &huge));
    let b = d.file("b.yaml", &pod("b", None, &huge));
    let out = plan(&kubelet_config(), &[&a, &b]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{a}:6: Pod/a: spec.containers[0].resources.limits.cpu: \"5Ei\": must be less than or equal to 9223372036854775807m"
        )),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn sums_beyond_i64_saturate() {
    // Each pod's cpu fits 64-bit millicores; their sum does not.
    let d = TempDir::new("saturate");
    let big = container("c", "{requests: {cpu: \"9000000000000000\", memory: 4Ei}}");
    let a = d.file("a.yaml", &pod("a", None, &big));
    let b = d.file("b.yaml", &pod("b", None, &big));
    // TieredReservation (1.36+) protects the sum of the requests on kubepods: a memory sum.
    let kubelet = d.file(
        "kubelet.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\nfeatureGates: {MemoryQoS: true}\nmemoryReservationPolicy: TieredReservation\n",
    );
    let out = qoslet(&[
        "plan",
        "--kubelet-config",
        &kubelet,
        "--capacity",
        CAPACITY,
        "--output",
        "json",
        &a,
        &b,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node"]["burstable"]["cpu_shares"], 262_144);
    assert_eq!(v["node"]["kubepods"]["memory_min_bytes"], i64::MAX);
}

#[test]
fn negative_quantities_are_refused_by_validate_and_plan() {
    let d = TempDir::new("negative");
    let f = d.file(
        "neg.yaml",
        &pod(
            "neg",
            None,
            &container("c", "{limits: {cpu: \"-2\", memory: -64Mi}}"),
        ),
    );
    let v = qoslet(&["validate", &f]);
    let lines = stderr(&v);
    assert_eq!(v.status.code(), Some(1), "{lines}");
    assert_eq!(String::from_utf8_lossy(&v.stdout), "invalid: 2 problems\n");
    assert_eq!(
        lines,
        format!(
            "{f}:6: Pod/neg: quantity-non-negative: spec.containers[0].resources.limits.cpu: \"-2\": must be greater than or equal to 0\n\
             {f}:6: Pod/neg: quantity-non-negative: spec.containers[0].resources.limits.memory: \"-64Mi\": must be greater than or equal to 0\n"
        )
    );
    let p = plan(&kubelet_config(), &[&f]);
    assert_eq!(p.status.code(), Some(1), "{}", stderr(&p));
    assert!(stderr(&p).contains("must be greater than or equal to 0"));
}

#[test]
fn validate_refuses_every_pod_plan_refuses() {
    let d = TempDir::new("parity");
    let ok = container("c", "{}");
    let uid = "6f1e3c1a-0b7a-4c1e-9a51-2f8d3c4b5a60";
    let cases = [
        ("name", pod("Bad_Name", None, &ok)),
        ("uid", pod("p", Some("not-a-uuid"), &ok)),
        ("container-name", pod("p", None, &container("C", "{}"))),
        ("duplicate", pod("p", None, &format!("{ok}{ok}"))),
        (
            "request-above-limit",
            pod(
                "p",
                None,
                &container("c", "{requests: {memory: 2Gi}, limits: {memory: 1Gi}}"),
            ),
        ),
        (
            "same-uid",
            format!(
                "{}---\n{}",
                pod("a", Some(uid), &ok),
                pod("b", Some(uid), &ok)
            ),
        ),
    ];
    for (what, text) in cases {
        let f = d.file(&format!("{what}.yaml"), &text);
        let v = qoslet(&["validate", &f]);
        let p = plan(&kubelet_config(), &[&f]);
        assert_eq!(v.status.code(), Some(1), "validate passed {what}");
        assert_eq!(
            p.status.code(),
            Some(1),
            "plan accepted {what}: {}",
            stderr(&p)
        );
    }
    // And what validate passes, plan accepts.
    let good = d.file("good.yaml", &pod("good", Some(uid), &ok));
    assert_eq!(qoslet(&["validate", &good]).status.code(), Some(0));
    assert_eq!(plan(&kubelet_config(), &[&good]).status.code(), Some(0));
}

#[test]
fn validate_refuses_every_kubelet_configuration_plan_refuses() {
    let d = TempDir::new("kubelet");
    let pods = d.file("p.yaml", &pod("p", None, &container("c", "{}")));
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let cases = [
        "cgroupDriver: bogus\n",
        "enforceNodeAllocatable: [pods, system-reserved]\n",
        "systemReserved: {memory: -1Gi}\n",
        "reservedSystemCPUs: \"0\"\nsystemReservedCgroup: /system.slice\n",
        "evictionHard: {memory.available: lots}\n",
        "cpuCFSQuotaPeriod: 5s\n",
    ];
    for (i, body) in cases.iter().enumerate() {
        let kc = d.file(&format!("kc{i}.yaml"), &format!("{head}{body}"));
        let v = qoslet(&["validate", &kc]);
        let p = plan(&kc, &[&pods]);
        assert_eq!(v.status.code(), Some(1), "validate passed {body}");
        assert_eq!(
            p.status.code(),
            Some(1),
            "plan accepted {body}: {}",
            stderr(&p)
        );
    }
}

#[test]
fn validate_checks_the_qoslet_configuration_values_run_reads() {
    let d = TempDir::new("qoslet-config");
    let head = "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\n";
    for body in [
        "metricsAddress: localhost-ish\n",
        "nodeRootCgroup: /a/../b\n",
        "capacity: {memory: -1Gi}\n",
        "capacity: {cpu: lots}\n",
    ] {
        let f = d.file("q.yaml", &format!("{head}{body}"));
        let v = qoslet(&["validate", &f]);
        assert_eq!(v.status.code(), Some(1), "validate passed {body}");
    }
    let f = d.file(
        "q.yaml",
        &format!("{head}nodeRootCgroup: /qoslet-demo\nmaxManifestBytes: 1024\n"),
    );
    let v = qoslet(&["validate", &f]);
    assert!(v.status.success(), "{}", stderr(&v));
}

#[test]
fn ignored_kubelet_fields_are_named_once() {
    let d = TempDir::new("ignored");
    let kc = d.file(
        "kc.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\naddress: 0.0.0.0\nstaticPodPath: /etc/kubernetes/manifests\npodPidsLimit: 100\nsystemReseved: {memory: 1Gi}\n",
    );
    let pods = d.file("p.yaml", &pod("p", None, &container("c", "{}")));
    let note = format!(
        "note: {kc}: KubeletConfiguration fields qoslet does not implement are ignored: address, staticPodPath, systemReseved (did you mean `systemReserved`?)\n"
    );
    let p = qoslet(&[
        "plan",
        "--kubelet-config",
        &kc,
        "--capacity",
        CAPACITY,
        "--output",
        "json",
        &pods,
    ]);
    assert!(p.status.success(), "{}", stderr(&p));
    assert_eq!(stderr(&p).matches(&note).count(), 1, "{}", stderr(&p));
    let v: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    assert_eq!(
        v["pods"][0]["pids_max"], 100,
        "podPidsLimit is the pod's pids.max"
    );
    let val = qoslet(&["validate", &kc]);
    assert!(val.status.success(), "{}", stderr(&val));
    assert_eq!(stderr(&val).matches(&note).count(), 1, "{}", stderr(&val));
    // -1 (the kubelet's default) and 0 set no limit.
    for unlimited in ["-1", "0"] {
        let kc = d.file(
            "kc-unlimited.yaml",
            &format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodPidsLimit: {unlimited}\n"),
        );
        let p = qoslet(&[
            "plan",
            "--kubelet-config",
            &kc,
            "--capacity",
            CAPACITY,
            "--output",
            "json",
            &pods,
        ]);
        let v: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
        assert!(v["pods"][0]["pids_max"].is_null(), "{unlimited}: {v}");
    }
}

#[test]
fn fifos_are_refused_promptly() {
    let d = TempDir::new("fifo");
    let fifo = d.0.join("pods.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let fifo = fifo.display().to_string();
    let good = d.file("p.yaml", &pod("p", None, &container("c", "{}")));
    // qoslet() kills a run that takes 60 s; nothing writes to the FIFO, so a blocking open
    // would hang.
    for (args, what) in [
        (vec!["validate", fifo.as_str()], "validate PATH"),
        (
            vec![
                "plan",
                "--kubelet-config",
                &kubelet_config(),
                "--capacity",
                CAPACITY,
                &fifo,
            ],
            "plan PATH",
        ),
        (
            vec![
                "plan",
                "--kubelet-config",
                &fifo,
                "--capacity",
                CAPACITY,
                &good,
            ],
            "plan --kubelet-config",
        ),
        (
            vec![
                "plan",
                "--kubelet-config",
                &kubelet_config(),
                "--config",
                &fifo,
                "--capacity",
                CAPACITY,
                &good,
            ],
            "plan --config",
        ),
    ] {
        let out = qoslet(&args);
        assert_eq!(out.status.code(), Some(2), "{what}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("a FIFO, not a regular file"),
            "{what}: {}",
            stderr(&out)
        );
    }
}

/// The largest resident set of any child this process waited for, in KiB.
fn children_max_rss_kib() -> i64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_CHILDREN is a valid selector.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, ru.as_mut_ptr()) };
    assert_eq!(rc, 0);
    // SAFETY: getrusage succeeded and initialised it.
    unsafe { ru.assume_init() }.ru_maxrss
}

#[test]
fn huge_files_and_devices_are_refused_with_bounded_memory() {
    let d = TempDir::new("huge");
    let sparse = d.0.join("sparse.yaml");
    let f = fs::File::create(&sparse).unwrap();
    // 8 GiB apparent size, nothing allocated but one block.
    f.write_at(b"x", 8 << 30).unwrap();
    let sparse = sparse.display().to_string();
    let good = d.file("p.yaml", &pod("p", None, &container("c", "{}")));
    for (args, needle) in [
        (
            vec!["validate", sparse.as_str()],
            "above the limit of 4194304 bytes",
        ),
        (
            vec!["validate", "/dev/zero"],
            "a character device, not a regular file",
        ),
        (
            vec![
                "plan",
                "--kubelet-config",
                "/dev/zero",
                "--capacity",
                CAPACITY,
                &good,
            ],
            "a character device, not a regular file",
        ),
        (
            vec![
                "plan",
                "--kubelet-config",
                &sparse,
                "--capacity",
                CAPACITY,
                &good,
            ],
            "above the limit of 4194304 bytes",
        ),
        (
            vec!["validate", "--max-manifest-bytes", "10", &good],
            "above the limit of 10 bytes",
        ),
    ] {
        let out = qoslet(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    // Every child of this test binary so far stayed small (the defect read 8-11 GB).
    let rss = children_max_rss_kib();
    assert!(rss < 512 * 1024, "a child reached {rss} KiB");
}
