//! Manifests to a plan, as `qoslet plan` and the manifest watch take them: documents, admission,
//! one pod per UID, the plan and the cgroup desired state. Nothing panics, and every admitted
//! pod is planned with an oom_score_adj in range.
//! The body is `qoslet::fuzzing::manifest_plan`, compiled and run on the shipped manifests by the
//! agent's unit tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| qoslet::fuzzing::manifest_plan(data));
