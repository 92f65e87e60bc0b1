//! A pod's status as its supervisors and the runtime share it. Every change wakes whoever waits
//! on [`Runtime::changed`](super::Runtime::changed), so a status page can follow a pod as it
//! starts, restarts and ends instead of at its next refresh.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::status::PodStatus;

#[derive(Clone)]
pub(crate) struct SharedStatus {
    status: Arc<Mutex<PodStatus>>,
    changed: Arc<Notify>,
}

impl SharedStatus {
    pub(crate) fn new(status: PodStatus, changed: Arc<Notify>) -> Self {
        Self {
            status: Arc::new(Mutex::new(status)),
            changed,
        }
    }

    /// Changes the status and says so.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut PodStatus) -> R) -> R {
        let r = f(&mut crate::support::lock(&self.status));
        self.notify();
        r
    }

    /// Says the pod changed in a way the status is computed from (its task ended).
    pub(crate) fn notify(&self) {
        // One stored permit: changes that come faster than the reader coalesce.
        self.changed.notify_one();
    }

    pub(crate) fn read(&self) -> MutexGuard<'_, PodStatus> {
        crate::support::lock(&self.status)
    }
}
