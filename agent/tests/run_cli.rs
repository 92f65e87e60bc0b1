//! `qoslet run` without privilege says what is missing in one sentence and keeps running on
//! its fallbacks (no backtrace).

use std::{
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

/// `cmd` (qoslet, or a wrapper about to run it) with `extra` options then `run` on the
/// standalone example with `config`, interrupted after two seconds; stderr is a pipe.
fn run_for_two_seconds(
    mut cmd: Command,
    extra: &[&str],
    examples: &Path,
    config: &Path,
) -> std::process::Output {
    let child = cmd
        .args(extra)
        .arg("run")
        .arg("--kubelet-config")
        .arg(examples.join("kubelet-config.yaml"))
        .arg("--config")
        .arg(config)
        .arg("--standalone")
        .arg(examples.join("pods"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting qoslet");
    thread::sleep(Duration::from_secs(2));
    // SAFETY: plain kill(2) of the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait_with_output().expect("qoslet output")
}

#[test]
fn without_bpf_privilege_run_says_so_in_one_sentence() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || Command::new("setpriv").arg("--version").output().is_err()
    {
        eprintln!("skipped: needs root and setpriv(1) to drop to an unprivileged user");
        return;
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let config = std::env::temp_dir().join(format!("qoslet-run-cli-{}.yaml", std::process::id()));
    // Port 0: the test must not collide with an agent running on the default port.
    std::fs::write(
        &config,
        "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: observe\nmetricsAddress: 127.0.0.1:0\n",
    )
    .unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_qoslet"))
        .env("NO_COLOR", "1");
    let out = run_for_two_seconds(cmd, &[], &examples, &config);
    let _ = std::fs::remove_file(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let sentence =
        "qoslet needs root, or the CAP_BPF and CAP_PERFMON capabilities, to load its eBPF programs";
    assert_eq!(stderr.matches(sentence).count(), 1, "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

/// Runs `qoslet run` in observe mode for two seconds with stderr a pipe, as under `kubectl logs`,
/// and returns what it logged.
fn observe_run_log(extra: &[&str]) -> String {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let work = std::env::temp_dir().join(format!(
        "qoslet-run-cli-log-{}-{}",
        std::process::id(),
        extra.len()
    ));
    std::fs::create_dir_all(&work).unwrap();
    let config = work.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nmode: observe\nmetricsAddress: 127.0.0.1:0\nstateDir: {}\n",
            work.join("state").display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qoslet"));
    cmd.env_remove("NO_COLOR").env_remove("QOSLET_LOG_FORMAT");
    let out = run_for_two_seconds(cmd, extra, &examples, &config);
    let _ = std::fs::remove_dir_all(&work);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Logs read by `kubectl logs` or a log pipeline: text without colour codes when stderr is not a
/// terminal, and with `--log-format json` one JSON object per line.
#[test]
fn logs_carry_no_colour_off_a_terminal_and_can_be_json() {
    let text = observe_run_log(&[]);
    assert!(text.contains("INFO"), "{text}");
    assert!(!text.contains('\u{1b}'), "escape codes in: {text}");
    let json = observe_run_log(&["--log-format", "json"]);
    let lines: Vec<&str> = json.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(
            v["level"].is_string() && v["fields"].is_object(),
            "not a log record: {l}"
        );
    }
}
