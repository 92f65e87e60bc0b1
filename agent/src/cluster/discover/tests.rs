use std::{fs, os::unix::fs::symlink, path::Path};

use serde_json::json;

use super::*;
use crate::cluster::mock::TempDir;

fn argv(line: &[&str]) -> Vec<String> {
    line.iter().map(|s| (*s).to_owned()).collect()
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// A fake `/proc` entry: `comm` and a NUL-separated `cmdline`; returns its directory.
fn process(proc: &Path, pid: u32, comm: &str, args: &[&str]) -> PathBuf {
    let dir = proc.join(pid.to_string());
    let mut cmdline = args.join("\0");
    cmdline.push('\0');
    write(&dir.join("comm"), &format!("{comm}\n"));
    write(&dir.join("cmdline"), &cmdline);
    dir
}

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn map(m: Option<&std::collections::BTreeMap<String, String>>) -> Vec<(&str, &str)> {
    m.map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
        .unwrap_or_default()
}

#[test]
fn the_command_line_is_read_as_pflag_reads_it() {
    let a = KubeletArgs::parse(&argv(&[
        "/usr/bin/kubelet",
        "--config",
        "/etc/first.yaml",
        "--hostname-override",
        "node-1",
        "--config=/var/lib/kubelet/config.yaml",
        "--cgroups-per-qos",
        "--cgroup_driver=systemd",
        "-v",
        "2",
        "--eviction-hard",
        "memory.available<300Mi",
        "--config-dir=",
        "--",
        "--cgroup-root=/after-dashes",
    ]));
    assert_eq!(
        a,
        KubeletArgs {
            config: Some("/var/lib/kubelet/config.yaml".into()),
            config_dir: None,
            flags: vec![
                ("cgroups-per-qos", "true".into()),
                ("cgroup-driver", "systemd".into()),
                ("eviction-hard", "memory.available<300Mi".into()),
            ],
        }
    );
    // argv[0] is never a flag; a value flag at the very end has no value and ends the line.
    let a = KubeletArgs::parse(&argv(&["--cgroup-root=/x", "--cgroup-driver"]));
    assert_eq!(a, KubeletArgs::default());
}

#[test]
fn flags_replace_maps_on_first_use_and_merge_feature_gates() {
    let mut cfg = to_json(&format!(
        "{HEAD}systemReserved: {{cpu: 500m, memory: 1Gi}}\nfeatureGates: {{A: true, B: true}}\nenforceNodeAllocatable: [pods, system-reserved]\ncgroupsPerQOS: true\n"
    ))
    .unwrap();
    let a = KubeletArgs::parse(&argv(&[
        "kubelet",
        "--system-reserved=memory=2Gi",
        "--system-reserved",
        "pid=100, ephemeral-storage=1Gi",
        "--feature-gates=B=false,C=T",
        "--enforce-node-allocatable=pods",
        "--cgroups-per-qos=0",
        "--pod-max-pids=4096",
        "--eviction-soft=memory.available<1Gi",
    ]));
    a.apply(&mut cfg).unwrap();
    assert_eq!(
        Value::Object(cfg),
        json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // The file's cpu is gone: the first --system-reserved replaced the map.
            "systemReserved": {"memory": "2Gi", "pid": "100", "ephemeral-storage": "1Gi"},
            "featureGates": {"A": true, "B": false, "C": true},
            "enforceNodeAllocatable": ["pods"],
            "cgroupsPerQOS": false,
            "podPidsLimit": 4096,
            "evictionSoft": {"memory.available": "1Gi"},
        })
    );
    for (bad, message) in [
        ("--cgroups-per-qos=yes", "\"yes\" is not a boolean"),
        ("--pod-max-pids=lots", "invalid digit"),
        ("--eviction-max-pod-grace-period=3000000000", "too large"),
        (
            "--eviction-hard=memory.available=1Gi",
            "expect string<string",
        ),
        ("--feature-gates=A=maybe", "not a boolean"),
    ] {
        let err = KubeletArgs::parse(&argv(&["kubelet", bad]))
            .apply(&mut Map::new())
            .unwrap_err();
        assert!(err.2.contains(message), "{bad}: {err:?}");
    }
}

#[test]
fn drop_ins_merge_as_a_json_merge_patch() {
    let mut base = json!({"a": {"x": 1, "y": 2}, "list": [1, 2], "gone": true, "kept": "k"});
    merge_patch(
        &mut base,
        &json!({"a": {"y": null, "z": 3}, "list": [3], "gone": null, "new": {"n": 1}}),
    );
    assert_eq!(
        base,
        json!({"a": {"x": 1, "z": 3}, "list": [3], "kept": "k", "new": {"n": 1}})
    );
}

