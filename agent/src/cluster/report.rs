//! What the node tells the API server besides evictions: node conditions of qoslet's own types
//! (`QosletMemoryPressure`, `QosletPIDPressure` on `nodes/status`; never the kubelet's
//! `MemoryPressure`), a Node Event when a threshold is met, and a per-node Lease
//! (`coordination.k8s.io/v1`, `qoslet-NODE`) renewed as a heartbeat. Conditions and events go
//! through the persistent queue; the lease is only worth its current value and is not queued.
//! The conditions arrive as the node publishes them ([`AgentState::conditions`]); `/readyz` gets
//! one line for the API watches.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};

use super::{
    queue::{Dropped, WriteQueue},
    source::{ApiWatchStates, GangAwareness},
    writes::{ApiWrite, EventObject, now},
};
use crate::{
    eviction::NodeCondition, hub::AgentState, hub::metrics::ApiWriteLabels, support::lock,
};

/// How long a lease holds without renewal; renewed every quarter of it (as the kubelet's).
pub(crate) const LEASE_SECS: i32 = 40;

/// qoslet's condition type for one of the kubelet's.
pub(crate) fn condition_type(c: NodeCondition) -> &'static str {
    match c {
        NodeCondition::MemoryPressure => "QosletMemoryPressure",
        NodeCondition::PidPressure => "QosletPIDPressure",
    }
}

/// The writes for a condition that changed: the condition, and an event when it became true.
/// The event is one per condition type and `run` (the start of this process, in seconds), its
/// `count` the times the condition became true in this run: repeats update one Event.
pub(crate) fn condition_writes(
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
                annotations: Default::default(),
            },
        ));
    }
    out
}

/// The per-node Lease `qoslet-NODE`, renewed by replacing the object last written (its
/// resourceVersion makes the replace fail with 409 if someone else wrote it; the next renewal
/// then reads it again).
pub(crate) struct LeaseKeeper {
    api: Api<Lease>,
    name: String,
    node: String,
    last: Option<Lease>,
}

