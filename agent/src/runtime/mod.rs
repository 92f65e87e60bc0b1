//! The standalone process runtime: runs the containers of manifest pods as host processes
//! inside their container cgroups (there are no images), with the kubelet's ordering, restart
//! policy, back-off, graceful termination and status.
//!
//! [`spec`] reads pods, [`backoff`] and [`status`] are pure, [`process`] and [`logs`] do the
//! I/O, `container` supervises one container and `pod` one pod, both writing the pod's status
//! through `shared`, which announces each change; [`Runtime`] ties them together.

pub(crate) mod backoff;
mod claims;
mod container;
mod executor;
pub mod logs;
mod pod;
pub(crate) mod process;
mod shared;
pub(crate) mod spec;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    sync::{Notify, watch},
    time::Instant,
};

pub use backoff::BackoffConfig;
pub use spec::ContainerCgroups;
pub use spec::ContainerSpec;
pub use spec::PodRuntimeSpec;

use crate::{
    node::pod_status::{
        self as status, ContainerState, ContainerStatus, PhaseInput, PodPhase, PodStatus,
    },
    policy::pod::PodKey,
};

use pod::{Control, PodTask};
use shared::SharedStatus;

/// Where logs go and how restarts back off.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Container logs: `<log_dir>/<namespace>_<name>_<uid>/<container>/<restart>.log`.
    pub log_dir: PathBuf,
    pub backoff: BackoffConfig,
}

/// A pod the runtime knows, running or stopping.
struct PodHandle {
    spec: Arc<PodRuntimeSpec>,
    status: SharedStatus,
    control: watch::Sender<Control>,
    done: watch::Receiver<bool>,
}

impl PodHandle {
    fn stop(&self, deadline: Instant) {
        self.status.update(|s| s.terminating = true);
        self.control.send_modify(|c| {
            // An earlier deadline stands: a second stop only shortens it.
            c.stop = Some(c.stop.map_or(deadline, |d| d.min(deadline)));
        });
    }

    fn is_done(&self) -> bool {
        *self.done.borrow()
    }
}

/// The process runtime. Call its methods from within a tokio runtime: pods run as tasks.
pub struct Runtime {
    config: RuntimeConfig,
    logs: Arc<logs::LogDir>,
    claims: claims::Claims,
    state: Mutex<State>,
    /// Woken by every pod status change.
    changed: Arc<Notify>,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<PodKey, PodHandle>,
    /// Removed or replaced pods still stopping.
    stopping: Vec<PodHandle>,
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Self {
        Self {
            logs: Arc::new(logs::LogDir::new(&config.log_dir)),
            claims: claims::Claims::default(),
            config,
            state: Mutex::new(State::default()),
            changed: Arc::new(Notify::new()),
        }
    }

