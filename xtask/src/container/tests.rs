use serde_json::json;

use super::*;

fn swaps() -> HostSwaps {
    HostSwaps {
        host_paths: vec![("/var/lib/qoslet".into(), std::env::temp_dir())],
        config_maps: vec![("qoslet-config".into(), PathBuf::from("/tmp/cm"))],
        node_name: "n1".into(),
        drop_caps: vec!["SYS_RESOURCE".into()],
        host_network: false,
        args: None,
    }
}

#[test]
fn the_manifests_daemonset_translates_field_by_field() {
    // The file itself: the kustomization only gathers it (the container test renders it with
    // kustomize), and unit tests build no Go tools.
    let text =
        fs::read_to_string(workspace_root().join("deploy/kubernetes/daemonset.yaml")).unwrap();
    let ds = deploy::documents(&text)
        .unwrap()
        .into_iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    let mut swaps = swaps();
    swaps.drop_caps.clear();
    swaps
        .host_paths
        .push(("/".into(), workspace_root().join("deploy/examples")));
    let spec = podman_run_args(&ds, &swaps).unwrap();
    let a = spec.args.join(" ");
    for want in [
        "--pid host",
        "--cap-drop=ALL",
        "--cap-add=CAP_BPF",
        "--cap-add=CAP_PERFMON",
        "--cap-add=CAP_SYS_RESOURCE",
        "--read-only --read-only-tmpfs=false",
        "--user=0",
        "--env NODE_NAME=n1",
        "--volume /sys/fs/cgroup:/sys/fs/cgroup:rw,rbind",
        "--volume /sys/kernel/btf:/sys/kernel/btf:ro,rbind",
        "--volume /tmp/cm:/etc/qoslet:ro,rbind",
        &format!(
            "--volume {}:/host:ro,rbind",
            workspace_root().join("deploy/examples").display()
        ),
        "localhost/qoslet:latest run --kube --host-root /host --config /etc/qoslet/config.yaml",
    ] {
        assert!(a.contains(want), "{want} in {a}");
    }
    assert!(!a.contains("--privileged"), "{a}");
    assert_eq!(spec.readiness_path, "/readyz");
    assert_eq!(spec.liveness_path, "/healthz");
}

fn minimal(container: serde_json::Value) -> serde_json::Value {
    json!({"spec": {"template": {"spec": {"containers": [container], "volumes": []}}}})
}

#[test]
fn a_capability_this_host_cannot_grant_is_left_out_and_nothing_else() {
    let ds = minimal(json!({
        "name": "c", "image": "i",
        "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["KILL", "SYS_RESOURCE"]}},
        "livenessProbe": {"httpGet": {"path": "/l"}},
        "readinessProbe": {"httpGet": {"path": "/r"}},
    }));
    let a = podman_run_args(&ds, &swaps()).unwrap().args;
    assert_eq!(a, ["--cap-drop=ALL", "--cap-add=CAP_KILL", "i"]);
}

#[test]
fn fields_it_does_not_translate_are_refused() {
    let mut ds = minimal(json!({"name": "c", "image": "i", "workingDir": "/x"}));
    let err = podman_run_args(&ds, &swaps()).err().unwrap();
    assert!(format!("{err}").contains("workingDir"), "{err}");
    ds["spec"]["template"]["spec"]["hostIPC"] = json!(true);
    let err = podman_run_args(&ds, &swaps()).err().unwrap();
    assert!(format!("{err}").contains("hostIPC"), "{err}");
    let ds = minimal(json!({
        "name": "c", "image": "i",
        "securityContext": {"procMount": "Unmasked"},
    }));
    let err = podman_run_args(&ds, &swaps()).err().unwrap();
    assert!(format!("{err}").contains("procMount"), "{err}");
}

#[test]
fn a_recursive_read_only_mount_is_read_only_where_podman_can() {
    let mount = |rro: &str, ro: bool| {
        let mut ds = minimal(json!({
            "name": "c", "image": "i",
            "livenessProbe": {"httpGet": {"path": "/l"}},
            "readinessProbe": {"httpGet": {"path": "/r"}},
            "volumeMounts": [{"name": "h", "mountPath": "/host", "readOnly": ro, "recursiveReadOnly": rro}],
        }));
        ds["spec"]["template"]["spec"]["volumes"] =
            json!([{"name": "h", "hostPath": {"path": "/tmp"}}]);
        podman_run_args(&ds, &swaps())
    };
    let a = mount("IfPossible", true).unwrap().args;
    assert_eq!(a, ["--volume", "/tmp:/host:ro,rbind", "i"]);
    let err = mount("Enabled", true).err().unwrap();
    assert!(format!("{err}").contains("recursiveReadOnly"), "{err}");
    assert!(mount("IfPossible", false).is_err(), "needs readOnly");
}

#[test]
fn quantities_become_podman_units() {
    assert_eq!(podman::podman_bytes("256Mi").unwrap(), 256 << 20);
    assert_eq!(podman::podman_bytes("1G").unwrap(), 1_000_000_000);
}
