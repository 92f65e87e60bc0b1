use serde_json::json;

use super::*;
use crate::{
    cgroup::{CgroupPath, Naming, Runner, desired_state},
    policy::{
        cpuset::CpuSet,
        plan::plan_node,
        pod::PodSpecView,
        settings::{Capacity, CgroupDriver, NodeSettings},
    },
    source::ManifestPod,
};

const UID: &str = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
const ID: &str = "4f2b7c0e9d8a1b3c5e7f90a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f";

fn pod(container_id: &str) -> core::Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ns", "uid": UID},
        "spec": {
            "nodeName": "node-a",
            "initContainers": [{"name": "proxy", "image": "x", "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "x",
                "resources": {"requests": {"memory": "64Mi", "cpu": "100m"}}}],
        },
        "status": {
            "phase": "Running", "qosClass": "Burstable",
            "initContainerStatuses": [{"name": "proxy", "image": "x", "imageID": "", "ready": true,
                "restartCount": 0, "containerID": "containerd://aaaa",
                "state": {"running": {"startedAt": "2026-11-30T10:00:00Z"}}}],
            "containerStatuses": [{"name": "app", "image": "x", "imageID": "", "ready": false,
                "restartCount": 2, "containerID": container_id,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                    "finishedAt": "2026-11-30T10:01:00Z"}}}],
        },
    }))
    .unwrap()
}

fn key() -> PodKey {
    PodKey {
        namespace: "ns".into(),
        name: "web".into(),
        uid: UID.into(),
    }
}

/// The pod as the API source yields it: admitted, its views computed once.
fn manifest_pod(p: core::Pod) -> ManifestPod {
    let a = crate::source::admit::admit_pod(p, Default::default()).unwrap();
    let admitted = a.pod.unwrap();
    ManifestPod {
        spec_hash: crate::source::spec_hash(&admitted.pod),
        pod: admitted.pod,
        object: a.object,
        view: admitted.view,
    }
}

fn pod_set(p: core::Pod) -> PodSet {
    let mut s = PodSet::default();
    s.pods.insert(key(), manifest_pod(p));
    s
}

#[test]
fn container_ids_come_from_the_status_with_the_runtime_prefix() {
    assert_eq!(
        container_id(&format!("containerd://{ID}"), ContainerRuntime::Containerd),
        Some(ID)
    );
    assert_eq!(
        container_id(&format!("cri-o://{ID}"), ContainerRuntime::CriO),
        Some(ID)
    );
    assert_eq!(
        container_id(&format!("docker://{ID}"), ContainerRuntime::Containerd),
        None
    );
    assert_eq!(
        container_id(&format!("cri-o://{ID}"), ContainerRuntime::Containerd),
        None
    );
    let set = pod_set(pod(&format!("containerd://{ID}")));
    let ids = container_ids(&set, ContainerRuntime::Containerd);
    assert_eq!(
        ids.get(&(UID.into(), "app".into())).map(String::as_str),
        Some(ID)
    );
    assert_eq!(
        ids.get(&(UID.into(), "proxy".into())).map(String::as_str),
        Some("aaaa")
    );
    // A CRI-O node ignores containerd ids (and the reverse).
    assert!(container_ids(&set, ContainerRuntime::CriO).is_empty());
    let node: core::Node = serde_json::from_value(json!({"metadata": {"name": "n"},
        "status": {"nodeInfo": {"containerRuntimeVersion": "cri-o://1.33.1", "machineID": "",
        "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
        "kubeletVersion": "", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}}))
    .unwrap();
    assert_eq!(runtime_of_node(&node), Some(ContainerRuntime::CriO));
}

#[test]
fn the_container_cgroup_is_named_as_the_kubelet_and_runtime_name_it() {
    let mut s = NodeSettings::defaults(Capacity {
        cpu_millis: 2000,
        memory_bytes: 8 << 30,
        pids: 4096,
        cpus: CpuSet::first(2),
    });
    let p = pod(&format!("containerd://{ID}"));
    let view = PodSpecView::from_pod(&p).unwrap();
    for (driver, runtime, scheme, want) in [
        (
            CgroupDriver::Systemd,
            ContainerRuntime::Containerd,
            "containerd",
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
                UID.replace('-', "_")
            ),
        ),
        (
            CgroupDriver::Systemd,
            ContainerRuntime::CriO,
            "cri-o",
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/crio-{ID}.scope",
                UID.replace('-', "_")
            ),
        ),
        (
            CgroupDriver::Cgroupfs,
            ContainerRuntime::Containerd,
            "containerd",
            format!("/kubepods/burstable/pod{UID}/{ID}"),
        ),
        (
            CgroupDriver::Cgroupfs,
            ContainerRuntime::CriO,
            "cri-o",
            format!("/kubepods/burstable/pod{UID}/crio-{ID}"),
        ),
    ] {
        s.cgroup_driver = driver;
        let plan = plan_node(&s, std::slice::from_ref(&view)).unwrap();
        let set = pod_set(pod(&format!("{scheme}://{ID}")));
        let naming = Naming {
            driver,
            runtime,
            node_root: CgroupPath::root(),
            runner: Runner::Kubelet,
            enforce: Default::default(),
        };
        let d = desired_state(&plan, &naming, &container_ids(&set, runtime));
        let paths: Vec<String> = d.cgroups.iter().map(|c| c.path.to_string()).collect();
        assert!(paths.contains(&want), "{driver:?} {runtime:?}: {paths:#?}");
    }
}

