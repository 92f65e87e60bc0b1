//! What the node tells the API server besides evictions: node conditions of qoslet's own types
//! (`QosletMemoryPressure`, `QosletPIDPressure` on `nodes/status`; never the kubelet's
//! `MemoryPressure`), a Node Event when a threshold is met, and a per-node Lease
//! (`coordination.k8s.io/v1`, `qoslet-NODE`) renewed as a heartbeat. Conditions and events go
//! through the persistent queue; the lease is only worth its current value and is not queued.
//! `/readyz` gets one line for the API watches.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};

use super::{
    queue::WriteQueue,
    source::WatchStates,
    writes::{ApiWrite, EventObject, now},
};
use crate::{
    eviction::NodeCondition,
    server::{AgentState, metrics::ConditionLabels},
};

/// How long a lease holds without renewal; renewed every quarter of it (as the kubelet's).
pub const LEASE_SECS: i32 = 40;

/// qoslet's condition type for one of the kubelet's.
pub fn condition_type(c: NodeCondition) -> &'static str {
    match c {
        NodeCondition::MemoryPressure => "QosletMemoryPressure",
        NodeCondition::PidPressure => "QosletPIDPressure",
    }
}

/// The writes for a condition that changed: the condition, and an event when it became true.
pub fn condition_writes(
    node: &str,
    node_uid: &str,
    c: NodeCondition,
    on: bool,
    at: &str,
    seq: u64,
) -> Vec<(String, ApiWrite)> {
    let type_ = condition_type(c);
    let (reason, message) = if on {
        (
            format!("{}ThresholdMet", c.as_str()),
            format!("qoslet: an eviction threshold for {} is met.", c.as_str()),
        )
    } else {
        (
            format!("No{}", c.as_str()),
            format!("qoslet: no eviction threshold for {} is met.", c.as_str()),
        )
    };
    let mut out = vec![(
        format!("node-condition-{type_}"),
        ApiWrite::NodeCondition {
            node: node.into(),
            type_: type_.into(),
            status: on,
            reason: reason.clone(),
            message: message.clone(),
            at: at.into(),
        },
    )];
    if on {
        out.push((
            format!("node-event-{type_}-{seq}"),
            ApiWrite::Event {
                name: format!("{node}.qoslet-{}-{seq}", type_.to_ascii_lowercase()),
                namespace: "default".into(),
                object: EventObject {
                    kind: "Node".into(),
                    namespace: None,
                    name: node.into(),
                    uid: node_uid.into(),
                },
                reason,
                message,
                type_: "Warning".into(),
                node: node.into(),
                at: at.into(),
            },
        ));
    }
    out
}

/// Creates or renews `qoslet-NODE` in `namespace`.
pub async fn renew_lease(client: &Client, namespace: &str, node: &str) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = format!("qoslet-{node}");
    let now = MicroTime(Timestamp::now());
    match api.get_opt(&name).await? {
        Some(mut l) => {
            let spec = l.spec.get_or_insert_with(LeaseSpec::default);
            spec.renew_time = Some(now);
            spec.holder_identity = Some(node.into());
            spec.lease_duration_seconds = Some(LEASE_SECS);
            api.replace(&name, &PostParams::default(), &l).await?;
        }
        None => {
            let l = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(namespace.into()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.into()),
                    lease_duration_seconds: Some(LEASE_SECS),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &l).await?;
        }
    }
    Ok(())
}

/// The reporter's parts.
pub struct Reporter {
    pub client: Client,
    pub node: String,
    pub node_uid: String,
    pub lease_namespace: String,
    pub queue: Arc<WriteQueue>,
    pub watches: WatchStates,
    /// Write conditions, events and the lease (not in observe mode).
    pub write: bool,
}

