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
    source::{GangAwareness, WatchStates},
    writes::{ApiWrite, EventObject, now},
};
use crate::{
    eviction::NodeCondition,
    lock,
    server::{
        AgentState,
        metrics::{ApiWriteLabels, ConditionLabels},
    },
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
/// The event is one per condition type and `run` (the start of this process, in seconds), its
/// `count` the times the condition became true in this run: repeats update one Event.
pub fn condition_writes(
    node: &str,
    node_uid: &str,
    c: NodeCondition,
    on: bool,
    at: &str,
    run: u64,
    count: i32,
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
            format!("node-event-{type_}-{run}"),
            ApiWrite::Event {
                name: format!("{node}.qoslet-{}-{run}", type_.to_ascii_lowercase()),
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
                count,
            },
        ));
    }
    out
}

/// The per-node Lease `qoslet-NODE`, renewed by replacing the object last written (its
/// resourceVersion makes the replace fail with 409 if someone else wrote it; the next renewal
/// then reads it again).
pub struct LeaseKeeper {
    api: Api<Lease>,
    name: String,
    node: String,
    last: Option<Lease>,
}

impl LeaseKeeper {
    pub fn new(client: &Client, namespace: &str, node: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            name: format!("qoslet-{node}"),
            node: node.into(),
            last: None,
        }
    }

    /// Creates or renews the lease.
    pub async fn renew(&mut self) -> Result<(), kube::Error> {
        let now = MicroTime(Timestamp::now());
        let current = match self.last.take() {
            Some(l) => Some(l),
            None => self.api.get_opt(&self.name).await?,
        };
        let written = match current {
            Some(mut l) => {
                let spec = l.spec.get_or_insert_with(LeaseSpec::default);
                spec.renew_time = Some(now);
                spec.holder_identity = Some(self.node.clone());
                spec.lease_duration_seconds = Some(LEASE_SECS);
                self.api
                    .replace(&self.name, &PostParams::default(), &l)
                    .await?
            }
            None => {
                let l = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.node.clone()),
                        lease_duration_seconds: Some(LEASE_SECS),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &l).await?
            }
        };
        self.last = Some(written);
        Ok(())
    }
}

/// The reporter's parts.
pub struct Reporter {
    pub client: Client,
    pub node: String,
    pub node_uid: String,
    pub lease_namespace: String,
    pub queue: Arc<WriteQueue>,
    pub watches: WatchStates,
    pub gang: Arc<std::sync::Mutex<GangAwareness>>,
    /// Write conditions, events and the lease (not in observe mode).
    pub write: bool,
    /// `taintOnPressure`.
    pub taint: bool,
}

