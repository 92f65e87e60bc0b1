//! The standalone node's eviction action: the runtime's bookkeeping first, then the cgroup kill.

use std::sync::Arc;

use crate::{
    eviction::{EvictionAction, Outcome, PodCgroups, PodKey as EvictionKey, action::ActionError},
    runtime::Runtime,
};

/// The eviction action of the standalone node: the runtime marks the pod Evicted (so it is not
/// restarted and its phase is Failed) and the cgroup-wide kill makes sure nothing survives.
pub struct RuntimeEviction<A> {
    runtime: Arc<Runtime>,
    kill: A,
}

impl<A> RuntimeEviction<A> {
    pub fn new(runtime: Arc<Runtime>, kill: A) -> Self {
        Self { runtime, kill }
    }
}

impl<A: EvictionAction> EvictionAction for RuntimeEviction<A> {
    async fn evict(
        &self,
        pod: &EvictionKey,
        cgroups: &PodCgroups,
        grace: std::time::Duration,
        message: &str,
    ) -> Result<Outcome, ActionError> {
        let key = self
            .runtime
            .status()
            .into_iter()
            .map(|s| s.key)
            .find(|k| k.namespace == pod.namespace && k.name == pod.name);
        if let Some(k) = &key {
            self.runtime.mark_evicted(k, message, grace);
        }
        self.kill.evict(pod, cgroups, grace, message).await
    }
}