/// The kubeadm layout: `--config` alone, the file beneath the kubelet's own root, a relative
/// path taken from the kubelet's working directory, and a symlink that resolves inside that root.
#[test]
fn a_kubeadm_kubelet_is_found_with_its_config_file() {
    let t = TempDir::new("discover-kubeadm");
    let proc = t.0.join("proc");
    process(&proc, 1, "systemd", &["/sbin/init"]);
    // A shell named kubelet and a kubelet-foo are not the kubelet.
    process(&proc, 50, "kubelet", &["/bin/sh", "-c", "exec kubelet"]);
    process(
        &proc,
        60,
        "kubelet-foo",
        &["/usr/bin/kubelet-foo", "--config=x"],
    );
    process(&proc, 61, "kubelet", &["/usr/bin/kubelet-foo"]);
    let dir = process(
        &proc,
        700,
        "kubelet",
        &["/usr/bin/kubelet", "--config", "config.yaml"],
    );
    let root = dir.join("root");
    symlink("/var/lib/kubelet", dir.join("cwd")).unwrap();
    // An absolute symlink resolves inside the kubelet's root, not this machine's.
    write(
        &root.join("etc/kubernetes/kubelet.yaml"),
        &format!(
            "{HEAD}cgroupDriver: systemd\nevictionHard: {{memory.available: 200Mi}}\nsystemReserved: {{memory: 1Gi}}\n"
        ),
    );
    fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
    symlink(
        "/etc/kubernetes/kubelet.yaml",
        root.join("var/lib/kubelet/config.yaml"),
    )
    .unwrap();
    symlink("/self", proc.join("self")).unwrap();

    let found = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap();
    assert_eq!(found.pid, 700);
    assert_eq!(found.config.cgroup_driver.as_deref(), Some("systemd"));
    assert_eq!(
        map(found.config.eviction_hard.as_ref()),
        [("memory.available", "200Mi")]
    );
    assert_eq!(
        map(found.config.system_reserved.as_ref()),
        [("memory", "1Gi")]
    );
    assert_eq!(
        found.source,
        format!(
            "kubelet pid 700, beneath {}: /var/lib/kubelet/config.yaml",
            root.display()
        )
    );
}

/// A kubelet configured by a base file, drop-ins and flags: flags beat drop-ins, later
/// drop-ins beat earlier ones, drop-ins beat the file; maps merge key by key across files.
#[test]
fn drop_ins_and_flags_take_the_kubelets_precedence() {
    let t = TempDir::new("discover-dropins");
    let proc = t.0.join("proc");
    let dir = process(
        &proc,
        812,
        "kubelet",
        &[
            "kubelet",
            "--config=/etc/kubelet/base.yaml",
            "--config-dir",
            "/etc/kubelet/conf.d",
            "--cgroup-driver=systemd",
            "--feature-gates=B=false",
        ],
    );
    let root = dir.join("root");
    write(
        &root.join("etc/kubelet/base.yaml"),
        &format!(
            "{HEAD}cgroupDriver: cgroupfs\ncgroupRoot: /base\nkubeReservedCgroup: /base\nfeatureGates: {{A: true, B: true}}\nsystemReserved: {{cpu: 500m, memory: 1Gi}}\n"
        ),
    );
    let d = root.join("etc/kubelet/conf.d");
    write(
        &d.join("10-a.conf"),
        &format!(
            "{HEAD}kubeReservedCgroup: /a\ncgroupRoot: /a\nevictionHard: {{memory.available: 250Mi}}\nsystemReserved: {{cpu: null, pid: \"100\"}}\n"
        ),
    );
    // A subdirectory is walked where its name sorts: between 10- and 20-.
    write(
        &d.join("15-sub/x.conf"),
        &format!("{HEAD}cgroupRoot: /sub\nkubeReservedCgroup: /sub\n"),
    );
    write(
        &d.join("20-b.conf"),
        &format!("{HEAD}kubeReservedCgroup: /b\n"),
    );
    // Not a .conf file: skipped, as the kubelet skips it.
    write(
        &d.join("30-skipped.yaml"),
        &format!("{HEAD}cgroupDriver: bogus\n"),
    );

    let found = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap();
    let kc = &found.config;
    assert_eq!(kc.cgroup_driver.as_deref(), Some("systemd"), "the flag");
    assert_eq!(
        kc.kube_reserved_cgroup.as_deref(),
        Some("/b"),
        "the last drop-in"
    );
    assert_eq!(
        kc.cgroup_root.as_deref(),
        Some("/sub"),
        "the subdirectory's"
    );
    assert_eq!(
        map(kc.system_reserved.as_ref()),
        [("memory", "1Gi"), ("pid", "100")],
        "merged key by key, null removes"
    );
    // The file had no evictionHard: the kubelet's default, then the drop-in's memory.available.
    assert_eq!(
        map(kc.eviction_hard.as_ref()),
        [
            ("imagefs.available", "15%"),
            ("memory.available", "250Mi"),
            ("nodefs.available", "10%"),
            ("nodefs.inodesFree", "5%"),
        ]
    );
    assert_eq!(kc.gate("A"), Some(true));
    assert_eq!(kc.gate("B"), Some(false));
    assert!(
        found.source.ends_with(
            ": /etc/kubelet/base.yaml, /etc/kubelet/conf.d/ (3 drop-ins), flags --cgroup-driver --feature-gates"
        ),
        "{}",
        found.source
    );

    // A drop-in of another kind stops the kubelet, and qoslet says which file.
    write(
        &d.join("40-wrong.conf"),
        "apiVersion: v1\nkind: ConfigMap\n",
    );
    let err = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "kubelet (pid 812): /etc/kubelet/conf.d/40-wrong.conf: a drop-in must be apiVersion kubelet.config.k8s.io/v1beta1, kind KubeletConfiguration (the kubelet refuses it too)"
    );
}

