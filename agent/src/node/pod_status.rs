//! Pod and container status as the kubelet reports it (phase, container states with reason and
//! exit code, restart counts), and the phase computation (pkg/kubelet/kubelet_pods.go
//! `getPhase`), kept pure so it is unit-tested.

use std::time::SystemTime;

use serde::Serialize;

use crate::policy::pod::ContainerKind;
use crate::policy::pod::{PodKey, RestartPolicy};

/// `status.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

/// How a container process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Termination {
    /// The exit status; 128 + the signal number when a signal ended it (as runtimes report).
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// `Completed` (exit 0), `Error`, or `StartError` when the command could not be started.
    pub reason: String,
    pub(crate) message: Option<String>,
    pub(crate) started_at: Option<SystemTime>,
    pub finished_at: SystemTime,
}

impl Termination {
    pub(crate) fn succeeded(&self) -> bool {
        self.exit_code == 0 && self.signal.is_none()
    }
}

/// `state` of a container status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ContainerState {
    /// Not running: `PodInitializing`, `SchedulingGated`, `CrashLoopBackOff` (restarting
    /// after the back-off), `CreateContainerError` (could not be created: no cgroup of its own,
    /// its cgroup missing, its log refused; `message` says which).
    Waiting {
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    Running {
        /// The container's main process, where qoslet's runtime started it; `None` in a
        /// cluster, where the kubelet's runtime did.
        pid: Option<u32>,
        started_at: SystemTime,
    },
    Terminated(Termination),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerStatus {
    pub name: String,
    pub(crate) kind: ContainerKind,
    pub state: ContainerState,
    /// The previous termination, kept while the container waits to restart or runs again.
    pub(crate) last_termination: Option<Termination>,
    pub restart_count: u32,
}

impl ContainerStatus {
    pub(crate) fn new(name: &str, kind: ContainerKind, waiting_reason: &str) -> Self {
        Self {
            name: name.to_owned(),
            kind,
            state: ContainerState::Waiting {
                reason: waiting_reason.to_owned(),
                message: None,
            },
            last_termination: None,
            restart_count: 0,
        }
    }

    /// The current termination, else the last one.
    pub fn last_exit(&self) -> Option<&Termination> {
        match &self.state {
            ContainerState::Terminated(t) => Some(t),
            _ => self.last_termination.as_ref(),
        }
    }
}

/// A snapshot of one pod, for the metrics server and `qoslet status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodStatus {
    pub key: PodKey,
    pub phase: PodPhase,
    /// `Evicted`, `SpecError`, `SchedulingGated`, ...; `None` in the ordinary course.
    pub reason: Option<String>,
    pub message: Option<String>,
    pub(crate) restart_policy: RestartPolicy,
    /// Init containers (regular and sidecars) in order, then app containers.
    pub containers: Vec<ContainerStatus>,
    /// Stopping or stopped on request (removed from the desired state, evicted, shut down).
    pub(crate) terminating: bool,
}

impl PodStatus {
    /// The pod is being evicted: reason `Evicted` and the eviction's message.
    pub(crate) fn set_evicted(&mut self, message: &str) {
        self.reason = Some(crate::eviction::action::EVICTED.into());
        self.message = Some(message.into());
    }

    pub(crate) fn is_evicted(&self) -> bool {
        self.reason.as_deref() == Some(crate::eviction::action::EVICTED)
    }
}

/// The reason a container waits before its first start: `PodInitializing` in a pod with init
/// containers (regular or sidecars), else `ContainerCreating` (pkg/kubelet/kubelet_pods.go
/// `convertToAPIContainerStatuses`, `defaultWaitingState`).
pub(crate) fn default_waiting(mut kinds: impl Iterator<Item = ContainerKind>) -> &'static str {
    if kinds.any(|k| k != ContainerKind::App) {
        "PodInitializing"
    } else {
        "ContainerCreating"
    }
}

/// The waiting reasons that say a container is not running because something is wrong, as
/// `kubectl get pods` shows them in place of the phase.
const PROBLEMS: [&str; 3] = [
    "CrashLoopBackOff",
    "CreateContainerError",
    "RunContainerError",
];

/// The first container's waiting reason that is a problem (init containers first, as kubectl
/// reports `Init:CrashLoopBackOff`); `None` when no container is held by one. The kubelet's
/// phase stays `Running` for a pod whose containers restart under `Always` (its `getPhase`: "All
/// containers are in the process of restarting"); this reason is what tells such a pod apart.
pub(crate) fn waiting_problem(containers: &[ContainerStatus]) -> Option<String> {
    containers.iter().find_map(|c| match &c.state {
        ContainerState::Waiting { reason, .. } if PROBLEMS.contains(&reason.as_str()) => {
            Some(if c.kind == ContainerKind::App {
                reason.clone()
            } else {
                format!("Init:{reason}")
            })
        }
        _ => None,
    })
}

/// What the phase depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PhaseInput<'a> {
    pub(crate) policy: RestartPolicy,
    pub(crate) containers: &'a [ContainerStatus],
    /// The pod's supervisor has finished: nothing will be restarted any more.
    pub(crate) finished: bool,
}

