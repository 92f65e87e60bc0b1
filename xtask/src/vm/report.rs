//! Turns the VM's console into a `KernelReport` and prints the matrix.

use std::path::PathBuf;

use super::KernelReport;

/// Reads the `QOSLET-VM-*` lines printed by `init.sh`. The run is ok only when the final result
/// line is there, every expected binary reported with exit code 0 and nothing failed.
pub fn parse(
    lines: &[String],
    expected_binaries: usize,
    timed_out: bool,
    fallback_kernel: &str,
    log_path: PathBuf,
) -> KernelReport {
    let mut kernel = None;
    let mut layout = None;
    let mut binaries = 0;
    let mut binaries_ok = 0;
    let mut result = None;
    for line in lines {
        // Kernel messages can interleave with init's output; find the marker anywhere.
        let Some(at) = line.find("QOSLET-VM-") else {
            continue;
        };
        let line = &line[at..];
        if let Some(rest) = line.strip_prefix("QOSLET-VM-KERNEL ") {
            kernel = Some(rest.trim().to_owned());
        } else if let Some(rest) = line.strip_prefix("QOSLET-VM-CGROUP ") {
            layout = Some(rest.trim().to_owned());
        } else if line.starts_with("QOSLET-VM-BINARY ") {
            binaries += 1;
            if field(line, "rc") == Some(0) && field(line, "failed") == Some(0) {
                binaries_ok += 1;
            }
        } else if line.starts_with("QOSLET-VM-RESULT ") {
            result = Some((
                field(line, "passed").unwrap_or(0),
                field(line, "failed").unwrap_or(0),
                field(line, "ignored").unwrap_or(0),
            ));
        }
    }
    let (passed, failed, ignored) = result.unwrap_or((0, 0, 0));
    let ok = !timed_out
        && result.is_some()
        && failed == 0
        && binaries == expected_binaries
        && binaries_ok == expected_binaries;
    let mut cgroup_layout = layout.unwrap_or_else(|| "unknown".to_owned());
    if timed_out {
        cgroup_layout.push_str(" (timed out)");
    } else if result.is_none() {
        cgroup_layout.push_str(" (no result line)");
    }
    KernelReport {
        kernel: kernel.unwrap_or_else(|| fallback_kernel.to_owned()),
        cgroup_layout,
        passed,
        failed,
        ignored,
        ok,
        log_path,
        sensors: super::sensor_table::parse_all(lines.iter().map(String::as_str)),
    }
}

fn field(line: &str, key: &str) -> Option<u32> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

pub fn print(reports: &[KernelReport]) {
    println!("vm-test results:");
    for r in reports {
        println!(
            "  {} kernel={} cgroup={} passed={} failed={} ignored={} log={}",
            if r.ok { "ok  " } else { "FAIL" },
            r.kernel,
            r.cgroup_layout,
            r.passed,
            r.failed,
            r.ignored,
            r.log_path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(str::to_owned).collect()
    }

    #[test]
    fn passes_only_with_all_binaries_and_result() {
        let ok = lines(
            "QOSLET-VM-KERNEL 6.12.1\nQOSLET-VM-CGROUP v2 controllers=cpu,memory\n\
             QOSLET-VM-BINARY name=a rc=0 passed=2 failed=0 ignored=1\n\
             QOSLET-VM-RESULT passed=2 failed=0 ignored=1",
        );
        let r = parse(&ok, 1, false, "x", PathBuf::new());
        assert!(r.ok);
        assert_eq!((r.kernel.as_str(), r.passed, r.ignored), ("6.12.1", 2, 1));
        assert!(
            !parse(&ok, 2, false, "x", PathBuf::new()).ok,
            "a binary is missing"
        );
        assert!(!parse(&ok, 1, true, "x", PathBuf::new()).ok, "timed out");
        assert!(
            !parse(&ok[..3], 1, false, "x", PathBuf::new()).ok,
            "no result line"
        );
        let crashed = lines(
            "QOSLET-VM-BINARY name=a rc=101 passed=0 failed=1 ignored=0\n\
             QOSLET-VM-RESULT passed=0 failed=1 ignored=0",
        );
        assert!(!parse(&crashed, 1, false, "x", PathBuf::new()).ok);
    }
}
