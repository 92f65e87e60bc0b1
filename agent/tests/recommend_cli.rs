//! `qoslet recommend-reserved` on recorded Summary samples (`--samples FILE`): the statistics,
//! the OpenShift sizing beside them, the KubeletConfiguration fragment, JSON and bad input.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Output},
};

use serde_json::{Value, json};

const MI: u64 = 1 << 20;
const MILLI: u64 = 1_000_000;

fn container(name: &str, mem: u64, cpu: u64) -> Value {
    json!({
        "name": name,
        "startTime": "2026-11-30T10:00:00Z",
        "cpu": {"time": "2026-11-30T10:00:00Z", "usageNanoCores": cpu},
        "memory": {"time": "2026-11-30T10:00:00Z", "workingSetBytes": mem}
    })
}

/// Ten summaries as an agent serves them: misc grows 100..190Mi and 10..100m, the kubelet
/// stays at 50Mi / 5m, the runtime grows 20..29Mi at 3m.
fn samples_file(name: &str) -> PathBuf {
    let mut lines = String::new();
    for i in 0..10 {
        let s = json!({
            "node": {
                "nodeName": "n",
                "startTime": "2026-11-30T10:00:00Z",
                "systemContainers": [
                    container("pods", 400 * MI, 200 * MILLI),
                    container("kubelet", 50 * MI, 5 * MILLI),
                    container("runtime", (20 + i) * MI, 3 * MILLI),
                    container("misc", (100 + 10 * i) * MI, (10 + 10 * i) * MILLI),
                ],
                "memory": {"time": "2026-11-30T10:00:00Z", "workingSetBytes": 900 * MI}
            },
            "pods": []
        });
        lines.push_str(&s.to_string());
        lines.push('\n');
    }
    let path = std::env::temp_dir().join(format!("qoslet-{name}-{}.jsonl", std::process::id()));
    fs::write(&path, lines).unwrap();
    path
}

fn recommend(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .arg("recommend-reserved")
        .args(args)
        .output()
        .expect("qoslet runs")
}

#[test]
fn recorded_samples_give_p99_plus_headroom_and_the_fragment() {
    let file = samples_file("table");
    let out = recommend(&[
        "--samples",
        file.to_str().unwrap(),
        "--capacity",
        "cpu=4,memory=16Gi",
    ]);
    let _ = fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("10 samples from "), "{stdout}");
    // misc p99 = 190Mi -> 209Mi; 100m -> 110m. kubelet + runtime p99 = 79Mi -> 87Mi (86.9
    // rounded up); 8m -> 9m (8.8 up).
    assert!(
        stdout.ends_with(
            "KubeletConfiguration:\nsystemReserved:\n  cpu: 110m\n  memory: 209Mi\nkubeReserved:\n  cpu: 9m\n  memory: 87Mi\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("  memory       140Mi     190Mi     190Mi         209Mi"),
        "{stdout}"
    );
    // OpenShift on 4 CPUs and 16 GiB: 0.08 CPU, 2.6Gi.
    assert!(
        stdout.contains(
            "for 4 CPUs and 16 GiB (one systemReserved for all):\n  cpu 0.08 (80m), memory 2.6Gi"
        ),
        "{stdout}"
    );
}

#[test]
fn json_output_states_the_samples_and_both_sizings() {
    let file = samples_file("json");
    let out = recommend(&[
        "--samples",
        file.to_str().unwrap(),
        "--capacity",
        "cpu=8,memory=32Gi",
        "--headroom-percent",
        "50",
        "--output",
        "json",
    ]);
    let _ = fs::remove_file(&file);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["samples"], 10);
    assert_eq!(v["window_secs"], Value::Null);
    assert_eq!(v["system_derived"], false);
    let mem = &v["system_reserved"]["memory_bytes"];
    assert_eq!(mem["p99"], 190 * MI);
    assert_eq!(mem["recommended"], 285 * MI);
    assert_eq!(
        v["kube_reserved"]["cpu_nano_cores"]["recommended"],
        12 * MILLI
    );
    assert_eq!(v["openshift_auto_sizing"]["cpu"], "0.09");
    assert_eq!(v["openshift_auto_sizing"]["memory"], "3.56Gi");
}

#[test]
fn a_line_that_is_not_a_summary_names_the_file_and_line() {
    let path = std::env::temp_dir().join(format!("qoslet-bad-{}.jsonl", std::process::id()));
    fs::write(
        &path,
        "{\"node\": {\"nodeName\": \"n\", \"startTime\": \"t\"}, \"pods\": []}\n[1]\n",
    )
    .unwrap();
    let out = recommend(&[
        "--samples",
        path.to_str().unwrap(),
        "--capacity",
        "cpu=1,memory=1Gi",
    ]);
    let _ = fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:2: not a Summary", path.display())),
        "{stderr}"
    );
}
