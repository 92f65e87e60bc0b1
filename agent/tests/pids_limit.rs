//! `podPidsLimit` on the real kernel, as root: `qoslet run` writes it to the pod cgroup's
//! `pids.max`, and a pod that forks past it gets EAGAIN at the limit.

use std::{
    fs,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

const LIMIT: usize = 16;
const FORKS: usize = 40;

mod common;

use common::{Daemon, WorkDir, wait_until};

#[test]
fn a_pod_forking_past_pod_pids_limit_gets_eagain_at_the_limit() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (real cgroups and processes)");
        return;
    }
    // perl-base is essential on Debian; it reports fork(2)'s errno, which sh does not.
    if Command::new("perl").arg("-v").output().is_err() {
        eprintln!("skipped: needs perl to report fork's errno");
        return;
    }
    let work_dir =
        WorkDir(std::env::temp_dir().join(format!("qoslet-pids-{}", std::process::id())));
    let work = work_dir.0.clone();
    let pods = work.join("pods");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&pods).unwrap();
    let script = format!(
        "my ($ok, $err) = (0, ''); for (1..{FORKS}) {{ my $p = fork; if (!defined $p) {{ $err = \"$!\"; next }} if ($p == 0) {{ sleep 300; exit 0 }} $ok++ }} $| = 1; print \"forked $ok, failed \", {FORKS} - $ok, \": $err\\n\"; sleep 300;"
    );
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: forker, namespace: pids}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: forker\n    command: [perl, -e, {}]\n",
        serde_json::to_string(&script).unwrap()
    );
    fs::write(pods.join("forker.yaml"), pod).unwrap();
    let node_root = format!("qoslet-test-{}-pids", std::process::id());
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = work.join("qoslet.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmetricsAddress: 127.0.0.1:{port}\nnodeRootCgroup: /{node_root}\ncapacity:\n  memory: 1Gi\nstateDir: {}\n",
            work.join("state").display()
        ),
    )
    .unwrap();
    let kubelet = work.join("kubelet.yaml");
    fs::write(
        &kubelet,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\npodPidsLimit: {LIMIT}\n"
        ),
    )
    .unwrap();
    let logs = work.join("logs");
    let child = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .args(["run", "--kubelet-config"])
        .arg(&kubelet)
        .arg("--config")
        .arg(&config)
        .arg("--standalone")
        .arg(&pods)
        .arg("--log-dir")
        .arg(&logs)
        .args(["--shutdown-grace-seconds", "2"])
        .stdout(Stdio::null())
        .stderr(fs::File::create(work.join("qoslet.log")).unwrap())
        .spawn()
        .expect("starting qoslet");
    let _daemon = Daemon { child };

    // The pod's cgroup, as the plan names it (BestEffort, cgroupfs).
    let plan = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .args(["plan", "--kubelet-config"])
        .arg(&kubelet)
        .args(["--capacity", "cpu=1,memory=1Gi", "--output", "json"])
        .arg(&pods)
        .output()
        .unwrap();
    assert!(
        plan.status.success(),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(plan["pods"][0]["pids_max"], LIMIT);
    let cgroup = plan["pods"][0]["cgroup"]
        .as_str()
        .unwrap()
        .trim_start_matches('/')
        .to_owned();
    let pure_v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let pids_dir = if pure_v2 {
        PathBuf::from(format!("/sys/fs/cgroup/{node_root}/{cgroup}"))
    } else {
        PathBuf::from(format!("/sys/fs/cgroup/pids/{node_root}/{cgroup}"))
    };

    // The container's log says how many forks failed and why.
    let log_line = wait_until("the forker's report", Duration::from_secs(60), || {
        let dir = fs::read_dir(&logs).ok()?.flatten().next()?.path();
        let text = fs::read_to_string(dir.join("forker/0.log")).ok()?;
        text.lines()
            .find(|l| l.contains("forked"))
            .map(str::to_owned)
    });
    let max = fs::read_to_string(pids_dir.join("pids.max")).unwrap();
    assert_eq!(
        max.trim(),
        LIMIT.to_string(),
        "pids.max of {}",
        pids_dir.display()
    );
    let current: usize = fs::read_to_string(pids_dir.join("pids.current"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        current, LIMIT,
        "the pod holds exactly the limit: {log_line}"
    );
    // perl and LIMIT - 1 children; every later fork failed with EAGAIN.
    assert!(
        log_line.contains(&format!(
            "forked {}, failed {}: Resource temporarily unavailable",
            LIMIT - 1,
            FORKS - (LIMIT - 1)
        )),
        "{log_line}"
    );
}
