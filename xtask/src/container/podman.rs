//! A DaemonSet's container as `podman run` arguments. Every field of the pod and container spec
//! that changes how the container runs is either translated or refused, so a field added to the
//! manifest cannot go untested silently.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use serde_json::{Map, Value};

/// What this host provides in place of a cluster's.
pub struct HostSwaps {
    /// hostPath volumes whose source is a test file or directory instead (`(node path, here)`).
    pub host_paths: Vec<(String, PathBuf)>,
    /// ConfigMap volumes, by ConfigMap name, as a directory holding its keys.
    pub config_maps: Vec<(String, PathBuf)>,
    /// `spec.nodeName`, for fieldRef environment variables.
    pub node_name: String,
    /// Capabilities of the manifest this host cannot grant.
    pub drop_caps: Vec<String>,
    /// The host's network instead of a pod network: the test reaches the agent on loopback
    /// (this machine has no bridge networking to give the container an address of its own).
    pub host_network: bool,
    /// Arguments instead of the container's own.
    pub args: Option<Vec<String>>,
}

/// `podman run` arguments (after `run`, image and command included) and what the test needs
/// from the manifest besides.
pub struct PodmanSpec {
    pub args: Vec<String>,
    pub image: String,
    pub liveness_path: String,
    pub readiness_path: String,
}

const POD_FIELDS: &[&str] = &[
    // Scheduling and API concerns that do not change how the container runs on its node.
    "serviceAccountName",
    "priorityClassName",
    "tolerations",
    "terminationGracePeriodSeconds",
    "containers",
    "volumes",
    "hostPID",
];
const CONTAINER_FIELDS: &[&str] = &[
    "name",
    "image",
    "imagePullPolicy",
    "args",
    "env",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "resources",
    "securityContext",
    "volumeMounts",
];

pub fn podman_run_args(daemonset: &Value, swaps: &HostSwaps) -> Result<PodmanSpec> {
    let pod = &daemonset["spec"]["template"]["spec"];
    let pod_map = pod.as_object().context("DaemonSet without a pod spec")?;
    refuse_unknown("pod spec", pod_map, POD_FIELDS)?;
    let containers = pod["containers"].as_array().context("no containers")?;
    let [c] = containers.as_slice() else {
        bail!("the DaemonSet has {} containers, not one", containers.len());
    };
    let c_map = c.as_object().context("container is not an object")?;
    refuse_unknown("container", c_map, CONTAINER_FIELDS)?;

    let mut args: Vec<String> = Vec::new();
    if pod["hostPID"] == true {
        args.extend(["--pid".into(), "host".into()]);
    }
    if swaps.host_network {
        args.extend(["--network".into(), "host".into()]);
    }
    security_context(&c["securityContext"], swaps, &mut args)?;
    if let Some(mem) = c["resources"]["limits"]["memory"].as_str() {
        args.push(format!("--memory={}", podman_bytes(mem)?));
    }
    if let Some(cpu) = c["resources"]["limits"]["cpu"].as_str() {
        args.push(format!("--cpus={}", cpus(cpu)?));
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().context("env without a name")?;
        let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => v.clone(),
            (_, Value::String(f)) if f == "spec.nodeName" => swaps.node_name.clone(),
            _ => bail!("env {name}: only values and spec.nodeName are translated"),
        };
        args.extend(["--env".into(), format!("{name}={value}")]);
    }
    let volumes = pod["volumes"].as_array().context("no volumes")?;
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().context("volumeMount without a name")?;
        let target = m["mountPath"]
            .as_str()
            .context("volumeMount without mountPath")?;
        refuse_unknown(
            "volumeMount",
            m.as_object().context("volumeMount is not an object")?,
            &["name", "mountPath", "readOnly", "recursiveReadOnly"],
        )?;
        let ro = m["readOnly"] == true;
        match m["recursiveReadOnly"].as_str() {
            None | Some("Disabled") => {}
            // What IfPossible gives on a runtime without recursive read-only mounts: the bind
            // read-only, its submounts as they are (podman's `ro`).
            Some("IfPossible") if ro => {}
            other => bail!("volumeMount {name}: recursiveReadOnly {other:?} is not translated"),
        }
        let v = volumes
            .iter()
            .find(|v| v["name"] == name)
            .with_context(|| format!("volumeMount {name} has no volume"))?;
        let source = if let Some(path) = v["hostPath"]["path"].as_str() {
            let source = match swaps.host_paths.iter().find(|(p, _)| p == path) {
                Some((_, here)) => here.clone(),
                None => PathBuf::from(path),
            };
            match v["hostPath"]["type"].as_str() {
                Some("Directory") if !source.is_dir() => {
                    bail!("hostPath {path}: {} is not a directory", source.display())
                }
                Some("File") if !source.is_file() => {
                    bail!("hostPath {path}: {} is not a file", source.display())
                }
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&source)?,
                _ => {}
            }
            source
        } else if let Some(cm) = v["configMap"]["name"].as_str() {
            swaps
                .config_maps
                .iter()
                .find(|(n, _)| n == cm)
                .map(|(_, d)| d.clone())
                .with_context(|| format!("no directory for ConfigMap {cm}"))?
        } else {
            bail!("volume {name}: only hostPath and configMap volumes are translated");
        };
        // rbind, like the kubelet's bind mounts (the cgroup hierarchies under /sys/fs/cgroup
        // are mounts of their own on a v1 or hybrid host).
        let opts = if ro { "ro,rbind" } else { "rw,rbind" };
        args.extend([
            "--volume".into(),
            format!("{}:{target}:{opts}", source.display()),
        ]);
    }
    let image = c["image"].as_str().context("container without an image")?;
    args.push(image.to_owned());
    let container_args: Vec<String> = match &swaps.args {
        Some(a) => a.clone(),
        None => c["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().map(str::to_owned).context("non-string arg"))
            .collect::<Result<_>>()?,
    };
    args.extend(container_args);
    let probe_path = |probe: &str| {
        c[probe]["httpGet"]["path"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("{probe} is not an httpGet"))
    };
    Ok(PodmanSpec {
        args,
        image: image.to_owned(),
        liveness_path: probe_path("livenessProbe")?,
        readiness_path: probe_path("readinessProbe")?,
    })
}

