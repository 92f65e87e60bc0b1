//! The node's eviction action: the executor hears of the eviction first (so it does not restart
//! the pod, and reports it Failed with reason `Evicted`), then the mode's action does the work
//! (the cgroup kill; in a cluster also the API's eviction).

use std::sync::Arc;

use super::seams::PodExecutor;
use crate::eviction::{EvictionAction, EvictionRequest, Outcome, action::ActionError};

pub struct ExecutorEviction<E, A> {
    executor: Arc<E>,
    action: A,
}

impl<E, A> ExecutorEviction<E, A> {
    pub fn new(executor: Arc<E>, action: A) -> Self {
        Self { executor, action }
    }
}

impl<E: PodExecutor, A: EvictionAction> EvictionAction for ExecutorEviction<E, A> {
    async fn evict(&self, req: &EvictionRequest) -> Result<Outcome, ActionError> {
        self.executor
            .mark_evicted(&req.pod, &req.message, req.grace);
        self.action.evict(req).await
    }
}
