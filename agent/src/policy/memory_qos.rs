//! Memory QoS on cgroup v2 (KEP-2570; pkg/kubelet/kuberuntime/kuberuntime_container_linux.go).

/// The kernel page size the kubelet rounds memory.high to.
pub(crate) const PAGE_SIZE: i64 = 4096;

/// `memory.high = floor((req + factor*(limit or allocatable - req)) / page) * page`, or `None`
/// when it would not be written: no factor, not above the request, or request == limit. From
/// 1.37 (`besteffort_too`) only a positive request == limit skips it, so a BestEffort
/// container (request = limit = 0) is throttled against allocatable: the
/// `generateLinuxContainerResources` change "Skip memory.high only for equal, positive memory
/// request/limit", and the 1.37 Memory QoS beta notes ("memory.high throttling on Burstable
/// and BestEffort containers").
/// Upstream computes in float64; this is exact (factor in millionths), which can only differ
/// when float64 rounding would cross a page boundary.
pub(crate) fn memory_high(
    request: i64,
    limit: i64,
    allocatable: i64,
    factor_ppm: Option<u32>,
    besteffort_too: bool,
) -> Option<i64> {
    let factor = i128::from(factor_ppm?);
    if request == limit && (request > 0 || !besteffort_too) {
        return None;
    }
    let ceiling = if limit != 0 { limit } else { allocatable };
    if ceiling <= 0 {
        return None;
    }
    let (req, ceiling) = (i128::from(request), i128::from(ceiling));
    let raw = req + (factor * (ceiling - req)).div_euclid(1_000_000);
    let high = raw.div_euclid(i128::from(PAGE_SIZE)) * i128::from(PAGE_SIZE);
    (high > req && high != 0).then_some(high as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_high_follows_the_kep_formula() {
        let mi = 1 << 20;
        for v137 in [false, true] {
            // 100Mi request, 200Mi limit, factor 0.9 -> 190Mi (page aligned).
            assert_eq!(
                memory_high(100 * mi, 200 * mi, 0, Some(900_000), v137),
                Some(190 * mi)
            );
            // No limit: against allocatable.
            assert_eq!(
                memory_high(100 * mi, 0, 1000 * mi, Some(900_000), v137),
                Some(910 * mi)
            );
            // Rounded down to a page.
            assert_eq!(memory_high(0, 10_000, 0, Some(500_000), v137), Some(4096));
            // A positive request == limit, no factor, or nothing above the request: not written.
            assert_eq!(memory_high(mi, mi, 0, Some(900_000), v137), None);
            assert_eq!(memory_high(0, mi, 0, None, v137), None);
            assert_eq!(memory_high(4000, 4100, 0, Some(900_000), v137), None);
        }
        // Neither request nor limit (BestEffort): not written up to 1.36, against allocatable
        // from 1.37.
        assert_eq!(memory_high(0, 0, 1000 * mi, Some(900_000), false), None);
        assert_eq!(
            memory_high(0, 0, 1000 * mi, Some(900_000), true),
            Some(900 * mi)
        );
    }
}