fn security_context(sc: &Value, swaps: &HostSwaps, args: &mut Vec<String>) -> Result<()> {
    let Some(sc) = sc.as_object() else {
        return Ok(());
    };
    for (k, v) in sc {
        match (k.as_str(), v) {
            ("privileged", Value::Bool(true)) => args.push("--privileged".into()),
            ("privileged", Value::Bool(false)) => {}
            ("runAsUser", Value::Number(n)) => args.push(format!("--user={n}")),
            // Checked by the kubelet against the image's user; uid 0 is set explicitly above.
            ("runAsNonRoot", Value::Bool(false)) => {}
            ("readOnlyRootFilesystem", Value::Bool(true)) => {
                // Kubernetes adds no tmpfs of its own; podman would, on /tmp, /run and others.
                args.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
            }
            ("readOnlyRootFilesystem", Value::Bool(false)) => {}
            ("allowPrivilegeEscalation", Value::Bool(false)) => {
                args.extend(["--security-opt".into(), "no-new-privileges".into()]);
            }
            ("allowPrivilegeEscalation", Value::Bool(true)) => {}
            ("seccompProfile", p) => match p["type"].as_str() {
                // podman's default profile, like the container runtime's on a node.
                Some("RuntimeDefault") => {}
                Some("Unconfined") => {
                    args.extend(["--security-opt".into(), "seccomp=unconfined".into()]);
                }
                other => bail!("seccompProfile {other:?} is not translated"),
            },
            ("capabilities", caps) => {
                for d in caps["drop"].as_array().into_iter().flatten() {
                    let d = d.as_str().context("capability name")?;
                    args.push(format!("--cap-drop={}", cap(d)));
                }
                for a in caps["add"].as_array().into_iter().flatten() {
                    let a = a.as_str().context("capability name")?;
                    if swaps.drop_caps.iter().any(|d| d == a) {
                        continue;
                    }
                    args.push(format!("--cap-add={}", cap(a)));
                }
            }
            _ => bail!("securityContext.{k}: {v} is not translated"),
        }
    }
    Ok(())
}

fn cap(name: &str) -> String {
    if name == "ALL" || name.starts_with("CAP_") {
        name.to_owned()
    } else {
        format!("CAP_{name}")
    }
}

fn refuse_unknown(what: &str, map: &Map<String, Value>, known: &[&str]) -> Result<()> {
    for k in map.keys() {
        if !known.contains(&k.as_str()) {
            bail!("{what}.{k} is not translated to podman (xtask/src/container/podman.rs)");
        }
    }
    Ok(())
}

/// A Kubernetes memory quantity as bytes (binary and decimal suffixes).
pub(super) fn podman_bytes(q: &str) -> Result<u64> {
    const UNITS: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in UNITS {
        if let Some(n) = q.strip_suffix(suffix) {
            return Ok(n.parse::<u64>().with_context(|| format!("quantity {q}"))? * mult);
        }
    }
    q.parse().with_context(|| format!("quantity {q}"))
}

/// A Kubernetes CPU quantity as a decimal number of CPUs.
fn cpus(q: &str) -> Result<String> {
    Ok(match q.strip_suffix('m') {
        Some(m) => format!("{:.3}", m.parse::<u64>()? as f64 / 1000.0),
        None => q.parse::<f64>()?.to_string(),
    })
}
