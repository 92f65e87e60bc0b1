//! Supervising one container: start it, wait for it, restart it under its rule with back-off,
//! and terminate it gracefully (SIGTERM, the grace period, then SIGKILL to every process of its
//! cgroups until none is left).

use std::{
    fs::File,
    os::unix::process::ExitStatusExt as _,
    path::PathBuf,
    process::ExitStatus,
    sync::Arc,
    time::{Duration, SystemTime},
};

use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    process::Child,
    sync::{oneshot, watch},
    time::{Instant, sleep, sleep_until},
};

use super::{
    backoff::{Backoff, BackoffConfig},
    claims::{Claim, Claims, Held},
    logs::LogDir,
    process::{self, ProcessError},
    shared::SharedStatus,
    spec::{ContainerSpec, PodRuntimeSpec},
    status::{ContainerState, Termination},
};
use crate::policy::pod::PodKey;

/// How long the final SIGKILL sweep may take before the runtime gives up and reports it.
const SWEEP_LIMIT: Duration = Duration::from_secs(10);

/// When a container restarts after its process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restart {
    Always,
    OnFailure,
    Never,
}

/// How supervision ended.
#[derive(Debug, Clone)]
pub(crate) enum SupervisionEnd {
    /// The process ended and is not restarted.
    Exited(Termination),
    /// A stop was requested.
    Stopped,
}

/// Why waiting for a running process ended.
enum Ended {
    Exited(Option<ExitStatus>),
    Stop(Instant),
}

/// A stop request: the deadline by which SIGKILL follows SIGTERM.
pub(crate) type StopRx = watch::Receiver<Option<Instant>>;

/// What a supervisor needs besides its stop channel.
#[derive(Clone)]
pub(crate) struct ContainerCtx {
    /// The pod's spec, shared with its task and the runtime's handle, not copied per container.
    pub(crate) pod_spec: Arc<PodRuntimeSpec>,
    /// The container's position in `PodStatus::containers` and in the pod's spec.
    pub(crate) index: usize,
    pub(crate) logs: Arc<LogDir>,
    pub(crate) claims: Claims,
    pub(crate) backoff: BackoffConfig,
    pub(crate) status: SharedStatus,
}

impl ContainerCtx {
    pub(crate) fn pod(&self) -> &PodKey {
        &self.pod_spec.key
    }

    pub(crate) fn spec(&self) -> &ContainerSpec {
        &self.pod_spec.containers[self.index]
    }

    fn update(&self, f: impl FnOnce(&mut super::status::ContainerStatus)) {
        self.status.update(|s| {
            if let Some(c) = s.containers.get_mut(self.index) {
                f(c);
            }
        });
    }
}

/// Runs the container until it ends without restart or a stop is requested. `started` is told
/// when the first process is running (sidecars gate the next init container on it).
pub(crate) async fn supervise(
    ctx: ContainerCtx,
    rule: Restart,
    mut stop: StopRx,
    mut started: Option<oneshot::Sender<()>>,
) -> SupervisionEnd {
    let mut backoff = Backoff::new(ctx.backoff);
    let mut restarts: u32 = 0;
    let mut held: Option<Held> = None;
    let mut last_create_error = String::new();
    loop {
        if stop.borrow().is_some() {
            return SupervisionEnd::Stopped;
        }
        let started_at = SystemTime::now();
        let run_start = Instant::now();
        let spawned = create(&ctx, &mut held, restarts)
            .and_then(|(log, path)| process::spawn(ctx.spec(), log, &path));
        let termination = match spawned {
            // The container could not be made (no cgroup of its own, its cgroup missing, its log
            // refused): it never ran, so it waits, and is tried again after the back-off.
            Err(e) if e.is_create_error() => {
                let message = e.to_string();
                if message != last_create_error {
                    tracing::warn!(pod = %ctx.pod(), container = %ctx.spec().name, error = %message, "Container not created; retrying after the back-off.");
                    last_create_error = message.clone();
                }
                ctx.update(|c| {
                    c.state = ContainerState::Waiting {
                        reason: "CreateContainerError".into(),
                        message: Some(message),
                    };
                });
                let delay = backoff.next_delay(Duration::ZERO);
                tokio::select! {
                    _ = sleep(delay) => {}
                    _ = stop.wait_for(Option::is_some) => return SupervisionEnd::Stopped,
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(pod = %ctx.pod(), container = %ctx.spec().name, error = %e, "Container failed to start.");
                Termination {
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    message: Some(e.to_string()),
                    started_at: None,
                    finished_at: SystemTime::now(),
                }
            }
            Ok(mut child) => {
                let pid = child.id().unwrap_or_default();
                ctx.update(|c| {
                    c.state = ContainerState::Running {
                        pid: Some(pid),
                        started_at,
                    }
                });
                tracing::info!(pod = %ctx.pod(), container = %ctx.spec().name, pid, restarts, "Container started.");
                if let Some(tx) = started.take() {
                    let _ = tx.send(());
                }
                let ended = tokio::select! {
                    st = child.wait() => Ended::Exited(st.ok()),
                    r = stop.wait_for(Option::is_some) => {
                        Ended::Stop(r.ok().and_then(|d| *d).unwrap_or_else(Instant::now))
                    }
                };
                let exit = match ended {
                    Ended::Exited(st) => {
                        // The main process is gone: like a runtime whose container init died,
                        // kill whatever it left in the container's cgroups.
                        sweep(&ctx).await;
                        st
                    }
                    Ended::Stop(deadline) => {
                        let st = terminate(&ctx, &mut child, deadline).await;
                        let t = termination(st, started_at);
                        tracing::info!(pod = %ctx.pod(), container = %ctx.spec().name, exit_code = t.exit_code, signal = ?t.signal, "Container stopped.");
                        ctx.update(|c| c.state = ContainerState::Terminated(t));
                        return SupervisionEnd::Stopped;
                    }
                };
                termination(exit, started_at)
            }
        };
        tracing::info!(pod = %ctx.pod(), container = %ctx.spec().name, exit_code = termination.exit_code, signal = ?termination.signal, reason = %termination.reason, "Container exited.");
        ctx.update(|c| c.state = ContainerState::Terminated(termination.clone()));
        let again = match rule {
            Restart::Always => true,
            Restart::OnFailure => !termination.succeeded(),
            Restart::Never => false,
        };
        if !again {
            return SupervisionEnd::Exited(termination);
        }
        let delay = backoff.next_delay(run_start.elapsed());
        ctx.update(|c| {
            c.last_termination = Some(termination);
            c.state = ContainerState::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: None,
            };
        });
        tokio::select! {
            _ = sleep(delay) => {}
            _ = stop.wait_for(Option::is_some) => return SupervisionEnd::Stopped,
        }
        restarts += 1;
        ctx.update(|c| c.restart_count = restarts);
    }
}