    /// Resolves once some pod's status changed since the last call returned (a container
    /// started or ended, a pod finished, was gated or evicted). Changes coalesce: one wake-up
    /// may stand for several, so read [`Runtime::status`] after it.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        crate::support::lock(&self.state)
    }

    /// Makes the running pods match `desired`: new pods start (once `held` gives no reason to
    /// hold them: workload gating released them), removed pods stop within their grace period,
    /// changed pods are stopped and started again from the new spec. Held pods wait with reason
    /// `SchedulingGated` and the hold as their message, and are released by a later call. Pods
    /// that finished (succeeded, failed, evicted) stay finished while their spec is the same.
    pub fn apply(&self, desired: Vec<PodRuntimeSpec>, held: impl Fn(&PodKey) -> Option<String>) {
        let mut state = self.state();
        state.stopping.retain(|p| !p.is_done());
        let mut desired: BTreeMap<PodKey, PodRuntimeSpec> =
            desired.into_iter().map(|s| (s.key.clone(), s)).collect();
        let gone: Vec<PodKey> = state
            .pods
            .keys()
            .filter(|k| !desired.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(h) = state.pods.remove(&key) {
                tracing::info!(pod = %key, "Pod removed; stopping it.");
                h.stop(Instant::now() + h.spec.termination_grace);
                state.stopping.push(h);
            }
        }
        for (key, spec) in std::mem::take(&mut desired) {
            let hold = held(&key);
            let mut previous = None;
            if let Some(h) = state.pods.get(&key) {
                if *h.spec == spec {
                    h.control.send_if_modified(|c| {
                        let changed = c.held != hold;
                        c.held = hold;
                        changed
                    });
                    continue;
                }
                tracing::info!(pod = %key, "Pod changed; replacing it.");
                let h = state.pods.remove(&key).expect("present");
                h.stop(Instant::now() + h.spec.termination_grace);
                previous = Some(h.done.clone());
                state.stopping.push(h);
            } else if let Some(h) = state.stopping.iter().rev().find(|h| h.spec.key == key) {
                // Removed and added again while still stopping: it shares the pod's cgroups
                // and logs, so it starts once the old one is gone.
                previous = Some(h.done.clone());
            }
            let handle = self.start(spec, hold, previous);
            state.pods.insert(key, handle);
        }
    }

    fn start(
        &self,
        spec: PodRuntimeSpec,
        held: Option<String>,
        previous: Option<watch::Receiver<bool>>,
    ) -> PodHandle {
        let spec = Arc::new(spec);
        let waiting = if held.is_none() {
            status::default_waiting(spec.containers.iter().map(|c| c.kind))
        } else {
            "SchedulingGated"
        };
        let status = SharedStatus::new(
            PodStatus {
                key: spec.key.clone(),
                phase: PodPhase::Pending,
                reason: held.is_some().then(|| "SchedulingGated".into()),
                message: held.clone(),
                restart_policy: spec.restart_policy,
                containers: spec
                    .containers
                    .iter()
                    .map(|c| ContainerStatus::new(&c.name, c.kind, waiting))
                    .collect(),
                terminating: false,
            },
            self.changed.clone(),
        );
        let (control_tx, control_rx) = watch::channel(Control { held, stop: None });
        let (done_tx, done_rx) = watch::channel(false);
        let task = PodTask {
            spec: spec.clone(),
            status: status.clone(),
            logs: self.logs.clone(),
            claims: self.claims.clone(),
            backoff: self.config.backoff,
            control: control_rx,
            previous,
            done: done_tx,
        };
        tokio::spawn(task.run());
        PodHandle {
            spec,
            status,
            control: control_tx,
            done: done_rx,
        }
    }

    /// Stops the pod for eviction within `grace`; it ends Failed with reason `Evicted` and is
    /// not restarted while its spec stays the same. False when the pod is unknown.
    pub fn mark_evicted(&self, key: &PodKey, message: &str, grace: Duration) -> bool {
        let state = self.state();
        let Some(h) = state.pods.get(key) else {
            return false;
        };
        h.status.update(|s| s.set_evicted(message));
        tracing::info!(pod = %key, grace_secs = grace.as_secs_f64(), reason = message, "Evicting pod.");
        h.stop(Instant::now() + grace);
        true
    }

    /// Stops every pod, each within the shorter of its own grace period and `grace`, and waits
    /// until all their processes are gone.
    pub async fn stop_all(&self, grace: Duration) {
        let mut dones = Vec::new();
        {
            let state = self.state();
            let now = Instant::now();
            for h in state.pods.values().chain(state.stopping.iter()) {
                h.stop(now + h.spec.termination_grace.min(grace));
                dones.push(h.done.clone());
            }
        }
        for mut d in dones {
            let _ = d.wait_for(|d| *d).await;
        }
        // Each container's supervisor has killed what was left in its cgroups; kill them once
        // more as a whole, so nothing the runtime started outlives it.
        let cgroups: Vec<ContainerCgroups> = {
            let state = self.state();
            state
                .pods
                .values()
                .chain(state.stopping.iter())
                .flat_map(|h| h.spec.containers.iter().map(|c| c.cgroups.clone()))
                .collect()
        };
        for _ in 0..100 {
            if cgroups.iter().map(process::kill_cgroups).sum::<usize>() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!("Processes survive in container cgroups after SIGKILL at shutdown.");
    }

    /// Whether a process of the pod runs in one of its running containers' cgroups (read now:
    /// the pod's admission asks, under node pressure; a snapshot does not read them).
    pub fn has_processes(&self, key: &PodKey) -> bool {
        let state = self.state();
        let Some(h) = state.pods.get(key) else {
            return false;
        };
        let status = h.status.read();
        status
            .containers
            .iter()
            .zip(&h.spec.containers)
            .filter(|(c, _)| matches!(c.state, ContainerState::Running { .. }))
            .any(|(_, spec)| !process::cgroup_pids(&spec.cgroups).is_empty())
    }

    /// A snapshot of every pod, including removed pods still stopping. It reads no cgroup
    /// file: the node takes one at each change of a pod's status, an eviction's among them.
    pub fn status(&self) -> Vec<PodStatus> {
        let mut state = self.state();
        state.stopping.retain(|p| !p.is_done());
        state
            .pods
            .values()
            .chain(state.stopping.iter())
            .map(snapshot)
            .collect()
    }
}

fn snapshot(h: &PodHandle) -> PodStatus {
    let mut s = h.status.read().clone();
    s.phase = status::phase(PhaseInput {
        policy: s.restart_policy,
        containers: &s.containers,
        finished: h.is_done(),
    });
    if s.is_evicted() && h.is_done() {
        s.phase = PodPhase::Failed;
    }
    if s.reason.is_none() {
        s.reason = status::waiting_problem(&s.containers);
    }
    s
}
