//! One pod's life: wait for release by workload gating, run the init containers in order
//! (sidecars started and kept running), then the app containers; on a stop, app containers are
//! terminated first, sidecars after them, all within the pod's grace deadline.

use std::sync::Arc;

use futures::future::join_all;
use tokio::{
    sync::{oneshot, watch},
    time::Instant,
};

use super::{
    backoff::BackoffConfig,
    claims::Claims,
    container::{ContainerCtx, Restart, StopRx, SupervisionEnd, supervise},
    logs::LogDir,
    shared::SharedStatus,
    spec::PodRuntimeSpec,
    status::ContainerState,
};
use crate::policy::pod::{ContainerKind, RestartPolicy};

/// What the runtime tells a pod task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Control {
    /// Why the pod waits (workload gating, admission); `None`: it may start.
    pub(crate) held: Option<String>,
    /// Stop by this deadline (SIGKILL after it).
    pub(crate) stop: Option<Instant>,
}

/// Everything a pod task needs.
pub(crate) struct PodTask {
    pub(crate) spec: Arc<PodRuntimeSpec>,
    pub(crate) status: SharedStatus,
    pub(crate) logs: Arc<LogDir>,
    pub(crate) claims: Claims,
    pub(crate) backoff: BackoffConfig,
    pub(crate) control: watch::Receiver<Control>,
    /// The pod this one replaces: it must be gone before this one starts.
    pub(crate) previous: Option<watch::Receiver<bool>>,
    pub(crate) done: watch::Sender<bool>,
}

impl PodTask {
    pub(crate) async fn run(mut self) {
        if let Some(mut prev) = self.previous.take() {
            let _ = prev.wait_for(|d| *d).await;
        }
        let (apps_tx, apps_rx) = watch::channel(None);
        let mut control = self.control.clone();
        let grace = self.spec.termination_grace;
        let body = body(&self, apps_rx);
        tokio::pin!(body);
        let mut control_open = true;
        loop {
            tokio::select! {
                _ = &mut body => break,
                changed = control.changed(), if control_open => {
                    let deadline = match changed {
                        Ok(()) => control.borrow_and_update().stop,
                        // The runtime is gone: stop within the pod's own grace.
                        Err(_) => {
                            control_open = false;
                            Some(Instant::now() + grace)
                        }
                    };
                    if let Some(d) = deadline {
                        apps_tx.send_if_modified(|s| s.is_none() && { *s = Some(d); true });
                    }
                }
            }
        }
        let stopped = apps_tx.borrow().is_some();
        self.status.update(|s| s.terminating |= stopped);
        let _ = self.done.send(true);
        // The phase also follows from `done`.
        self.status.notify();
    }

    fn ctx(&self, index: usize) -> ContainerCtx {
        ContainerCtx {
            pod_spec: self.spec.clone(),
            index,
            logs: self.logs.clone(),
            claims: self.claims.clone(),
            backoff: self.backoff,
            status: self.status.clone(),
        }
    }

    fn set_waiting(&self, kinds: &[ContainerKind], reason: &str) {
        self.status.update(|s| {
            for c in s.containers.iter_mut().filter(|c| kinds.contains(&c.kind)) {
                if matches!(c.state, ContainerState::Waiting { .. }) {
                    c.state = ContainerState::Waiting {
                        reason: reason.into(),
                        message: None,
                    };
                }
            }
        });
    }

    fn set_reason(&self, reason: Option<&str>) {
        self.status.update(|s| s.reason = reason.map(Into::into));
    }
}

/// The pod's course; returns when it is over (completed, failed or stopped).
async fn body(task: &PodTask, mut stop: StopRx) {
    let mut control = task.control.clone();
    // Held by workload gating until released, its status saying why.
    loop {
        let Some(why) = control.borrow_and_update().held.clone() else {
            break;
        };
        task.status.update(|s| {
            if s.message.as_ref() != Some(&why) {
                s.message = Some(why);
            }
        });
        tokio::select! {
            r = control.changed() => if r.is_err() { return },
            _ = stop.wait_for(Option::is_some) => return,
        }
    }
    task.set_reason(None);
    task.status.update(|s| s.message = None);
    task.set_waiting(
        &[
            ContainerKind::Init,
            ContainerKind::Sidecar,
            ContainerKind::App,
        ],
        super::status::default_waiting(task.spec.containers.iter().map(|c| c.kind)),
    );
    tracing::info!(pod = %task.spec.key, "Pod released; starting its containers.");

    let (sidecar_tx, sidecar_rx) = watch::channel(None);
    let mut sidecars = Vec::new();
    let app_rule = match task.spec.restart_policy {
        RestartPolicy::Always => Restart::Always,
        RestartPolicy::OnFailure => Restart::OnFailure,
        RestartPolicy::Never => Restart::Never,
    };
    // Init containers rerun on failure unless the pod never restarts anything.
    let init_rule = match task.spec.restart_policy {
        RestartPolicy::Never => Restart::Never,
        _ => Restart::OnFailure,
    };
    let mut initialised = true;
    for (i, c) in task.spec.containers.iter().enumerate() {
        match c.kind {
            ContainerKind::App => {}
            ContainerKind::Init => {
                match supervise(task.ctx(i), init_rule, stop.clone(), None).await {
                    SupervisionEnd::Exited(t) if t.succeeded() => {}
                    _ => {
                        initialised = false;
                        break;
                    }
                }
            }
            ContainerKind::Sidecar => {
                let (tx, rx) = oneshot::channel();
                let fut = supervise(task.ctx(i), Restart::Always, sidecar_rx.clone(), Some(tx));
                sidecars.push(tokio::spawn(fut));
                tokio::select! {
                    _ = rx => {}
                    _ = stop.wait_for(Option::is_some) => {
                        initialised = false;
                        break;
                    }
                }
            }
        }
    }
    if initialised && stop.borrow().is_none() {
        let apps = task
            .spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| c.kind == ContainerKind::App)
            .map(|(i, _)| tokio::spawn(supervise(task.ctx(i), app_rule, stop.clone(), None)));
        join_all(apps.collect::<Vec<_>>()).await;
    }
    // Sidecars go last, within the stop deadline when there is one.
    let deadline = stop
        .borrow()
        .unwrap_or_else(|| Instant::now() + task.spec.termination_grace);
    let _ = sidecar_tx.send(Some(deadline));
    join_all(sidecars).await;
    tracing::info!(pod = %task.spec.key, "Pod finished.");
}
