//! Gang eviction on the real node (#40): a gang of real Workload and PodGroup objects
//! (`scheduling.k8s.io/v1beta1`), owned by a Job, whose pods carry `spec.schedulingGroup`. A
//! BestEffort hog of the gang grows past the node's threshold (memory.available 100Mi of the
//! node cgroup's 2 GiB); qoslet evicts as the group's `disruptionMode` says (`all`: every member
//! on this node; `single`: the hog alone) and leaves the member bound to a second Node object
//! to that node (`gangEviction: node`, the default). Then the real garbage collector: the Job
//! deleted, its gang goes, and qoslet's watches of the gang's objects end with it.
//!
//! The Job is suspended: it only owns the gang (as a gang's controller would), and the test
//! makes the pods, so the hog is the gang's one grower and a pod can be bound to the second
//! Node. The pods name the Job as a plain (not controlling) owner, which the Job controller
//! does not adopt or count.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Event, Node, Pod},
};
use kube::{
    Api,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, LogParams, Patch,
        PatchParams, PostParams,
    },
};
use serde_json::{Value, json};

use super::{
    Cluster, TestNamespace, apiserver_metrics, cluster, create_running, pod, qoslet_pod, uid,
    wait_for, with_own_client,
};

/// The gang's PodGroup, and the Event annotation that names it (agent/src/eviction/manager.rs).
const GROUP: &str = "gang-members";
const UNIT_ANNOTATION: &str = "qoslet.dev/unit";

fn scheduling(kind: &str, plural: &str) -> ApiResource {
    let version = "v1beta1";
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.k8s.io", version, kind),
        plural,
    )
}

fn podgroups(c: &Cluster, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(c.client.clone(), ns, &scheduling("PodGroup", "podgroups"))
}

fn workloads(c: &Cluster, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(c.client.clone(), ns, &scheduling("Workload", "workloads"))
}

/// Cleans up what a namespace's deletion cannot, or not at once: the PodGroups'
/// `podgroup-protection` finalizer (the controller manager removes it only once no running pod
/// references the group), the pod bound to the second Node (no kubelet confirms its deletion:
/// deleted with no grace) and that Node.
/// Declared after the namespace, so it runs first.
struct Cleanup {
    namespace: String,
    kubeconfig: PathBuf,
    other_node: Option<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let ns = self.namespace.clone();
        let other = self.other_node.clone();
        with_own_client(&self.kubeconfig, |client| async move {
            if let Some(other) = other {
                let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let on_other = ListParams::default().fields(&format!("spec.nodeName={other}"));
                for p in pods
                    .list(&on_other)
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                {
                    let name = p.metadata.name.unwrap_or_default();
                    let _ = pods
                        .delete(&name, &DeleteParams::default().grace_period(0))
                        .await;
                }
                let _ = Api::<Node>::all(client.clone())
                    .delete(&other, &DeleteParams::default())
                    .await;
                // qoslet's DaemonSet (which tolerates every taint) made a pod for the second
                // Node; its controller deletes it with the Node, but once left it after a failed
                // sync ("read version ... is not as new as written version").
                let qoslet: Api<Pod> = Api::namespaced(client.clone(), "qoslet-system");
                let labels = ListParams::default().labels("app.kubernetes.io/name=qoslet");
                let deadline = Instant::now() + Duration::from_secs(30);
                while Instant::now() < deadline {
                    let for_other: Vec<String> = qoslet
                        .list(&labels)
                        .await
                        .map(|l| l.items)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|p| {
                            let affinity = p.spec.as_ref().and_then(|s| s.affinity.as_ref());
                            serde_json::to_string(&affinity)
                                .is_ok_and(|a| a.contains(&format!("\"{other}\"")))
                        })
                        .filter_map(|p| p.metadata.name)
                        .collect();
                    if for_other.is_empty() {
                        break;
                    }
                    for name in for_other {
                        let _ = qoslet.delete(&name, &DeleteParams::default()).await;
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(client, &ns, &scheduling("PodGroup", "podgroups"));
            let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            for pg in api
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                if let Some(name) = pg.metadata.name {
                    let _ = api.patch(&name, &PatchParams::default(), &release).await;
                }
            }
        });
    }
}

