//! `qoslet plan` end to end on deploy/examples: table, JSON and bad input.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples")
}

fn plan(args: &[&str]) -> Output {
    let kubelet = examples().join("kubelet-config.yaml");
    Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .arg("plan")
        .arg("--kubelet-config")
        .arg(kubelet)
        .args(args)
        .output()
        .expect("qoslet runs")
}

fn pods_dir() -> String {
    examples().join("pods").display().to_string()
}

const CAPACITY: &str = "cpu=4,memory=32Gi,pids=4194304";

#[test]
fn table_shows_the_node_and_every_pod() {
    let out = plan(&["--capacity", CAPACITY, &pods_dir()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("31033655296"), "{stdout}");
    assert!(stdout.contains("31138512896"), "{stdout}");
    for pod in ["shop/db", "shop/web", "default/batch", "default/shared"] {
        assert!(
            stdout.contains(&format!("POD {pod} ")),
            "{pod} missing:\n{stdout}"
        );
    }
}

#[test]
fn json_is_the_stable_schema() {
    let out = plan(&["--capacity", CAPACITY, "--output", "json", &pods_dir()]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let node = &v["node"];
    assert_eq!(node["capacity"]["memory_bytes"], 34_359_738_368i64);
    assert_eq!(node["allocatable"]["memory_bytes"], 31_033_655_296i64);
    assert_eq!(node["allocatable"]["cpu_millis"], 3500);
    assert_eq!(node["kubepods"]["memory_limit_bytes"], 31_138_512_896i64);
    assert_eq!(node["kubepods"]["cgroup"], "/kubepods.slice");
    assert_eq!(node["besteffort"]["cpu_shares"], 2);
    assert!(node["system_reserved"]["cgroup"].is_null());
    assert!(node["warnings"].is_array());
    let pods = v["pods"].as_array().expect("pods");
    let find = |name: &str| {
        pods.iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let web = find("web");
    assert_eq!(web["qos_class"], "Burstable");
    assert!(web["memory_limit_bytes"].is_null());
    assert!(web["cpu_quota_us"].is_null()); // the init container has no cpu limit
    let containers = web["containers"].as_array().unwrap();
    let kinds: Vec<&str> = containers
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["init", "sidecar", "app"]);
    // 16Gi of 32Gi -> 500; the sidecar is capped at its app's score.
    assert_eq!(containers[2]["oom_score_adj"], 500);
    assert_eq!(containers[1]["oom_score_adj"], 500);
    assert_eq!(containers[0]["oom_score_adj"], 999);
    let db = find("db");
    assert_eq!(db["qos_class"], "Guaranteed");
    assert_eq!(db["uid"], "6f1e3c1a-0b7a-4c1e-9a51-2f8d3c4b5a60");
    assert_eq!(db["cpu_quota_us"], 200_000);
    assert_eq!(db["containers"][0]["oom_score_adj"], -997);
    assert_eq!(find("batch")["qos_class"], "BestEffort");
    assert_eq!(find("shared")["qos_class"], "Guaranteed");
}

#[test]
fn broken_manifest_exits_1_naming_file_object_and_field() {
    let dir = std::env::temp_dir().join(format!("qoslet-plan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broken.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad, namespace: ns}\nspec:\n  containers:\n  - name: c\n    resources: {limits: {memory: 1Gb}}\n",
    )
    .unwrap();
    let typed = dir.join("typed.yaml");
    std::fs::write(
        &typed,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: t, namespace: ns}\nspec:\n  containers:\n  - name: c\n    resources: {limits: [1]}\n",
    )
    .unwrap();
    let out = plan(&[
        "--capacity",
        CAPACITY,
        file.to_str().unwrap(),
        typed.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    std::fs::remove_dir_all(&dir).ok();
    let typed_line = format!(
        "{}:7: Pod/ns/t: spec.containers[0].resources.limits: invalid type: sequence, expected a map",
        typed.display()
    );
    assert!(stderr.contains(&typed_line), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = format!(
        "{}:7: Pod/ns/bad: spec.containers[0].resources.limits.memory: quantity \"1Gb\"",
        file.display()
    );
    assert!(stderr.contains(&line), "{stderr}");
}

#[test]
fn reservation_above_capacity_exits_1_and_unreadable_exits_2() {
    let out = plan(&["--capacity", "cpu=4,memory=2Gi", &pods_dir()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Resource \"memory\" has a reservation of 3172Mi but capacity of 2Gi."),
        "{stderr}"
    );
    let out = plan(&["--capacity", CAPACITY, "/nonexistent/qoslet-pods"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn plan_says_which_kubernetes_version_it_follows() {
    let out = plan(&["--capacity", CAPACITY, &pods_dir()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("Following the kubelet of Kubernetes 1.37.\n"),
        "{stdout}"
    );
    let out = plan(&["--capacity", CAPACITY, "--output", "json", &pods_dir()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node"]["kubernetes_version"], "1.37");
    assert_eq!(v["eviction_order"], serde_json::json!([]));
    let help = Command::new(env!("CARGO_BIN_EXE_qoslet"))
        .args(["plan", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("1.34") && help.contains("1.37"), "{help}");
}

/// Serves one `/stats/summary` answer on a loopback port, as a running agent would.
fn serve_once(body: String) -> (u16, std::thread::JoinHandle<()>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        // Read the whole request before answering.
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => req.extend_from_slice(&buf[..n]),
            }
        }
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    });
    (port, handle)
}

#[test]
fn usage_from_a_running_agent_ranks_the_pods_for_eviction() {
    let out = plan(&["--capacity", CAPACITY, "--output", "json", &pods_dir()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let uid = |name: &str| {
        v["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["uid"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    const GI: u64 = 1 << 30;
    // batch (BestEffort, no request) uses 1Gi; web (16Gi requested) 2Gi; db (4Gi) 4Gi; shared
    // has no stats.
    let pod = |name: &str, ws: u64| {
        serde_json::json!({"podRef": {"name": name, "namespace": "x", "uid": uid(name)},
            "startTime": "t", "memory": {"time": "t", "workingSetBytes": ws}})
    };
    let summary = serde_json::json!({
        "node": {"nodeName": "n", "startTime": "t"},
        "pods": [pod("batch", GI), pod("web", 2 * GI), pod("db", 4 * GI)]
    });
    let (port, server) = serve_once(summary.to_string());
    let url = format!("http://127.0.0.1:{port}");
    let out = plan(&["--capacity", CAPACITY, "--usage-from", &url, &pods_dir()]);
    server.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let order = stdout
        .split_once("EVICTION ORDER (memory pressure)\n")
        .unwrap_or_else(|| panic!("{stdout}"))
        .1;
    let lines: Vec<&str> = order.lines().collect();
    assert!(
        lines[0].starts_with("     1  default/shared  no stats"),
        "{order}"
    );
    assert!(
        lines[1].starts_with("     2  default/batch  usage 1024.0Mi exceeds request 0.0Mi"),
        "{order}"
    );
    assert!(
        lines[2].starts_with("     3  shop/db  usage 4096.0Mi within request"),
        "{order}"
    );
    assert!(
        lines[3].starts_with("     4  shop/web  usage 2048.0Mi within request"),
        "{order}"
    );
}
