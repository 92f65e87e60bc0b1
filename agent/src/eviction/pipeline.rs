//! One eviction, in the order both modes share; the manager (`manager.rs`) decides and reports,
//! this runs what is decided:
//!
//! 1. **mark** the pod's cgroup v2 directory ([`EvictionMark`], one syscall), which a restart
//!    after a crash reads back (`node/leftovers.rs` `stop_leftovers`, `cluster/marks.rs`); a pod
//!    without a v2 directory cannot be marked, and is recorded in the state file first instead;
//! 2. **stop** the offender: the mode's one step, an [`EvictionAction`] (standalone:
//!    [`CgroupKill`](super::CgroupKill); cluster mode: `cluster::ApiEviction`, the freeze, the
//!    API's writes and the kill). Its future is polled first and runs up to its first wait before
//!    anything below starts;
//! 3. beside it, **hold** the pod where it runs ([`HoldEvicted`], the node's executor: it does
//!    not start the pod again and reports it Failed with reason `Evicted`);
//! 4. **record** it in the state file ([`StateFile`]): a marked pod once the mode's step is done
//!    (standalone: its processes gone), an unmarked one beside the hold; the sync to the disk
//!    follows on a blocking thread, which nothing waits for.
//!
//! The [`Outcome`] goes back to the manager, which reports the decision (metrics, status, the
//! node's events). The evicted set lives in the state file alone: the manager keeps its own
//! evictions only until the node's next inventory leaves them out.

use std::{
    os::fd::AsFd as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{EvictionAction, EvictionRequest, Outcome, action::ActionError};
use crate::{
    persist::{EvictionMark, StateFile, Unsynced, unix_now},
    policy::pod::PodKey,
};

/// Whoever runs the pods, in an eviction: it must not start the evicted pod again, and it reports
/// it Failed with reason `Evicted` (the node's executor, `node::PodExecutor`).
pub(crate) trait HoldEvicted: Send + Sync {
    /// The pod is being evicted, within `grace`.
    fn hold(&self, pod: &PodKey, message: &str, grace: Duration);

    /// Whether [`Self::hold`] itself signals the pod's processes (qoslet's own runtime stops an
    /// evicted pod at once), so the eviction's first signal may be there.
    fn signals_on_hold(&self) -> bool;
}

/// The eviction pipeline: the mode's step `S`, the runner `H`, the state file.
pub(crate) struct Pipeline<S, H> {
    stop: S,
    runner: Arc<H>,
    records: Arc<Mutex<StateFile>>,
}

impl<S, H> Pipeline<S, H> {
    pub(crate) fn new(stop: S, runner: Arc<H>, records: Arc<Mutex<StateFile>>) -> Self {
        Self {
            stop,
            runner,
            records,
        }
    }
}

/// Records the eviction (at `at`, Unix seconds) in the state file, in the page cache; what is
/// left to sync.
fn record(records: &Mutex<StateFile>, req: &EvictionRequest, at: u64) -> Option<Unsynced> {
    let mut records = crate::support::lock(records);
    records.record_evicted(&req.pod, req.revision, &req.message, at);
    records.write().unwrap_or_else(|e| {
        tracing::warn!(pod = %req.pod, error = %e, "Could not write the eviction to the state file.");
        None
    })
}

/// A sync that takes this long is said: the disk, not qoslet, is slow.
const SLOW_SYNC: Duration = Duration::from_secs(1);

/// Waits for the disk to hold the record, on a blocking thread and without the state's lock;
/// nothing waits for it (the mark, or the page cache where there is none, covers the time until
/// then). The eviction and its report used to wait for it: an fsync waits for the journal,
/// which a build writing beside it can fill.
fn sync_detached(records: Arc<Mutex<StateFile>>, pod: PodKey, unsynced: Unsynced) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn_blocking(move || {
        let started = Instant::now();
        match unsynced.sync() {
            Ok(()) => crate::support::lock(&records).synced(&unsynced),
            Err(e) => {
                tracing::warn!(pod = %pod, error = %e, "Could not sync the eviction to the state file; the next save tries again.");
            }
        }
        let took = started.elapsed();
        if took >= SLOW_SYNC {
            tracing::warn!(pod = %pod, seconds = took.as_secs_f64(), "The state file took long to reach the disk.");
        }
    });
}

impl<S: EvictionAction, H: HoldEvicted> EvictionAction for Pipeline<S, H> {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        let at = unix_now();
        let marked = req.cgroups.unified.as_ref().is_some_and(|dir| {
            let mark = EvictionMark::new(&req.pod, req.revision, &req.message, at)
                .with_annotations(&req.annotations);
            dir.open()
                .and_then(|fd| mark.write(fd.as_fd()))
                .inspect_err(|e| tracing::debug!(pod = %req.pod, error = %e, "Could not mark the pod's cgroup; the state file is written before the mode's action."))
                .is_ok()
        });
        if !marked {
            // Page cache only: no disk wait before the action (synced right after it starts).
            record(&self.records, req, at);
        }
        let record_and_sync = || {
            if let Some(unsynced) = record(&self.records, req, at) {
                sync_detached(self.records.clone(), req.pod.clone(), unsynced);
            }
        };
        let hold = async {
            let held = Instant::now();
            self.runner.hold(&req.pod, &req.message, req.grace);
            if !marked {
                record_and_sync();
            }
            held
        };
        // `join` polls the mode's step first: its kill or freeze goes out before the rest starts.
        let (outcome, held) = futures::future::join(self.stop.evict(req), hold).await;
        // A marked pod's record waits for the step (standalone: until its processes are gone):
        // the mark covers a crash until then, and the write and its sync would run beside the
        // victim's exit.
        if marked {
            record_and_sync();
        }
        let mut outcome = outcome?;
        if self.runner.signals_on_hold() {
            outcome.first_signal_at = Some(outcome.first_signal_at.map_or(held, |t| t.min(held)));
        }
        Ok(outcome)
    }

    fn awaiting(&self) -> Option<PodKey> {
        self.stop.awaiting()
    }
}
