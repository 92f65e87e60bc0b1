//! `cargo xtask cluster up --vm-node`: a second node that is a VM, as a systemd machine is one: a
//! Debian bookworm root filesystem (mmdebstrap) with systemd as PID 1 on pure cgroup v2,
//! Debian's 6.12 cloud kernel, containerd with `SystemdCgroup = true` and a kubelet with
//! `cgroupDriver: systemd`, joined to the host's API server.
//!
//! The root filesystem (the same containerd, kubelet and CNI plugins as the host node's, Debian's
//! runc, the systemd units of `vm_node/`) is built once per key into
//! `~/.cache/qoslet/vm-node/<key>/` and never written: each cluster boots a qcow2 overlay of it.
//! What is the cluster's (certificates, kubeconfig, kubelet configuration, CNI subnet, the pause
//! and test images, containerd's `hosts.toml` for the cluster's registry) is a second, read-only
//! disk made per `up`, mounted at `/mnt/cluster` in the VM.
//!
//! QEMU (TCG, user networking) runs in the cluster's network namespace, so the guest reaches the
//! namespace's loopback, where the API server listens, at 10.0.2.2. The guest sends the
//! `kubernetes` Service's ClusterIP there (iptables DNAT, as kube-proxy would), so its pods reach
//! the API server as the host node's do. The API server reaches the kubelet (logs, exec) at the
//! VM's node IP, an address of the namespace's loopback that QEMU forwards to the guest. The
//! guest pulls qoslet's image from the registry on the host node's IP as any outside address:
//! QEMU connects to it from the namespace.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{API_IP, CA_FILE, Cluster, parts, pki, wait};
use crate::{apt, toolchain};

/// The VM node's name and IP (an address of the VM's loopback and, forwarded by QEMU to the VM's
/// kubelet port, of the cluster namespace's).
pub const NODE: &str = "qoslet-vm-node";
const NODE_IP: &str = "192.0.2.2";
/// The VM's pods: another documentation range than the host node's.
const POD_SUBNET: &str = "198.18.0.0/24";
/// The taint that keeps the tests' pods (written for the host node) off the VM; qoslet's
/// DaemonSet tolerates every taint.
const TAINT: &str = "qoslet.dev/vm-node=true:NoSchedule";
/// QEMU's user network: the host (here, the cluster namespace's loopback) as the guest sees it.
const SLIRP_HOST: &str = "10.0.2.2";
/// The VM's size: at most the 2 GiB and 2 vCPUs a shared machine's VM may have.
const MEMORY_MIB: u32 = 2048;
const CPUS: u32 = 2;
/// Room in the root filesystem for the images containerd unpacks and the kubelet's files.
const ROOTFS_SIZE: &str = "4G";

/// Debian's packages in the root filesystem: systemd as init (with udev for the disks' device
/// units, dbus for runc's and the kubelet's systemd cgroup driver), what the kubelet and
/// containerd run (mount and util-linux are essential), the 6.12 cloud kernel with its modules
/// (bridge, veth, overlay, netfilter) and an initramfs (virtio_blk is a module).
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "iproute2",
    "iptables",
    "conntrack",
    "ethtool",
    "ca-certificates",
    "procps",
    "runc",
    "initramfs-tools",
    KERNEL,
];
/// Debian's metapackage of the newest 6.12 cloud kernel (bookworm-security).
const KERNEL: &str = "linux-image-6.12-cloud-amd64";
const SUITE: &str = "bookworm";
/// The host's own sources (deb.debian.org).
const MIRRORS: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];
/// What the host needs to build and boot it.
const HOST_PACKAGES: &[&str] = &["mmdebstrap", "qemu-system-x86", "qemu-utils", "e2fsprogs"];

