//! A histogram as the kernel keeps it, exported as is.

use std::sync::{Arc, RwLock};

use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{MetricType, TypedMetric},
};

/// A histogram as the kernel keeps it: log2 microsecond buckets (bucket `i` counts values in
/// `[2^i, 2^(i+1))` µs), exported as is instead of being replayed into a client-side histogram.
#[derive(Debug, Clone, Default)]
pub(crate) struct KernelHistogram {
    inner: Arc<RwLock<KernelHistogramData>>,
}

#[derive(Debug, Clone, Default)]
struct KernelHistogramData {
    count: u64,
    sum_ns: u64,
    buckets: Vec<u64>,
}

impl KernelHistogram {
    /// Replaces the snapshot (the kernel's counters are cumulative already).
    pub(crate) fn set(&self, count: u64, sum_ns: u64, buckets: &[u64]) {
        let mut d = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        d.count = count;
        d.sum_ns = sum_ns;
        d.buckets = buckets.to_vec();
    }

    /// The upper bound (seconds) of the bucket holding the `q` quantile, `None` when empty.
    pub(crate) fn quantile_upper_bound(&self, q: f64) -> Option<f64> {
        let d = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let total: u64 = d.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil() as u64;
        let mut seen = 0;
        for (i, n) in d.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(bucket_upper_bound(i));
            }
        }
        None
    }
}

fn bucket_upper_bound(i: usize) -> f64 {
    (1u64 << (i + 1).min(63)) as f64 * 1e-6
}

impl TypedMetric for KernelHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for KernelHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let d = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let last = d.buckets.len().saturating_sub(1);
        let buckets: Vec<(f64, u64)> = d
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    // The encoder writes `le="+Inf"` only for infinity, and Prometheus'
                    // histogram_quantile needs that bucket (NaN without it).
                    if i == last {
                        f64::INFINITY
                    } else {
                        bucket_upper_bound(i)
                    },
                    *n,
                )
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(d.sum_ns as f64 * 1e-9, d.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}
