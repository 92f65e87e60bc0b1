//! The runtime's own defences, whatever reaches it (validation at the door should refuse most of
//! these pods first): no container outside its own cgroups, no log outside the log directory,
//! no two containers sharing a cgroup or a log, the kubelet's waiting reasons, and nothing the
//! runtime started alive after `stop_all`. Every process is one the test's runtime started, in
//! cgroups the test created.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use qoslet::{
    cgroup::CgroupBeneath,
    node::{ContainerState, PodPhase, PodStatus},
    policy::pod::{ContainerKind, PodKey, RestartPolicy},
    runtime::{ContainerCgroups, ContainerSpec, PodRuntimeSpec},
};
use qoslet_tests::{
    TempDir, TestCgroup, cgroup_beneath, container_cgroups, fast_runtime, find_pod, require_root,
    unique_name, wait_for_pod,
};

const WAIT: Duration = Duration::from_secs(20);

/// A container running `script`, which first creates `mark` (so the test sees whether it ever
/// ran) and then sleeps.
fn container(name: &str, mark: &Path, dirs: Vec<CgroupBeneath>) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        kind: ContainerKind::App,
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("echo ran > '{}'; exec sleep 60", mark.display()),
        ],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        working_dir: "/".into(),
        cgroups: ContainerCgroups { dirs },
    }
}

fn pod(namespace: &str, name: &str, uid: &str, containers: Vec<ContainerSpec>) -> PodRuntimeSpec {
    PodRuntimeSpec {
        key: PodKey {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        },
        containers,
        restart_policy: RestartPolicy::Always,
        termination_grace: Duration::from_secs(2),
    }
}

fn dirs(cgs: &[TestCgroup]) -> Vec<CgroupBeneath> {
    cgs.iter().map(TestCgroup::beneath).collect()
}

fn waiting(s: &PodStatus, container: usize) -> Option<(&str, &str)> {
    match &s.containers[container].state {
        ContainerState::Waiting { reason, message } => {
            Some((reason.as_str(), message.as_deref().unwrap_or("")))
        }
        _ => None,
    }
}

/// Every file and directory below `root`, relative to it.
fn tree(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_path_buf());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// A container whose cgroups are missing (none given, a directory that does not exist, a
/// directory that is not a cgroup, or a symlink out of the node root to a real cgroup) is not
/// started: it waits with `CreateContainerError` and the
/// cause, its command never runs, and the pod is Pending; its sibling with cgroups runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_without_its_own_cgroup_never_starts() {
    require_root();
    let (logs, work) = (TempDir::new(), TempDir::new());
    let good = container_cgroups(&unique_name());
    let not_a_cgroup = work.path.join("not-a-cgroup");
    fs::create_dir(&not_a_cgroup).unwrap();
    let missing = good[0].path.with_file_name(unique_name());
    // The node root a pod's directory is named beneath; the link leads out of it.
    let root = work.path.join("root");
    fs::create_dir(&root).unwrap();
    std::os::unix::fs::symlink(&good[0].path, root.join("link")).unwrap();
    let cases: [(&str, Vec<CgroupBeneath>, &str); 4] = [
        ("none", vec![], "no cgroup of its own"),
        (
            "missing",
            vec![cgroup_beneath(&missing)],
            "No such file or directory",
        ),
        (
            "plain-dir",
            vec![cgroup_beneath(&not_a_cgroup)],
            "is not a cgroup directory",
        ),
        (
            "symlink",
            vec![cgroup_beneath(&root.join("link"))],
            "cannot open to join the cgroup",
        ),
    ];
    let rt = fast_runtime(&logs.path);
    let (name, d, _) = &cases[0];
    let specs = vec![pod(
        "rt",
        name,
        &unique_name(),
        vec![
            container("ok", &work.path.join(format!("{name}-ok")), dirs(&good)),
            container("bad", &work.path.join(format!("{name}-bad")), d.clone()),
        ],
    )];
    let key = specs[0].key.clone();
    rt.apply(specs, |_| None);
    let s = wait_for_pod(&rt, &key, "the bad container refused", |s| {
        waiting(s, 1).is_some_and(|(r, _)| r == "CreateContainerError")
    })
    .await;
    assert!(waiting(&s, 1).unwrap().1.contains(cases[0].2), "{s:#?}");
    // Its sibling runs, inside its cgroups.
    let s = wait_for_pod(&rt, &key, "the good container running", |s| {
        matches!(s.containers[0].state, ContainerState::Running { .. })
    })
    .await;
    assert_eq!(s.phase, PodPhase::Pending, "an app container never ran");
    assert_eq!(s.reason.as_deref(), Some("CreateContainerError"));
    // Running means started; its shell writes the mark a moment later (under load, after
    // `stop_all` would have killed it).
    let ok_mark = work.path.join(format!("{name}-ok"));
    let deadline = Instant::now() + WAIT;
    while !ok_mark.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok_mark.exists(), "the good container ran");
    rt.stop_all(Duration::from_secs(2)).await;

    for (name, d, cause) in &cases[1..] {
        let rt = fast_runtime(&logs.path);
        let spec = pod(
            "rt",
            name,
            &unique_name(),
            vec![container(
                "bad",
                &work.path.join(format!("{name}-bad")),
                d.clone(),
            )],
        );
        let key = spec.key.clone();
        rt.apply(vec![spec], |_| None);
        let s = wait_for_pod(&rt, &key, "the container refused", |s| {
            waiting(s, 0).is_some_and(|(r, _)| r == "CreateContainerError")
        })
        .await;
        assert!(waiting(&s, 0).unwrap().1.contains(cause), "{name}: {s:#?}");
        // Still refused after a few back-off rounds, never started, never counted as a restart.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let s = find_pod(&rt, &key);
        assert!(waiting(&s, 0).is_some(), "{s:#?}");
        assert_eq!(s.containers[0].restart_count, 0);
        assert_eq!(s.phase, PodPhase::Pending);
        rt.stop_all(Duration::from_secs(2)).await;
    }
    for (name, _, _) in &cases {
        assert!(
            !work.path.join(format!("{name}-bad")).exists(),
            "{name}: the refused container ran"
        );
    }
}