/// Files of the root filesystem: (path, contents).
const FILES: &[(&str, &str)] = &[
    ("etc/hostname", "qoslet-vm-node\n"),
    (
        "etc/hosts",
        "127.0.0.1 localhost\n127.0.1.1 qoslet-vm-node\n",
    ),
    ("etc/resolv.conf", "nameserver 10.0.2.3\n"),
    (
        "etc/fstab",
        "/dev/vda / ext4 rw,noatime 0 0\n/dev/vdb /mnt/cluster ext4 ro,noatime 0 0\n",
    ),
    (
        "etc/modules-load.d/qoslet-node.conf",
        "overlay\nbridge\nveth\n",
    ),
    (
        "etc/sysctl.d/90-qoslet-node.conf",
        "net.ipv4.ip_forward = 1\n",
    ),
    (
        "etc/systemd/network/10-slirp.network",
        include_str!("vm_node/slirp.network"),
    ),
    (
        "etc/containerd/config.toml",
        include_str!("vm_node/containerd.toml"),
    ),
    (
        "etc/systemd/system/containerd.service",
        include_str!("vm_node/containerd.service"),
    ),
    (
        "etc/systemd/system/qoslet-images.service",
        include_str!("vm_node/qoslet-images.service"),
    ),
    (
        "etc/systemd/system/qoslet-node-net.service",
        include_str!("vm_node/qoslet-node-net.service"),
    ),
    (
        "etc/systemd/system/kubelet.service",
        include_str!("vm_node/kubelet.service"),
    ),
];
/// Units started at boot: (unit, where its file is in the root filesystem).
const ENABLED: &[(&str, &str)] = &[
    (
        "systemd-networkd.service",
        "/lib/systemd/system/systemd-networkd.service",
    ),
    (
        "containerd.service",
        "/etc/systemd/system/containerd.service",
    ),
    (
        "qoslet-images.service",
        "/etc/systemd/system/qoslet-images.service",
    ),
    (
        "qoslet-node-net.service",
        "/etc/systemd/system/qoslet-node-net.service",
    ),
    ("kubelet.service", "/etc/systemd/system/kubelet.service"),
];
/// The host node's programs copied in: (where the parts are, where in the VM).
fn programs(bins: &parts::Bins) -> Vec<(PathBuf, String)> {
    let mut out = vec![(bins.kube("kubelet"), "usr/local/bin/kubelet".to_owned())];
    for p in ["containerd", "containerd-shim-runc-v2", "ctr"] {
        out.push((bins.containerd.join(p), format!("usr/local/bin/{p}")));
    }
    for p in ["bridge", "host-local", "loopback", "portmap"] {
        out.push((bins.cni.join(p), format!("opt/cni/bin/{p}")));
    }
    out
}

/// What the tests read of the VM node (`cluster.json`'s `vm_node`).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Info {
    pub node: String,
    /// What qoslet's `/readyz` must name as the kubelet's configuration it read, as it words
    /// it: the base file, the drop-in directory with its count of `*.conf` files, the flags of
    /// the fields qoslet reads.
    /// There is no one file of it: the tests take the kubelet's own merge from its `/configz`.
    pub kubelet_layout: Vec<String>,
    /// The taint that keeps other pods off the node: the tests' pods for it tolerate it.
    pub taint: String,
    /// kubectl, for `exec` in a pod of the test's on the node: its cgroups and qoslet's pod IP
    /// are reachable from the VM only.
    pub kubectl: PathBuf,
}

pub fn info(c: &Cluster) -> Info {
    let dropins = DROPINS.iter().filter(|(n, _)| n.ends_with(".conf")).count();
    Info {
        node: NODE.into(),
        kubelet_layout: vec![
            KUBELET_CONFIG.into(),
            format!("{KUBELET_CONFIG_DIR}/ ({dropins} drop-ins)"),
            // qoslet names the flags it read in name order.
            "flags --eviction-hard --system-reserved".into(),
        ],
        taint: TAINT.into(),
        kubectl: c.bins.kubectl(),
    }
}

/// A built root filesystem: its ext4 image and the kernel and initramfs to boot it with.
pub struct RootFs {
    pub image: PathBuf,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
}

/// The key of a root filesystem: everything that goes into it. The parts' stamps change when a
/// pinned version or build setting does; the kernel is the metapackage's candidate version.
fn key_text(bins: &parts::Bins) -> Result<String> {
    let mut text = format!("suite {SUITE}\nmirrors {MIRRORS:?}\npackages {PACKAGES:?}\n");
    text.push_str(&format!("kernel {}\n", candidate(KERNEL)?));
    for dir in [&bins.kubernetes, &bins.containerd, &bins.cni] {
        let stamp = dir.parent().unwrap_or(dir).join("stamp");
        text.push_str(&fs::read_to_string(&stamp).unwrap_or_default());
    }
    for (path, contents) in FILES {
        text.push_str(&format!("file {path}\n{contents}"));
    }
    text.push_str(&format!("enabled {ENABLED:?}\nsize {ROOTFS_SIZE}\n"));
    Ok(text)
}

