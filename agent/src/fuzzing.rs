//! The bodies of the cargo-fuzz targets (`fuzz/fuzz_targets/`, `cargo xtask fuzz`), one function
//! each, taking the fuzzer's bytes. They live in the library so that every build and unit-test
//! run compiles them against today's API (the fuzz crate is its own nightly workspace, which CI
//! does not build) and `tests` below runs each on the shipped manifests. Each one asserts the
//! properties its target checks; a panic is a finding.

use std::{collections::BTreeMap, path::Path};

use crate::{
    cgroup::{
        desired::{Naming, desired_state},
        name::{CgroupPath, ContainerRuntime},
    },
    config::{KubeletConfig, QosletConfiguration, node_settings},
    policy::{
        cpuset::CpuSet,
        plan::plan_node,
        quantity::Quantity,
        settings::{Capacity, NodeSettings},
    },
    source::{
        admit::{admit, unique_uids},
        manifest::{Loaded, parse_documents},
    },
    workload::{self, Forest, ValidationOptions},
};

fn capacity() -> Capacity {
    Capacity {
        cpu_millis: 4000,
        memory_bytes: 32 << 30,
        pids: 4_194_304,
        cpus: CpuSet::first(4),
    }
}

/// Quantities: parsing, the canonical string, arithmetic and conversions never panic, and the
/// canonical string parses back to the same value. Input: `A` or `A B`.
pub fn quantity(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (a, b) = text.split_once(' ').unwrap_or((text, "1"));
    let Ok(qa) = a.parse::<Quantity>() else {
        return;
    };
    let canonical = qa.canonical();
    let back: Quantity = canonical
        .parse()
        .unwrap_or_else(|e| panic!("{a:?} -> {canonical:?} does not parse: {e}"));
    assert_eq!(back, qa, "{a:?} -> {canonical:?}");
    let _ = (
        qa.value(),
        qa.milli_value(),
        qa.scaled_value(-9),
        qa.signum(),
    );
    if let Ok(qb) = b.parse::<Quantity>() {
        let _ = qa.cmp(&qb);
        if let Some(s) = qa.checked_add(&qb) {
            let _ = (s.canonical(), s.value());
            if let Some(d) = s.checked_sub(&qb) {
                assert_eq!(d, qa, "({a} + {b}) - {b}");
            }
        }
    }
}

/// Manifests to a plan, as `qoslet plan` and the manifest watch take them: documents,
/// admission, one pod per UID, the plan and the cgroup desired state. Nothing panics, and every
/// admitted pod is planned with an oom_score_adj in range.
pub fn manifest_plan(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut loaded = Loaded::default();
    parse_documents(Path::new("fuzz.yaml"), text, &mut loaded);
    let mut admitted: Vec<_> = loaded
        .objects
        .iter()
        .filter_map(|o| admit(o).ok())
        .collect();
    let _ = unique_uids(&mut admitted, &BTreeMap::new());
    let pods: Vec<_> = admitted
        .into_iter()
        .filter_map(|a| a.pod.map(|p| p.view))
        .collect();
    let mut s = NodeSettings::defaults(capacity());
    s.pod_pids_limit = Some(1024);
    let plan = plan_node(&s, &pods).expect("default settings plan");
    assert_eq!(plan.pods.len(), pods.len());
    for p in &plan.pods {
        for c in &p.containers {
            assert!(
                (-997..=1000).contains(&c.oom_score_adj),
                "{}",
                c.oom_score_adj
            );
        }
    }
    let naming = Naming {
        driver: s.cgroup_driver,
        runtime: ContainerRuntime::Standalone,
        node_root: CgroupPath::parse("/fuzz").expect("root"),
        runner: crate::cgroup::Runner::Qoslet,
        enforce: Default::default(),
    };
    let d = desired_state(&plan, &naming, &BTreeMap::new());
    // Admission already checked every name the cgroups are built from.
    assert!(d.refused_pods.is_empty(), "{:?}", d.refused_pods);
}

/// A KubeletConfiguration through parsing, its checks, the node settings and an empty plan.
pub fn kubelet_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("fuzz.yaml");
    let Ok(kc) = KubeletConfig::parse(file, text) else {
        return;
    };
    let _ = kc.check(file);
    if let Ok(s) = node_settings(file, &kc, &QosletConfiguration::default(), capacity()) {
        let _ = plan_node(&s, &[]);
    }
}

/// A QosletConfiguration through parsing and its checks.
pub fn qoslet_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = QosletConfiguration::parse(Path::new("fuzz.yaml"), text);
    }
}

/// Workload / PodGroup / CompositePodGroup documents through decoding, validation, dangling
/// references, gating, updates and disruption units: nothing panics.
pub fn workload(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut loaded = Loaded::default();
    parse_documents(Path::new("fuzz.yaml"), text, &mut loaded);
    let objects: Vec<_> = loaded
        .objects
        .iter()
        .filter_map(|o| o.hierarchy_object().ok())
        .collect();
    for gate in [false, true] {
        let opts = ValidationOptions {
            pod_group_preemption_policy: gate,
        };
        for forest in Forest::by_namespace(objects.clone()).values() {
            let _ = workload::validate(forest, &opts);
            let _ = workload::dangling(forest);
            let _ = workload::startable(forest, &opts);
            for name in forest.pods.keys() {
                let _ = workload::disruption_unit(forest, name);
            }
            let evicted: Vec<String> = forest.pods.keys().take(2).cloned().collect();
            let _ = workload::breaks_gang(forest, &evicted);
        }
    }
    // The second half of the objects as an update of the first.
    let (old, new) = objects.split_at(objects.len() / 2);
    let _ = workload::apply_updates(old.to_vec(), new.to_vec());
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    /// Every YAML file below `deploy/`, the fuzzer's own seeds.
    fn shipped_yaml() -> Vec<Vec<u8>> {
        fn walk(dir: &Path, out: &mut Vec<Vec<u8>>) {
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "yaml") {
                    out.push(fs::read(&p).expect("reading a shipped manifest"));
                }
            }
        }
        let mut out = Vec::new();
        walk(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy"),
            &mut out,
        );
        out
    }

    #[test]
    fn every_fuzz_target_takes_the_shipped_manifests() {
        let seeds = shipped_yaml();
        assert!(seeds.len() > 10, "only {} manifests found", seeds.len());
        for seed in &seeds {
            manifest_plan(seed);
            kubelet_config(seed);
            qoslet_config(seed);
            workload(seed);
        }
        for q in [
            "100m 1",
            "1Gi 512Mi",
            "5Ei 5Ei",
            "-1.5e3 2",
            "9223372036854775807 1",
        ] {
            quantity(q.as_bytes());
        }
    }
}
