//! Workload / PodGroup / CompositePodGroup documents through decoding, validation, dangling
//! references, gating, updates and disruption units: nothing panics.
//! The body is `qoslet::fuzzing::workload`, compiled and run on the shipped manifests by the
//! agent's unit tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| qoslet::fuzzing::workload(data));
