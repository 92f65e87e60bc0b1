//! Helpers for qoslet's root integration tests.
