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
}

#[tokio::test]
async fn a_write_is_persisted_retried_and_removed_once_delivered() {
    let dir = TempDir::new("queue");
    let q = Arc::new(WriteQueue::open(&dir.0).unwrap());
    q.push("evict-a", "pod-a", evict("a")).unwrap();
    assert_eq!(files(&dir.0), ["evict-a.json"]);
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    deliver_n(&q, 1, move |_| {
        let n = a.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < 2 {
                Delivery::Retry("down".into())
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
                Delivery::Retry("429".into())
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
    assert_eq!(files(&dir.0).len(), MAX_PENDING);
    drop(q);
    let old = serde_json::to_string(&Stored {
        seq: 0,
        key: "k".into(),
        queued_at: unix_now() - TTL.as_secs() - 1,
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
                Delivery::Retry("down".into())
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