/// `mergeDefaultEvictionSettings` fills the base file's map, and a flag then replaces it whole.
#[test]
fn merged_eviction_defaults_belong_to_the_base_file() {
    let t = TempDir::new("discover-merge-defaults");
    let proc = t.0.join("proc");
    let base = format!(
        "{HEAD}mergeDefaultEvictionSettings: true\nevictionHard: {{memory.available: 200Mi}}\n"
    );
    let dir = process(&proc, 7, "kubelet", &["kubelet", "--config=/c.yaml"]);
    write(&dir.join("root/c.yaml"), &base);
    let run = || {
        Discover {
            proc: &proc,
            host_root: None,
            node_name: None,
        }
        .run()
        .unwrap()
        .config
    };
    let kc = run();
    assert_eq!(
        map(kc.eviction_hard.as_ref()),
        [
            ("imagefs.available", "15%"),
            ("memory.available", "200Mi"),
            ("nodefs.available", "10%"),
            ("nodefs.inodesFree", "5%"),
        ]
    );
    process(
        &proc,
        7,
        "kubelet",
        &[
            "kubelet",
            "--config=/c.yaml",
            "--eviction-hard=memory.available<300Mi",
        ],
    );
    let kc = run();
    assert_eq!(
        map(kc.eviction_hard.as_ref()),
        [("memory.available", "300Mi")]
    );
    assert_eq!(kc.merge_default_eviction_settings, None);
}

/// A kubelet configured by flags alone: the kubelet's defaults, and the flags over them.
#[test]
fn a_kubelet_of_flags_alone() {
    let t = TempDir::new("discover-flags");
    let proc = t.0.join("proc");
    let dir = process(
        &proc,
        90,
        "kubelet",
        &[
            "/opt/bin/kubelet",
            "--cgroup-driver=cgroupfs",
            "--kube-reserved=cpu=100m,memory=256Mi",
            "--eviction-hard=memory.available<500Mi,nodefs.available<5%",
            "--reserved-cpus=0-1",
        ],
    );
    fs::create_dir_all(dir.join("root")).unwrap();
    let kc = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap()
    .config;
    assert_eq!(kc.cgroup_driver.as_deref(), Some("cgroupfs"));
    assert_eq!(
        map(kc.kube_reserved.as_ref()),
        [("cpu", "100m"), ("memory", "256Mi")]
    );
    assert_eq!(
        map(kc.eviction_hard.as_ref()),
        [("memory.available", "500Mi"), ("nodefs.available", "5%")]
    );
    assert_eq!(kc.reserved_system_cpus.as_deref(), Some("0-1"));
    assert_eq!(kc.system_reserved, None);

    // No --config and no --eviction-hard: no hard threshold at all, as in the kubelet, whose
    // default evictionHard comes with a config file only.
    process(
        &proc,
        90,
        "kubelet",
        &["/opt/bin/kubelet", "--cgroup-driver=systemd"],
    );
    let kc = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap()
    .config;
    assert_eq!(map(kc.eviction_hard.as_ref()), []);
    assert!(kc.eviction_hard.is_some());
}

