//! Whether this process may load eBPF programs, told in one sentence when it may not.

use thiserror::Error;

/// CAP_BPF and CAP_PERFMON (Linux 5.8+) or CAP_SYS_ADMIN are needed to load tracing programs.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PrivilegeError {
    #[error(
        "qoslet needs root, or the CAP_BPF and CAP_PERFMON capabilities, to load its eBPF programs; run it as root or as the privileged DaemonSet"
    )]
    MissingCapabilities,
}

/// This process's effective capability set, from `/proc/self/status` (no libcap dependency);
/// 0 when it cannot be read.
pub(crate) fn effective_capabilities() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    parse_cap_eff(&status).unwrap_or(0)
}

/// Checks that the effective capabilities allow loading tracing programs.
pub(crate) fn check() -> Result<(), PrivilegeError> {
    if has_bpf_capabilities(effective_capabilities()) {
        Ok(())
    } else {
        Err(PrivilegeError::MissingCapabilities)
    }
}

/// Reads the `CapEff:` line (hex bit mask).
pub(crate) fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

pub(crate) fn has_bpf_capabilities(effective: u64) -> bool {
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_effective_capabilities() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert!(has_bpf_capabilities(0x1ff_ffff_ffff));
    }

    #[test]
    fn an_unprivileged_process_is_refused_with_one_sentence() {
        assert!(!has_bpf_capabilities(0));
        assert!(has_bpf_capabilities((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!has_bpf_capabilities(1 << CAP_BPF));
        let msg = PrivilegeError::MissingCapabilities.to_string();
        assert_eq!(msg.matches(';').count(), 1);
        assert!(msg.starts_with("qoslet needs root"));
    }
}