/// apt's candidate version of `package` on the host's sources.
fn candidate(package: &str) -> Result<String> {
    let out = Command::new("apt-cache")
        .args(["policy", package])
        .output()
        .context("apt-cache policy")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(|v| v.trim().to_owned())
        .filter(|v| v != "(none)")
        .with_context(|| format!("apt knows no candidate of {package}"))
}

fn sha256(text: &str) -> Result<String> {
    let dir = std::env::temp_dir().join(format!("qoslet-vm-node-key-{}", std::process::id()));
    fs::write(&dir, text)?;
    let out = Command::new("sha256sum").arg(&dir).output()?;
    let _ = fs::remove_file(&dir);
    let hex = String::from_utf8(out.stdout)?;
    Ok(hex
        .get(..16)
        .context("sha256sum printed no hash")?
        .to_owned())
}

/// The root filesystem of `bins`, built unless the cache has it.
pub fn rootfs(bins: &parts::Bins) -> Result<RootFs> {
    apt::ensure("cluster vm-node", HOST_PACKAGES)?;
    let key_text = key_text(bins)?;
    let dir = toolchain::cache_dir()?
        .join("vm-node")
        .join(sha256(&key_text)?);
    let built = RootFs {
        image: dir.join("rootfs.ext4"),
        vmlinuz: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
    };
    // Written last: its presence marks a complete build.
    let done = dir.join("key");
    if done.is_file() {
        println!(
            "cluster: vm-node root filesystem cached in {}",
            dir.display()
        );
        return Ok(built);
    }
    let t = Instant::now();
    let work = dir.with_extension("building");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let root = work.join("root");
    println!("cluster: building the vm-node root filesystem (mmdebstrap {SUITE})");
    apt::run(
        Command::new("mmdebstrap")
            .args(["--variant=minbase", "--quiet"])
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(SUITE)
            .arg(&root)
            .args(MIRRORS),
    )?;
    println!("cluster: mmdebstrap done in {:.0?}", t.elapsed());
    for (path, contents) in FILES {
        let file = root.join(path);
        fs::create_dir_all(file.parent().context("a file at the root")?)?;
        // resolv.conf may be a dangling symlink mmdebstrap left.
        let _ = fs::remove_file(&file);
        fs::write(&file, contents)?;
    }
    let wants = root.join("etc/systemd/system/multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    for (unit, target) in ENABLED {
        let link = wants.join(unit);
        let _ = fs::remove_file(&link);
        symlink(target, &link)?;
    }
    fs::create_dir_all(root.join("mnt/cluster"))?;
    for (from, to) in programs(bins) {
        let dest = root.join(to);
        fs::create_dir_all(dest.parent().context("a program at the root")?)?;
        fs::copy(&from, &dest).with_context(|| format!("copying {}", from.display()))?;
    }
    let boot = |prefix: &str| -> Result<PathBuf> {
        fs::read_dir(root.join("boot"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .with_context(|| format!("no /boot/{prefix}* in the root filesystem"))
    };
    fs::copy(boot("vmlinuz-")?, work.join("vmlinuz"))?;
    fs::copy(boot("initrd.img-")?, work.join("initrd.img"))?;
    let image = work.join("rootfs.ext4");
    apt::run(
        Command::new("mke2fs")
            .args(["-q", "-t", "ext4", "-L", "qoslet-root", "-d"])
            .arg(&root)
            .arg(&image)
            .arg(ROOTFS_SIZE),
    )?;
    fs::remove_dir_all(&root)?;
    fs::write(work.join("key"), &key_text)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&work, &dir)?;
    println!(
        "cluster: vm-node root filesystem built in {:.0?} ({})",
        t.elapsed(),
        dir.display()
    );
    Ok(built)
}

/// The VM node being started: when QEMU was.
pub struct Started {
    at: Instant,
}

/// Builds (or finds) the root filesystem and the cluster's disk, and starts the VM in the
/// cluster's namespaces; the kubelet joins on its own.
pub fn start(c: &Cluster, archives: &[PathBuf]) -> Result<Started> {
    let t = Instant::now();
    let rootfs = rootfs(&c.bins)?;
    let vm = c.path("vm-node");
    let disk = vm.join("cluster");
    fs::create_dir_all(disk.join("images"))?;
    fs::create_dir_all(disk.join("cni"))?;
    let pki_dir = c.path("pki");
    pki::leaf(
        &pki_dir,
        &pki::Identity {
            file: "vm-kubelet",
            user: &format!("system:node:{NODE}"),
            group: Some("system:nodes"),
        },
        &[],
    )?;
    fs::copy(c.path(CA_FILE), disk.join("ca.crt"))?;
    fs::copy(pki_dir.join("vm-kubelet.crt"), disk.join("kubelet.crt"))?;
    fs::copy(pki_dir.join("vm-kubelet.key"), disk.join("kubelet.key"))?;
    for a in archives {
        let name = a.file_name().context("an archive without a name")?;
        fs::copy(a, disk.join("images").join(name))?;
    }
    let hosts = disk.join(format!("certs.d/{}", super::REGISTRY));
    fs::create_dir_all(&hosts)?;
    fs::write(hosts.join("hosts.toml"), super::registry_hosts_toml())?;
    fs::write(disk.join("kubelet.kubeconfig"), kubeconfig())?;
    write_kubelet_layout(&disk.join("kubelet"))?;
    fs::write(disk.join("node-net.sh"), node_net_script())?;
    fs::write(
        disk.join("cni/10-qoslet.conflist"),
        serde_json::to_string_pretty(&serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "qoslet-vm-node",
            "plugins": [{
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }],
        }))?,
    )?;
    let mut bytes = 0;
    for e in walk(&disk)? {
        bytes += fs::metadata(e)?.len();
    }
    // ext4's own metadata on top of the files.
    let mib = (bytes >> 20) + 64;
    let disk_image = vm.join("cluster.ext4");
    apt::run(
        Command::new("mke2fs")
            .args(["-q", "-t", "ext4", "-L", "qoslet-cluster", "-d"])
            .arg(&disk)
            .arg(&disk_image)
            .arg(format!("{mib}M")),
    )?;
    let overlay = vm.join("root.qcow2");
    apt::run(
        Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&rootfs.image)
            .arg(&overlay),
    )?;
    // QEMU listens for the kubelet's port on the node IP in the namespace.
    super::ip(&[
        "-n",
        &c.netns(),
        "addr",
        "add",
        &format!("{NODE_IP}/32"),
        "dev",
        "lo",
    ])?;
    // Connections to a local address come from that address, and QEMU hands a connection's
    // source on to the guest unless it is loopback (then 10.0.2.2): the guest would drop a SYN
    // from its own node IP as martian. From 127.0.0.1, the guest sees the host at 10.0.2.2.
    super::ip(&[
        "-n",
        &c.netns(),
        "route",
        "replace",
        "table",
        "local",
        "local",
        NODE_IP,
        "dev",
        "lo",
        "proto",
        "kernel",
        "scope",
        "host",
        "src",
        "127.0.0.1",
    ])?;
    let args: Vec<String> = [
        "-machine",
        "q35",
        "-cpu",
        "max",
        "-smp",
        &CPUS.to_string(),
        "-m",
        &MEMORY_MIB.to_string(),
        // As the kernel matrix's VMs (xtask/src/vm/qemu.rs): single-threaded TCG on this loaded
        // 2-core host.
        "-accel",
        "tcg,thread=single",
        "-nographic",
        "-nodefaults",
        "-no-reboot",
        "-serial",
        "stdio",
        "-kernel",
        &rootfs.vmlinuz.display().to_string(),
        "-initrd",
        &rootfs.initrd.display().to_string(),
        "-append",
        "root=/dev/vda rw console=ttyS0 panic=-1 net.ifnames=0 mitigations=off systemd.unified_cgroup_hierarchy=1 systemd.show_status=1",
        "-drive",
        &format!("file={},if=virtio,format=qcow2", overlay.display()),
        "-drive",
        &format!(
            "file={},if=virtio,format=raw,readonly=on",
            disk_image.display()
        ),
        "-netdev",
        &format!("user,id=net0,hostfwd=tcp:{NODE_IP}:10250-:10250"),
        "-device",
        "virtio-net-pci,netdev=net0",
        "-device",
        "virtio-rng-pci",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    println!("cluster: vm-node disks ready in {:.1?}", t.elapsed());
    let at = Instant::now();
    c.start("vm-node", Path::new("/usr/bin/qemu-system-x86_64"), &args)?;
    println!(
        "cluster: vm-node booting (console: {})",
        c.path("logs/vm-node.log").display()
    );
    Ok(Started { at })
}

