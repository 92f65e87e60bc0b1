//! The QosletConfiguration parser never panics.
//! The body is `qoslet::fuzzing::qoslet_config`, compiled and run on the shipped manifests by the
//! agent's unit tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| qoslet::fuzzing::qoslet_config(data));
