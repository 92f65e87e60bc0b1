//! The nodes a test runs on: the host node, whose cgroups (v1, the cgroupfs driver) this machine
//! reads directly, and, with `cargo xtask cluster up --vm-node`, the VM node (pure v2, the
//! systemd driver), whose cgroups, kernel counters and pod network only the VM reaches: there a
//! pod of the test's own (busybox, the node's `/sys/fs/cgroup` mounted read-only) reads them,
//! through `kubectl exec`.

use std::{fs, path::PathBuf, process::Command};

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::json;

use super::{Cluster, TestNamespace, create_running, pod};

/// `cluster.json`'s `vm_node` (xtask/src/cluster/vm_node.rs).
#[derive(Clone, Deserialize)]
pub struct VmNodeInfo {
    pub node: String,
    pub kubelet_layout: Vec<String>,
    pub taint: String,
    pub kubectl: PathBuf,
}

/// A node the tests run on.
#[derive(Clone)]
pub struct Target {
    pub node: String,
    /// The kubelet's configuration file; `None` where it has none but the merge of several
    /// (the VM node's): the tests take the kubelet's own merge from its `/configz`.
    pub kubelet_config: Option<PathBuf>,
    /// What qoslet's `/readyz` names as the kubelet's configuration it found, in its order.
    pub kubelet_layout: Vec<String>,
    /// `None`: the host node. `Some`: the VM node.
    vm: Option<VmNodeInfo>,
}

impl Target {
    pub fn is_vm(&self) -> bool {
        self.vm.is_some()
    }

    /// `pod` placed on this node: selected by its hostname label (the scheduler still places it),
    /// tolerating the VM node's taint.
    pub fn place(&self, mut p: Pod) -> Pod {
        let spec = p.spec.as_mut().expect("a pod spec");
        spec.node_selector = Some(
            [("kubernetes.io/hostname".to_owned(), self.node.clone())]
                .into_iter()
                .collect(),
        );
        if let Some(vm) = &self.vm {
            let (key_value, effect) = vm.taint.split_once(':').expect("key=value:effect");
            let (key, value) = key_value.split_once('=').expect("key=value");
            spec.tolerations = Some(vec![
                serde_json::from_value(json!({
                    "key": key, "operator": "Equal", "value": value, "effect": effect,
                }))
                .unwrap(),
            ]);
        }
        p
    }

    /// What the test reads on this node; on the VM node, a reader pod in `ns` first.
    pub async fn files(&self, c: &Cluster, ns: &TestNamespace) -> NodeFiles {
        let Some(vm) = &self.vm else {
            return NodeFiles::Host;
        };
        let mut reader = self.place(pod("reader", "sleep 3600", json!({}), "Always"));
        let spec = reader.spec.as_mut().unwrap();
        spec.containers[0].volume_mounts = Some(vec![
            serde_json::from_value(json!({
                "name": "cgroup", "mountPath": "/sys/fs/cgroup", "readOnly": true,
            }))
            .unwrap(),
        ]);
        spec.volumes = Some(vec![
            serde_json::from_value(json!({
                "name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup", "type": "Directory"},
            }))
            .unwrap(),
        ]);
        create_running(ns, vec![reader]).await;
        NodeFiles::Vm {
            kubectl: vm.kubectl.clone(),
            kubeconfig: c.info.kubeconfig.clone(),
            namespace: ns.name.clone(),
        }
    }
}

impl Cluster {
    /// The host node.
    pub fn host(&self) -> Target {
        Target {
            node: self.info.node.clone(),
            kubelet_config: Some(self.info.kubelet_config.clone()),
            kubelet_layout: self.info.kubelet_layout.clone(),
            vm: None,
        }
    }

    /// Every node: the host's, then the VM's when the cluster has it.
    pub fn targets(&self) -> Vec<Target> {
        let mut out = vec![self.host()];
        if let Some(vm) = &self.info.vm_node {
            out.push(Target {
                node: vm.node.clone(),
                kubelet_config: None,
                kubelet_layout: vm.kubelet_layout.clone(),
                vm: Some(vm.clone()),
            });
        }
        out
    }
}

