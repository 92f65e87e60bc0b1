use super::*;
use crate::policy::{
    cpu::WeightFormula,
    cpuset::CpuSet,
    plan::plan_node,
    pod::{Amounts, ContainerKind, ContainerView, PodSpecView, Resources},
    settings::{Capacity, NodeSettings},
};

const UID: &str = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee";
const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn pod(uid: &str, container: &str) -> PodSpecView {
    let q = |s: &str| Some(s.parse().unwrap());
    PodSpecView {
        namespace: "default".into(),
        name: "web".into(),
        uid: uid.into(),
        containers: vec![ContainerView {
            name: container.into(),
            kind: ContainerKind::App,
            resources: Resources {
                requests: Amounts {
                    cpu: q("250m"),
                    memory: q("1Gi"),
                },
                limits: Amounts::default(),
            },
        }],
        pod_resources: None,
        overhead: Amounts::default(),
        hugepages: Default::default(),
        priority: None,
        priority_class_name: None,
        static_or_mirror: false,
        status_qos_class: None,
    }
}

fn settings(driver: CgroupDriver, root: &str) -> NodeSettings {
    let mut s = NodeSettings::defaults(Capacity {
        cpu_millis: 2000,
        memory_bytes: 8 << 30,
        pids: 4096,
        cpus: CpuSet::first(2),
    });
    s.cgroup_driver = driver;
    s.cgroup_root = root.into();
    s.weight_formula = WeightFormula::KubeletLinear;
    s
}

fn naming(driver: CgroupDriver, runtime: ContainerRuntime, node_root: &str) -> Naming {
    Naming {
        driver,
        runtime,
        node_root: CgroupPath::parse(node_root).unwrap(),
        runner: Runner::Qoslet,
        enforce: Default::default(),
    }
}

fn ids(id: &str) -> ContainerIds {
    [((UID.to_string(), "app".to_string()), id.to_string())].into()
}

fn paths(d: &DesiredState) -> Vec<String> {
    d.cgroups.iter().map(|c| c.path.to_string()).collect()
}

#[test]
fn cgroupfs_names_sit_under_the_node_root_in_depth_first_pre_order() {
    let s = settings(CgroupDriver::Cgroupfs, "/");
    let plan = plan_node(&s, &[pod(UID, "app")]).unwrap();
    let d = desired_state(
        &plan,
        &naming(
            CgroupDriver::Cgroupfs,
            ContainerRuntime::Containerd,
            "/node",
        ),
        &ids(ID),
    );
    assert!(d.refused_pods.is_empty());
    assert_eq!(
        paths(&d),
        vec![
            "/kubepods".to_string(),
            "/kubepods/besteffort".into(),
            "/kubepods/burstable".into(),
            format!("/kubepods/burstable/pod{UID}"),
            format!("/kubepods/burstable/pod{UID}/{ID}"),
        ]
    );
    let ctr = &d.cgroups[4];
    assert_eq!(ctr.role, Role::Container);
    assert_eq!(ctr.oom_score_adj, Some(875));
    // A plan already rooted at the node root (config folds nodeRootCgroup into cgroupRoot).
    let s = settings(CgroupDriver::Cgroupfs, "/node");
    let plan = plan_node(&s, &[pod(UID, "app")]).unwrap();
    let d2 = desired_state(
        &plan,
        &naming(
            CgroupDriver::Cgroupfs,
            ContainerRuntime::Containerd,
            "/node",
        ),
        &ids(ID),
    );
    assert_eq!(paths(&d2), paths(&d));
}

#[test]
fn systemd_names_and_runtime_scopes() {
    let s = settings(CgroupDriver::Systemd, "/");
    let plan = plan_node(&s, &[pod(UID, "app")]).unwrap();
    let uid = UID.replace('-', "_");
    for (runtime, scope) in [
        (
            ContainerRuntime::Containerd,
            format!("cri-containerd-{ID}.scope"),
        ),
        (ContainerRuntime::CriO, format!("crio-{ID}.scope")),
    ] {
        let d = desired_state(
            &plan,
            &naming(CgroupDriver::Systemd, runtime, "/"),
            &ids(ID),
        );
        assert_eq!(
            paths(&d)[4],
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/{scope}"
            )
        );
    }
    assert_eq!(
        container_component(CgroupDriver::Cgroupfs, ContainerRuntime::CriO, "ab"),
        "crio-ab"
    );
}

