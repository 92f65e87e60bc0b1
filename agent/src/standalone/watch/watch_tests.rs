//! The watch on a real directory: removal and re-creation, cancel-safety of `changed()`, the
//! parse grace period.

use std::{fs, time::Duration};

use super::*;

/// A scratch manifest directory inside a scratch parent, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base =
            std::env::temp_dir().join(format!("qoslet-watch-{tag}-{}-{n}", std::process::id()));
        fs::create_dir_all(base.join("manifests")).unwrap();
        Self(base)
    }

    fn dir(&self) -> PathBuf {
        self.0.join("manifests")
    }

    /// A watch of the directory for qoslet's runtime, a burst settling after `debounce`.
    fn watch(&self, debounce: Duration) -> ManifestWatch {
        ManifestWatch::new(&self.dir(), debounce, Default::default(), Runner::Qoslet).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: c, command: [sleep]}}]\n"
    )
}

fn names(w: &ManifestWatch) -> Vec<String> {
    w.state().pods.keys().map(|k| k.name.clone()).collect()
}

const LIMIT: Duration = Duration::from_secs(10);

async fn next(w: &mut ManifestWatch) -> Result<Diff, ManifestDirError> {
    tokio::time::timeout(LIMIT, w.changed())
        .await
        .expect("a change within the limit")
}

#[tokio::test]
async fn the_directory_removed_and_created_again_is_still_watched() {
    let s = Scratch::new("recreate");
    fs::write(s.dir().join("a.yaml"), pod("a")).unwrap();
    let mut w = s.watch(Duration::from_millis(20));
    w.reload().unwrap();
    assert_eq!(names(&w), ["a"]);
    fs::remove_dir_all(s.dir()).unwrap();
    // Missing: an error, and the last good state stays.
    assert!(next(&mut w).await.is_err());
    assert_eq!(names(&w), ["a"]);
    fs::create_dir(s.dir()).unwrap();
    fs::write(s.dir().join("b.yaml"), pod("b")).unwrap();
    let mut saw_b = false;
    for _ in 0..5 {
        if let Ok(d) = next(&mut w).await
            && names(&w) == ["b"]
        {
            assert_eq!(d.pods_removed.len(), 1, "{d:?}");
            saw_b = true;
            break;
        }
    }
    assert!(
        saw_b,
        "the re-created directory was not read: {:?}",
        names(&w)
    );
    // And later changes inside it are seen too.
    fs::write(s.dir().join("c.yaml"), pod("c")).unwrap();
    let d = next(&mut w).await.unwrap();
    assert_eq!(d.pods_added.len(), 1, "{d:?}");
    assert_eq!(names(&w), ["b", "c"]);
}

/// `changed()` polled in a `select!` that a busy branch wins over and over (the node's loop
/// with sensor events arriving during the debounce): no change may be lost.
#[tokio::test]
async fn changed_loses_nothing_when_its_future_is_dropped() {
    let s = Scratch::new("cancel");
    let mut w = s.watch(Duration::from_millis(100));
    w.reload().unwrap();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let dir = s.dir();
    let toggler = tokio::spawn(async move {
        let file = dir.join("t.yaml");
        for i in 0..10 {
            let want: Vec<String> = if i % 2 == 0 {
                fs::write(&file, pod("t")).unwrap();
                vec!["t".into()]
            } else {
                fs::remove_file(&file).unwrap();
                vec![]
            };
            loop {
                let got = tokio::time::timeout(LIMIT, seen_rx.recv())
                    .await
                    .unwrap_or_else(|_| panic!("toggle {i} ({want:?}) was never processed"))
                    .unwrap();
                if got == want {
                    break;
                }
            }
        }
        let _ = stop_tx.send(());
    });
    let mut busy = tokio::time::interval(Duration::from_millis(2));
    let mut wins = 0u64;
    loop {
        tokio::select! {
            _ = busy.tick() => wins += 1,
            r = w.changed() => {
                r.unwrap();
                seen_tx.send(names(&w)).unwrap();
            }
            _ = &mut stop_rx => break,
        }
    }
    toggler.await.unwrap();
    assert!(wins > 100, "the busy branch should have won often: {wins}");
}