/// A suspended Job that owns the gang: its uid.
async fn owner_job(c: &Cluster, ns: &TestNamespace) -> String {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "gang"},
        "spec": {
            "suspend": true,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "main", "image": "localhost/qoslet-test:latest",
                    "imagePullPolicy": "Never", "command": ["/bin/busybox", "true"],
                }],
            }},
        },
    }))
    .unwrap();
    let job = Api::<Job>::namespaced(c.client.clone(), &ns.name)
        .create(&PostParams::default(), &job)
        .await
        .expect("the owning Job");
    job.metadata.uid.expect("the Job's uid")
}

/// The Workload and its PodGroup [`GROUP`] (a gang of minCount 2, `disruptionMode` all or
/// single), both controlled by the Job, as a gang's controller makes them.
async fn gang_objects(c: &Cluster, ns: &TestNamespace, job_uid: &str, all: bool) {
    let owner = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": "gang", "uid": job_uid,
        "controller": true,
    }]);
    let mode = if all {
        json!({"all": {}})
    } else {
        json!({"single": {}})
    };
    let policy = json!({"gang": {"minCount": 2}});
    let workload = json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": "gang", "ownerReferences": owner},
        "spec": {
            "controllerRef": {"apiGroup": "batch", "kind": "Job", "name": "gang"},
            "podGroupTemplates": [
                {"name": "members", "schedulingPolicy": policy, "disruptionMode": mode},
            ],
        },
    });
    let group = json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": GROUP, "ownerReferences": owner},
        "spec": {
            "workloadRef": {"workloadName": "gang", "templateName": "members"},
            "schedulingPolicy": policy,
            "disruptionMode": mode,
        },
    });
    let post = PostParams::default();
    for (api, v) in [
        (workloads(c, &ns.name), workload),
        (podgroups(c, &ns.name), group),
    ] {
        let obj: DynamicObject = serde_json::from_value(v).unwrap();
        api.create(&post, &obj)
            .await
            .unwrap_or_else(|e| panic!("create {:?}: {e}", obj.metadata.name));
    }
}

/// A pod of the gang, owned (not controlled) by the Job.
fn member(name: &str, script: &str, job_uid: &str) -> Pod {
    let mut p = pod(name, script, json!({}), "Never");
    p.metadata.owner_references = Some(
        serde_json::from_value(json!([{
            "apiVersion": "batch/v1", "kind": "Job", "name": "gang", "uid": job_uid,
        }]))
        .unwrap(),
    );
    p.spec.as_mut().unwrap().scheduling_group =
        Some(serde_json::from_value(json!({"podGroupName": GROUP})).unwrap());
    p
}

/// A second Node object (no kubelet) and a member of the gang bound to it.
async fn member_elsewhere(c: &Cluster, ns: &TestNamespace, other: &str, job_uid: &str) -> Pod {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": other},
    }))
    .unwrap();
    Api::<Node>::all(c.client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("a second Node object");
    let mut p = member("elsewhere", "sleep 3600", job_uid);
    p.spec.as_mut().unwrap().node_name = Some(other.to_owned());
    ns.pods()
        .create(&PostParams::default(), &p)
        .await
        .expect("a member bound to the second node")
}

/// Evicted as qoslet (or the kubelet) evicts: Failed, with the `DisruptionTarget` condition of
/// an eviction at a node threshold; reason Evicted unless the kubelet's status manager dropped
/// it (docs/cluster.md: the top-level reason is the kubelet's to keep).
fn evicted(p: &Pod) -> bool {
    let Some(s) = p.status.as_ref() else {
        return false;
    };
    s.phase.as_deref() == Some("Failed")
        && s.reason.as_deref().is_none_or(|r| r == "Evicted")
        && s.conditions.as_ref().is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "DisruptionTarget"
                    && c.status == "True"
                    && c.reason.as_deref() == Some("TerminationByKubelet")
                    && c.message
                        .as_deref()
                        .is_some_and(|m| m.starts_with("The node was low on resource: memory."))
            })
        })
}

/// The namespace's `Evicted` Events by the uid of the pod they are about.
async fn evicted_events(c: &Cluster, ns: &TestNamespace) -> Vec<Event> {
    Api::<Event>::namespaced(c.client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Evicted"))
        .collect()
}

fn about(events: &[Event], pod_uid: &str) -> Vec<Event> {
    events
        .iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(pod_uid))
        .cloned()
        .collect()
}

