//! Quantities: parsing, the canonical string, arithmetic and conversions never panic, and the
//! canonical string parses back to the same value.
//! The body is `qoslet::fuzzing::quantity`, compiled and run on the shipped manifests by the
//! agent's unit tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| qoslet::fuzzing::quantity(data));
