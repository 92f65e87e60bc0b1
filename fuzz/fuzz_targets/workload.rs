//! Workload / PodGroup / CompositePodGroup documents through decoding, validation, dangling
//! references, gating, updates and disruption units: nothing panics.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use qoslet::{
    source::manifest::{Loaded, parse_documents},
    workload::{self, Forest, ValidationOptions},
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut loaded = Loaded::default();
    parse_documents(Path::new("fuzz.yaml"), text, &mut loaded);
    let objects: Vec<_> = loaded.objects.iter().filter_map(|o| workload::decode(o).ok()).collect();
    for gate in [false, true] {
        let opts = ValidationOptions { pod_group_preemption_policy: gate };
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
});