fn source(e: &Event) -> Option<&str> {
    e.source.as_ref().and_then(|s| s.component.as_deref())
}

/// qoslet's log lines at WARN or ERROR that name `namespace`, but for its decision to evict.
async fn qoslet_complaints(c: &Cluster, namespace: &str) -> Vec<String> {
    let q = qoslet_pod(c).await;
    let log = Api::<Pod>::namespaced(c.client.clone(), "qoslet-system")
        .logs(q.metadata.name.as_deref().unwrap(), &LogParams::default())
        .await
        .expect("qoslet's log");
    log.lines()
        .filter(|l| l.contains(namespace) && (l.contains("WARN") || l.contains("ERROR")))
        .filter(|l| !l.contains("Evicting to relieve node pressure"))
        .map(str::to_owned)
        .collect()
}

/// The API server's count of open single-object watches (`scope="resource"`, a list with
/// `metadata.name=X`: qoslet's watches of the objects its pods reference; the controller
/// manager's are cluster-wide) of Workloads and PodGroups.
async fn object_watches(c: &Cluster) -> u64 {
    let text = apiserver_metrics(c).await;
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains("group=\"scheduling.k8s.io\"")
                && (l.contains("resource=\"podgroups\"") || l.contains("resource=\"workloads\""))
                && l.contains("scope=\"resource\"")
                && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// One gang on this node (two sleeping members and a BestEffort hog that grows at 50 MiB/s to
/// 4000 MiB, past the node's 2 GiB) and one member bound to a second Node object; waits until
/// qoslet has evicted the hog. Returns the namespace, its cleanup, the members here by name and
/// the member elsewhere.
async fn gang_under_pressure(
    c: &Cluster,
    prefix: &str,
    all: bool,
) -> (TestNamespace, Cleanup, Vec<Pod>, Pod) {
    let _q = qoslet_pod(c).await;
    let ns = TestNamespace::create(c, prefix).await;
    let other = format!("{prefix}-other-{}", std::process::id());
    let cleanup = Cleanup {
        namespace: ns.name.clone(),
        kubeconfig: ns.kubeconfig.clone(),
        other_node: Some(other.clone()),
    };
    let job_uid = owner_job(c, &ns).await;
    gang_objects(c, &ns, &job_uid, all).await;
    let elsewhere = member_elsewhere(c, &ns, &other, &job_uid).await;
    let mut here = create_running(
        &ns,
        vec![
            member("sleeper-0", "sleep 3600", &job_uid),
            member("sleeper-1", "sleep 3600", &job_uid),
        ],
    )
    .await;
    // Last, so that the sleepers are running when it grows.
    here.extend(
        create_running(
            &ns,
            vec![member(
                "hog",
                "echo go | /bin/qoslet-test-hog 4000 50",
                &job_uid,
            )],
        )
        .await,
    );
    let api = ns.pods();
    wait_for("the hog Failed", || async {
        let p = api.get("hog").await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(())
    })
    .await;
    (ns, cleanup, here, elsewhere)
}

/// The member on the second node as qoslet must leave it: not Failed, no `DisruptionTarget`,
/// no `qoslet.dev/evicted-at`, and no Event about it.
fn untouched(p: &Pod, events: &[Event]) {
    let s = p.status.clone().unwrap_or_default();
    assert_ne!(s.phase.as_deref(), Some("Failed"), "{s:#?}");
    assert!(
        s.conditions
            .unwrap_or_default()
            .iter()
            .all(|c| c.type_ != "DisruptionTarget"),
        "the member elsewhere has a DisruptionTarget: {p:#?}"
    );
    assert!(
        p.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("qoslet.dev/evicted-at")),
        "{:?}",
        p.metadata.annotations
    );
    assert!(
        about(events, &uid(p)).is_empty(),
        "an Event about the member elsewhere"
    );
}

