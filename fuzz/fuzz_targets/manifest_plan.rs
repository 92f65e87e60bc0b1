//! Manifests to a plan, as `qoslet plan` and the manifest watch take them: documents, admission,
//! one pod per UID, the plan and the cgroup desired state. Nothing panics, and every admitted
//! pod is planned with an oom_score_adj in range.
#![no_main]

use std::{collections::BTreeMap, path::Path};

use libfuzzer_sys::fuzz_target;
use qoslet::{
    cgroup::{
        desired::{Naming, desired_state},
        name::{CgroupPath, ContainerRuntime},
    },
    policy::{
        cpuset::CpuSet,
        plan::plan_node,
        settings::{Capacity, NodeSettings},
    },
    source::{
        admit::{admit, unique_uids},
        manifest::{Loaded, parse_documents},
    },
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut loaded = Loaded::default();
    parse_documents(Path::new("fuzz.yaml"), text, &mut loaded);
    let mut admitted: Vec<_> = loaded.objects.iter().filter_map(|o| admit(o).ok()).collect();
    let _ = unique_uids(&mut admitted, &BTreeMap::new());
    let pods: Vec<_> = admitted.into_iter().filter_map(|a| a.pod.map(|p| p.view)).collect();
    let mut s = NodeSettings::defaults(Capacity {
        cpu_millis: 4000,
        memory_bytes: 32 << 30,
        pids: 4_194_304,
        cpus: CpuSet::first(4),
    });
    s.pod_pids_limit = Some(1024);
    let plan = plan_node(&s, &pods).expect("default settings plan");
    assert_eq!(plan.pods.len(), pods.len());
    for p in &plan.pods {
        for c in &p.containers {
            assert!((-997..=1000).contains(&c.oom_score_adj), "{}", c.oom_score_adj);
        }
    }
    let naming = Naming {
        driver: s.cgroup_driver,
        runtime: ContainerRuntime::Standalone,
        node_root: CgroupPath::parse("/fuzz").expect("root"),
        create_containers: true,
    };
    let d = desired_state(&plan, &naming, &BTreeMap::new());
    // Admission already checked every name the cgroups are built from.
    assert!(d.refused_pods.is_empty(), "{:?}", d.refused_pods);
});
