//! Gang-aware eviction on the real kernel: a `disruptionMode: all` group goes whole, a gang
//! with surplus members loses a surplus member and then a lone pod rather than dropping below
//! its minimum, and a critical pod is never evicted.

use std::{collections::BTreeMap, path::Path, time::Duration};

use qoslet::{
    eviction::{Inventory, Order},
    policy::qos::QosClass,
    source::manifest::{Loaded, parse_documents},
    workload::{Forest, decode},
};
use qoslet_tests::{EvictionRun, Hog, NodeRoot, hard_memory_config, managed_pod, require_root};

const MI: u64 = 1 << 20;

fn forests(yaml: &str) -> BTreeMap<String, Forest> {
    let mut loaded = Loaded::default();
    parse_documents(Path::new("gang-test.yaml"), yaml, &mut loaded);
    assert!(loaded.malformed.is_empty(), "{:?}", loaded.malformed);
    Forest::by_namespace(loaded.objects.iter().map(|r| decode(r).expect("decodable")))
}

fn pod_yaml(name: &str, group: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  schedulingGroup: {{podGroupName: {group}}}\n  containers: [{{name: main, image: busybox}}]\n"
    )
}

fn group_yaml(name: &str, min: u32, all: bool) -> String {
    let mode = if all {
        ", disruptionMode: {all: {}}"
    } else {
        ""
    };
    format!(
        "---\napiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {{name: {name}, namespace: default}}\nspec: {{workloadRef: {{workloadName: w, templateName: t}}, schedulingPolicy: {{gang: {{minCount: {min}}}}}{mode}}}\n"
    )
}

fn killed(h: &mut Hog) -> bool {
    tokio::task::block_in_place(|| h.wait_signal(Duration::from_secs(5))) == Some(libc::SIGKILL)
}

/// 384 MiB node root, pressure once the working set passes 288 MiB.
fn node() -> Option<NodeRoot> {
    require_root();
    NodeRoot::create(384 * MI)
}

fn start(node: &NodeRoot, inventory: Inventory) -> EvictionRun {
    let cfg = hard_memory_config("96Mi", Order::GangAware, Duration::from_secs(1));
    EvictionRun::start(node, cfg, inventory, true, Some(Duration::from_millis(10)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disruption_mode_all_group_is_evicted_whole() {
    let Some(node) = node() else { return };
    let v1 = node.v1;
    let (j0, j1, grower) = (node.pod("j0"), node.pod("j1"), node.pod("grower"));
    let yaml = group_yaml("job", 2, true) + &pod_yaml("j0", "job") + &pod_yaml("j1", "job");
    let run = start(
        &node,
        Inventory {
            pods: vec![
                managed_pod("j0", &j0, v1, QosClass::BestEffort, 0, 0),
                managed_pod("j1", &j1, v1, QosClass::BestEffort, 0, 0),
                managed_pod("grower", &grower, v1, QosClass::Burstable, 250, 0),
            ],
            forests: forests(&yaml),
        },
    );
    let mut h0 = j0.start_hog(60, None);
    let mut h1 = j1.start_hog(60, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut hg = grower.start_hog(200, Some(60.0));
    let decisions = run.wait_decisions(1, Duration::from_secs(30)).await;
    assert_eq!(decisions, vec![vec!["j0".to_owned(), "j1".to_owned()]]);
    assert!(killed(&mut h0) && killed(&mut h1), "the whole unit goes");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(hg.alive(), "the Burstable pod under its request survives");
    assert_eq!(run.decisions().len(), 1);
    let unit = run.stats.lock().unwrap().recent[0].unit.clone();
    assert!(unit.is_some_and(|u| u.contains("job")));
    assert_eq!(node.oom_kills(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_loses_surplus_members_first() {
    let Some(node) = node() else { return };
    let v1 = node.v1;
    let names = ["a0", "a1", "a2"];
    let gang: Vec<_> = names.iter().map(|n| node.pod(n)).collect();
    let (lone, grower) = (node.pod("lone"), node.pod("grower"));
    let mut yaml = group_yaml("gang", 2, false);
    for n in names {
        yaml += &pod_yaml(n, "gang");
    }
    let mut pods: Vec<_> = names
        .iter()
        .zip(&gang)
        .map(|(n, p)| managed_pod(n, p, v1, QosClass::BestEffort, 0, 0))
        .collect();
    pods.push(managed_pod("lone", &lone, v1, QosClass::BestEffort, 0, 0));
    pods.push(managed_pod(
        "grower",
        &grower,
        v1,
        QosClass::Burstable,
        300,
        0,
    ));
    let run = start(
        &node,
        Inventory {
            pods,
            forests: forests(&yaml),
        },
    );
    let mut hogs: Vec<Hog> = gang.iter().map(|p| p.start_hog(40, None)).collect();
    let mut hl = lone.start_hog(30, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut hg = grower.start_hog(180, Some(40.0));
    let decisions = run.wait_decisions(2, Duration::from_secs(30)).await;
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    assert_eq!(decisions[0].len(), 1);
    assert!(
        names.contains(&decisions[0][0].as_str()),
        "a surplus member first: {decisions:?}"
    );
    assert_eq!(
        decisions[1],
        ["lone"],
        "then the lone pod, not a gang member"
    );
    assert!(killed(&mut hl));
    // The grower reaches its cap; the gang stays at its minimum.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let alive = hogs.iter_mut().map(Hog::alive).filter(|a| *a).count();
    assert_eq!(alive, 2, "two gang members survive");
    assert!(hg.alive());
    assert_eq!(run.decisions().len(), 2);
    assert_eq!(node.oom_kills(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_pod_is_never_evicted() {
    let Some(node) = node() else { return };
    let v1 = node.v1;
    let (critical, grower) = (node.pod("critical"), node.pod("grower"));
    let run = start(
        &node,
        Inventory {
            pods: vec![
                managed_pod(
                    "critical",
                    &critical,
                    v1,
                    QosClass::BestEffort,
                    0,
                    2_000_000_000,
                ),
                managed_pod("grower", &grower, v1, QosClass::Burstable, 16, 0),
            ],
            forests: BTreeMap::new(),
        },
    );
    // Without the exclusion the critical pod would rank first: it is further over its request.
    let mut hc = critical.start_hog(150, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut hg = grower.start_hog(250, Some(50.0));
    let decisions = run.wait_decisions(1, Duration::from_secs(30)).await;
    assert_eq!(decisions, vec![vec!["grower".to_owned()]]);
    assert!(killed(&mut hg));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(hc.alive(), "the critical pod survives");
    assert_eq!(node.oom_kills(), 0);
}
