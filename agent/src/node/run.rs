//! The node's run loop: everything a mode hands in (source, executor, eviction action) wired to
//! the cgroups, the sensors, the eviction manager and the HTTP server, until a signal; then a
//! drain (the pass or eviction in progress finishes, bounded by the grace period), the pods
//! stopped and the cgroups qoslet created removed.
//!
//! Threading (docs/architecture.md, "Threads"): one task owns the node and runs every pass;
//! the eviction manager, the memory watcher, the sensors' readers and the HTTP server run on
//! their own tasks and reach the node through channels only.

use std::sync::Arc;

use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{info, warn};

use super::{
    SensorControl,
    app::{App, NodeError, RunConfig},
    seams::{PodExecutor, PodSource},
};
use crate::{
    cgroup::{self, Mode},
    eviction::EvictionAction,
    hub::AgentState,
    hub::metrics::SensorLabels,
    sensors::{SensorEvent, SensorMode, Sensors, SensorsConfig},
};

/// Runs the node until SIGINT, SIGTERM or SIGHUP (`signals`, which the mode made at its start
/// and watched until now); then drains and stops.
pub(crate) async fn run<S, E, A>(
    cfg: RunConfig,
    source: S,
    executor: Arc<E>,
    action: A,
    mut signals: Signals,
) -> Result<(), NodeError>
where
    S: PodSource,
    E: PodExecutor,
    A: EvictionAction + 'static,
{
    let enforce = cfg.mode == Mode::Enforce;
    if enforce && !cgroup::oom::can_lower_scores() {
        warn!(
            "qoslet lacks CAP_SYS_RESOURCE: negative oom_score_adj (Guaranteed pods' -997, qoslet's own -999) cannot be set; give the DaemonSet that capability."
        );
    }
    if enforce && let Err(e) = cgroup::set_own_oom_score() {
        warn!(error = %e, "Could not set qoslet's own oom_score_adj to -999.");
    }
    let ebpf = SensorsConfig::from(&cfg.qc.ebpf);
    let sensors = move |state: &AgentState| {
        let (sensors, events) = Sensors::start(ebpf);
        report_sensors(state, &sensors);
        release_freed_memory();
        (sensors, events)
    };
    drive(cfg, source, executor, action, sensors, async move {
        signals.next().await
    })
    .await
}

/// The loop of [`run`] with the machine's parts handed in: `sensors` starts the sensors once the
/// agent's state exists (the kernel's, or a fake), and `stop` resolves with the reason the node
/// stops (a signal). The node's tests run it over a cgroup tree in a temporary directory.
pub(super) async fn drive<S, E, A, C>(
    cfg: RunConfig,
    source: S,
    executor: Arc<E>,
    action: A,
    sensors: impl FnOnce(&AgentState) -> (C, mpsc::Receiver<SensorEvent>),
    stop: impl Future<Output = &'static str>,
) -> Result<(), NodeError>
where
    S: PodSource,
    E: PodExecutor,
    A: EvictionAction + 'static,
    C: SensorControl,
{
    let mut app = App::build(cfg, source, executor, action, sensors).await?;
    app.first_pass();
    let signal = app.run_until(stop).await;
    info!(signal, "Stopping on a signal.");
    app.shutdown().await;
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP: each stops the node the same way. Made once, at the mode's start,
/// and handed to [`run`]: tokio installs the handler when a `Signal` is made, and a signal that
/// comes while none exists is not delivered to one made later (without any, the kernel's
/// default ends the process at once, with no log line). One that comes before [`run`] asks
/// is kept until then.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Must run inside a tokio runtime.
    pub(crate) fn new() -> Result<Self, NodeError> {
        let watch = |kind, name| {
            signal(kind).map_err(|source| NodeError::Signal {
                signal: name,
                source,
            })
        };
        Ok(Self {
            int: watch(SignalKind::interrupt(), "SIGINT")?,
            term: watch(SignalKind::terminate(), "SIGTERM")?,
            hup: watch(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// The next of the three to come: its name.
    pub(crate) async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// Loading the sensors parses the kernel's BTF and leaves its freed memory scattered in the heap,
/// which glibc keeps resident; hand whole free pages back to the kernel once.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn report_sensors(state: &AgentState, sensors: &Sensors) {
    let mut active = Vec::new();
    for st in sensors.statuses() {
        let on = st.mode != SensorMode::Off;
        if on {
            active.push(format!("{} ({})", st.name, st.source));
        }
        state
            .metrics
            .sensor_active
            .get_or_create(&SensorLabels {
                sensor: st.name.into(),
                source: st.source.clone(),
            })
            .set(on.into());
    }
    state.status.update(|s| s.node.sensors = active.clone());
    state.readiness.set("sensors", true, active.join(", "));
}
