//! Diagnostics for operators on the programs' rare paths (a ring full, a watched cgroup without a
//! CPU slot, a map full, a record that could not be filled), through aya-log into the agent's
//! logs.
//!
//! Off unless the agent is asked (`ebpf.kernelDiagnostics`): the switch is aya-log's own
//! load-time global `AYA_LOG_LEVEL`, which the agent sets to 0 (off) or to `Level::Debug`. It
//! lives in the frozen `.rodata` map, so the verifier knows its value and removes every logging
//! branch of a program loaded with diagnostics off; without that pruning the off path would be a
//! load and a branch. Every check a log site makes of its own (is this the first record on this
//! CPU?) comes after [`on`], so it is pruned with the logging.

use aya_log_ebpf::macro_support::{Level, level_enabled};

/// Whether diagnostics are on. aya-log-ebpf is pinned (`=0.2.0`), whose macros check the same
/// global through the same function.
#[inline(always)]
pub fn on() -> bool {
    level_enabled(Level::Warn)
}