#[test]
fn pod_status_is_the_api_servers() {
    let p = pod(&format!("containerd://{ID}"));
    let s = pod_status(&key(), &p);
    assert_eq!(s.phase, PodPhase::Running);
    assert_eq!(s.containers.len(), 2);
    assert_eq!(s.containers[0].kind, ContainerKind::Sidecar);
    assert!(matches!(
        s.containers[0].state,
        ContainerState::Running { .. }
    ));
    let app = &s.containers[1];
    assert_eq!(app.restart_count, 2);
    assert_eq!(
        app.state,
        ContainerState::Waiting {
            reason: "CrashLoopBackOff".into(),
            message: None,
        }
    );
    assert_eq!(app.last_termination.as_ref().unwrap().reason, "OOMKilled");
    assert_eq!(app.last_termination.as_ref().unwrap().exit_code, 137);
}

#[tokio::test]
async fn an_evicted_pod_reads_evicted_until_it_leaves() {
    let ex = KubeletExecutor::new(ContainerRuntime::Containerd);
    let p = manifest_pod(pod(&format!("containerd://{ID}")));
    let planned = || PlannedPod {
        key: key(),
        pod: &p,
        qos_class: crate::policy::qos::QosClass::Burstable,
        critical: false,
        held: None,
        container_cgroups: BTreeMap::new(),
    };
    ex.apply(vec![planned()], &[]);
    ex.mark_evicted(&key(), "low on memory", Duration::ZERO);
    tokio::time::timeout(Duration::from_secs(1), ex.changed())
        .await
        .unwrap();
    ex.apply(vec![planned()], &[]);
    let s = ex.status();
    assert_eq!(s[0].reason.as_deref(), Some("Evicted"));
    ex.apply(Vec::new(), &[]);
    assert!(ex.status().is_empty());
    assert!(lock(&ex.evicted).is_empty());
}

/// The kubelet started a container of the evicted pod again (its Failed status never reached
/// the API): the pod no longer reads evicted, and the node's next pass makes it a candidate
/// again. A container that started before the eviction changes nothing.
#[tokio::test]
async fn an_evicted_pod_that_runs_again_is_no_longer_evicted() {
    let ex = KubeletExecutor::new(ContainerRuntime::Containerd);
    let started = |at: u64| {
        let mut p = pod(&format!("containerd://{ID}"));
        p.status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .state = Some(
            serde_json::from_value(json!({"running": {"startedAt":
                jiff::Timestamp::from_second(at as i64).unwrap().to_string()}}))
            .unwrap(),
        );
        manifest_pod(p)
    };
    let planned = |p| PlannedPod {
        key: key(),
        pod: p,
        qos_class: crate::policy::qos::QosClass::Burstable,
        critical: false,
        held: None,
        container_cgroups: BTreeMap::new(),
    };
    let now = unix_now();
    let before = started(now - 60);
    ex.apply(vec![planned(&before)], &[]);
    ex.mark_evicted(&key(), "low on memory", Duration::ZERO);
    ex.apply(vec![planned(&before)], &[]);
    assert_eq!(ex.status()[0].reason.as_deref(), Some("Evicted"));
    let again = started(lock(&ex.evicted)[&key()].1 + 1);
    ex.apply(vec![planned(&again)], &[]);
    assert_ne!(ex.status()[0].reason.as_deref(), Some("Evicted"));
    assert!(lock(&ex.evicted).is_empty());
}
