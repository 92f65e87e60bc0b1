//! CPU shares, CFS quota and cgroup v2 weights (pkg/kubelet/cm/helpers_linux.go,
//! pkg/kubelet/cm/cgroup_manager_linux.go, runc libcontainer/cgroups/utils.go).

use serde::{Deserialize, Serialize};

pub(crate) const MIN_SHARES: u64 = 2;
pub(crate) const MAX_SHARES: u64 = 262_144;
pub(crate) const SHARES_PER_CPU: i64 = 1024;
pub(crate) const MILLI_CPU_TO_CPU: i64 = 1000;
/// Default CFS period, microseconds.
pub const QUOTA_PERIOD_US: u64 = 100_000;
pub(crate) const MIN_QUOTA_PERIOD_US: i64 = 1000;

/// How cgroup v1 shares map to cgroup v2 `cpu.weight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum WeightFormula {
    /// The kubelet's linear map `1 + ((shares-2)*9999)/262142`, used for the cgroups it manages.
    #[default]
    KubeletLinear,
    /// The quadratic map of runc >= 1.3.2 and crun >= 1.23 (container cgroups), which sends the
    /// default 1024 shares to the default weight 100.
    RuncQuadratic,
}

/// `MilliCPUToShares`: 0 -> 2, else `m*1024/1000` clamped to [2, 262144].
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    if milli_cpu <= 0 {
        // Upstream maps 0 to MinShares to match the kernel default for "unset".
        return MIN_SHARES;
    }
    let shares =
        (i128::from(milli_cpu) * i128::from(SHARES_PER_CPU)) / i128::from(MILLI_CPU_TO_CPU);
    shares.clamp(MIN_SHARES.into(), MAX_SHARES.into()) as u64
}

/// `MilliCPUToQuota`: 0 -> 0 (no quota), else `m*period/1000`, at least 1000 us.
pub fn milli_cpu_to_quota(milli_cpu: i64, period_us: u64) -> i64 {
    if milli_cpu <= 0 {
        return 0;
    }
    let quota = i128::from(milli_cpu) * i128::from(period_us) / i128::from(MILLI_CPU_TO_CPU);
    quota.clamp(MIN_QUOTA_PERIOD_US.into(), i64::MAX.into()) as i64
}

impl WeightFormula {
    /// cgroup v2 `cpu.weight` for `shares`, in [1, 10000] (0 only for 0 shares, runc's "unset").
    pub fn weight(self, shares: u64) -> u64 {
        match self {
            Self::KubeletLinear => linear_weight(shares),
            Self::RuncQuadratic => quadratic_weight(shares),
        }
    }
}

/// pkg/kubelet/cm/cgroup_manager_linux.go `getCPUWeight`.
fn linear_weight(shares: u64) -> u64 {
    if shares >= MAX_SHARES {
        return 10_000;
    }
    1 + (shares.max(MIN_SHARES) - 2) * 9999 / 262_142
}

/// runc `ConvertCPUSharesToCgroupV2Value` (1.3.2+). It is defined in float64; the same
/// operations in the same order give the same IEEE results, so the check values match.
fn quadratic_weight(shares: u64) -> u64 {
    match shares {
        0 => 0,
        1..=2 => 1,
        s if s >= MAX_SHARES => 10_000,
        s => {
            let l = (s as f64).log2();
            let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
            (10f64.powf(exponent).ceil() as u64).clamp(1, 10_000)
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn reference_weight_table() {
        // REFERENCE section 3: milliCPU -> shares -> linear / quadratic.
        let table = [
            (100, 102, 4, 17),
            (500, 512, 20, 59),
            (1000, 1024, 39, 100),
            (8000, 8192, 313, 532),
            (64000, 65536, 2500, 3023),
        ];
        for (milli, shares, linear, quadratic) in table {
            assert_eq!(milli_cpu_to_shares(milli), shares, "{milli}m");
            assert_eq!(
                WeightFormula::KubeletLinear.weight(shares),
                linear,
                "{shares}"
            );
            assert_eq!(
                WeightFormula::RuncQuadratic.weight(shares),
                quadratic,
                "{shares}"
            );
        }
    }

    #[test]
    fn shares_and_quota_clamp() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD_US), 0);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD_US), 1000);
        assert_eq!(milli_cpu_to_quota(500, QUOTA_PERIOD_US), 50_000);
        assert_eq!(milli_cpu_to_quota(2500, 50_000), 125_000);
        assert_eq!(WeightFormula::KubeletLinear.weight(2), 1);
        assert_eq!(WeightFormula::KubeletLinear.weight(MAX_SHARES), 10_000);
        assert_eq!(WeightFormula::RuncQuadratic.weight(MAX_SHARES - 1), 10_000);
    }

    proptest! {
        #[test]
        fn weights_are_monotonic_and_in_range(a in 2u64..300_000, b in 2u64..300_000) {
            let (lo, hi) = (a.min(b), a.max(b));
            for f in [WeightFormula::KubeletLinear, WeightFormula::RuncQuadratic] {
                let (wl, wh) = (f.weight(lo), f.weight(hi));
                prop_assert!((1..=10_000).contains(&wl) && (1..=10_000).contains(&wh));
                prop_assert!(wl <= wh, "{:?}: w({lo})={wl} > w({hi})={wh}", f);
            }
        }
    }
}
