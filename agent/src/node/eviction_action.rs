//! The node's eviction action. Before anything is killed, the eviction is written to the state
//! file (so a crash from here on never starts the pod again) and the executor hears of it (so it
//! does not restart the pod, and reports it Failed with reason `Evicted`); then the mode's action
//! does the work (the cgroup kill; in a cluster also the API's eviction).

use std::sync::{Arc, Mutex};

use super::{seams::PodExecutor, state::StateFile};
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

impl<E: PodExecutor, A: EvictionAction> EvictionAction for ExecutorEviction<E, A> {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        {
            let mut state = crate::lock(&self.state);
            state.record_evicted(&req.pod, req.revision, &req.message);
            // Page cache only: no disk wait before the kill (the node syncs it right after).
            if let Err(e) = state.save(false) {
                tracing::warn!(pod = %req.pod, error = %e, "Could not record the eviction before acting; a crash now would start the pod again.");
            }
        }
        self.executor
            .mark_evicted(&req.pod, &req.message, req.grace);
        self.action.evict(req).await
    }
}