/// Reads files of a node: this machine's for the host node, through the reader pod on the VM.
pub enum NodeFiles {
    Host,
    Vm {
        kubectl: PathBuf,
        kubeconfig: PathBuf,
        namespace: String,
    },
}

/// Ends each file's text in the reader's output.
const END: &str = "@@qoslet-test-end@@";

impl NodeFiles {
    /// The texts of `paths` (absolute on the node), `None` where a file cannot be read.
    pub fn read_all(&self, paths: &[String]) -> Vec<Option<String>> {
        match self {
            NodeFiles::Host => paths.iter().map(|p| fs::read_to_string(p).ok()).collect(),
            NodeFiles::Vm { .. } => {
                let script = format!(
                    "for f do /bin/busybox cat \"$f\" 2>/dev/null || echo '<unreadable>'; echo {END}; done"
                );
                let mut args = vec!["sh".to_owned(), "-c".to_owned(), script, "sh".to_owned()];
                args.extend(paths.iter().cloned());
                let out = self.exec(&args).expect("the reader pod's cat");
                let texts: Vec<&str> = out.split(&format!("{END}\n")).collect();
                assert_eq!(texts.len(), paths.len() + 1, "{out}");
                texts[..paths.len()]
                    .iter()
                    .map(|t| (*t != "<unreadable>\n").then(|| (*t).to_owned()))
                    .collect()
            }
        }
    }

    pub fn read(&self, path: &str) -> Option<String> {
        self.read_all(&[path.to_owned()]).pop().flatten()
    }

    /// GET `path` from qoslet's metrics port on this node (from the cluster's network
    /// namespace on the host node; from the reader pod on the VM's pod network).
    pub fn qoslet_get(&self, c: &Cluster, q: &Pod, path: &str) -> Option<String> {
        match self {
            NodeFiles::Host => super::qoslet_get(c, q, path),
            NodeFiles::Vm { .. } => {
                let ip = q.status.as_ref()?.pod_ip.as_ref()?;
                let url = format!("http://{ip}:9479{path}");
                // As the tests' reader ([`super::READER`]): the endpoints are guarded.
                self.exec(&[
                    "wget".into(),
                    "-q".into(),
                    "--header".into(),
                    format!("Authorization: Bearer {}", c.reader),
                    "-O".into(),
                    "-".into(),
                    url,
                ])
            }
        }
    }

    /// `args` run by busybox in the reader pod; its stdout if it succeeded.
    fn exec(&self, args: &[String]) -> Option<String> {
        let NodeFiles::Vm {
            kubectl,
            kubeconfig,
            namespace,
        } = self
        else {
            unreachable!("exec is the VM node's")
        };
        let out = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["-n", namespace, "exec", "reader", "--", "/bin/busybox"])
            .args(args)
            .output()
            .expect("kubectl exec");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The node's capacity of pids as the kubelet computes it
    /// (`pkg/kubelet/stats/pidlimit`): the lower of `kernel.pid_max` and `kernel.threads-max`.
    pub fn pid_capacity(&self) -> i64 {
        let v = self.read_all(&[
            "/proc/sys/kernel/pid_max".into(),
            "/proc/sys/kernel/threads-max".into(),
        ]);
        v.iter()
            .map(|t| {
                t.as_deref()
                    .and_then(|t| t.trim().parse::<i64>().ok())
                    .expect("pid_max and threads-max")
            })
            .min()
            .unwrap()
    }

    /// The kernel's OOM kills on the VM node (`oom_kill` of `/proc/vmstat`: the VM is the node).
    pub fn vm_oom_kills(&self) -> u64 {
        let text = self.read("/proc/vmstat").expect("/proc/vmstat");
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .expect("oom_kill in /proc/vmstat")
    }
}
