//! The eviction manager on the real kernel, one test binary (each binary embeds the agent and
//! its eBPF object, and the VM matrix's initramfs must fit in the VM's memory). The tests run
//! one at a time: each node root may take hundreds of MiB, and the VM has about 1 GiB.

/// Held by every test for its whole run.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod kubelet_order {
    //! The eviction manager on the real kernel: a node root cgroup with a memory limit and a hard
    //! memory.available threshold, one pod of each class plus a Burstable pod over its request.
    //! Memory grows in the BestEffort and the Burstable-over pods; the manager must evict BestEffort
    //! first, then the Burstable pod over its request, before the kernel OOM killer acts.

    use std::time::Duration;

    use qoslet::{
        eviction::{Inventory, Order},
        policy::qos::QosClass,
    };
    use qoslet_tests::{
        EvictionNodeRoot, EvictionRun, hard_memory_config, managed_pod, require_root,
    };

    const MI: u64 = 1 << 20;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn best_effort_then_burstable_over_request_are_evicted_before_the_oom_killer() {
        let _serial = crate::SERIAL.lock().await;
        require_root();
        // Pressure once the pods' working set passes 384 - 96 = 288 MiB.
        let Some(node) = EvictionNodeRoot::create(384 * MI) else {
            return;
        };
        let v1 = node.v1;
        let g = node.pod("guaranteed");
        let bu = node.pod("burstable-under");
        let be = node.pod("best-effort");
        let bo = node.pod("burstable-over");
        let inventory = Inventory {
            pods: vec![
                managed_pod("guaranteed", &g, v1, QosClass::Guaranteed, 64, 0),
                managed_pod("burstable-under", &bu, v1, QosClass::Burstable, 64, 0),
                managed_pod("best-effort", &be, v1, QosClass::BestEffort, 0, 0),
                managed_pod("burstable-over", &bo, v1, QosClass::Burstable, 16, 0),
            ],
            forests: Default::default(),
        };
        let cfg = hard_memory_config("96Mi", Order::GangAware, Duration::from_secs(1));
        let run = EvictionRun::start(&node, cfg, inventory, true, Some(Duration::from_millis(10)));

        let mut hog_g = g.start_hog(56, None);
        let mut hog_bu = bu.start_hog(32, None);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // BestEffort is 48 MiB over its (zero) request before the Burstable hog starts, and grows
        // faster, so at the first crossing it is the further over. A fixed head start was not
        // enough under emulation: twice on the 6.12 VM the Burstable pod led.
        let mut hog_be = be.start_hog(250, Some(80.0));
        let be_usage = be.memory_cgroup(v1);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while be_usage.usage().unwrap_or(0) < 48 * MI as i64 {
            assert!(
                std::time::Instant::now() < deadline,
                "the BestEffort hog never reached 48 MiB"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut hog_bo = bo.start_hog(240, Some(30.0));

        let decisions = run.wait_decisions(2, Duration::from_secs(40)).await;
        assert_eq!(
            decisions,
            vec![
                vec!["best-effort".to_owned()],
                vec!["burstable-over".to_owned()]
            ],
            "eviction order"
        );
        let sig = |h: &mut qoslet_tests::Hog| {
            tokio::task::block_in_place(|| h.wait_signal(Duration::from_secs(5)))
        };
        assert_eq!(sig(&mut hog_be), Some(libc::SIGKILL));
        assert_eq!(sig(&mut hog_bo), Some(libc::SIGKILL));
        // Let the survivors run on a moment after the last eviction: nothing else may go.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(hog_g.alive(), "the Guaranteed pod must survive");
        assert!(
            hog_bu.alive(),
            "the Burstable pod under its request must survive"
        );
        assert_eq!(
            node.oom_kills(),
            0,
            "the kernel OOM killer must not have acted"
        );

        let stats = run.stats.lock().unwrap().clone();
        assert_eq!(stats.evictions.get("memory.available"), Some(&2));
        assert_eq!(stats.decision_latency.count, 2);
        for d in &stats.recent {
            assert_eq!(d.signal, "memory.available");
            assert_eq!(d.threshold, 96 * MI as i64);
            assert!(d.observed < d.threshold, "{d:?}");
            assert!(d.latency.is_some());
            let (_, status) = &d.statuses[0];
            assert_eq!((status.phase, status.reason), ("Failed", "Evicted"));
            assert_eq!(status.conditions[0].type_, "DisruptionTarget");
            assert!(
                status
                    .message
                    .starts_with("The node was low on resource: memory.")
            );
        }
    }
}

mod gangs {
    //! Gang-aware eviction on the real kernel: a `disruptionMode: all` group goes whole, a gang
    //! with surplus members loses a surplus member and then a lone pod rather than dropping below
    //! its minimum, and a critical pod is never evicted.

    use std::{collections::BTreeMap, path::Path, time::Duration};

    use qoslet::{
        eviction::{Inventory, Order},
        policy::qos::QosClass,
        source::manifest::{Loaded, parse_documents},
        workload::Forest,
    };
    use qoslet_tests::{
        EvictionNodeRoot, EvictionRun, Hog, hard_memory_config, managed_pod, require_root,
    };

    const MI: u64 = 1 << 20;

    fn forests(yaml: &str) -> BTreeMap<String, Forest> {
        let mut loaded = Loaded::default();
        parse_documents(Path::new("gang-test.yaml"), yaml, &mut loaded);
        assert!(loaded.malformed.is_empty(), "{:?}", loaded.malformed);
        Forest::by_namespace(
            loaded
                .objects
                .iter()
                .map(|r| r.hierarchy_object().expect("decodable")),
        )
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
    fn node() -> Option<EvictionNodeRoot> {
        require_root();
        EvictionNodeRoot::create(384 * MI)
    }

    fn start(node: &EvictionNodeRoot, inventory: Inventory) -> EvictionRun {
        let cfg = hard_memory_config("96Mi", Order::GangAware, Duration::from_secs(1));
        EvictionRun::start(node, cfg, inventory, true, Some(Duration::from_millis(10)))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_disruption_mode_all_group_is_evicted_whole() {
        let _serial = crate::SERIAL.lock().await;
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
        let _serial = crate::SERIAL.lock().await;
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
        let _serial = crate::SERIAL.lock().await;
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
}

mod action {
    //! The standalone eviction action on the real kernel: SIGTERM first, the grace period, then the
    //! whole cgroup killed (cgroup.kill on v2 and in the unified tree of hybrid hosts, SIGKILL to
    //! every pid on v1 until the cgroup is empty).

    use std::{
        process::{Command, Stdio},
        time::{Duration, Instant},
    };

    use qoslet::{
        eviction::{CgroupKill, EvictionAction as _, EvictionRequest},
        policy::pod::PodKey,
    };
    use qoslet_tests::{EvictionNodeRoot, require_root};

    const MI: u64 = 1 << 20;

    fn request(cgroups: qoslet::eviction::PodCgroups, grace: Duration) -> EvictionRequest {
        EvictionRequest {
            pod: key(),
            cgroups,
            grace,
            message: "m".into(),
            annotations: Default::default(),
            seen: Default::default(),
            signal: "memory.available".into(),
            hard: grace.is_zero(),
            unit: None,
            revision: 0,
        }
    }

    fn key() -> PodKey {
        PodKey {
            namespace: "default".into(),
            name: "pod".into(),
            uid: "uid-pod".into(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_that_exits_on_sigterm_is_not_killed() {
        let _serial = crate::SERIAL.lock().await;
        require_root();
        let Some(node) = EvictionNodeRoot::create(128 * MI) else {
            return;
        };
        let pod = node.pod("pod");
        let mut hog = pod.start_hog(4, None);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = Instant::now();
        let out = CgroupKill
            .evict(&request(
                pod.eviction_cgroups(node.v1),
                Duration::from_secs(5),
            ))
            .await
            .expect("eviction");
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "SIGTERM was enough: no full grace wait"
        );
        assert!(out.first_signal_at.is_some_and(|t| t >= t0));
        let sig = tokio::task::block_in_place(|| hog.wait_signal(Duration::from_secs(2)));
        assert_eq!(sig, Some(libc::SIGTERM));
        assert_eq!((out.status.phase, out.status.reason), ("Failed", "Evicted"));
        assert!(pod.memory.pids().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_that_ignores_sigterm_is_killed_whole_after_the_grace_period() {
        let _serial = crate::SERIAL.lock().await;
        require_root();
        let Some(node) = EvictionNodeRoot::create(128 * MI) else {
            return;
        };
        let pod = node.pod("pod");
        // A shell that ignores SIGTERM and keeps starting children: only a cgroup-wide kill ends it.
        let mut sh = Command::new("sh")
            .args(["-c", "trap '' TERM; read go; while :; do sleep 0.05; done"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("starting sh");
        pod.add(sh.id());
        {
            use std::io::Write as _;
            let stdin = sh.stdin.as_mut().expect("stdin");
            stdin.write_all(b"go\n").expect("releasing sh");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let grace = Duration::from_millis(500);
        let t0 = Instant::now();
        CgroupKill
            .evict(&request(pod.eviction_cgroups(node.v1), grace))
            .await
            .expect("eviction");
        assert!(t0.elapsed() >= grace, "the grace period was honoured");
        let status = tokio::task::block_in_place(|| sh.wait()).expect("waiting for sh");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(pod.memory.pids().is_empty());
        if let Some(u) = &pod.unified {
            assert!(u.pids().is_empty());
            // Before 5.14 (the 5.10 VM) there is no cgroup.kill: the SIGKILL loop did it.
            let version = qoslet_tests::kernel_version();
            assert_eq!(
                u.path.join("cgroup.kill").exists(),
                version >= (5, 14),
                "cgroup.kill on Linux {version:?}"
            );
        }
    }
}

mod watch {
    //! The node root watcher on the real kernel, notifications only (no level check): on v1 the
    //! memory threshold notification (cgroup.event_control + eventfd) fires when usage crosses the
    //! level; on v2 inotify reports memory.events changing when the node root passes memory.high.

    use std::time::Duration;

    use qoslet::eviction::{WakeSource, WatchConfig, spawn_watcher};
    use qoslet_tests::{EvictionNodeRoot, require_root};

    const MI: u64 = 1 << 20;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watcher_wakes_on_the_kernels_notification() {
        let _serial = crate::SERIAL.lock().await;
        require_root();
        let Some(node) = EvictionNodeRoot::create(256 * MI) else {
            return;
        };
        let expected = if node.v1 {
            WakeSource::UsageThreshold
        } else {
            // memory.high throttles and counts `high` events without any OOM kill.
            node.memory.write("memory.high", &(64 * MI).to_string());
            WakeSource::MemoryEvents
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let watcher = spawn_watcher(
            WatchConfig {
                node_root: node.memory_cgroup(),
                level_bytes: (64 * MI) as i64,
                poll: None,
            },
            tx,
        )
        .expect("starting the watcher");
        let pod = node.pod("pod");
        // Nothing crossed yet: no wake-up.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), rx.recv())
                .await
                .is_err(),
            "a wake-up before any crossing"
        );
        let mut hog = pod.start_hog(128, Some(200.0));
        let wake = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a wake-up within 10 s of the crossing")
            .expect("the watcher is running");
        assert_eq!(wake.source, expected);
        assert!(hog.alive());
        assert_eq!(node.oom_kills(), 0);
        watcher.abort();
    }
}
