//! The kubelet executor: the kubelet admits and starts pods and the container runtime makes
//! their cgroups; qoslet starts nothing and only finds them.
//!
//! A pod's cgroup is named from its QoS class and UID (the plan does that, for the cgroupfs and
//! systemd drivers); a container's from `status.containerStatuses[].containerID`, whose runtime
//! prefix (`containerd://`, `cri-o://`) must match the node's runtime, named as that runtime
//! names it (`cri-containerd-<id>.scope`, `crio-<id>.scope`; `cgroup::name`). Pod status is what
//! the API server says, with the processes read from each container's cgroup.

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1 as core;
use tokio::sync::Notify;

use crate::{
    cgroup::{ContainerIds, ContainerRuntime, Runner},
    eviction::NodeCondition,
    node::{
        ContainerState, ContainerStatus, PlannedPod, PodExecutor, PodPhase, PodStatus, Termination,
    },
    persist::{ran_again_since, unix_now},
    policy::pod::{ContainerKind, PodKey, RestartPolicy},
    source::{ManifestPod, PodSet},
    support::lock,
};

/// The container runtime a Node reports (`status.nodeInfo.containerRuntimeVersion`, e.g.
/// `containerd://2.1.0`, `cri-o://1.33.0`).
pub(crate) fn runtime_of_node(node: &core::Node) -> Option<ContainerRuntime> {
    let v = node
        .status
        .as_ref()?
        .node_info
        .as_ref()?
        .container_runtime_version
        .as_str();
    runtime_of_scheme(v.split("://").next()?)
}

fn runtime_of_scheme(scheme: &str) -> Option<ContainerRuntime> {
    match scheme {
        "containerd" => Some(ContainerRuntime::Containerd),
        "cri-o" => Some(ContainerRuntime::CriO),
        _ => None,
    }
}

/// The id of a `containerID` (`containerd://<id>`) when it is of `runtime`.
pub(crate) fn container_id(container_id: &str, runtime: ContainerRuntime) -> Option<&str> {
    let (scheme, id) = container_id.split_once("://")?;
    (runtime_of_scheme(scheme) == Some(runtime)).then_some(id)
}

/// Container ids by (pod uid, container name) from the pods' statuses (init, sidecar and app
/// containers).
pub(crate) fn container_ids(pods: &PodSet, runtime: ContainerRuntime) -> ContainerIds {
    let mut out = ContainerIds::new();
    for (key, p) in &pods.pods {
        let Some(st) = &p.pod.status else { continue };
        let all = st
            .init_container_statuses
            .iter()
            .flatten()
            .chain(st.container_statuses.iter().flatten());
        for c in all {
            let Some(raw) = c.container_id.as_deref() else {
                continue;
            };
            match container_id(raw, runtime) {
                Some(id) => {
                    out.insert((key.uid.clone(), c.name.clone()), id.to_owned());
                }
                None => {
                    tracing::debug!(pod = %key, container = %c.name, id = raw, runtime = ?runtime, "Container id of another runtime; its cgroup is not looked for.");
                }
            }
        }
    }
    out
}

/// The kubelet's pods as qoslet sees them.
pub(crate) struct KubeletExecutor {
    runtime: ContainerRuntime,
    statuses: Mutex<BTreeMap<PodKey, PodStatus>>,
    /// Pods evicted, with the message and when (seconds since the Unix epoch): reported Failed
    /// until they leave the API, or run again after it (the kubelet restarted them).
    evicted: Mutex<BTreeMap<PodKey, (String, u64)>>,
    changed: Notify,
}

impl KubeletExecutor {
    pub(crate) fn new(runtime: ContainerRuntime) -> Self {
        Self {
            runtime,
            statuses: Mutex::default(),
            evicted: Mutex::default(),
            changed: Notify::new(),
        }
    }

    /// Who runs the pods this executor reports on; the API source's door reads it too, before
    /// the executor exists (it needs the Node's runtime, which the source lists).
    pub(crate) const RUNNER: Runner = Runner::Kubelet;
}

impl PodExecutor for KubeletExecutor {
    fn runner(&self) -> Runner {
        Self::RUNNER
    }

    fn accepts(&self, _pod: &ManifestPod) -> Result<(), String> {
        // The kubelet runs whatever the API server accepted.
        Ok(())
    }