/// `disruptionMode: all`: the hog's eviction takes the gang's two sleeping members on this node
/// with it, each Failed with qoslet's `DisruptionTarget` and an `Evicted` Event of qoslet's
/// that names the unit (`qoslet.dev/unit: PodGroup/gang-members`); the member bound to the
/// second Node is left to that node.
#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn a_gang_of_disruption_mode_all_is_evicted_whole_on_this_node() {
    let c = cluster().await;
    let t = Instant::now();
    let (ns, cleanup, here, elsewhere) = gang_under_pressure(&c, "qoslet-e2e-gang-all", true).await;
    let api = ns.pods();
    let names: Vec<String> = here
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    let ended = wait_for("every member on this node evicted", || async {
        let mut out = Vec::new();
        for n in &names {
            let p = api.get(n).await.ok()?;
            evicted(&p).then_some(())?;
            out.push(p);
        }
        Some(out)
    })
    .await;
    for (before, after) in here.iter().zip(&ended) {
        assert_eq!(uid(before), uid(after), "the same pod object");
    }
    let events = wait_for("an Evicted Event of each member here", || async {
        let events = evicted_events(&c, &ns).await;
        here.iter()
            .all(|p| !about(&events, &uid(p)).is_empty())
            .then_some(events)
    })
    .await;
    for p in &here {
        for e in about(&events, &uid(p)) {
            assert_eq!(source(&e), Some("qoslet"), "{e:#?}");
            let unit = e
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(UNIT_ANNOTATION));
            assert_eq!(
                unit.map(String::as_str),
                Some(format!("PodGroup/{GROUP}").as_str()),
                "{e:#?}"
            );
            assert!(
                e.message
                    .as_deref()
                    .is_some_and(|m| m.starts_with("The node was low on resource: memory.")),
                "{e:#?}"
            );
        }
    }
    // Past the sleepers' 1 s grace and qoslet's next passes: still nothing elsewhere.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let elsewhere_now = api.get("elsewhere").await.expect("the member elsewhere");
    assert_eq!(uid(&elsewhere_now), uid(&elsewhere));
    assert_eq!(
        elsewhere_now
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref()),
        cleanup.other_node.as_deref()
    );
    untouched(&elsewhere_now, &evicted_events(&c, &ns).await);
    println!(
        "disruptionMode all: {} evicted together ({:?}), each Event naming PodGroup/{GROUP}; the member elsewhere untouched; {:.0?}",
        names.len(),
        ended
            .iter()
            .map(|p| p.status.as_ref().and_then(|s| s.reason.clone()))
            .collect::<Vec<_>>(),
        t.elapsed()
    );
}

/// `disruptionMode: single`: the hog goes alone (its Event of the kubelet's annotations only,
/// no unit); the gang's sleeping members keep running, and the member elsewhere is untouched.
#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn a_gang_of_disruption_mode_single_loses_only_the_hog() {
    let c = cluster().await;
    let t = Instant::now();
    let (ns, _cleanup, here, elsewhere) =
        gang_under_pressure(&c, "qoslet-e2e-gang-single", false).await;
    let api = ns.pods();
    let hog = wait_for("the hog evicted", || async {
        let p = api.get("hog").await.ok()?;
        evicted(&p).then_some(p)
    })
    .await;
    let events = wait_for("the hog's Evicted Event", || async {
        let events = evicted_events(&c, &ns).await;
        (!about(&events, &uid(&hog)).is_empty()).then_some(events)
    })
    .await;
    for e in about(&events, &uid(&hog)) {
        assert_eq!(source(&e), Some("qoslet"), "{e:#?}");
        assert!(
            e.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| !a.contains_key(UNIT_ANNOTATION)
                    && a.get("starved_resource").map(String::as_str) == Some("memory")),
            "{e:#?}"
        );
    }
    // Past the hog's 1 s grace and qoslet's next passes: the sleepers still run.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let events = evicted_events(&c, &ns).await;
    for p in here
        .iter()
        .filter(|p| p.metadata.name.as_deref() != Some("hog"))
    {
        let now = api.get(p.metadata.name.as_deref().unwrap()).await.unwrap();
        assert_eq!(uid(&now), uid(p));
        let s = now.status.clone().unwrap_or_default();
        assert_eq!(s.phase.as_deref(), Some("Running"), "{now:#?}");
        assert!(about(&events, &uid(p)).is_empty(), "{events:#?}");
        for cs in s.container_statuses.unwrap_or_default() {
            assert_eq!(cs.restart_count, 0, "{cs:#?}");
        }
    }
    let elsewhere_now = api.get("elsewhere").await.expect("the member elsewhere");
    assert_eq!(uid(&elsewhere_now), uid(&elsewhere));
    untouched(&elsewhere_now, &events);
    println!(
        "disruptionMode single: the hog alone evicted (reason {:?}), 2 members running, the member elsewhere untouched; {:.0?}",
        hog.status.as_ref().and_then(|s| s.reason.clone()),
        t.elapsed()
    );
}