#[test]
fn invalid_names_refuse_only_their_pod() {
    let s = settings(CgroupDriver::Cgroupfs, "/");
    let good = "01234567-89ab-4cde-8f01-23456789abcd";
    let pods = [pod("../../x", "app"), pod(good, "app"), pod(UID, "App_")];
    let plan = plan_node(&s, &pods).unwrap();
    let d = desired_state(
        &plan,
        &naming(CgroupDriver::Cgroupfs, ContainerRuntime::Containerd, "/"),
        &ContainerIds::new(),
    );
    let refused: Vec<&NameError> = d.refused_pods.iter().map(|p| &p.source).collect();
    assert_eq!(
        refused,
        vec![
            &NameError::Uid {
                uid: "../../x".into()
            },
            &NameError::ContainerName {
                name: "App_".into()
            }
        ]
    );
    assert!(paths(&d).contains(&format!("/kubepods/burstable/pod{good}")));
    assert!(paths(&d).iter().all(|p| !p.contains("..")));
    // Container ids: hex for CRI runtimes; nothing that climbs for any runtime.
    let plan = plan_node(&s, &[pod(UID, "app")]).unwrap();
    for (runtime, id) in [
        (ContainerRuntime::Containerd, "../../../x"),
        (ContainerRuntime::CriO, "xyz"),
        (ContainerRuntime::Standalone, ".."),
    ] {
        let d = desired_state(
            &plan,
            &naming(CgroupDriver::Cgroupfs, runtime, "/"),
            &ids(id),
        );
        assert_eq!(d.refused_pods.len(), 1, "{id}");
    }
    let d = desired_state(
        &plan,
        &naming(CgroupDriver::Cgroupfs, ContainerRuntime::Standalone, "/"),
        &ids("web-0"),
    );
    assert!(d.refused_pods.is_empty());
}

#[test]
fn components_and_uids_are_checked() {
    assert!(validate_uid(UID).is_ok());
    for bad in [
        "",
        "../../x",
        "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeee",
        "aaaaaaaa/bbbb-4ccc-8ddd-eeeeeeeeeeee",
    ] {
        assert!(validate_uid(bad).is_err(), "{bad}");
    }
    for bad in ["/a/../b", "/a/./b", "/a/b c"] {
        assert!(CgroupPath::parse(bad).is_err(), "{bad}");
    }
    let root = CgroupPath::parse("/node").unwrap();
    assert_eq!(
        CgroupPath::under_root("/node/kubepods", &root)
            .unwrap()
            .to_string(),
        "/kubepods"
    );
    assert_eq!(
        CgroupPath::under_root("/kubepods", &root)
            .unwrap()
            .to_string(),
        "/kubepods"
    );
}

#[test]
fn under_the_kubelet_nothing_is_created_and_only_enforced_areas_are_written() {
    let s = settings(CgroupDriver::Systemd, "/");
    let plan = plan_node(&s, &[pod(UID, "app")]).unwrap();
    let mut n = naming(CgroupDriver::Systemd, ContainerRuntime::CriO, "/");
    n.runner = Runner::Kubelet;
    n.enforce = [Area::MemoryQos, Area::QosTierWeights].into();
    let d = desired_state(&plan, &n, &ids(ID));
    assert!(d.cgroups.iter().all(|c| !c.create), "{d:#?}");
    let by_role = |r: Role| d.cgroups.iter().find(|c| c.role == r).unwrap();
    let tier = by_role(Role::QosTier);
    assert!(tier.writes.allows("cpu.weight") && tier.writes.allows("memory.min"));
    let pod = by_role(Role::Pod);
    assert!(pod.writes.allows("memory.min") && !pod.writes.allows("cpu.weight"));
    assert!(!pod.writes.allows("memory.max") && !pod.writes.allows("cgroup.subtree_control"));
    let ctr = by_role(Role::Container);
    assert_eq!(
        ctr.path.components().last().unwrap(),
        &format!("crio-{ID}.scope")
    );
    assert_eq!(ctr.oom_score_adj, None, "oomScoreAdj not enforced");
    n.enforce = [Area::OomScoreAdj].into();
    let d = desired_state(&plan, &n, &ids(ID));
    let ctr = d
        .cgroups
        .iter()
        .find(|c| c.role == Role::Container)
        .unwrap();
    assert_eq!(ctr.oom_score_adj, Some(875));
    assert!(!ctr.writes.allows("memory.min"));
}