impl LeaseKeeper {
    pub(crate) fn new(client: &Client, namespace: &str, node: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            name: format!("qoslet-{node}"),
            node: node.into(),
            last: None,
        }
    }

    /// Creates or renews the lease.
    pub(crate) async fn renew(&mut self) -> Result<(), kube::Error> {
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

/// What the API server was last told about the node's conditions and qoslet's taint; each
/// change of the node's conditions becomes the writes that tell it.
pub(crate) struct ConditionReport {
    node: String,
    node_uid: String,
    /// `taintOnPressure`.
    taint: bool,
    /// The start of this process, in seconds: names this run's events.
    run: u64,
    /// Per condition type (memory, PID): the status last written.
    last: [Option<bool>; 2],
    /// Per condition type: how often it became true in this run.
    counts: [i32; 2],
    tainted: Option<bool>,
}

impl ConditionReport {
    pub(crate) fn new(node: &str, node_uid: &str, taint: bool, run: u64) -> Self {
        Self {
            node: node.into(),
            node_uid: node_uid.into(),
            taint,
            run,
            last: [None, None],
            counts: [0, 0],
            tainted: None,
        }
    }

    /// The writes, as (id, key, write), that bring the API server to `conditions` (the node's
    /// conditions now, at `at`): a condition whose status changed (every one the first time),
    /// its event when it became true, and the taint when pressure began or ended.
    pub(crate) fn writes(
        &mut self,
        conditions: &[NodeCondition],
        at: &str,
    ) -> Vec<(String, &'static str, ApiWrite)> {
        let mut out = Vec::new();
        for (i, c) in [NodeCondition::MemoryPressure, NodeCondition::PidPressure]
            .into_iter()
            .enumerate()
        {
            let on = conditions.contains(&c);
            if self.last[i] == Some(on) {
                continue;
            }
            self.last[i] = Some(on);
            if on {
                self.counts[i] = self.counts[i].saturating_add(1);
            }
            let writes = condition_writes(
                &self.node,
                &self.node_uid,
                c,
                on,
                at,
                self.run,
                self.counts[i],
            );
            out.extend(writes.into_iter().map(|(id, w)| (id, "node", w)));
        }
        let pressure = self.last.contains(&Some(true));
        if self.taint && self.tainted != Some(pressure) {
            self.tainted = Some(pressure);
            let w = ApiWrite::NodeTaint {
                node: self.node.clone(),
                on: pressure,
            };
            out.push(("node-taint".into(), "node-taint", w));
        }
        out
    }
}

/// The reporter's parts.
pub(crate) struct Reporter {
    pub(crate) client: Client,
    pub(crate) node: String,
    pub(crate) node_uid: String,
    pub(crate) lease_namespace: String,
    pub(crate) queue: Arc<WriteQueue>,
    pub(crate) watches: ApiWatchStates,
    pub(crate) gang: Arc<std::sync::Mutex<GangAwareness>>,
    /// Write conditions, events and the lease (not in observe mode).
    pub(crate) write: bool,
    /// `taintOnPressure`.
    pub(crate) taint: bool,
}

impl Reporter {
    /// Runs until aborted, with the agent's state: the node's conditions as they change (the
    /// node publishes them on [`AgentState::conditions`]), readiness and the queue's drops
    /// every second, the lease every `LEASE_SECS / 4`.
    pub(crate) async fn run(self, state: Arc<AgentState>) {
        state.readiness.register("api");
        // The lease on its own: a renewal the API server is slow to answer holds up nothing.
        tokio::join!(self.report(&state), self.keep_lease());
    }

    async fn report(&self, state: &AgentState) {
        let mut conditions = state.conditions.subscribe();
        // The conditions as they are at start are written too.
        conditions.mark_changed();
        let run = u64::try_from(Timestamp::now().as_second()).unwrap_or(0);
        let mut report = ConditionReport::new(&self.node, &self.node_uid, self.taint, run);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut pods_synced = false;
        loop {
            tokio::select! {
                Ok(()) = conditions.changed(), if self.write => {
                    let now_on = conditions.borrow_and_update().clone();
                    for (id, key, w) in report.writes(&now_on, &now()) {
                        if let Err(e) = self.queue.push(&id, key, w) {
                            tracing::error!(error = %e, "Could not queue a node condition or the node's taint.");
                        }
                    }
                }
                _ = tick.tick() => {
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
                    count_dropped(state, self.queue.take_dropped());
                }
            }
        }
    }

    async fn keep_lease(&self) {
        if !self.write {
            return;
        }
        let mut lease = LeaseKeeper::new(&self.client, &self.lease_namespace, &self.node);
        let mut failing = false;
        let mut wait = Duration::ZERO;
        loop {
            tokio::time::sleep(wait).await;
            let renewed = lease.renew().await;
            wait = next_renewal(wait, renewed.is_ok());
            match renewed {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("The qoslet lease is renewed again.");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "Could not renew the qoslet lease; retrying.");
                }
                Err(_) => {}
            }
        }
    }
}

/// The wait before the next renewal: a quarter of the lease after a renewal; after a failure,
/// twice the last wait up to the whole lease (a lease the server cannot take lapses anyway),
/// so an API server that is down gets one renewal in 40 s from each node, not one in 10.
fn next_renewal(last: Duration, renewed: bool) -> Duration {
    let quarter = Duration::from_secs((LEASE_SECS / 4) as u64);
    if renewed {
        quarter
    } else {
        (last * 2).clamp(quarter, Duration::from_secs(LEASE_SECS as u64))
    }
}