/// Waits for the VM's Node to be Ready and qoslet's DaemonSet pod on it to be Ready.
pub fn wait_ready(c: &Cluster, started: &Started) -> Result<()> {
    let tail = || c.log_tail("vm-node");
    wait("the VM node to be Ready", Duration::from_secs(900), || {
        c.node_ready(NODE)
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", tail()))?;
    println!(
        "cluster: node {NODE} Ready {:.0?} after QEMU started",
        started.at.elapsed()
    );
    wait(
        "qoslet's pod on the VM node to be Ready",
        Duration::from_secs(600),
        || {
            c.kubectl()
                .args([
                    "-n",
                    "qoslet-system",
                    "get",
                    "pods",
                    "--field-selector",
                    &format!("spec.nodeName={NODE}"),
                    "-o",
                    "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
                ])
                .output()
                .is_ok_and(|o| o.stdout == b"True")
        },
    )
    .map_err(|e| anyhow::anyhow!("{e}\n{}", tail()))?;
    println!(
        "cluster: qoslet's pod on {NODE} Ready {:.0?} after QEMU started",
        started.at.elapsed()
    );
    Ok(())
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(walk(&p)?);
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

/// The kubelet's kubeconfig: the API server at the namespace's loopback, its certificate's name
/// (`kubernetes` is among its SANs, 10.0.2.2 is not).
fn kubeconfig() -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: qoslet\n  cluster:\n    server: https://{SLIRP_HOST}:443\n    tls-server-name: kubernetes\n    certificate-authority: /mnt/cluster/ca.crt\nusers:\n- name: kubelet\n  user:\n    client-certificate: /mnt/cluster/kubelet.crt\n    client-key: /mnt/cluster/kubelet.key\ncontexts:\n- name: qoslet\n  context:\n    cluster: qoslet\n    user: kubelet\ncurrent-context: qoslet\n"
    )
}

/// Where the kubelet's files are in the VM, as nodeadm (Amazon EKS's AL2023 nodes) writes them:
/// `vm_node/kubelet.service` names the file with `--config`, the environment file the directory
/// with `--config-dir`.
const KUBELET_CONFIG: &str = "/etc/kubernetes/kubelet/config.json";
const KUBELET_CONFIG_DIR: &str = "/etc/kubernetes/kubelet/config.json.d";

/// The files of `--config-dir` (name, fields over the base file). Each layer overrides a field
/// that sets qoslet's plan or thresholds, so that a reader that skips a layer, takes the
/// drop-ins out of lexical order, replaces a map a drop-in only patches, reads a file without
/// the `.conf` suffix or lays flags under the files instead of over them gets another Node
/// Allocatable than the kubelet's (the test compares qoslet's with the Node's):
/// - `cgroupDriver` is set by a drop-in alone (without it, cgroupfs: qoslet would look for
///   `kubepods`, not `kubepods.slice`);
/// - `kubeReserved.memory` is the base's 256Mi, then 192Mi, then 128Mi (lexical order), while
///   its `cpu`, 50m, stays the base's (a merge patch merges the map key by key);
/// - `evictionHard` `memory.available` is the base's 100Mi, a drop-in's 200Mi, then the
///   flag's 150Mi, as is `systemReserved` (the base's `memory` 64Mi, the flag's 128Mi): the
///   flags replace the files' maps;
/// - `podPidsLimit` is the base's 512, then a drop-in's 1024;
/// - the disabled file (not `*.conf`) would make `kubeReserved.memory` 512Mi.
const DROPINS: &[(&str, &str)] = &[
    (
        "00-nodeadm.conf",
        r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "cgroupDriver": "systemd", "kubeReserved": {"memory": "192Mi"}, "evictionHard": {"memory.available": "200Mi"}, "podPidsLimit": 1024}"#,
    ),
    (
        "10-kube-reserved.conf",
        r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "kubeReserved": {"memory": "128Mi"}}"#,
    ),
    (
        "20-kube-reserved.conf.disabled",
        r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "kubeReserved": {"memory": "512Mi"}}"#,
    ),
];

