//! The node's eviction action: the kill first, the bookkeeping after it.
//!
//! Where the pod has a cgroup v2 directory the only step before the mode's action (the cgroup
//! kill; in a cluster also the API's eviction) is an [`EvictionMark`] on that directory, one
//! syscall, which a restart after a crash reads back (`run.rs` `stop_leftovers`). The executor
//! hears of the eviction (so it does not restart the pod, and reports it Failed with reason
//! `Evicted`) and the state file is written, synced, while the action waits for the pod's
//! processes to go: the action's future is polled first, and runs up to its first wait before
//! anything else (standalone: the kill; cluster mode: the freeze, then the wait for the pod's
//! status). A pod without a v2 directory cannot be marked: its eviction is written to the state
//! file before the action, as before.

use std::{
    os::fd::AsFd as _,
    sync::{Arc, Mutex},
};

use super::{
    seams::PodExecutor,
    state::{EvictionMark, StateFile, unix_now},
};
use crate::eviction::{EvictionAction, EvictionRequest, Outcome, action::ActionError};

pub struct ExecutorEviction<E, A> {
    executor: Arc<E>,
    action: A,
    state: Arc<Mutex<StateFile>>,
}

impl<E, A> ExecutorEviction<E, A> {
    pub fn new(executor: Arc<E>, action: A, state: Arc<Mutex<StateFile>>) -> Self {
        Self {
            executor,
            action,
            state,
        }
    }
}

/// Records the eviction (at `at`, Unix seconds) in the state file; `durable` waits for the disk.
fn record(state: &Mutex<StateFile>, req: &EvictionRequest, at: u64, durable: bool) {
    let mut state = crate::lock(state);
    state.record_evicted(&req.pod, req.revision, &req.message, at);
    if let Err(e) = state.save(durable) {
        tracing::warn!(pod = %req.pod, error = %e, "Could not write the eviction to the state file.");
    }
}

impl<E: PodExecutor, A: EvictionAction> EvictionAction for ExecutorEviction<E, A> {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        let at = unix_now();
        let marked = req.cgroups.unified.as_ref().is_some_and(|dir| {
            let mark = EvictionMark::new(&req.pod, req.revision, &req.message, at)
                .with_annotations(&req.annotations);
            dir.open()
                .and_then(|fd| mark.write(fd.as_fd()))
                .inspect_err(|e| tracing::debug!(pod = %req.pod, error = %e, "Could not mark the pod's cgroup; the state file is written before the kill."))
                .is_ok()
        });
        if !marked {
            // Page cache only: no disk wait before the kill (the node syncs it right after).
            record(&self.state, req, at, false);
        }
        let bookkeeping = async {
            // The executor's own stop may signal the pod too (the standalone runtime does).
            let told = std::time::Instant::now();
            self.executor
                .mark_evicted(&req.pod, &req.message, req.grace);
            if marked {
                let (state, req) = (self.state.clone(), req.clone());
                // fsync off the runtime's threads; the mark covers the time until it is done.
                let _ = tokio::task::spawn_blocking(move || record(&state, &req, at, true)).await;
            }
            told
        };
        // `join` polls the action first: its kill goes out before the bookkeeping starts.
        let (outcome, told) = futures::future::join(self.action.evict(req), bookkeeping).await;
        let mut outcome = outcome?;
        if self.executor.runner().signals_on_evict() {
            outcome.first_signal_at = Some(outcome.first_signal_at.map_or(told, |t| t.min(told)));
        }
        Ok(outcome)
    }

    fn awaiting(&self) -> Option<crate::policy::pod::PodKey> {
        self.action.awaiting()
    }
}
