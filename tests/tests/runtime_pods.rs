//! The standalone process runtime on real processes and real cgroups: ordering of init
//! containers, sidecars and app containers, restart back-off, graceful termination, cgroup
//! placement, logs, gating and eviction. Every process is one the test's runtime started, in
//! cgroups the test created.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use qoslet::{
    node::{ContainerState, PodPhase, PodStatus},
    policy::pod::PodKey,
    runtime::{ContainerCgroups, PodRuntimeSpec, logs::container_log_path},
    source::manifest::{Loaded, parse_documents},
};
use qoslet_tests::{
    TempDir, TestCgroup, container_cgroups, fast_runtime, find_pod, require_root, unique_name,
    wait_for_pod,
};

const WAIT: Duration = Duration::from_secs(20);

/// Reads one Pod manifest; every container gets its own cgroups, kept alive by the caller.
fn pod(yaml: &str) -> (PodRuntimeSpec, Vec<Vec<TestCgroup>>) {
    let mut loaded = Loaded::default();
    parse_documents(Path::new("test.yaml"), yaml, &mut loaded);
    assert!(loaded.malformed.is_empty(), "{:?}", loaded.malformed);
    let mut spec = PodRuntimeSpec::from_pod(&loaded.objects[0].decode().expect("a Pod"))
        .expect("a runnable pod");
    let mut all = Vec::new();
    let names: Vec<String> = spec.containers.iter().map(|c| c.name.clone()).collect();
    for name in names {
        let cgs = container_cgroups(&unique_name());
        let dirs = cgs.iter().map(TestCgroup::beneath).collect();
        assert!(spec.set_cgroups(&name, ContainerCgroups { dirs }));
        all.push(cgs);
    }
    (spec, all)
}

fn running_pid(s: &PodStatus, container: &str) -> Option<u32> {
    s.containers
        .iter()
        .find(|c| c.name == container)
        .and_then(|c| match c.state {
            ContainerState::Running { pid, .. } => pid,
            _ => None,
        })
}

fn log(logs: &Path, key: &PodKey, container: &str, restart: u32) -> String {
    fs::read_to_string(container_log_path(logs, key, container, restart)).unwrap_or_default()
}

async fn wait_log(logs: &Path, key: &PodKey, container: &str, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = log(logs, key, container, 0);
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{container} never logged {needle:?}; log: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_container_prepares_what_the_app_reads_inside_its_cgroups() {
    require_root();
    let (logs, work) = (TempDir::new(), TempDir::new());
    let yaml = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: init-app, namespace: rt}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  initContainers:
  - name: prepare
    command: [/bin/sh, -c, "echo prepared > {dir}/data"]
  containers:
  - name: app
    command: [/bin/sh, -c]
    args: ["cat data; echo X=$X; pwd; echo to-stderr >&2; exec sleep 60"]
    workingDir: {dir}
    env: [{{name: X, value: "42"}}]
"#,
        dir = work.path.display()
    );
    let (spec, cgroups) = pod(&yaml);
    let key = spec.key.clone();
    let rt = fast_runtime(&logs.path);
    rt.apply(vec![spec], |_| None);
    let s = wait_for_pod(&rt, &key, "the app running", |s| {
        running_pid(s, "app").is_some()
    })
    .await;
    assert_eq!(s.phase, PodPhase::Running);
    let init = &s.containers[0];
    match &init.state {
        ContainerState::Terminated(t) => {
            assert_eq!((t.exit_code, t.reason.as_str()), (0, "Completed"));
        }
        other => panic!("init container not terminated: {other:?}"),
    }
    let text = wait_log(&logs.path, &key, "app", "to-stderr").await;
    assert!(text.contains("prepared\n"), "{text:?}");
    assert!(text.contains("X=42\n"), "{text:?}");
    assert!(
        text.contains(&format!("{}\n", work.path.display())),
        "{text:?}"
    );

    // The app (after `exec`, the sleep) is in every cgroup of its container and nowhere else.
    let pid = running_pid(&s, "app").unwrap();
    let proc_cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for cg in &cgroups[1] {
        let name = cg.path.file_name().unwrap().to_str().unwrap();
        assert!(
            cg.pids().contains(&(pid as i32)),
            "{pid} not in {}",
            cg.path.display()
        );
        assert!(
            proc_cgroup
                .lines()
                .any(|l| l.ends_with(&format!(":/{name}"))),
            "/proc/{pid}/cgroup lacks {name}: {proc_cgroup}"
        );
    }
    let app_lines = proc_cgroup
        .lines()
        .filter(|l| {
            l.contains(&format!(
                "/{}",
                cgroups[1][0].path.file_name().unwrap().to_str().unwrap()
            ))
        })
        .count();
    assert_eq!(app_lines, cgroups[1].len(), "{proc_cgroup}");
    assert!(rt.has_processes(&key));

    rt.stop_all(Duration::from_secs(5)).await;
    assert!(cgroups[1].iter().all(|c| c.pids().is_empty()));
    let s = find_pod(&rt, &key);
    assert_eq!(
        s.phase,
        PodPhase::Failed,
        "a Never pod stopped by SIGTERM: {s:#?}"
    );
    match &s.containers[1].state {
        ContainerState::Terminated(t) => assert_eq!((t.signal, t.exit_code), (Some(15), 143)),
        other => panic!("app not terminated: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_starts_before_and_stops_after_the_app() {
    require_root();
    let (logs, work) = (TempDir::new(), TempDir::new());
    let yaml = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: sidecar, namespace: rt}}
