//! Sizing `systemReserved` / `kubeReserved` (`qoslet recommend-reserved`), pure: from samples
//! of what the system and the kube daemons actually use, and beside it the fixed formula of
//! OpenShift's automatic node sizing. The kubelet itself computes nothing here; its docs only
//! advise reading the Summary API and reserving what the system uses.
//!
//! Percentiles are nearest-rank over the samples as taken (no interpolation): with few samples
//! p99 is the largest, which is what a reservation should cover anyway. Our own code because
//! it is a sort and an index.

use serde::Serialize;

/// What a set of samples of one quantity says, and the reservation it suggests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Sized {
    pub(crate) samples: usize,
    pub(crate) p50: u64,
    pub(crate) p99: u64,
    pub(crate) max: u64,
    /// p99 plus the headroom, rounded up to `round_to`.
    pub(crate) recommended: u64,
}

/// Nearest-rank percentile `p` (0 < p <= 100) of `sorted` (ascending, not empty).
pub(crate) fn percentile(sorted: &[u64], p: u32) -> u64 {
    let n = sorted.len();
    let rank = (u64::from(p) * n as u64).div_ceil(100).max(1) as usize;
    sorted[rank.min(n) - 1]
}

/// p50, p99 and max of `values`, and p99 * (100 + headroom_pct) / 100 rounded up to a multiple
/// of `round_to`; `None` without samples.
pub(crate) fn size(values: &[u64], headroom_pct: u32, round_to: u64) -> Option<Sized> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let p99 = percentile(&sorted, 99);
    let padded = (u128::from(p99) * u128::from(100 + headroom_pct)).div_ceil(100);
    let round = u128::from(round_to.max(1));
    let recommended = u64::try_from(padded.div_ceil(round) * round).unwrap_or(u64::MAX);
    Some(Sized {
        samples: values.len(),
        p50: percentile(&sorted, 50),
        p99,
        max: sorted[sorted.len() - 1],
        recommended,
    })
}

/// OpenShift's automatic node sizing (machine-config-operator, templates/common/_base/files/
/// kubelet-auto-sizing.yaml, `dynamic_memory_sizing` / `dynamic_cpu_sizing`): one
/// `systemReserved` for everything that is not a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct AutoSizing {
    /// The inputs as the script reads them: `getconf _NPROCESSORS_ONLN` and `free -g` (whole
    /// GiB, truncated).
    pub(crate) cpus: u64,
    pub(crate) memory_gib: u64,
    /// The values it writes, e.g. `0.08` and `3.56Gi`.
    pub(crate) cpu: String,
    pub(crate) memory: String,
    pub(crate) cpu_millis: u64,
    pub(crate) memory_bytes: u64,
}

/// `dynamic_cpu_sizing`: 6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% of
/// the rest; `dynamic_memory_sizing`: 25% of the first 4 GiB, 20% of the next 4, 10% of the
/// next 8, 6% of the next 112, 2% of the rest. Computed in exact decimals (awk uses doubles,
/// which print the same for these few digits).
pub(crate) fn openshift_auto_sizing(cpus: u64, memory_gib: u64) -> AutoSizing {
    // CPU in 1/10000 of a core, memory in 1/1000 GiB.
    let cpu = tiered(cpus, &[(1, 600), (1, 100), (2, 50)], 25);
    let mem = tiered(memory_gib, &[(4, 250), (4, 200), (8, 100), (112, 60)], 20);
    AutoSizing {
        cpus,
        memory_gib,
        cpu: decimal(cpu, 4),
        memory: format!("{}Gi", decimal(mem, 3)),
        // A Quantity rounds a fraction of a milli-unit or byte up.
        cpu_millis: cpu.div_ceil(10),
        memory_bytes: (u128::from(mem) << 30).div_ceil(1000) as u64,
    }
}

/// `total` units charged tier by tier: each `(width, rate)` takes up to `width` units at
/// `rate`, what is left goes at `rest`.
fn tiered(total: u64, tiers: &[(u64, u64)], rest: u64) -> u64 {
    let mut left = total;
    let mut sum = 0;
    for (width, rate) in tiers {
        let used = left.min(*width);
        sum += used * rate;
        left -= used;
    }
    sum + left * rest
}

/// `value / 10^places` as awk prints it: no trailing zeros, no trailing point.
fn decimal(value: u64, places: u32) -> String {
    let scale = 10u64.pow(places);
    let (int, frac) = (value / scale, value % scale);
    if frac == 0 {
        return int.to_string();
    }
    let digits = format!("{frac:0width$}", width = places as usize);
    format!("{int}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=200).collect();
        assert_eq!(percentile(&v, 50), 100);
        assert_eq!(percentile(&v, 99), 198);
        assert_eq!(percentile(&v, 100), 200);
        assert_eq!(percentile(&[7], 99), 7);
        // Ten samples: p99 is the largest.
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile(&v, 99), 10);
        assert_eq!(percentile(&v, 50), 5);
    }

    #[test]
    fn size_pads_p99_and_rounds_up() {
        let mib = 1 << 20;
        let s = size(&[300 * mib, 100 * mib, 200 * mib], 10, mib).unwrap();
        assert_eq!(
            (s.samples, s.p50, s.p99, s.max),
            (3, 200 * mib, 300 * mib, 300 * mib)
        );
        assert_eq!(s.recommended, 330 * mib);
        // 123 millicores + 10% = 135.3 -> 136.
        let s = size(&[123_000_000], 10, 1_000_000).unwrap();
        assert_eq!(s.recommended, 136_000_000);
        assert_eq!(size(&[], 10, 1), None);
    }

    #[test]
    fn openshift_auto_sizing_follows_the_script() {
        // (cpus, GiB) -> (SYSTEM_RESERVED_CPU, SYSTEM_RESERVED_MEMORY) as the script prints.
        let rows = [
            (1, 2, "0.06", "0.5Gi"),
            (2, 4, "0.07", "1Gi"),
            (4, 8, "0.08", "1.8Gi"),
            (8, 16, "0.09", "2.6Gi"),
            (16, 32, "0.11", "3.56Gi"),
            (64, 128, "0.23", "9.32Gi"),
            (96, 256, "0.31", "11.88Gi"),
            (5, 5, "0.0825", "1.2Gi"),
        ];
        for (cpus, gib, cpu, memory) in rows {
            let a = openshift_auto_sizing(cpus, gib);
            assert_eq!(
                (a.cpu.as_str(), a.memory.as_str()),
                (cpu, memory),
                "{cpus} {gib}"
            );
        }
        let a = openshift_auto_sizing(5, 8);
        assert_eq!(a.cpu_millis, 83); // 82.5m rounds up as a Quantity does
        assert_eq!(a.memory_bytes, (18 << 30) / 10 + 1); // 1.8Gi = 1932735283.2 bytes, up
    }
}