    fn container_ids(&self, pods: &PodSet) -> ContainerIds {
        container_ids(pods, self.runtime)
    }

    fn apply(&self, pods: Vec<PlannedPod<'_>>, _conditions: &[NodeCondition]) -> Vec<String> {
        let mut evicted = lock(&self.evicted);
        evicted.retain(|k, (_, at)| {
            let Some(p) = pods.iter().find(|p| &p.key == k) else {
                return false;
            };
            let Some(started) = ran_again_since(&p.pod.pod, *at) else {
                return true;
            };
            tracing::warn!(pod = %k, evicted_at = *at, started_at = started, "An evicted pod runs again (the kubelet started a container after the eviction); it is a candidate again.");
            false
        });
        let next: BTreeMap<PodKey, PodStatus> = pods
            .iter()
            .map(|p| {
                let mut s = pod_status(&p.key, &p.pod.pod);
                if let Some((m, _)) = evicted.get(&p.key) {
                    s.set_evicted(m);
                    s.terminating = true;
                }
                (p.key.clone(), s)
            })
            .collect();
        drop(evicted);
        let mut cur = lock(&self.statuses);
        if *cur != next {
            *cur = next;
            self.changed.notify_one();
        }
        Vec::new()
    }

    fn status(&self) -> Vec<PodStatus> {
        lock(&self.statuses).values().cloned().collect()
    }

    async fn changed(&self) {
        self.changed.notified().await;
    }

    fn mark_evicted(&self, key: &PodKey, message: &str, grace: Duration) {
        tracing::info!(pod = %key, grace_secs = grace.as_secs_f64(), reason = message, "Evicting pod.");
        lock(&self.evicted).insert(key.clone(), (message.into(), unix_now()));
        if let Some(s) = lock(&self.statuses).get_mut(key) {
            s.set_evicted(message);
            s.terminating = true;
        }
        self.changed.notify_one();
    }

    async fn stop_all(&self, _grace: Duration) {
        // The kubelet's pods outlive qoslet.
    }
}

fn system_time(
    t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> Option<SystemTime> {
    t.map(|t| SystemTime::from(t.0))
}

fn termination(t: &core::ContainerStateTerminated) -> Termination {
    Termination {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: t.reason.clone().unwrap_or_default(),
        message: t.message.clone(),
        started_at: system_time(t.started_at.as_ref()),
        finished_at: system_time(t.finished_at.as_ref()).unwrap_or(SystemTime::UNIX_EPOCH),
    }
}

/// The API's status of a pod in the node's terms.
pub(crate) fn pod_status(key: &PodKey, pod: &core::Pod) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let st = pod.status.clone().unwrap_or_default();
    let statuses: BTreeMap<&str, &core::ContainerStatus> = st
        .init_container_statuses
        .iter()
        .flatten()
        .chain(st.container_statuses.iter().flatten())
        .map(|c| (c.name.as_str(), c))
        .collect();
    let mut containers = Vec::new();
    let kinds = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let kind = if c.restart_policy.as_deref() == Some("Always") {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            (c.name.as_str(), kind)
        })
        .chain(
            spec.containers
                .iter()
                .map(|c| (c.name.as_str(), ContainerKind::App)),
        );
    for (name, kind) in kinds {
        let mut c = ContainerStatus::new(name, kind, "ContainerCreating");
        if let Some(s) = statuses.get(name) {
            c.restart_count = s.restart_count.max(0) as u32;
            let state = s.state.clone().unwrap_or_default();
            c.state = if let Some(r) = &state.running {
                ContainerState::Running {
                    pid: None,
                    started_at: system_time(r.started_at.as_ref())
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                }
            } else if let Some(t) = &state.terminated {
                ContainerState::Terminated(termination(t))
            } else {
                let w = state.waiting.unwrap_or_default();
                ContainerState::Waiting {
                    reason: w.reason.unwrap_or_else(|| "ContainerCreating".into()),
                    message: w.message,
                }
            };
            c.last_termination = s
                .last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .map(termination);
        }
        containers.push(c);
    }
    PodStatus {
        key: key.clone(),
        phase: match st.phase.as_deref() {
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            _ => PodPhase::Pending,
        },
        reason: st.reason.clone(),
        message: st.message.clone(),
        restart_policy: match spec.restart_policy.as_deref() {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        },
        containers,
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

#[cfg(test)]
mod tests;
