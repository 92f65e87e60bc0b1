//! A pod's disruption unit across nodes (`gangEviction: unit`): the PodGroups of the
//! `disruptionMode: all` unit a pod of this node belongs to, and the unit's live members on other
//! nodes, resolved to their UIDs when the eviction is decided (a pod created later under a
//! member's name is never evicted).
//!
//! Reads the node's pods from the source's store and lists the namespace's workload objects and
//! pods from the API server; the eviction action ([`super::action`]) turns the members into
//! writes. Data flows one way: [`super::source`] → here → [`super::action`].

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams},
    runtime::reflector::Store,
};

use super::source::{loaded_all, workload_resources};
use crate::{
    policy::pod::PodKey,
    workload::{Forest, Kind, UnitRoot, disruption_unit},
};

/// Where a unit's members on other nodes are found: the API client and the node's pods.
#[derive(Clone)]
pub(crate) struct UnitMembers {
    pub(crate) client: Client,
    /// The node's pods, as the source's watch keeps them.
    pub(crate) pods: Store<Pod>,
}

impl UnitMembers {
    /// The PodGroups of the `disruptionMode: all` unit `key` belongs to (every leaf below the
    /// highest `all` ancestor), or `None` when the pod goes alone. `namespace_objects` are the
    /// namespace's workload objects, listed when the decision is made (the source watches only
    /// the node's pods' ancestors, not their sibling groups on other nodes).
    pub(crate) fn unit_groups(
        &self,
        key: &PodKey,
        namespace_objects: &[(ApiResource, Vec<Arc<DynamicObject>>)],
    ) -> Option<Vec<String>> {
        let pod = self
            .pods
            .find(|p| p.metadata.uid.as_deref() == Some(key.uid.as_str()))?;
        let loaded = loaded_all(&[pod], namespace_objects);
        // Through admission, as at the source's door: nothing unvalidated reaches the forest.
        let objects = loaded
            .objects
            .iter()
            .filter_map(|raw| crate::source::admit::admit(raw).ok())
            .map(|a| a.object)
            .chain(
                loaded
                    .typed
                    .into_iter()
                    .filter_map(|(o, t)| crate::source::admit::admit_typed(t, o).ok())
                    .map(|a| a.object),
            );
        let forest = Forest::new(objects);
        let unit = disruption_unit(&forest, &key.name)?;
        let UnitRoot::Group(top) = unit.root else {
            return None;
        };
        let groups: Vec<String> = forest
            .subtree(&top)
            .into_iter()
            .filter(|r| r.kind == Kind::PodGroup)
            .map(|r| r.name)
            .collect();
        (!groups.is_empty()).then_some(groups)
    }

    /// The live members of `pod`'s unit on nodes other than `node`, by UID, now; empty when the
    /// pod goes alone. Lists the namespace's workload objects (`GET` of each kind) and pods.
    pub(crate) async fn resolve(
        &self,
        pod: &PodKey,
        node: &str,
    ) -> Result<Vec<PodKey>, kube::Error> {
        let ns = pod.namespace.as_str();
        let mut listed = Vec::new();
        for ar in workload_resources() {
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &ar);
            let objs = match api.list(&ListParams::default().match_any()).await {
                Ok(l) => l.items.into_iter().map(Arc::new).collect(),
                // CompositePodGroups (alpha) may not be served.
                Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
                Err(e) => return Err(e),
            };
            listed.push((ar, objs));
        }
        let Some(groups) = self.unit_groups(pod, &listed) else {
            return Ok(Vec::new());
        };
        members_elsewhere(&self.client, ns, &groups, node).await
    }
}

/// `GET namespaces/{ns}/pods`: the pods of `groups` on nodes other than `node` that have not
/// ended.
async fn members_elsewhere(
    client: &Client,
    namespace: &str,
    groups: &[String],
    node: &str,
) -> Result<Vec<PodKey>, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pods = api.list(&ListParams::default()).await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| {
            let spec = p.spec.as_ref();
            let group = spec
                .and_then(|s| s.scheduling_group.as_ref())
                .and_then(|g| g.pod_group_name.as_deref());
            let elsewhere = spec.and_then(|s| s.node_name.as_deref()) != Some(node);
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            elsewhere
                && group.is_some_and(|g| groups.iter().any(|x| x == g))
                && !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| {
            Some(PodKey {
                namespace: namespace.to_owned(),
                name: p.metadata.name?,
                uid: p.metadata.uid?,
            })
        })
        .collect())
}
