//! The nodes a test runs on: the host node, whose cgroups (v1, the cgroupfs driver) this machine
//! reads directly, and, with `cargo xtask cluster up --vm-node`, the VM node (pure v2, the
//! systemd driver), whose cgroups, kernel counters and pod network only the VM reaches: there a
//! pod of the test's own (busybox, the node's `/sys/fs/cgroup` mounted read-only) reads them,
//! through `kubectl exec`. For the churn of `evictions_under_real_controllers` the reader also
//! shares the VM's pid namespace: it lists the hogs' processes, and triggers them on the VM's pod
//! network.

use std::{
    collections::BTreeSet,
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::{Value, json};

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
        self.reader(c, ns, false).await
    }

    /// [`Self::files`], and on the VM node a reader that sees the VM's processes too (`hostPID`;
    /// Guaranteed, 200m of cpu, so that its sampling loop neither starves an emulated CPU nor is
    /// evicted before the hogs).
    pub async fn files_and_processes(&self, c: &Cluster, ns: &TestNamespace) -> NodeFiles {
        self.reader(c, ns, true).await
    }

    async fn reader(&self, c: &Cluster, ns: &TestNamespace, processes: bool) -> NodeFiles {
        let Some(vm) = &self.vm else {
            return NodeFiles::Host;
        };
        let resources = if processes {
            let r = json!({"cpu": "200m", "memory": "64Mi"});
            json!({"requests": r, "limits": r})
        } else {
            json!({})
        };
        let mut reader = self.place(pod("reader", "sleep 3600", resources, "Always"));
        let spec = reader.spec.as_mut().unwrap();
        spec.host_pid = processes.then_some(true);
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

    /// A pod template (a workload's `spec.template`) placed on this node, as [`Self::place`].
    pub fn place_template(&self, template: Value) -> Value {
        let p: Pod = serde_json::from_value(template).expect("a pod template");
        let mut placed = serde_json::to_value(self.place(p)).unwrap();
        let m = placed.as_object_mut().unwrap();
        m.remove("apiVersion");
        m.remove("kind");
        placed
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
        let out = self.exec_command(args).output().expect("kubectl exec");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The `kubectl exec` that runs `args` by busybox in the reader pod.
    fn exec_command(&self, args: &[String]) -> Command {
        let NodeFiles::Vm {
            kubectl,
            kubeconfig,
            namespace,
        } = self
        else {
            unreachable!("exec is the VM node's")
        };
        let mut cmd = Command::new(kubectl);
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["-n", namespace, "exec", "reader", "--", "/bin/busybox"])
            .args(args);
        cmd
    }

    /// `script` run by busybox's shell in the reader pod.
    fn sh(&self, script: &str) -> Option<String> {
        self.exec(&["sh".into(), "-c".into(), script.into()])
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

/// The uids of the pods whose hog (`qoslet-test-hog`) has a process on the VM, one sample a line:
/// the sample's number, then the uids (as systemd's slice names spell them, `_` for `-`), from
/// each process's cgroup (`.../kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope`).
/// Shell builtins alone, so that a sample forks nothing on an emulated CPU.
const HOG_PODS: &str = r#"sample() {
  cur=
  for d in /proc/[0-9]*; do
    read -r c 2>/dev/null <"$d/comm" || continue
    [ "$c" = qoslet-test-hog ] || continue
    read -r l 2>/dev/null <"$d/cgroup" || continue
    l=${l##*-pod}
    cur="$cur ${l%%.slice*}"
  done
}
"#;

/// The stop file of [`HogSampler`]'s loop, in the reader's own root.
const SAMPLER_STOP: &str = "/qoslet-sampler-stop";

/// The pod uids of one [`HOG_PODS`] line.
fn hog_pod_uids(line: &str) -> BTreeSet<String> {
    line.split_whitespace()
        .skip(1)
        .map(|u| u.replace('_', "-"))
        .collect()
}

impl NodeFiles {
    /// The VM's memory left before each of qoslet's (and the kubelet's) memory signals, in
    /// bytes, as both read them: the node's (`MemTotal` less its working set, `MemTotal - MemFree
    /// - Inactive(file)` of `/proc/meminfo`: the cgroup v2 root's, the kubelet's capacity
    /// `MemTotal`) and the pods' (`allocatableMemory.available`: kubepods' `memory.max` less its
    /// `memory.current` and `inactive_file`).
    pub fn vm_memory_available(&self) -> (i64, i64) {
        let texts = self.read_all(&[
            "/proc/meminfo".into(),
            "/sys/fs/cgroup/kubepods.slice/memory.max".into(),
            "/sys/fs/cgroup/kubepods.slice/memory.current".into(),
            "/sys/fs/cgroup/kubepods.slice/memory.stat".into(),
        ]);
        let text = |i: usize| texts[i].as_deref().expect("the VM's memory files");
        let kib = |key: &str| -> i64 {
            text(0)
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or_else(|| panic!("{key} in /proc/meminfo"))
        };
        let node = (kib("MemFree") + kib("Inactive(file)")) * 1024;
        let number = |i: usize| -> i64 { text(i).trim().parse().expect("kubepods' memory") };
        let inactive: i64 = text(3)
            .lines()
            .find_map(|l| l.strip_prefix("inactive_file ")?.trim().parse().ok())
            .expect("inactive_file in kubepods' memory.stat");
        let pods = number(1) - (number(2) - inactive);
        (node, pods)
    }

    /// The uids of the pods whose hog has a process on the VM now (the reader's [`HOG_PODS`]).
    pub fn vm_hog_pods(&self) -> BTreeSet<String> {
        let out = self
            .sh(&format!("{HOG_PODS}sample; echo \"0$cur\""))
            .expect("the reader pod's list of hogs");
        hog_pod_uids(&out)
    }

    /// Starts the hog of pod `ip` (listening on `port`, its cap `cap_mib`) from the reader pod, on
    /// the VM's pod network: the connection is its trigger, its line the cap. Ready says the
    /// container started, not that the hog listens yet, so a refused connection is tried again for
    /// 10 s.
    pub fn vm_trigger(&self, ip: &str, port: u16, cap_mib: i64) {
        let t = Instant::now();
        let script = format!("echo {cap_mib} | nc {ip} {port}");
        while self.sh(&script).is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the hog at {ip}:{port} on the VM"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Samples the VM's hog processes from the reader pod (`hostPID`), 50 ms apart, until
    /// [`HogSampler::stop`]: about 3 samples a second on the emulated VM (2026-12-06), where a
    /// sample of the reader's 200m takes about 0.3 s.
    pub fn vm_hog_sampler(&self) -> HogSampler {
        let script = format!(
            "{HOG_PODS}n=0; prev=x
while [ ! -e {SAMPLER_STOP} ]; do
  sample; n=$((n+1))
  [ \"$cur\" = \"$prev\" ] || echo \"$n$cur\"
  prev=$cur
  sleep 0.05
done
echo \"samples $n\""
        );
        let child = self
            .exec_command(&["sh".into(), "-c".into(), script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("kubectl exec of the sampler");
        HogSampler { child }
    }
}

/// The reader pod's loop sampling the VM's hog processes: it prints a sample when the pods with a
/// hog process change (a handful of lines an eviction, which the pipe holds until the end).
pub struct HogSampler {
    child: Child,
}

impl HogSampler {
    /// Ends the loop: the samples taken, and the pods' uids with a hog process in each sample that
    /// differed from the one before.
    pub fn stop(self, files: &NodeFiles) -> (u64, Vec<BTreeSet<String>>) {
        files
            .sh(&format!(": >{SAMPLER_STOP}"))
            .expect("the sampler's stop file");
        let out = self.child.wait_with_output().expect("the sampler's output");
        let text = String::from_utf8_lossy(&out.stdout);
        let samples = text
            .lines()
            .find_map(|l| l.strip_prefix("samples ")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("the sampler ended early: {text}"));
        let changes = text
            .lines()
            .filter(|l| !l.starts_with("samples "))
            .map(hog_pod_uids)
            .collect();
        (samples, changes)
    }
}
