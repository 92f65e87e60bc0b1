//! qoslet's process runtime as the node's [`PodExecutor`]: it creates the container cgroups
//! (named by container name), admits pods as the kubelet does under node pressure, holds pods
//! that workload gating has not released, and runs the rest.

use std::{collections::BTreeMap, time::Duration};

use super::{ContainerCgroups, Runtime, spec::PodRuntimeSpec};
use crate::{
    cgroup::{ContainerIds, Runner},
    eviction::{Admission, NodeCondition, admit},
    node::{PlannedPod, PodExecutor, PodStatus},
    policy::pod::PodKey,
    source::{ManifestPod, PodSet},
};

impl PodExecutor for Runtime {
    fn runner(&self) -> Runner {
        Runner::Qoslet
    }

    /// Only pods it can read into what it runs (the source's door refused the rest already,
    /// with `spec::run_check`).
    fn accepts(&self, pod: &ManifestPod) -> Result<(), String> {
        PodRuntimeSpec::from_pod(&pod.pod)
            .map(drop)
            .map_err(|_| not_read(pod))
    }

    /// The standalone runtime names container cgroups by the container's name.
    fn container_ids(&self, pods: &PodSet) -> ContainerIds {
        let mut ids = ContainerIds::new();
        for (key, p) in &pods.pods {
            let Some(spec) = &p.pod.spec else { continue };
            let names = spec
                .init_containers
                .iter()
                .flatten()
                .chain(&spec.containers)
                .map(|c| c.name.clone());
            for name in names {
                ids.insert((key.uid.clone(), name.clone()), name);
            }
        }
        ids
    }

    fn apply(&self, pods: Vec<PlannedPod<'_>>, conditions: &[NodeCondition]) -> Vec<String> {
        // Admission: under MemoryPressure BestEffort pods that are not running yet wait.
        let mut problems = Vec::new();
        let mut specs = Vec::new();
        let mut held = BTreeMap::new();
        for p in pods {
            let Ok(mut spec) = PodRuntimeSpec::from_pod(&p.pod.pod) else {
                problems.push(not_read(p.pod));
                continue;
            };
            for (name, dirs) in p.container_cgroups {
                spec.set_cgroups(&name, ContainerCgroups { dirs });
            }
            // A running pod's processes are read only when admission would hold it.
            let admitted = admit(conditions, p.qos_class, p.critical, false) == Admission::Admit
                || self.has_processes(&p.key);
            let hold = p.held.or_else(|| {
                (!admitted).then(|| {
                    "the node has MemoryPressure: a BestEffort pod that is not running waits".into()
                })
            });
            held.insert(p.key.clone(), hold);
            specs.push(spec);
        }
        Runtime::apply(self, specs, |k| held.get(k).cloned().flatten());
        problems
    }

    fn status(&self) -> Vec<PodStatus> {
        Runtime::status(self)
    }

    async fn changed(&self) {
        Runtime::changed(self).await;
    }

    fn mark_evicted(&self, key: &PodKey, message: &str, grace: Duration) {
        Runtime::mark_evicted(self, key, message, grace);
    }

    async fn stop_all(&self, grace: Duration) {
        Runtime::stop_all(self, grace).await;
    }
}

fn not_read(pod: &ManifestPod) -> String {
    let m = &pod.pod.metadata;
    format!(
        "Pod/{}/{}: not read for qoslet's runtime",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}
