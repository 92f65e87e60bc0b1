//! Crash recovery at start, where qoslet runs the pods itself: what an earlier run left running
//! is stopped, its cgroups removed, and the evictions it recorded only on a cgroup read back.

use std::{os::fd::AsFd as _, sync::Arc, time::Duration};

use tracing::{info, warn};

use super::trees;
use crate::{
    cgroup::{self, CgroupBeneath, CgroupFs},
    eviction::{CgroupKill, EvictionAction, EvictionRequest, PodCgroups},
    persist::{EvictionMark, StateFile},
    policy::{pod::PodKey, settings::CgroupDriver},
};

/// After a crash (SIGKILL, power loss) the earlier run's pods may still run in the cgroups it
/// created, unsupervised: qoslet cannot adopt a process it did not start (it would never learn
/// its exit status), so it stops them and removes their cgroups; the pass then starts the pods
/// again. Evicted pods stay evicted: that is in the state file, or (after a crash between an
/// eviction's kill and the state file's write) in the [`EvictionMark`] on the pod's cgroup v2
/// directory, read back here before the cgroup is removed. A mark counts only on the cgroup of
/// the pod it names: a pod's processes that can write their own cgroup's attributes cannot keep
/// another pod from starting again.
pub(super) async fn stop_leftovers(
    fs: &Arc<CgroupFs>,
    driver: CgroupDriver,
    persisted: &mut StateFile,
) {
    let mut paths = persisted.created_cgroups();
    if paths.is_empty() {
        return;
    }
    paths.sort_by_key(|p| std::cmp::Reverse(p.depth()));
    let procs_tree = fs.mounts().procs_tree();
    let unified = trees::unified_tree(fs.trees());
    let mut stopped = 0;
    for p in &paths {
        let dir = |tree| CgroupBeneath::new(fs, tree, p);
        let cgroups = PodCgroups {
            procs: procs_tree.map(dir).into_iter().collect(),
            unified: unified.map(dir),
        };
        if !cgroups
            .procs
            .iter()
            .any(|d| d.read_procs().is_ok_and(|v| !v.is_empty()))
        {
            continue;
        }
        let req = EvictionRequest {
            pod: PodKey {
                namespace: String::new(),
                name: p.to_string(),
                uid: String::new(),
            },
            cgroups,
            grace: Duration::ZERO,
            message: "left by an earlier run of qoslet".into(),
            annotations: Default::default(),
            seen: Default::default(),
            signal: String::new(),
            hard: true,
            unit: None,
            revision: 0,
        };
        match CgroupKill.evict(&req).await {
            Ok(_) => stopped += 1,
            Err(e) => {
                warn!(cgroup = %p, error = %e, "Could not stop a process left by an earlier run.");
            }
        }
    }
    let mut recovered = 0;
    for (t, p) in unified
        .iter()
        .flat_map(|&t| paths.iter().map(move |p| (t, p)))
    {
        let Some(mark) = fs
            .open_dir_fd(t, p)
            .ok()
            .and_then(|d| EvictionMark::read(d.as_fd()))
        else {
            continue;
        };
        if cgroup::name::check_pod_component(p, driver, &mark.uid).is_err() {
            warn!(cgroup = %p, uid = %mark.uid, "An eviction mark names a pod other than its cgroup's; ignored.");
            continue;
        }
        persisted.record_evicted(&mark.key(), mark.spec, &mark.message, mark.at);
        recovered += 1;
    }
    let mut removed = 0;
    for p in &paths {
        let gone = fs.trees().map(|t| fs.rmdir(t, p)).all(|r| r.is_ok());
        removed += usize::from(gone);
    }
    info!(
        cgroups = paths.len(),
        stopped,
        removed,
        recovered,
        "Stopped what an earlier run of qoslet left running and removed its cgroups."
    );
    persisted.set_created_cgroups(&Default::default());
}