/// The kubelet's hard threshold on `memory.available`, the flag's: not the host node's 100Mi,
/// which is also the kubelet's default.
const MEMORY_AVAILABLE: &str = "150Mi";

/// The kubelet's `--system-reserved` and `--eviction-hard` flags: what the environment file
/// adds over the files.
fn kubelet_flags() -> String {
    format!(
        "--system-reserved=cpu=100m,memory=128Mi --eviction-hard=memory.available<{MEMORY_AVAILABLE},nodefs.available<1%,imagefs.available<1%,nodefs.inodesFree<1%"
    )
}

/// The kubelet's configuration on the cluster's disk under `dir`: `etc/` (copied to
/// `/etc/kubernetes/kubelet`: the base `config.json` and `config.json.d/`) and `environment`
/// (the flags, `NODEADM_KUBELET_ARGS`). Otherwise as the host node's (`write_kubelet_config`),
/// with the VM's own paths.
fn write_kubelet_layout(dir: &Path) -> Result<()> {
    let etc = dir.join("etc");
    let dropins = etc.join("config.json.d");
    fs::create_dir_all(&dropins)?;
    let base = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupsPerQOS": true,
        "enforceNodeAllocatable": ["pods"],
        "systemReserved": {"cpu": "100m", "memory": "64Mi"},
        "kubeReserved": {"cpu": "50m", "memory": "256Mi"},
        "podPidsLimit": 512,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        // The pause and test images were imported and cannot be pulled again: never collect
        // them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "address": "0.0.0.0",
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "failSwapOn": false,
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": "/mnt/cluster/ca.crt"},
        },
        "authorization": {"mode": "Webhook"},
    });
    fs::write(
        etc.join("config.json"),
        serde_json::to_string_pretty(&base)?,
    )?;
    for (name, text) in DROPINS {
        fs::write(dropins.join(name), text)?;
    }
    fs::write(
        dir.join("environment"),
        format!(
            "NODEADM_KUBELET_ARGS=--config-dir={KUBELET_CONFIG_DIR} --hostname-override={NODE} --node-ip={NODE_IP} --register-with-taints={TAINT} {}\n",
            kubelet_flags()
        ),
    )?;
    Ok(())
}