/// The real garbage collector: the owning Job deleted (background propagation), its dependents
/// go: the gang's pods and its Workload are deleted, and its PodGroup once the controller
/// manager's podgroup-protection-controller (the `GenericWorkload` gate, xtask/src/cluster.rs)
/// has removed the API server's `scheduling.k8s.io/podgroup-protection` finalizer, which it does
/// once no running pod references the group. qoslet follows: its watches of the gang's Workload and PodGroup
/// (single-object watches on the API server) end once the node's pods that referenced them are
/// gone, and its log names the namespace in no warning or error.
#[tokio::test]
#[ignore = "needs a real cluster: cargo xtask cluster test"]
async fn deleting_the_gangs_job_collects_the_gang_and_qoslet_lets_it_go() {
    let c = cluster().await;
    let t = Instant::now();
    let _q = qoslet_pod(&c).await;
    let ns = TestNamespace::create(&c, "qoslet-e2e-gang-gc").await;
    let _cleanup = Cleanup {
        namespace: ns.name.clone(),
        kubeconfig: ns.kubeconfig.clone(),
        other_node: None,
    };
    let watches_before = object_watches(&c).await;
    let job_uid = owner_job(&c, &ns).await;
    gang_objects(&c, &ns, &job_uid, true).await;
    let pods = create_running(
        &ns,
        vec![
            member("sleeper-0", "sleep 3600", &job_uid),
            member("sleeper-1", "sleep 3600", &job_uid),
        ],
    )
    .await;
    // qoslet watches the Workload and the PodGroup its pods reference.
    wait_for(
        "qoslet's watches of the gang's Workload and PodGroup",
        || async { (object_watches(&c).await >= watches_before + 2).then_some(()) },
    )
    .await;
    let watching = object_watches(&c).await;

    let deleted_at = Instant::now();
    Api::<Job>::namespaced(c.client.clone(), &ns.name)
        .delete("gang", &DeleteParams::background())
        .await
        .expect("the Job deleted");
    let api = ns.pods();
    wait_for(
        "the gang's pods deleted by the garbage collector",
        || async {
            let mut gone = true;
            for p in &pods {
                let now = api
                    .get_opt(p.metadata.name.as_deref().unwrap())
                    .await
                    .ok()?;
                gone &= now.is_none_or(|n| uid(&n) != uid(p));
            }
            gone.then_some(())
        },
    )
    .await;
    let pods_gone = deleted_at.elapsed();
    wait_for("the Workload deleted by the garbage collector", || async {
        workloads(&c, &ns.name)
            .get_opt("gang")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let groups = podgroups(&c, &ns.name);
    wait_for("the PodGroup deleted", || async {
        groups.get_opt(GROUP).await.ok()?.is_none().then_some(())
    })
    .await;
    wait_for("qoslet's watches of the gang's objects ended", || async {
        (object_watches(&c).await <= watches_before).then_some(())
    })
    .await;
    let watches_gone = deleted_at.elapsed();
    let complaints = qoslet_complaints(&c, &ns.name).await;
    assert!(complaints.is_empty(), "{complaints:#?}");
    let status: Value = serde_json::from_str(
        &super::qoslet_get(&c, &qoslet_pod(&c).await, "/status").expect("qoslet's /status"),
    )
    .expect("its JSON");
    let stale: Vec<&Value> = status["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["namespace"] == json!(ns.name))
        .collect();
    assert!(stale.is_empty(), "qoslet still lists {stale:#?}");
    println!(
        "garbage collector: the pods gone {pods_gone:.0?} after the Job's deletion, the Workload and the PodGroup deleted; qoslet's watches {watching} -> {} by {watches_gone:.0?}; {:.0?}",
        object_watches(&c).await,
        t.elapsed()
    );
}
