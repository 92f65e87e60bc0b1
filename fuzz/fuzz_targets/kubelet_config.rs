//! A KubeletConfiguration, parsed, turned into node settings, checked as `validate` does and
//! planned for an empty node: nothing panics.
//! The body is `qoslet::fuzzing::kubelet_config`, compiled and run on the shipped manifests by the
//! agent's unit tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| qoslet::fuzzing::kubelet_config(data));