/// Without ptrace access the kubelet's root answers EACCES: the same paths are read beneath
/// --host-root, and without one the error says what was tried.
#[test]
fn a_closed_kubelet_root_falls_back_to_the_host_root() {
    let t = TempDir::new("discover-eacces");
    let proc = t.0.join("proc");
    let dir = process(
        &proc,
        4242,
        "kubelet",
        &["/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml"],
    );
    // The kubelet's own root holds another file: it must not be read.
    write(
        &dir.join("root/var/lib/kubelet/config.yaml"),
        &format!("{HEAD}cgroupDriver: cgroupfs\n"),
    );
    let host = t.0.join("host");
    write(
        &host.join("var/lib/kubelet/config.yaml"),
        &format!("{HEAD}cgroupDriver: systemd\n"),
    );
    let closed = |p: &Path| {
        if p.ends_with("root") {
            Err(io::Error::from_raw_os_error(libc::EACCES))
        } else {
            open_dir(p)
        }
    };
    let found = Discover {
        proc: &proc,
        host_root: Some(&host),
        node_name: None,
    }
    .run_with(&closed)
    .unwrap();
    assert_eq!(found.config.cgroup_driver.as_deref(), Some("systemd"));
    assert!(
        found
            .source
            .starts_with(&format!("kubelet pid 4242, beneath {}:", host.display())),
        "{}",
        found.source
    );

    let err = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run_with(&closed)
    .unwrap_err();
    assert_eq!(
        err.chain(),
        format!(
            "kubelet (pid 4242): cannot open its root {}/4242/root and no --host-root to read its files beneath: Permission denied (os error 13)",
            proc.display()
        )
    );
}

#[test]
fn no_kubelet_and_several_kubelets() {
    let t = TempDir::new("discover-none");
    let proc = t.0.join("proc");
    process(&proc, 1, "systemd", &["/sbin/init"]);
    let err = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "no kubelet process in {} (comm and argv[0] named kubelet)",
            proc.display()
        )
    );

    for pid in [31, 300, 4] {
        let dir = process(
            &proc,
            pid,
            "kubelet",
            &["kubelet", &format!("--cgroup-root=/k{pid}")],
        );
        fs::create_dir_all(dir.join("root")).unwrap();
    }
    let found = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap();
    assert_eq!(found.pid, 4);
    assert_eq!(found.config.cgroup_root.as_deref(), Some("/k4"));

    // Of several, the one that names this node.
    let dir = process(
        &proc,
        500,
        "kubelet",
        &[
            "kubelet",
            "--hostname-override",
            "node-b",
            "--cgroup-root=/b",
        ],
    );
    fs::create_dir_all(dir.join("root")).unwrap();
    let found = Discover {
        proc: &proc,
        host_root: None,
        node_name: Some("node-b"),
    }
    .run()
    .unwrap();
    assert_eq!(found.pid, 500);
    assert_eq!(found.config.cgroup_root.as_deref(), Some("/b"));
}

/// `--kubelet-config /host/...`: the host's file, its absolute symlink resolved on the host.
#[test]
fn a_named_file_beneath_the_host_root_is_read_inside_it() {
    let t = TempDir::new("discover-named");
    let host = t.0.join("host");
    write(
        &host.join("etc/kubernetes/kubelet.yaml"),
        &format!("{HEAD}cgroupDriver: systemd\n"),
    );
    fs::create_dir_all(host.join("var/lib/kubelet")).unwrap();
    symlink(
        "/etc/kubernetes/kubelet.yaml",
        host.join("var/lib/kubelet/config.yaml"),
    )
    .unwrap();
    let shown = host.join("var/lib/kubelet/config.yaml");
    let kc = load_in_root(&host, Path::new("/var/lib/kubelet/config.yaml"), &shown).unwrap();
    assert_eq!(kc.cgroup_driver.as_deref(), Some("systemd"));
    let err = load_in_root(&host, Path::new("/var/lib/kubelet/other.yaml"), &shown).unwrap_err();
    assert_eq!(err.to_string(), format!("{}: cannot read", shown.display()));
}

/// A path in the kubelet's files cannot climb out of the root it is read beneath.
#[test]
fn paths_stay_inside_the_kubelets_root() {
    let t = TempDir::new("discover-escape");
    let proc = t.0.join("proc");
    let outside = t.0.join("outside.yaml");
    write(&outside, &format!("{HEAD}cgroupDriver: systemd\n"));
    let dir = process(
        &proc,
        5,
        "kubelet",
        &["kubelet", "--config=../../../../../../outside.yaml"],
    );
    let root = dir.join("root");
    fs::create_dir_all(&root).unwrap();
    let err = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap_err();
    assert!(
        matches!(&err, DiscoverError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound),
        "{err:?}"
    );
    // `..` stops at the root's top, as at `/`.
    write(
        &root.join("outside.yaml"),
        &format!("{HEAD}cgroupDriver: cgroupfs\n"),
    );
    let found = Discover {
        proc: &proc,
        host_root: None,
        node_name: None,
    }
    .run()
    .unwrap();
    assert_eq!(found.config.cgroup_driver.as_deref(), Some("cgroupfs"));
}