/// Two containers of one name: the second cannot take the first one's cgroups or log file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_containers_never_share_a_cgroup_or_a_log() {
    require_root();
    let (logs, work) = (TempDir::new(), TempDir::new());
    let cgs = container_cgroups(&unique_name());
    let other = container_cgroups(&unique_name());
    let third = container_cgroups(&unique_name());
    let rt = fast_runtime(&logs.path);
    // Same name, same cgroups (what a pass gives a duplicate name).
    let a = pod(
        "rt",
        "dup",
        &unique_name(),
        vec![
            container("c", &work.path.join("first"), dirs(&cgs)),
            container("c", &work.path.join("second"), dirs(&cgs)),
        ],
    );
    // Same name, cgroups of its own: still one log file for both, so refused too.
    let b = pod(
        "rt",
        "dup-log",
        &unique_name(),
        vec![
            container("c", &work.path.join("b-first"), dirs(&other)),
            container("c", &work.path.join("b-second"), dirs(&third)),
        ],
    );
    let (ka, kb) = (a.key.clone(), b.key.clone());
    rt.apply(vec![a, b], |_| None);
    for key in [&ka, &kb] {
        let s = wait_for_pod(&rt, key, "one running, one refused", |s| {
            let running = s
                .containers
                .iter()
                .filter(|c| matches!(c.state, ContainerState::Running { .. }))
                .count();
            let refused = (0..2)
                .filter(|&i| waiting(s, i).is_some_and(|(r, _)| r == "CreateContainerError"))
                .count();
            running == 1 && refused == 1
        })
        .await;
        let message = (0..2).find_map(|i| waiting(&s, i)).unwrap().1.to_owned();
        assert!(
            message.contains("shared with another container") || message.contains("in use by"),
            "{message}"
        );
    }
    assert_eq!(cgs[0].pids().len(), 1, "only the first container's process");
    // One container of each pod ran (whichever came first). "Running" is the spawn; the shell
    // writes its mark a moment later (long under TCG), so the marks are waited for.
    let ran = || {
        let [a1, a2, b1, b2] =
            ["first", "second", "b-first", "b-second"].map(|f| work.path.join(f).exists());
        (u8::from(a1) + u8::from(a2), u8::from(b1) + u8::from(b2))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while ran() != (1, 1) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ran(), (1, 1), "containers that ran, of each pod");
    rt.stop_all(Duration::from_secs(2)).await;
}