spec:
  terminationGracePeriodSeconds: 5
  initContainers:
  - name: proxy
    restartPolicy: Always
    command: [/bin/sh, -c, "touch {dir}/proxy-up; exec sleep 60"]
  containers:
  - name: app
    # Started is not ready (no startup probe here): wait for the sidecar's work.
    command: [/bin/sh, -c, "until test -f {dir}/proxy-up; do sleep 1; done; echo proxy-seen; exec sleep 60"]
"#,
        dir = work.path.display()
    );
    let (spec, _cgroups) = pod(&yaml);
    let key = spec.key.clone();
    let rt = fast_runtime(&logs.path);
    rt.apply(vec![spec], |_| None);
    let s = wait_for_pod(&rt, &key, "the app running", |s| {
        running_pid(s, "app").is_some()
    })
    .await;
    assert!(running_pid(&s, "proxy").is_some(), "{s:#?}");
    wait_log(&logs.path, &key, "app", "proxy-seen").await;
    let started = |c: usize| match &s.containers[c].state {
        ContainerState::Running { started_at, .. } => *started_at,
        other => panic!("not running: {other:?}"),
    };
    assert!(started(0) <= started(1));

    rt.stop_all(Duration::from_secs(5)).await;
    let s = find_pod(&rt, &key);
    let finished = |c: usize| match &s.containers[c].state {
        ContainerState::Terminated(t) => t.finished_at,
        other => panic!("not terminated: {other:?}"),
    };
    assert!(
        finished(1) <= finished(0),
        "the app must stop before its sidecar: {s:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_container_restarts_with_back_off_under_on_failure() {
    require_root();
    let logs = TempDir::new();
    let yaml = r#"
apiVersion: v1
kind: Pod
metadata: {name: crash, namespace: rt}
spec:
  restartPolicy: OnFailure
  terminationGracePeriodSeconds: 2
  containers:
  - name: crash
    command: [/bin/sh, -c, "echo attempt; exit 1"]
  - name: done
    command: [/bin/sh, -c, "exit 0"]
"#;
    let (spec, _cgroups) = pod(yaml);
    let key = spec.key.clone();
    let rt = fast_runtime(&logs.path);
    let t0 = Instant::now();
    rt.apply(vec![spec], |_| None);
    let s = wait_for_pod(&rt, &key, "three restarts", |s| {
        s.containers[0].restart_count >= 3
    })
    .await;
    // Delays of 100, 200 and 400 ms precede the third restart.
    assert!(
        t0.elapsed() >= Duration::from_millis(700),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(
        s.phase,
        PodPhase::Running,
        "OnFailure keeps restarting: {s:#?}"
    );
    let last = s.containers[0].last_exit().expect("an exit");
    assert_eq!((last.exit_code, last.reason.as_str()), (1, "Error"));
    // The container that succeeded is not restarted.
    assert_eq!(s.containers[1].restart_count, 0);
    assert!(matches!(&s.containers[1].state, ContainerState::Terminated(t) if t.exit_code == 0));
    for restart in 0..3 {
        assert_eq!(
            log(&logs.path, &key, "crash", restart),
            "attempt\n",
            "run {restart}"
        );
    }
    rt.stop_all(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_ignoring_sigterm_is_killed_after_the_grace_period() {
    require_root();
    let logs = TempDir::new();
    let yaml = r#"
apiVersion: v1
kind: Pod
metadata: {name: stubborn, namespace: rt}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: stubborn
    command: [/bin/sh, -c, "trap '' TERM; echo ready; while true; do sleep 1; done"]
  - name: polite
    command: [sleep, "60"]
"#;
    let (spec, cgroups) = pod(yaml);
    let key = spec.key.clone();
    let rt = fast_runtime(&logs.path);
    rt.apply(vec![spec], |_| None);
    wait_for_pod(&rt, &key, "both running", |s| {
        running_pid(s, "stubborn").is_some() && running_pid(s, "polite").is_some()
    })
    .await;
    wait_log(&logs.path, &key, "stubborn", "ready").await;
    let t0 = Instant::now();
    // The drain grace is longer: the pod's own 1 s applies.
    rt.stop_all(Duration::from_secs(30)).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "killed before the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    let s = find_pod(&rt, &key);
    let term = |i: usize| match &s.containers[i].state {
        ContainerState::Terminated(t) => t.clone(),
        other => panic!("not terminated: {other:?}"),
    };
    assert_eq!((term(0).signal, term(0).exit_code), (Some(9), 137));
    assert_eq!((term(1).signal, term(1).exit_code), (Some(15), 143));
    for cg in cgroups.iter().flatten() {
        assert!(
            cg.pids().is_empty(),
            "{} still has {:?}",
            cg.path.display(),
            cg.pids()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_pods_wait_for_release_and_evicted_pods_fail() {
    require_root();
    let logs = TempDir::new();
    let yaml = r#"
apiVersion: v1
kind: Pod
metadata: {name: gated, namespace: rt}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: app
    command: [sleep, "60"]
"#;
    let (spec, _cgroups) = pod(yaml);
    let key = spec.key.clone();
    let rt = fast_runtime(&logs.path);
    let why = "waiting for PodGroup/g to exist";
    rt.apply(vec![spec.clone()], |_| Some(why.into()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = find_pod(&rt, &key);
    assert_eq!(s.phase, PodPhase::Pending);
    assert_eq!(s.reason.as_deref(), Some("SchedulingGated"));
    assert_eq!(s.message.as_deref(), Some(why));
    assert!(
        !container_log_path(&logs.path, &key, "app", 0).exists(),
        "a held pod ran"
    );

    rt.apply(vec![spec.clone()], |_| None);
    let s = wait_for_pod(&rt, &key, "the released pod running", |s| {
        running_pid(s, "app").is_some()
    })
    .await;
    assert_eq!((s.reason, s.message), (None, None), "released");

    assert!(rt.mark_evicted(&key, "memory pressure", Duration::from_secs(1)));
    let s = wait_for_pod(&rt, &key, "the eviction", |s| s.phase == PodPhase::Failed).await;
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(s.message.as_deref(), Some("memory pressure"));
    // Still desired with the same spec: it stays evicted, not restarted.
    rt.apply(vec![spec], |_| None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = find_pod(&rt, &key);
    assert_eq!(
        (s.phase, s.containers[0].restart_count),
        (PodPhase::Failed, 0)
    );
    assert!(running_pid(&s, "app").is_none());
    // Removed from the desired state: gone from the status once stopped.
    rt.apply(Vec::new(), |_| None);
    rt.stop_all(Duration::from_secs(1)).await;
    assert!(rt.status().is_empty(), "{:#?}", rt.status());
}

/// The runtime announces status changes: a reader that only wakes on `Runtime::changed` (as the
/// standalone node's status page does) sees a pod start, run and end, without polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_changes_wake_the_reader() {
    require_root();
    let logs = TempDir::new();
    let (spec, _cgroups) = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: announced, namespace: rt}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: app
    command: [/bin/sh, -c, "sleep 0.5"]
"#);
    let key = spec.key.clone();
    let rt = fast_runtime(&logs.path);
    // Waits on wake-ups alone until the pod reaches `phase`; returns how many it took.
    let wake_until = |phase: PodPhase| {
        let (rt, key) = (&rt, &key);
        async move {
            let mut wakes = 0;
            tokio::time::timeout(WAIT, async {
                loop {
                    rt.changed().await;
                    wakes += 1;
                    if find_pod(rt, key).phase == phase {
                        return;
                    }
                }
            })
            .await
            .unwrap_or_else(|_| panic!("no wake-up announced {phase:?}: {:#?}", find_pod(rt, key)));
            wakes
        }
    };
    rt.apply(vec![spec], |_| None);
    let to_running = wake_until(PodPhase::Running).await;
    let to_succeeded = wake_until(PodPhase::Succeeded).await;
    eprintln!("Running after {to_running} wake-ups, Succeeded after {to_succeeded} more");
}