impl Reporter {
    /// Runs until aborted, with the agent's state: readiness and conditions every second,
    /// the lease every `LEASE_SECS / 4`.
    pub async fn run(self, state: Arc<AgentState>) {
        state.readiness.register("api");
        let mut last: [Option<bool>; 2] = [None, None];
        let mut seq = u64::try_from(Timestamp::now().as_second()).unwrap_or(0);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let lease_every = Duration::from_secs((LEASE_SECS / 4) as u64);
        let mut lease_due = tokio::time::Instant::now();
        let mut lease_failing = false;
        loop {
            tick.tick().await;
            state.readiness.set(
                "api",
                self.watches.synced(),
                format!("watches: {}", self.watches.summary()),
            );
            if !self.write {
                continue;
            }
            for (i, c) in [NodeCondition::MemoryPressure, NodeCondition::PidPressure]
                .into_iter()
                .enumerate()
            {
                let on = state
                    .metrics
                    .node_condition
                    .get_or_create(&ConditionLabels {
                        condition: c.as_str().into(),
                    })
                    .get()
                    == 1;
                if last[i] == Some(on) {
                    continue;
                }
                last[i] = Some(on);
                seq += 1;
                let at = now();
                for (id, w) in condition_writes(&self.node, &self.node_uid, c, on, &at, seq) {
                    if let Err(e) = self.queue.push(&id, "node", w) {
                        tracing::error!(error = %e, "Could not queue a node condition.");
                    }
                }
            }
            if tokio::time::Instant::now() >= lease_due {
                lease_due = tokio::time::Instant::now() + lease_every;
                match renew_lease(&self.client, &self.lease_namespace, &self.node).await {
                    Ok(()) if lease_failing => {
                        lease_failing = false;
                        tracing::info!("The qoslet lease is renewed again.");
                    }
                    Ok(()) => {}
                    Err(e) if !lease_failing => {
                        lease_failing = true;
                        tracing::warn!(error = %e, "Could not renew the qoslet lease; retrying.");
                    }
                    Err(_) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::mock::{self, status};

    #[tokio::test]
    async fn the_lease_is_created_then_renewed() {
        let mut gets = 0;
        let (client, api) = mock::client(move |r| {
            Some(match r.method.as_str() {
                "GET" => {
                    gets += 1;
                    if gets == 1 {
                        (404, status(404, "NotFound", "no lease"))
                    } else {
                        (
                            200,
                            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": "qoslet-node-a", "namespace": "kube-node-lease", "resourceVersion": "7"},
                            "spec": {"holderIdentity": "node-a", "renewTime": "2026-11-30T10:00:00.000000Z"}}),
                        )
                    }
                }
                _ => (200, r.body.clone()),
            })
        });
        renew_lease(&client, "kube-node-lease", "node-a")
            .await
            .unwrap();
        renew_lease(&client, "kube-node-lease", "node-a")
            .await
            .unwrap();
        let reqs = api.requests();
        let calls: Vec<(&str, &str)> = reqs.iter().map(|r| (r.method.as_str(), r.path())).collect();
        let path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
        assert_eq!(
            calls,
            [
                ("GET", &*format!("{path}/qoslet-node-a")),
                ("POST", path),
                ("GET", &*format!("{path}/qoslet-node-a")),
                ("PUT", &*format!("{path}/qoslet-node-a")),
            ]
        );
        assert_eq!(reqs[1].body["spec"]["holderIdentity"], "node-a");
        assert_eq!(reqs[1].body["spec"]["leaseDurationSeconds"], LEASE_SECS);
        assert_eq!(
            reqs[3].body["metadata"]["resourceVersion"], "7",
            "optimistic concurrency"
        );
        assert_ne!(
            reqs[3].body["spec"]["renewTime"],
            "2026-11-30T10:00:00.000000Z"
        );
    }

    #[test]
    fn a_met_threshold_sets_qoslets_condition_and_a_node_event() {
        let w = condition_writes(
            "node-a",
            "uid-n",
            NodeCondition::MemoryPressure,
            true,
            "t",
            5,
        );
        let ApiWrite::NodeCondition { type_, status, .. } = &w[0].1 else {
            panic!("{w:?}")
        };
        assert_eq!((type_.as_str(), *status), ("QosletMemoryPressure", true));
        let ApiWrite::Event {
            object,
            type_,
            name,
            ..
        } = &w[1].1
        else {
            panic!("{w:?}")
        };
        assert_eq!((object.kind.as_str(), type_.as_str()), ("Node", "Warning"));
        assert_eq!(name, "node-a.qoslet-qosletmemorypressure-5");
        let off = condition_writes("node-a", "u", NodeCondition::PidPressure, false, "t", 6);
        assert_eq!(off.len(), 1, "no event when it clears");
        assert_eq!(off[0].0, "node-condition-QosletPIDPressure");
    }
}