/// Names built to escape the log directory are refused, not sanitised: nothing is written
/// outside it, and the container does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_built_to_escape_the_log_dir_write_nothing_outside_it() {
    require_root();
    let scratch = TempDir::new();
    // The log dir sits four levels down, so `..` climbs stay in the test's own scratch, where
    // every file is listed.
    let logs = scratch.path.join("a/b/c/logs");
    fs::create_dir_all(&logs).unwrap();
    let marks = TempDir::new();
    let abs = std::env::temp_dir().join(format!("qoslet-esc-abs-{}", std::process::id()));
    let long = "n".repeat(254);
    let abs_s = abs.display().to_string();
    let hostile: Vec<(&str, &str, &str, &str)> = vec![
        ("..", "p", "u1", "c"),
        ("../../../esc", "p", "u2", "c"),
        ("ns", "x/../../../../esc", "u3", "c"),
        ("ns", "p", "../../../../esc", "c"),
        ("ns", "p", &abs_s, "c"),
        ("ns", "p", "u4", "../../../esc"),
        ("ns", "p", "u5", ".."),
        ("ns", "p", "u6", &abs_s),
        ("ns", "p", "u7", "a\nb"),
        ("ns", "p", "u8", "a\0b"),
        ("ns", &long, "u9", "c"),
    ];
    let before = tree(&scratch.path);
    let rt = fast_runtime(&logs);
    let mut specs = Vec::new();
    let mut keep = Vec::new();
    for (i, (ns, name, uid, c)) in hostile.iter().enumerate() {
        let cgs = container_cgroups(&unique_name());
        specs.push(pod(
            ns,
            name,
            uid,
            vec![container(c, &marks.path.join(i.to_string()), dirs(&cgs))],
        ));
        keep.push(cgs);
    }
    let keys: Vec<PodKey> = specs.iter().map(|s| s.key.clone()).collect();
    rt.apply(specs, |_| None);
    for key in &keys {
        let s = wait_for_pod(&rt, key, "the hostile container refused", |s| {
            waiting(s, 0).is_some_and(|(r, _)| r == "CreateContainerError")
        })
        .await;
        assert!(
            waiting(&s, 0).unwrap().1.contains("not a plain file name"),
            "{s:#?}"
        );
    }
    rt.stop_all(Duration::from_secs(2)).await;
    assert_eq!(
        tree(&scratch.path),
        before,
        "files appeared in the scratch dir"
    );
    assert!(!abs.exists(), "{} was created", abs.display());
    assert!(
        tree(&marks.path).is_empty(),
        "a refused container ran: {:?}",
        tree(&marks.path)
    );
}

/// A container that keeps failing waits in `CrashLoopBackOff`; the pod's phase stays the
/// kubelet's (`Running` under `Always`) and its reason says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_container_reports_crash_loop_back_off() {
    require_root();
    let logs = TempDir::new();
    let cgs = container_cgroups(&unique_name());
    let mut c = container("crash", Path::new("/dev/null"), dirs(&cgs));
    c.argv = vec!["/bin/sh".into(), "-c".into(), "exit 3".into()];
    let spec = pod("rt", "crash", &unique_name(), vec![c]);
    let key = spec.key.clone();
    let rt = fast_runtime(&logs.path);
    rt.apply(vec![spec], |_| None);
    let s = wait_for_pod(&rt, &key, "crash-loop back-off after a restart", |s| {
        s.containers[0].restart_count >= 1
            && waiting(s, 0).is_some_and(|(r, _)| r == "CrashLoopBackOff")
    })
    .await;
    assert_eq!(s.reason.as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(s.phase, PodPhase::Running);
    assert_eq!(s.containers[0].last_exit().map(|t| t.exit_code), Some(3));
    rt.stop_all(Duration::from_secs(2)).await;
}

/// After `stop_all` nothing the runtime started is alive: not the container's main process, not
/// what it forked into a new session, not a process that ignores SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_the_runtime_started_survives_stop_all() {
    require_root();
    let logs = TempDir::new();
    let cgs = container_cgroups(&unique_name());
    let mut c = container("forker", Path::new("/dev/null"), dirs(&cgs));
    c.argv = vec![
        "/bin/sh".into(),
        "-c".into(),
        "trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep 300' & (sleep 300 &) ; while :; do sleep 0.02; done".into(),
    ];
    let spec = pod("rt", "forker", &unique_name(), vec![c]);
    let key = spec.key.clone();
    let rt = fast_runtime(&logs.path);
    rt.apply(vec![spec], |_| None);
    wait_for_pod(&rt, &key, "the forker running", |s| {
        matches!(s.containers[0].state, ContainerState::Running { .. })
    })
    .await;
    let deadline = Instant::now() + WAIT;
    while cgs[0].pids().len() < 3 {
        assert!(Instant::now() < deadline, "the forks never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pids = cgs[0].pids();
    // Every process it started is in its cgroups, in every hierarchy.
    for pid in &pids {
        // The loop's `sleep 0.02` children come and go: one listed a moment ago may be gone
        // (an error, or an empty file while it is a zombie), and a gone process is in no cgroup.
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cgroup.is_empty() {
            continue;
        }
        for c in &cgs {
            let name = c.path.file_name().unwrap().to_str().unwrap();
            assert!(
                cgroup.contains(name),
                "pid {pid} is outside {}: {cgroup}",
                c.path.display()
            );
        }
    }
    rt.stop_all(Duration::from_millis(500)).await;
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "pid {pid} survived stop_all"
        );
    }
    for c in &cgs {
        assert!(
            c.pids().is_empty(),
            "{} still has processes",
            c.path.display()
        );
    }
}