/// The pod phase from its containers, as the kubelet's `getPhase` computes it.
pub(crate) fn phase(input: PhaseInput<'_>) -> PodPhase {
    // Once nothing restarts, a pod ends like a `Never` pod whatever its policy says.
    let policy = if input.finished {
        RestartPolicy::Never
    } else {
        input.policy
    };
    let mut pending_init = 0;
    let mut init_failed = false;
    for c in input
        .containers
        .iter()
        .filter(|c| c.kind == ContainerKind::Init)
    {
        match c.last_exit() {
            Some(t) if t.succeeded() && matches!(c.state, ContainerState::Terminated(_)) => {}
            Some(t) if !t.succeeded() && policy == RestartPolicy::Never => init_failed = true,
            _ => pending_init += 1,
        }
    }
    if init_failed {
        return PodPhase::Failed;
    }
    let (mut waiting, mut running, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in input
        .containers
        .iter()
        .filter(|c| c.kind == ContainerKind::App)
    {
        match &c.state {
            ContainerState::Running { .. } => running += 1,
            ContainerState::Terminated(t) => {
                stopped += 1;
                if t.succeeded() {
                    succeeded += 1;
                }
            }
            ContainerState::Waiting { .. } if c.last_termination.is_some() => stopped += 1,
            ContainerState::Waiting { .. } => waiting += 1,
        }
    }
    if pending_init > 0 || waiting > 0 {
        // An app container that never ran keeps the pod pending, unless a finished pod never
        // got to start it (its init containers or the pod were stopped).
        return if input.finished {
            PodPhase::Failed
        } else {
            PodPhase::Pending
        };
    }
    if running > 0 {
        return PodPhase::Running;
    }
    match policy {
        RestartPolicy::Always => PodPhase::Running,
        _ if stopped == succeeded => PodPhase::Succeeded,
        RestartPolicy::Never => PodPhase::Failed,
        RestartPolicy::OnFailure => PodPhase::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(code: i32) -> Termination {
        Termination {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_at: None,
            finished_at: SystemTime::UNIX_EPOCH,
        }
    }

    fn c(kind: ContainerKind, state: ContainerState, last: Option<i32>) -> ContainerStatus {
        ContainerStatus {
            state,
            last_termination: last.map(term),
            ..ContainerStatus::new("c", kind, "")
        }
    }

    fn waiting() -> ContainerState {
        ContainerState::Waiting {
            reason: "PodInitializing".into(),
            message: None,
        }
    }

    fn running() -> ContainerState {
        ContainerState::Running {
            pid: Some(1),
            started_at: SystemTime::UNIX_EPOCH,
        }
    }

    fn done(code: i32) -> ContainerState {
        ContainerState::Terminated(term(code))
    }

    fn ph(policy: RestartPolicy, finished: bool, cs: &[ContainerStatus]) -> PodPhase {
        phase(PhaseInput {
            policy,
            containers: cs,
            finished,
        })
    }

    use ContainerKind::{App, Init, Sidecar};
    use RestartPolicy::{Always, Never, OnFailure};

    #[test]
    fn pending_until_init_containers_succeed() {
        let cs = [c(Init, running(), None), c(App, waiting(), None)];
        assert_eq!(ph(Always, false, &cs), PodPhase::Pending);
        let cs = [c(Init, done(0), None), c(App, running(), None)];
        assert_eq!(ph(Always, false, &cs), PodPhase::Running);
    }

    #[test]
    fn a_failed_init_container_fails_only_never_pods() {
        let cs = [c(Init, done(1), None), c(App, waiting(), None)];
        assert_eq!(ph(Never, false, &cs), PodPhase::Failed);
        assert_eq!(ph(OnFailure, false, &cs), PodPhase::Pending);
    }

    #[test]
    fn completion_depends_on_the_policy() {
        let ok = [c(Sidecar, running(), None), c(App, done(0), None)];
        assert_eq!(ph(Never, false, &ok), PodPhase::Succeeded);
        assert_eq!(ph(OnFailure, false, &ok), PodPhase::Succeeded);
        assert_eq!(ph(Always, false, &ok), PodPhase::Running);
        let bad = [c(App, done(0), None), c(App, done(2), None)];
        assert_eq!(ph(Never, false, &bad), PodPhase::Failed);
        assert_eq!(ph(OnFailure, false, &bad), PodPhase::Running);
    }

    #[test]
    fn a_container_in_back_off_keeps_the_pod_running() {
        let cs = [c(App, waiting(), Some(1))];
        assert_eq!(ph(OnFailure, false, &cs), PodPhase::Running);
    }

    #[test]
    fn a_finished_pod_ends_as_never_would() {
        let cs = [c(App, done(137), None)];
        assert_eq!(ph(Always, true, &cs), PodPhase::Failed);
        let cs = [c(App, done(0), None)];
        assert_eq!(ph(Always, true, &cs), PodPhase::Succeeded);
        let cs = [c(Init, done(143), None), c(App, waiting(), None)];
        assert_eq!(ph(Always, true, &cs), PodPhase::Failed);
    }

    #[test]
    fn containers_wait_in_pod_initializing_only_behind_init_containers() {
        assert_eq!(default_waiting([App].into_iter()), "ContainerCreating");
        assert_eq!(
            default_waiting([Sidecar, App].into_iter()),
            "PodInitializing"
        );
        assert_eq!(default_waiting([Init, App].into_iter()), "PodInitializing");
    }
}