/// The writes the queue gave up on, as `qoslet_api_writes_dropped_total`.
fn count_dropped(state: &AgentState, dropped: Dropped) {
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::mock::{self, status};

    /// Every 10 s while renewals succeed; failing, 10, 20, 40, 40... s; back to 10 s at once.
    #[test]
    fn renewals_back_off_to_the_lease_while_failing() {
        let mut wait = Duration::ZERO;
        let mut waits = Vec::new();
        for renewed in [true, true, false, false, false, false, true] {
            wait = next_renewal(wait, renewed);
            waits.push(wait.as_secs());
        }
        assert_eq!(waits, [10, 10, 20, 40, 40, 40, 10]);
    }

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

    /// Each change of the node's conditions, and only a change, becomes writes: the condition,
    /// its event when it became true (counted on in this run), and the taint while any is true.
    #[test]
    fn each_change_of_the_conditions_is_written_once() {
        let mut report = ConditionReport::new("node-a", "uid-n", true, 5);
        let ids = |w: Vec<(String, &'static str, ApiWrite)>| -> Vec<String> {
            w.into_iter().map(|(id, _, _)| id).collect()
        };
        assert_eq!(
            ids(report.writes(&[], "t0")),
            [
                "node-condition-QosletMemoryPressure",
                "node-condition-QosletPIDPressure",
                "node-taint"
            ],
            "at start, both conditions false and no taint"
        );
        assert!(report.writes(&[], "t1").is_empty(), "nothing changed");
        let on = report.writes(&[NodeCondition::MemoryPressure], "t2");
        assert_eq!(
            ids(on.clone()),
            [
                "node-condition-QosletMemoryPressure",
                "node-event-QosletMemoryPressure-5",
                "node-taint"
            ]
        );
        assert!(matches!(on[2].2, ApiWrite::NodeTaint { on: true, .. }));
        let both = [NodeCondition::MemoryPressure, NodeCondition::PidPressure];
        assert_eq!(
            ids(report.writes(&both, "t3")),
            [
                "node-condition-QosletPIDPressure",
                "node-event-QosletPIDPressure-5"
            ],
            "tainted already"
        );
        assert_eq!(
            ids(report.writes(&[], "t4")).len(),
            3,
            "both false, untainted"
        );
        let again = report.writes(&[NodeCondition::MemoryPressure], "t5");
        let ApiWrite::Event { count, .. } = &again[1].2 else {
            panic!("{again:?}")
        };
        assert_eq!(*count, 2, "the second time in this run");
        let mut untainted = ConditionReport::new("node-a", "uid-n", false, 5);
        assert!(
            untainted
                .writes(&[NodeCondition::MemoryPressure], "t")
                .iter()
                .all(|(_, _, w)| !matches!(w, ApiWrite::NodeTaint { .. }))
        );
    }

    fn agent_state() -> Arc<AgentState> {
        Arc::new(AgentState::new(
            Box::new(crate::node::summary::CgroupSummary::new(
                Default::default(),
                None,
            )),
            None,
        ))
    }

    /// The reporter hears the node's conditions on the agent's state as they change and queues
    /// them at once; the `qoslet_node_condition` gauge is not read.
    #[tokio::test]
    async fn the_reporter_reacts_to_the_published_conditions() {
        let (_dir, queue) = mock::queue("report");
        let (client, _api) = mock::Routes::new()
            .on("GET", "*", 404, status(404, "NotFound", "no lease"))
            .route("POST", "*", |r| Some((201, r.body.clone())))
            .client();
        let state = agent_state();
        let reporter = Reporter {
            client,
            node: "node-a".into(),
            node_uid: "uid-n".into(),
            lease_namespace: "kube-node-lease".into(),
            queue: queue.clone(),
            watches: ApiWatchStates::default(),
            gang: Arc::new(std::sync::Mutex::new(GangAwareness::On)),
            write: true,
            taint: false,
        };
        let task = tokio::spawn(reporter.run(state.clone()));
        let memory_status = || {
            queue.pending().into_iter().find_map(|(id, w)| match w {
                ApiWrite::NodeCondition { status, .. }
                    if id == "node-condition-QosletMemoryPressure" =>
                {
                    Some(status)
                }
                _ => None,
            })
        };
        let wait_for = |want: bool, within: Duration| {
            let (queue, memory_status) = (&queue, &memory_status);
            async move {
                let deadline = tokio::time::Instant::now() + within;
                while memory_status() != Some(want) {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{:?}",
                        queue.pending()
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        wait_for(false, Duration::from_secs(5)).await;
        // The gauge alone says nothing to the reporter, over several of its seconds.
        state
            .metrics
            .node_condition
            .get_or_create(&crate::hub::metrics::ConditionLabels {
                condition: NodeCondition::MemoryPressure.as_str().into(),
            })
            .set(1);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(memory_status(), Some(false));
        // Published, it is queued well within the second the reporter used to poll at.
        let published = std::time::Instant::now();
        state
            .conditions
            .send_replace(vec![NodeCondition::MemoryPressure]);
        wait_for(true, Duration::from_millis(500)).await;
        let took = published.elapsed();
        assert!(
            queue
                .pending()
                .iter()
                .any(|(id, _)| id.starts_with("node-event-QosletMemoryPressure-"))
        );
        task.abort();
        eprintln!("published condition queued after {took:?}");
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