/// The node IP on the VM's loopback; the ClusterIP of `kubernetes` sent to the API server, from
/// the VM (OUTPUT) and its pods (PREROUTING), the pods' traffic masqueraded as the VM's.
fn node_net_script() -> String {
    let mut s = format!("ip addr add {NODE_IP}/32 dev lo\n");
    for chain in ["PREROUTING", "OUTPUT"] {
        s.push_str(&format!(
            "iptables -t nat -A {chain} -d {API_IP}/32 -p tcp --dport 443 -j DNAT --to-destination {SLIRP_HOST}:443\n"
        ));
    }
    s.push_str(&format!(
        "iptables -t nat -A POSTROUTING -s {POD_SUBNET} ! -d {POD_SUBNET} -j MASQUERADE\n"
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_subnets_of_the_two_nodes_differ() {
        assert_ne!(POD_SUBNET, super::super::POD_SUBNET);
        assert_ne!(NODE_IP, super::super::NODE_IP);
    }

    #[test]
    fn the_unit_names_the_layouts_paths() {
        let unit = include_str!("vm_node/kubelet.service");
        assert!(unit.contains(&format!("--config {KUBELET_CONFIG} ")));
        assert!(unit.contains("/etc/kubernetes/kubelet\n"));
        assert!(KUBELET_CONFIG_DIR.starts_with("/etc/kubernetes/kubelet/"));
    }

    #[test]
    fn the_images_pinned_sandbox_is_the_clusters_pause() {
        assert!(include_str!("vm_node/containerd.toml").contains(super::super::images::PAUSE));
    }
}
