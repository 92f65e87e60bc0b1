//! A KubeletConfiguration, parsed, turned into node settings, checked as `validate` does and
//! planned for an empty node: nothing panics.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use qoslet::{
    config::{KubeletConfig, QosletConfiguration, node_settings},
    policy::{cpuset::CpuSet, plan::plan_node, settings::Capacity},
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("fuzz.yaml");
    let Ok(kc) = KubeletConfig::parse(file, text) else {
        return;
    };
    let _ = kc.check(file);
    let capacity = Capacity {
        cpu_millis: 4000,
        memory_bytes: 32 << 30,
        pids: 4_194_304,
        cpus: CpuSet::first(4),
    };
    if let Ok(s) = node_settings(file, &kc, &QosletConfiguration::default(), capacity) {
        let _ = plan_node(&s, &[]);
    }
});
