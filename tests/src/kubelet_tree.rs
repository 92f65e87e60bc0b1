//! Kubelet-shaped cgroup trees and the pods that match them: what the kubelet and a container
//! runtime (containerd, CRI-O; cgroupfs or systemd driver) would have created for a pod,
//! below a test's node root, and the Pod object the fake API server serves for it. Used by the
//! cluster-mode test and bench.

use std::{fs, path::PathBuf};

use qoslet::cgroup::{Tree, layout::Controller};
use serde_json::{Value, json};

use crate::{NodeRoot, fake_api::FakeApi};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Runtime {
    Containerd,
    CriO,
}

/// A pod as the kubelet and the runtime would have made it.
pub struct KPod {
    pub name: String,
    /// Assigned by the API server when the pod is created.
    pub uid: String,
    pub qos: &'static str,
    pub id: String,
    pub group: Option<&'static str>,
}

impl KPod {
    pub fn new(name: impl Into<String>, uid: &str, qos: &'static str) -> Self {
        let id = format!("{:0>64}", uid.replace('-', ""));
        Self {
            name: name.into(),
            uid: uid.into(),
            qos,
            id,
            group: None,
        }
    }

    /// The container cgroup below the node root, as the kubelet and the runtime name it.
    pub fn container_cgroup(&self, driver: Driver, runtime: Runtime) -> String {
        let tier = match self.qos {
            "Guaranteed" => None,
            "Burstable" => Some("burstable"),
            _ => Some("besteffort"),
        };
        let pod = match driver {
            Driver::Cgroupfs => {
                let mut p = "kubepods".to_owned();
                if let Some(t) = tier {
                    p.push('/');
                    p.push_str(t);
                }
                format!("{p}/pod{}", self.uid)
            }
            Driver::Systemd => {
                let uid = self.uid.replace('-', "_");
                match tier {
                    Some(t) => {
                        format!("kubepods.slice/kubepods-{t}.slice/kubepods-{t}-pod{uid}.slice")
                    }
                    None => format!("kubepods.slice/kubepods-pod{uid}.slice"),
                }
            }
        };
        let ctr = match (driver, runtime) {
            (Driver::Systemd, Runtime::Containerd) => format!("cri-containerd-{}.scope", self.id),
            (Driver::Systemd, Runtime::CriO) => format!("crio-{}.scope", self.id),
            (Driver::Cgroupfs, Runtime::CriO) => format!("crio-{}", self.id),
            (Driver::Cgroupfs, Runtime::Containerd) => self.id.clone(),
        };
        format!("{pod}/{ctr}")
    }

    pub fn object(&self, runtime: Runtime, node: &str) -> Value {
        let scheme = match runtime {
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
        };
        let resources = match self.qos {
            "Burstable" => json!({"requests": {"memory": "16Mi"}}),
            _ => json!({}),
        };
        let mut spec = json!({"nodeName": node, "containers": [{"name": "c", "image": "busybox", "resources": resources}]});
        if let Some(g) = self.group {
            spec["schedulingGroup"] = json!({"podGroupName": g});
        }
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": "ns", "uid": self.uid},
            "spec": spec,
            "status": {"phase": "Running", "qosClass": self.qos, "containerStatuses": [{
                "name": "c", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
                "containerID": format!("{scheme}://{}", self.id),
                "state": {"running": {"startedAt": "2026-11-30T10:00:00Z"}}}]},
        })
    }
}

/// Creates `rel` below the node root in every hierarchy (v1 cpusets get their parent's CPUs;
/// on pure v2 the parents pass memory, cpu and pids down) and returns the directories.
pub fn make_cgroup(root: &NodeRoot, rel: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for tree in root.mounts.trees.keys().copied() {
        let mut path = root.path(tree, "");
        for c in rel.split('/') {
            if tree == Tree::V2 {
                let available = fs::read_to_string(path.join("cgroup.controllers")).unwrap();
                let want: Vec<String> = ["cpu", "memory", "pids"]
                    .iter()
                    .filter(|k| available.split_whitespace().any(|a| a == **k))
                    .map(|k| format!("+{k}"))
                    .collect();
                let _ = fs::write(path.join("cgroup.subtree_control"), want.join(" "));
            }
            path = path.join(c);
            if !path.exists() {
                fs::create_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                if tree == Tree::V1(Controller::Cpuset) {
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        let v = fs::read_to_string(path.parent().unwrap().join(f)).unwrap();
                        fs::write(path.join(f), v.trim()).unwrap();
                    }
                }
            }
        }
        dirs.push(path);
    }
    dirs
}

/// Creates the pod in the fake and takes the UID it was given.
pub fn create(fake: &FakeApi, p: &mut KPod, runtime: Runtime, node: &str) {
    let created = fake
        .create_json(p.object(runtime, node))
        .expect("creating the pod");
    p.uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
}

pub fn join(dirs: &[PathBuf], pid: u32) {
    for d in dirs {
        fs::write(d.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", d.display()));
    }
}
