use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::{cluster::mock::TempDir, policy::pod::PodKey};

fn evict(name: &str) -> ApiWrite {
    ApiWrite::Evict {
        pod: PodKey {
            namespace: "ns".into(),
            name: name.into(),
            uid: "u".into(),
        },
        grace_secs: 0,
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs the queue with `send` until `n` writes were delivered.
async fn deliver_n<F, Fut>(q: &Arc<WriteQueue>, n: u64, send: F)
where
    F: Fn(ApiWrite) -> Fut + Send + 'static,
    Fut: Future<Output = Delivery> + Send + 'static,
{
    let task = tokio::spawn(q.clone().run(send));
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.delivered() < n {
        assert!(Instant::now() < deadline, "pending: {:?}", q.pending());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    // Its clone of the queue gone: the caller's drop is the last and writes the files.
    let _ = task.await;
}

#[tokio::test]
async fn a_write_is_persisted_retried_and_removed_once_delivered() {
    let dir = TempDir::new("queue");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    q.push("evict-a", "pod-a", evict("a")).unwrap();
    q.flush();
    assert_eq!(files(&dir.0), ["evict-a.json"]);
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    deliver_n(&q, 1, move |_| {
        let n = a.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < 2 {
                Delivery::retry("down")
            } else {
                Delivery::Done
            }
        }
    })
    .await;
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert!(files(&dir.0).is_empty(), "{:?}", files(&dir.0));
    assert!(q.pending().is_empty());
}

/// The oldest pending Eviction API request names the pod the manager waits for; other writes
/// do not count, and once it is delivered the next one does.
#[tokio::test]
async fn the_oldest_pending_eviction_is_the_one_awaited() {
    let dir = TempDir::new("queue");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    assert_eq!(q.pending_eviction(), None);
    q.push(
        "event-x",
        "pod-x",
        ApiWrite::NodeTaint {
            node: "n".into(),
            on: true,
        },
    )
    .unwrap();
    assert_eq!(q.pending_eviction(), None);
    q.push("evict-b", "pod-b", evict("b")).unwrap();
    q.push("evict-a", "pod-a", evict("a")).unwrap();
    assert_eq!(q.pending_eviction().map(|p| p.name), Some("b".into()));
    let task = tokio::spawn(q.clone().run(|w| async move {
        match w {
            ApiWrite::Evict { pod, .. } if pod.name == "b" => Delivery::Done,
            _ => Delivery::retry("refused for now"),
        }
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.pending_eviction().map(|p| p.name).as_deref() != Some("a") {
        assert!(Instant::now() < deadline, "pending: {:?}", q.pending());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
}

#[tokio::test]
async fn pending_writes_survive_a_restart_in_their_order() {
    let dir = TempDir::new("queue");
    {
        let q = WriteQueue::open(&dir.0).unwrap();
        q.push("w-b", "pod-b", evict("b")).unwrap();
        q.push("w-a", "pod-a", evict("a")).unwrap();
        // A write interrupted before its rename is not a write.
        fs::write(dir.0.join(".tmp-w-c.json"), "{").unwrap();
    }
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    let ids: Vec<String> = q.pending().into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["w-b", "w-a"], "push order, not name order");
    assert_eq!(files(&dir.0), ["w-a.json", "w-b.json"]);
    let sent = Arc::new(Mutex::new(Vec::new()));
    let s = sent.clone();
    deliver_n(&q, 2, move |w| {
        s.lock().unwrap().push(w);
        async { Delivery::Done }
    })
    .await;
    assert_eq!(*sent.lock().unwrap(), [evict("b"), evict("a")]);
    // Pushed after the restart: a later sequence number than every loaded one.
    q.push("w-d", "pod-d", evict("d")).unwrap();
    drop(q);
    let q = WriteQueue::open(&dir.0).unwrap();
    assert_eq!(q.pending().len(), 1);
}

#[tokio::test]
async fn writes_of_one_object_keep_their_order_and_others_do_not_wait() {
    let dir = TempDir::new("queue");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    q.push("a-1", "pod-a", evict("a1")).unwrap();
    q.push("a-2", "pod-a", evict("a2")).unwrap();
    q.push("b-1", "pod-b", evict("b1")).unwrap();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let s = sent.clone();
    let refused = Arc::new(AtomicUsize::new(0));
    let r = refused.clone();
    deliver_n(&q, 3, move |w| {
        let ApiWrite::Evict { pod, .. } = &w else {
            unreachable!()
        };
        let name = pod.name.clone();
        // a1 is refused twice (a PDB's 429), then accepted.
        let refuse = name == "a1" && r.fetch_add(1, Ordering::SeqCst) < 2;
        if !refuse {
            s.lock().unwrap().push(name);
        }
        async move {
            if refuse {
                Delivery::retry("429")
            } else {
                Delivery::Done
            }
        }
    })
    .await;
    assert_eq!(*sent.lock().unwrap(), ["b1", "a1", "a2"]);
}

#[tokio::test]
async fn pushing_an_id_again_replaces_the_pending_write() {
    let dir = TempDir::new("queue");
    let q = WriteQueue::open(&dir.0).unwrap();
    q.push("cond", "node", evict("old")).unwrap();
    q.push("cond", "node", evict("new")).unwrap();
    assert_eq!(q.pending(), [("cond".to_owned(), evict("new"))]);
    assert!(q.push("../escape", "k", evict("x")).is_err());
}

/// A permanent refusal (a failed UID precondition) is dropped at once, counted by kind and
/// status, and does not hold back the next write of the same object.
#[tokio::test]
async fn a_rejected_write_is_dropped_counted_and_does_not_block() {
    let dir = TempDir::new("queue");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    q.push("a-1", "pod-a", evict("a1")).unwrap();
    q.push("a-2", "pod-a", evict("a2")).unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    let task = tokio::spawn(q.clone().run(move |w| {
        a.fetch_add(1, Ordering::SeqCst);
        let ApiWrite::Evict { pod, .. } = &w else {
            unreachable!()
        };
        let first = pod.name == "a1";
        async move {
            if first {
                Delivery::Rejected {
                    code: 409,
                    message: "precondition failed".into(),
                }
            } else {
                Delivery::Done
            }
        }
    }));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !q.pending().is_empty() {
        assert!(Instant::now() < deadline, "{:?}", q.pending());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "never retried");
    // The persister may still be writing a file of a write already gone; it removes it then.
    q.flush();
    assert!(files(&dir.0).is_empty());
    let d = q.take_dropped();
    assert_eq!(d.rejected.get(&("evict", 409)), Some(&1));
    assert_eq!(q.take_dropped(), Dropped::default(), "taken once");
}

/// Beyond MAX_PENDING the oldest write goes; a write older than the TTL (here one left on disk
/// by a run long ago) is dropped when the queue opens, never sent.
#[tokio::test]
async fn the_queue_is_bounded_and_old_writes_expire() {
    let dir = TempDir::new("queue");
    let q = WriteQueue::open(&dir.0).unwrap();
    for i in 0..=MAX_PENDING {
        q.push(&format!("w-{i}"), &format!("k-{i}"), evict("x"))
            .unwrap();
    }
    let pending = q.pending();
    assert_eq!(pending.len(), MAX_PENDING);
    assert_eq!(pending[0].0, "w-1", "the oldest went");
    assert_eq!(q.take_dropped().overflow, 1);
    q.flush();
    assert_eq!(files(&dir.0).len(), MAX_PENDING);
    drop(q);
    let old = serde_json::to_string(&Stored {
        seq: 0,
        key: "k".into(),
        queued_at: unix_now() - TTL.as_secs() - 1,
        boot: None,
        write: evict("stale"),
    })
    .unwrap();
    fs::write(dir.0.join("w-1.json"), old).unwrap();
    let q = WriteQueue::open(&dir.0).unwrap();
    assert_eq!(q.pending().len(), MAX_PENDING - 1);
    assert!(!q.pending().iter().any(|(id, _)| id == "w-1"));
    assert_eq!(q.take_dropped().expired, 1);
    assert!(!dir.0.join("w-1.json").exists());
}

#[test]
fn the_backoff_is_jittered_within_half_to_all_of_it() {
    let d = Duration::from_secs(10);
    let all: Vec<Duration> = (0..50).map(|_| jitter(d)).collect();
    assert!(all.iter().all(|j| *j >= d / 2 && *j < d), "{all:?}");
    assert!(
        all.iter().any(|j| *j != all[0]),
        "not all the same: {all:?}"
    );
}

#[tokio::test]
async fn settled_waits_for_the_write_to_leave_and_no_longer() {
    let dir = TempDir::new("queue-settled");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    q.push("evict-a", "pod-a", evict("a")).unwrap();
    // Nobody delivers: the wait ends at its deadline, the write still pending.
    let t = Instant::now();
    assert!(!q.settled("evict-a", Duration::from_millis(50)).await);
    assert!(t.elapsed() >= Duration::from_millis(50));
    // Delivered after a first refusal: the wait ends when it leaves, not at the deadline.
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    let task = tokio::spawn(q.clone().run(move |_| {
        let n = a.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if n == 0 {
                Delivery::retry("down")
            } else {
                Delivery::Done
            }
        }
    }));
    let t = Instant::now();
    assert!(q.settled("evict-a", Duration::from_secs(10)).await);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    // A write that is not pending has settled.
    assert!(q.settled("evict-b", Duration::ZERO).await);
    task.abort();
}

fn pod_status(name: &str) -> ApiWrite {
    ApiWrite::PodEvicted {
        pod: PodKey {
            namespace: "ns".into(),
            name: name.into(),
            uid: "u".into(),
        },
        message: "m".into(),
        at: "2026-12-03T00:00:00Z".into(),
        seen: Default::default(),
    }
}

fn condition() -> ApiWrite {
    ApiWrite::NodeCondition {
        node: "n".into(),
        type_: "QosletMemoryPressure".into(),
        status: true,
        reason: "r".into(),
        message: "m".into(),
        at: "2026-12-03T00:00:00Z".into(),
    }
}

/// Of the writes due together, the pod's status goes out first, whatever was pushed before it.
#[tokio::test]
async fn the_pod_status_goes_before_node_writes_and_events() {
    let dir = TempDir::new("queue-order");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    q.push("cond", "node", condition()).unwrap();
    q.push("evict-b", "pod-b", evict("b")).unwrap();
    q.push("status-a", "pod-a", pod_status("a")).unwrap();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let s = sent.clone();
    deliver_n(&q, 3, move |w| {
        s.lock().unwrap().push(w.kind());
        async { Delivery::Done }
    })
    .await;
    assert_eq!(
        *sent.lock().unwrap(),
        ["podEvicted", "evict", "nodeCondition"]
    );
}

/// A request that never answers (a half-open connection) is cut at REQUEST_TIMEOUT and tried
/// again; meanwhile the other writes go out.
#[tokio::test(start_paused = true)]
async fn a_request_that_never_answers_holds_nothing_back_and_is_retried() {
    let dir = TempDir::new("queue-stuck");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    q.push("status-a", "pod-a", pod_status("a")).unwrap();
    q.push("evict-b", "pod-b", evict("b")).unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    let started = Instant::now();
    let task = tokio::spawn(q.clone().run(move |w| {
        let hang =
            matches!(w, ApiWrite::PodEvicted { .. }) && a.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Delivery::Done
        }
    }));
    while q.delivered() < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        q.pending().len(),
        1,
        "the eviction went while the status hung"
    );
    assert!(started.elapsed() < REQUEST_TIMEOUT);
    while q.delivered() < 2 {
        assert!(started.elapsed() < REQUEST_TIMEOUT * 3, "{:?}", q.pending());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        started.elapsed() >= REQUEST_TIMEOUT,
        "cut at the timeout, not before"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    task.abort();
}

/// The API server's Retry-After is a floor under the backoff.
#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured() {
    let dir = TempDir::new("queue-retry-after");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    q.push("evict-a", "pod-a", evict("a")).unwrap();
    let times = Arc::new(Mutex::new(Vec::new()));
    let t = times.clone();
    deliver_n(&q, 1, move |_| {
        let mut t = t.lock().unwrap();
        t.push(Instant::now());
        let first = t.len() == 1;
        async move {
            if first {
                Delivery::Retry {
                    why: "429".into(),
                    after: Some(Duration::from_secs(7)),
                }
            } else {
                Delivery::Done
            }
        }
    })
    .await;
    let t = times.lock().unwrap();
    assert_eq!(t.len(), 2);
    assert!(t[1] - t[0] >= Duration::from_secs(7), "{:?}", t[1] - t[0]);
}

/// Within one boot a write's age is the boot's monotonic clock, whatever the wall clock says:
/// one pushed a TTL ago on that clock is dropped though its wall time is now, and one pushed
/// just now is kept though its wall time is from long ago.
#[tokio::test]
async fn a_writes_age_is_kept_on_the_boots_clock() {
    let dir = TempDir::new("queue-boottime");
    fs::create_dir_all(&dir.0).unwrap();
    let boot = boot_id()
        .and_then(|id| BootTime::now(&id))
        .expect("CLOCK_BOOTTIME and a boot id");
    if boot.ms <= TTL.as_millis() as u64 {
        // A machine up for less than the TTL cannot have a write that old.
        return;
    }
    let stored = |seq, boot_ms, queued_at| Stored {
        seq,
        key: format!("k{seq}"),
        queued_at,
        boot: Some(BootTime {
            id: boot.id.clone(),
            ms: boot_ms,
        }),
        write: evict("x"),
    };
    let old = stored(0, boot.ms - TTL.as_millis() as u64 - 1000, unix_now());
    let new = stored(1, boot.ms, unix_now() - 10 * TTL.as_secs());
    fs::write(dir.0.join("old.json"), serde_json::to_string(&old).unwrap()).unwrap();
    fs::write(dir.0.join("new.json"), serde_json::to_string(&new).unwrap()).unwrap();
    let q = WriteQueue::open(&dir.0).unwrap();
    let ids: Vec<String> = q.pending().into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["new"]);
    assert_eq!(q.take_dropped().expired, 1);
}

/// A write delivered before the queue's thread wrote its file leaves no file behind.
#[tokio::test]
async fn a_write_delivered_before_its_file_leaves_none() {
    let dir = TempDir::new("queue-fast");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    for i in 0..20 {
        q.push(&format!("w-{i}"), &format!("k-{i}"), evict("x"))
            .unwrap();
    }
    deliver_n(&q, 20, |_| async { Delivery::Done }).await;
    q.flush();
    assert!(files(&dir.0).is_empty(), "{:?}", files(&dir.0));
}
