//! The kubelet's crash-loop back-off (pkg/kubelet/kuberuntime, `CrashLoopBackOff`): a restart
//! waits `base` (10 s), doubling after each restart up to `max` (5 min); a container that ran
//! for `reset_after` (10 min) starts again from `base`. Pure: the caller supplies run times.

use std::time::Duration;

/// The back-off parameters; the base is configurable so tests run fast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    pub base: Duration,
    pub max: Duration,
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

/// The back-off of one container.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    config: BackoffConfig,
    /// The delay before the next restart; `None` until the first restart.
    current: Option<Duration>,
}

impl Backoff {
    pub(crate) fn new(config: BackoffConfig) -> Self {
        Self {
            config,
            current: None,
        }
    }

    /// The delay before restarting a container that exited after running for `ran_for`.
    pub(crate) fn next_delay(&mut self, ran_for: Duration) -> Duration {
        let delay = match self.current {
            Some(d) if ran_for < self.config.reset_after => {
                d.saturating_mul(2).min(self.config.max)
            }
            _ => self.config.base.min(self.config.max),
        };
        self.current = Some(delay);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn doubles_from_base_to_max() {
        let mut b = Backoff::new(BackoffConfig::default());
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay(S(1)).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn resets_after_a_long_run() {
        let mut b = Backoff::new(BackoffConfig::default());
        for _ in 0..4 {
            b.next_delay(S(1));
        }
        assert_eq!(b.next_delay(S(599)), S(160));
        assert_eq!(b.next_delay(S(600)), S(10));
        assert_eq!(b.next_delay(S(0)), S(20));
    }

    #[test]
    fn a_small_base_scales_the_sequence() {
        let mut b = Backoff::new(BackoffConfig {
            base: Duration::from_millis(50),
            max: Duration::from_millis(150),
            reset_after: S(600),
        });
        let delays: Vec<u128> = (0..4).map(|_| b.next_delay(S(0)).as_millis()).collect();
        assert_eq!(delays, [50, 100, 150, 150]);
    }
}
