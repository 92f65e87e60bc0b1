//! The QosletConfiguration parser never panics.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use qoslet::config::QosletConfiguration;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = QosletConfiguration::parse(Path::new("fuzz.yaml"), text);
    }
});