#[tokio::test]
async fn a_manifest_that_stops_parsing_keeps_its_pod_for_the_grace_period() {
    let s = Scratch::new("grace");
    let file = s.dir().join("a.yaml");
    fs::write(&file, pod("a")).unwrap();
    let grace = Duration::from_millis(600);
    let mut w = s.watch(Duration::from_millis(20)).with_parse_grace(grace);
    w.reload().unwrap();
    // Half-written: invalid YAML for a while.
    fs::write(&file, "apiVersion: v1\nkind: Pod\nmetadata: {name: a\n").unwrap();
    let broke = Instant::now();
    let d = next(&mut w).await.unwrap();
    assert!(d.pods_removed.is_empty(), "{d:?}");
    assert_eq!(names(&w), ["a"]);
    assert_eq!(d.new_problems.len(), 1, "{d:?}");
    // Written in full again within the grace period: nothing changed for the pod.
    fs::write(&file, pod("a")).unwrap();
    let d = next(&mut w).await.unwrap();
    assert!(
        d.pods_removed.is_empty() && d.pods_changed.is_empty(),
        "{d:?}"
    );
    assert!(broke.elapsed() < grace, "the test machine was too slow");
    // Broken for good: removed once the grace period is over, without another event.
    fs::write(&file, "kind: [").unwrap();
    let broke = Instant::now();
    let d = next(&mut w).await.unwrap();
    assert!(d.pods_removed.is_empty(), "{d:?}");
    let d = next(&mut w).await.unwrap();
    assert_eq!(d.pods_removed.len(), 1, "{d:?}");
    assert!(
        broke.elapsed() >= grace,
        "removed after {:?}",
        broke.elapsed()
    );
    // A deleted file removes its pod at once.
    fs::write(&file, pod("a")).unwrap();
    assert_eq!(next(&mut w).await.unwrap().pods_added.len(), 1);
    fs::remove_file(&file).unwrap();
    assert_eq!(next(&mut w).await.unwrap().pods_removed.len(), 1);
}

/// A pod qoslet's runtime cannot run (a container without a `command`: there is no image
/// entrypoint) is refused at the door with the runtime's own line; the rest run.
#[test]
fn a_pod_the_runtime_cannot_run_is_refused_at_the_door() {
    let s = Scratch::new("unrunnable");
    fs::write(s.dir().join("a.yaml"), pod("a")).unwrap();
    let image_only = "apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec:\n  containers: [{name: c, image: x}]\n";
    fs::write(s.dir().join("b.yaml"), image_only).unwrap();
    let set = load_dir(
        &s.dir(),
        &PodSet::default(),
        &ValidationOptions::default(),
        Runner::Qoslet,
        DEFAULT_MAX_BYTES,
    )
    .unwrap();
    let diff = diff(&PodSet::default(), &set);
    let names: Vec<&str> = set.pods.keys().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["a"]);
    let file = s.dir().join("b.yaml");
    assert_eq!(
        diff.new_problems,
        [format!(
            "{}: Pod/b: schema: spec.containers[0].command: required: qoslet runs commands on the host and has no image entrypoint",
            file.display()
        )]
    );
}

/// A file written again as it was (an editor saving unchanged, a tool rewriting the directory)
/// costs its read and no load; a change of a text loads the directory.
#[tokio::test]
async fn files_rewritten_unchanged_load_nothing() {
    let s = Scratch::new("unchanged");
    fs::write(s.dir().join("a.yaml"), pod("a")).unwrap();
    fs::write(s.dir().join("b.yaml"), pod("b")).unwrap();
    let mut w = s.watch(Duration::from_millis(20));
    w.reload().unwrap();
    assert_eq!((names(&w), w.loads), (vec!["a".into(), "b".into()], 1));
    fs::write(s.dir().join("a.yaml"), pod("a")).unwrap();
    let diff = next(&mut w).await.unwrap();
    assert!(diff.is_empty(), "{diff:?}");
    assert_eq!(w.loads, 1, "the same texts loaded again");
    fs::write(s.dir().join("a.yaml"), pod("c")).unwrap();
    let diff = next(&mut w).await.unwrap();
    let added: Vec<&str> = diff.pods_added.iter().map(|k| k.name.as_str()).collect();
    assert_eq!((added, w.loads), (vec!["c"], 2));
    assert_eq!(names(&w), ["b", "c"]);
}
