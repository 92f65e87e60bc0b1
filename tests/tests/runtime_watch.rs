//! The standalone manifest directory, watched with inotify: adding, changing and removing a
//! manifest shows in the diff; a broken manifest is one clear problem while the others stay.

use std::{fs, time::Duration};

use qoslet::{cgroup::Runner, standalone::watch::ManifestWatch, workload::ValidationOptions};
use qoslet_tests::TempDir;

const WAIT: Duration = Duration::from_secs(10);

fn pod(name: &str, cmd: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  containers: [{{name: c, command: [{cmd}]}}]\n"
    )
}

fn names(keys: &[qoslet::policy::pod::PodKey]) -> Vec<&str> {
    keys.iter().map(|k| k.name.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_changes_become_desired_state_diffs() {
    let dir = TempDir::new();
    fs::write(dir.path.join("keep.yaml"), pod("keep", "sleep")).unwrap();
    let mut watch = ManifestWatch::new(
        &dir.path,
        Duration::from_millis(100),
        ValidationOptions::default(),
        Runner::Qoslet,
    )
    .expect("watching the directory");
    let initial = watch.reload().unwrap();
    assert_eq!(names(&initial.pods_added), ["keep"]);

    let next = async |w: &mut ManifestWatch| {
        tokio::time::timeout(WAIT, w.changed())
            .await
            .expect("no change seen within the timeout")
            .expect("reloading")
    };

    fs::write(dir.path.join("web.yaml"), pod("web", "sleep")).unwrap();
    let d = next(&mut watch).await;
    assert_eq!(names(&d.pods_added), ["web"], "{d:?}");
    assert!(
        d.pods_changed.is_empty() && d.pods_removed.is_empty(),
        "{d:?}"
    );

    fs::write(dir.path.join("web.yaml"), pod("web", "cat")).unwrap();
    let d = next(&mut watch).await;
    assert_eq!(names(&d.pods_changed), ["web"], "{d:?}");

    // Written under a hidden name and renamed, as editors do: one reload, one problem line.
    let broken = "apiVersion: v1\nkind: Pod\nmetadata: {name: bad, namespace: demo}\nspec:\n  containers:\n  - name: c\n    command: [x]\n    env: [{name: A, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]\n";
    fs::write(dir.path.join(".bad.yaml.tmp"), broken).unwrap();
    fs::rename(dir.path.join(".bad.yaml.tmp"), dir.path.join("bad.yaml")).unwrap();
    let d = next(&mut watch).await;
    assert_eq!(d.new_problems.len(), 1, "{d:?}");
    let line = &d.new_problems[0];
    assert!(
        line.starts_with(&format!(
            "{}: Pod/demo/bad: schema: spec.containers[0].env[0].valueFrom: ",
            dir.path.join("bad.yaml").display()
        )),
        "{line}"
    );
    assert!(
        d.pods_added.is_empty() && d.pods_removed.is_empty(),
        "{d:?}"
    );
    let running: Vec<&str> = watch.state().pods.keys().map(|k| k.name.as_str()).collect();
    assert_eq!(running, ["keep", "web"]);

    // A misspelt key is dropped, as the API server drops it, with one warning naming the line,
    // the field and the field meant; the pod runs.
    fs::write(
        dir.path.join("typo.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: typo, namespace: demo}\nspec:\n  containers:\n  - name: c\n    command: [sleep]\n    resoures: {limits: {memory: 1Gi}}\n",
    )
    .unwrap();
    let d = next(&mut watch).await;
    assert_eq!(names(&d.pods_added), ["typo"], "{d:?}");
    assert_eq!(
        d.new_warnings,
        [format!(
            "{}:8: Pod/demo/typo: unknown-field: spec.containers[0].resoures: unknown field (did you mean `resources`?)",
            dir.path.join("typo.yaml").display()
        )],
        "{d:?}"
    );
    fs::remove_file(dir.path.join("typo.yaml")).unwrap();
    let d = next(&mut watch).await;
    assert_eq!(names(&d.pods_removed), ["typo"], "{d:?}");
    assert!(d.new_warnings.is_empty(), "{d:?}");

    fs::remove_file(dir.path.join("web.yaml")).unwrap();
    let d = next(&mut watch).await;
    assert_eq!(names(&d.pods_removed), ["web"], "{d:?}");
    assert!(
        d.new_problems.is_empty(),
        "the broken manifest is reported once: {d:?}"
    );
    assert_eq!(watch.state().problems.len(), 1);
}