/// The container's claims (taken once, held until supervision ends) and the log file of this
/// run.
fn create(
    ctx: &ContainerCtx,
    held: &mut Option<Held>,
    restart: u32,
) -> Result<(File, PathBuf), ProcessError> {
    if ctx.spec().cgroups.dirs.is_empty() {
        return Err(ProcessError::NoCgroup);
    }
    if held.is_none() {
        let log_dir = ctx.logs.container_dir(ctx.pod(), &ctx.spec().name)?;
        let mut wanted: Vec<Claim> = ctx
            .spec()
            .cgroups
            .dirs
            .iter()
            .map(|d| Claim::Cgroup(d.display()))
            .collect();
        wanted.push(Claim::Log(log_dir));
        *held = Some(ctx.claims.take(wanted).map_err(|c| match c {
            Claim::Cgroup(path) => ProcessError::SharedCgroup { path },
            Claim::Log(path) => ProcessError::SharedLog { path },
        })?);
    }
    Ok(ctx.logs.create(ctx.pod(), &ctx.spec().name, restart)?)
}

/// SIGTERM to the container's processes, then SIGKILL to all of them at `deadline`.
async fn terminate(ctx: &ContainerCtx, child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    signal(ctx, child, Signal::SIGTERM);
    tokio::select! {
        st = child.wait() => {
            sweep(ctx).await;
            return st.ok();
        }
        _ = sleep_until(deadline) => {}
    }
    tracing::info!(pod = %ctx.pod(), container = %ctx.spec().name, "Grace period over; killing the container.");
    signal(ctx, child, Signal::SIGKILL);
    let st = child.wait().await.ok();
    sweep(ctx).await;
    st
}

/// Signals every process in the container's cgroups, and the main process when the container
/// has no cgroups (it is our unreaped child, so its pid cannot have been reused).
fn signal(ctx: &ContainerCtx, child: &Child, sig: Signal) {
    process::signal_cgroup(&ctx.spec().cgroups, sig);
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

/// SIGKILL to every process left in the container's cgroups, repeated until none is left.
async fn sweep(ctx: &ContainerCtx) {
    let limit = Instant::now() + SWEEP_LIMIT;
    while process::signal_cgroup(&ctx.spec().cgroups, Signal::SIGKILL) > 0 {
        if Instant::now() > limit {
            tracing::warn!(pod = %ctx.pod(), container = %ctx.spec().name, "Processes survive in the container's cgroups after SIGKILL.");
            return;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

fn termination(st: Option<ExitStatus>, started_at: SystemTime) -> Termination {
    let (exit_code, signal) = match st {
        Some(st) => match (st.code(), st.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            (None, None) => (255, None),
        },
        None => (255, None),
    };
    Termination {
        exit_code,
        signal,
        reason: if exit_code == 0 && signal.is_none() {
            "Completed".into()
        } else {
            "Error".into()
        },
        message: None,
        started_at: Some(started_at),
        finished_at: SystemTime::now(),
    }
}