impl Reporter {
    /// Runs until aborted, with the agent's state: readiness and conditions every second,
    /// the lease every `LEASE_SECS / 4`.
    pub async fn run(self, state: Arc<AgentState>) {
        state.readiness.register("api");
        let mut last: [Option<bool>; 2] = [None, None];
        let mut counts = [0i32; 2];
        let mut tainted: Option<bool> = None;
        let run = u64::try_from(Timestamp::now().as_second()).unwrap_or(0);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let lease_every = Duration::from_secs((LEASE_SECS / 4) as u64);
        let mut lease_due = tokio::time::Instant::now();
        let mut lease_failing = false;
        let mut lease = LeaseKeeper::new(&self.client, &self.lease_namespace, &self.node);
        let mut pods_synced = false;
        loop {
            tick.tick().await;
            // Ready once the pods have been listed; a later outage shows in the line only.
            pods_synced |= self.watches.synced();
            state.readiness.set(
                "api",
                pods_synced,
                format!("watches: {}", self.watches.summary()),
            );
            let gang = *lock(&self.gang);
            state
                .metrics
                .gang_awareness
                .set(i64::from(gang != GangAwareness::Off));
            let dropped = self.queue.take_dropped();
            for ((write, code), n) in dropped.rejected {
                state
                    .metrics
                    .api_writes_dropped
                    .get_or_create(&ApiWriteLabels {
                        write: write.into(),
                        reason: format!("rejected-{code}"),
                    })
                    .inc_by(n);
            }
            for (reason, n) in [("expired", dropped.expired), ("overflow", dropped.overflow)] {
                if n > 0 {
                    state
                        .metrics
                        .api_writes_dropped
                        .get_or_create(&ApiWriteLabels {
                            write: String::new(),
                            reason: reason.into(),
                        })
                        .inc_by(n);
                }
            }
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
                if on {
                    counts[i] = counts[i].saturating_add(1);
                }
                let at = now();
                let writes =
                    condition_writes(&self.node, &self.node_uid, c, on, &at, run, counts[i]);
                for (id, w) in writes {
                    if let Err(e) = self.queue.push(&id, "node", w) {
                        tracing::error!(error = %e, "Could not queue a node condition.");
                    }
                }
            }
            let pressure = last.contains(&Some(true));
            if self.taint && tainted != Some(pressure) {
                tainted = Some(pressure);
                let w = ApiWrite::NodeTaint {
                    node: self.node.clone(),
                    on: pressure,
                };
                if let Err(e) = self.queue.push("node-taint", "node-taint", w) {
                    tracing::error!(error = %e, "Could not queue the node's taint.");
                }
            }
            if tokio::time::Instant::now() >= lease_due {
                lease_due = tokio::time::Instant::now() + lease_every;
                match lease.renew().await {
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

    /// Created once, then renewed by replacing the lease last written: no GET per renewal. A
    /// conflict (someone else wrote it) makes the next renewal read it again.
    #[tokio::test]
    async fn the_lease_is_created_then_renewed_without_a_get_each_time() {
        let mut rv = 0;
        let mut puts = 0;
        let (client, api) = mock::client(move |r| {
            let exists = rv > 0;
            let mut stored = |body: &serde_json::Value| {
                rv += 1;
                let mut b = body.clone();
                b["metadata"]["resourceVersion"] = rv.to_string().into();
                b["metadata"]["namespace"] = "kube-node-lease".into();
                (200, b)
            };
            Some(match r.method.as_str() {
                "GET" if !exists => (404, status(404, "NotFound", "no lease")),
                "GET" => stored(
                    &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "qoslet-node-a"}, "spec": {"holderIdentity": "node-a"}}),
                ),
                "PUT" => {
                    puts += 1;
                    if puts == 3 {
                        (409, status(409, "Conflict", "the object has been modified"))
                    } else {
                        stored(&r.body)
                    }
                }
                _ => stored(&r.body),
            })
        });
        let mut lease = LeaseKeeper::new(&client, "kube-node-lease", "node-a");
        for _ in 0..3 {
            lease.renew().await.unwrap();
        }
        assert!(lease.renew().await.is_err(), "the conflict");
        lease.renew().await.unwrap();
        let reqs = api.requests();
        let calls: Vec<(&str, &str)> = reqs.iter().map(|r| (r.method.as_str(), r.path())).collect();
        let path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
        let one = format!("{path}/qoslet-node-a");
        assert_eq!(
            calls,
            [
                ("GET", one.as_str()),
                ("POST", path),
                ("PUT", &one),
                ("PUT", &one),
                ("PUT", &one),
                ("GET", &one),
                ("PUT", &one),
            ]
        );
        assert_eq!(reqs[1].body["spec"]["holderIdentity"], "node-a");
        assert_eq!(reqs[1].body["spec"]["leaseDurationSeconds"], LEASE_SECS);
        assert_eq!(
            (
                &reqs[2].body["metadata"]["resourceVersion"],
                &reqs[3].body["metadata"]["resourceVersion"]
            ),
            (&json!("1"), &json!("2")),
            "each replace carries the resourceVersion of the last write"
        );
        assert_ne!(
            reqs[2].body["spec"]["renewTime"],
            reqs[1].body["spec"]["renewTime"]
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
            2,
        );
        let ApiWrite::NodeCondition { type_, status, .. } = &w[0].1 else {
            panic!("{w:?}")
        };
        assert_eq!((type_.as_str(), *status), ("QosletMemoryPressure", true));
        let ApiWrite::Event {
            object,
            type_,
            name,
            count,
            ..
        } = &w[1].1
        else {
            panic!("{w:?}")
        };
        assert_eq!((object.kind.as_str(), type_.as_str()), ("Node", "Warning"));
        assert_eq!(name, "node-a.qoslet-qosletmemorypressure-5");
        assert_eq!(*count, 2, "the second time in this run: one Event, counted");
        let off = condition_writes("node-a", "u", NodeCondition::PidPressure, false, "t", 5, 2);
        assert_eq!(off.len(), 1, "no event when it clears");
        assert_eq!(off[0].0, "node-condition-QosletPIDPressure");
    }
}
