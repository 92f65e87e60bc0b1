//! The CPU-pressure controller: when latency-sensitive pods wait too long on the run queue, the
//! BestEffort tier is constrained one level per window, and released one level per run of calm
//! windows. Pure: the node feeds it one [`Window`] per housekeeping tick and applies the
//! [`Lever`] of its level to the BestEffort tier's desired settings (the reconciler writes it).
//!
//! Why latency and not usage: CPU weights share bandwidth, they do not bound wake-up latency; a
//! Guaranteed pod beside BestEffort hogs waits behind them even with the kubelet's weights.
//! qoslet sees that wait directly (the `sched_switch` sensor's log2 histograms), so it acts on
//! the symptom instead of on node CPU usage as koordlet's BestEffort suppression does.
//!
//! Levels, cumulative (each keeps the ones below it):
//! 1. `cpu.idle = 1` on the tier (SCHED_IDLE for the whole tier, 5.15+; skipped where the kernel
//!    has no `cpu.idle`);
//! 2. the tier confined by cpuset to `cap_percent` of the pods' CPUs (at least one, never all;
//!    the highest-numbered), so the others run no BestEffort task at all (skipped with fewer
//!    than two CPUs or no cpuset controller);
//! 3. a bandwidth cap at `cap_percent` of the node's CPU;
//! 4. the cap at `floor_percent`, so BestEffort never starves completely.
//!
//! Why the cpuset comes before the caps: `cargo xtask bench cpu` measured that on the kernels
//! where the kubelet's weights let a waking Guaranteed pod wait behind BestEffort (the VMs: 3-7
//! ms p99), `cpu.idle` and the caps leave that p99 at 3-11 ms (a capped tier still runs on
//! every CPU, in bursts), while keeping BestEffort off some CPUs brings it back to what the pod
//! sees alone, at the cost of the 50% cap. Koordinator suppresses BestEffort by cpuset too.
//!
//! The tier's weight is not a lever: the kubelet already gives BestEffort the minimum (2 shares,
//! weight 1), there is nothing lower to write.
//!
//! Whose pressure: a window counts only while the BestEffort tier uses CPU. When it used less
//! than a quarter of the floor's grant ([`IDLE_SHARE_OF_FLOOR`]), the protected pods waited
//! behind something else (Burstable pods, system daemons, a busy hypervisor) and no lever on
//! BestEffort shortens that wait: engaging would only starve BestEffort pods started later, and
//! holding a level would keep them starved for as long as the other load lasts. Such a window is
//! calm here, so an engaged tier whose hogs are gone is released on schedule.
//!
//! Hysteresis: pressure steps up at once (one level per window), calm steps down only after
//! `calm_windows` calm windows in a row, one level at a time. When pressure comes back soon after
//! a release (within the calm run that allowed it), the calm run needed doubles, up to
//! `max_calm_windows`, so a steady BestEffort load does not make the tier flap every few seconds.

use std::time::Duration;

use qoslet_common::sched::RUNQ_HIST_BUCKETS;

use super::{cpu::MIN_QUOTA_PERIOD_US, cpuset::CpuSet};

/// A log2 run-queue latency histogram (bucket `i`: `[2^i, 2^(i+1))` µs).
pub(crate) type Histogram = [u64; RUNQ_HIST_BUCKETS];

/// The controller's configuration (QosletConfiguration `cpuPressure`), validated.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuPressureConfig {
    /// Run-queue latency p99 of the protected pods above which the window is under pressure.
    pub(crate) latency_target: Duration,
    /// Burstable pods are protected too (Guaranteed always are).
    pub(crate) protect_burstable: bool,
    /// The node's CPU PSI `some` share of the window (0..1) above which the window is under
    /// pressure; `None` ignores PSI. Off by default: the node's PSI counts the BestEffort
    /// tier's own waiting, which no lever removes, so it would hold the tier constrained for as
    /// long as BestEffort is busy even when the protected pods no longer wait.
    pub(crate) psi_some_target: Option<f64>,
    /// Calm windows in a row before one level is released.
    pub(crate) calm_windows: u32,
    /// The most calm windows a release can require after back-off.
    pub(crate) max_calm_windows: u32,
    /// Level 2's share of the pods' CPUs and level 3's cap, percent of the node's CPU.
    pub cap_percent: u32,
    /// Level 4's cap (the floor), percent of the node's CPU.
    pub(crate) floor_percent: u32,
    /// Fewer protected wake-ups than this in a window: its p99 says nothing, the window is calm
    /// as far as latency goes.
    pub(crate) min_wakeups: u64,
}

impl Default for CpuPressureConfig {
    fn default() -> Self {
        Self {
            latency_target: Duration::from_millis(5),
            protect_burstable: false,
            psi_some_target: None,
            calm_windows: 5,
            max_calm_windows: 60,
            cap_percent: 50,
            floor_percent: 10,
            min_wakeups: 20,
        }
    }
}

/// How constrained the BestEffort tier is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum Level {
    #[default]
    None = 0,
    Idle = 1,
    Cpuset = 2,
    Cap = 3,
    Floor = 4,
}

/// The levers this node's kernel and cgroups offer; a level without its lever is skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Available {
    /// The tier has `cpu.idle`.
    pub(crate) idle: bool,
    /// The tier has `cpuset.cpus` and the pods have at least two CPUs.
    pub(crate) cpuset: bool,
}

impl Level {
    pub(crate) fn as_u8(self) -> u8 {
        self as u8
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Idle => "idle",
            Level::Cpuset => "cpuset",
            Level::Cap => "cap",
            Level::Floor => "floor",
        }
    }

    /// One level up, past the levels whose lever is not available.
    fn up(self, available: Available) -> Self {
        let next = match self {
            Level::None => Level::Idle,
            Level::Idle => Level::Cpuset,
            Level::Cpuset => Level::Cap,
            Level::Cap | Level::Floor => Level::Floor,
        };
        if next.offered(available) {
            next
        } else {
            next.up(available)
        }
    }

    fn down(self, available: Available) -> Self {
        let next = match self {
            Level::Floor => Level::Cap,
            Level::Cap => Level::Cpuset,
            Level::Cpuset => Level::Idle,
            Level::Idle | Level::None => return Level::None,
        };
        if next.offered(available) {
            next
        } else {
            next.down(available)
        }
    }

    fn offered(self, available: Available) -> bool {
        match self {
            Level::Idle => available.idle,
            Level::Cpuset => available.cpuset,
            Level::None | Level::Cap | Level::Floor => true,
        }
    }
}

/// The BestEffort tier is idle in a window where it used less than the floor's grant divided by
/// this (a quarter: 2.5% of the node's CPU with the default 10% floor). A tier held at the floor
/// by hogs uses all of it, so the hogs never read as idle.
pub(crate) const IDLE_SHARE_OF_FLOOR: f64 = 4.0;

/// What one window measured.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Window {
    /// The protected pods' run-queue latency p99 over the window; `None`: too few wake-ups.
    pub(crate) latency_p99: Option<Duration>,
    /// The node's CPU PSI `some` share of the window (0..1); `None`: not read.
    pub(crate) psi_some: Option<f64>,
    /// The CPU the BestEffort tier used over the window, a share of the node's (0..1); `None`:
    /// not read (then the tier counts as busy).
    pub(crate) besteffort_share: Option<f64>,
}

/// A level change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Engage { from: Level, to: Level },
    Release { from: Level, to: Level },
}

/// What the tier's settings are at a level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lever {
    /// `cpu.idle`; `None`: the kernel has none, leave it alone.
    pub(crate) idle: Option<bool>,
    /// The CFS quota in µs per `period_us`; `None`: unlimited (`max` / `-1`).
    pub(crate) quota_us: Option<i64>,
    pub(crate) period_us: u64,
    /// The tier's CPUs; `None`: no cpuset lever here, leave them alone.
    pub(crate) cpus: Option<CpuSet>,
}

/// The state machine that steps the BestEffort tier's level: up on a pressured window, down
/// after a run of calm ones (longer after a release that did not hold).
#[derive(Debug, Clone)]
pub(crate) struct LevelStepper {
    cfg: CpuPressureConfig,
    level: Level,
    /// Calm windows in a row so far.
    calm: u32,
    /// Calm windows in a row needed for the next release.
    required: u32,
    /// Windows since the last release while no engagement followed; `None`: none yet.
    since_release: Option<u32>,
}

impl LevelStepper {
    pub(crate) fn new(cfg: CpuPressureConfig) -> Self {
        let required = cfg.calm_windows.max(1);
        Self {
            cfg,
            level: Level::None,
            calm: 0,
            required,
            since_release: None,
        }
    }

    pub(crate) fn config(&self) -> &CpuPressureConfig {
        &self.cfg
    }

    pub(crate) fn level(&self) -> Level {
        self.level
    }

    /// Calm windows needed for the next release (after back-off).
    #[cfg(test)]
    pub(crate) fn required_calm(&self) -> u32 {
        self.required
    }

    /// Whether `w` is under pressure that a lever on BestEffort can relieve.
    pub(crate) fn pressured(&self, w: &Window) -> bool {
        let latency = w.latency_p99.is_some_and(|p| p > self.cfg.latency_target);
        let psi = matches!((w.psi_some, self.cfg.psi_some_target), (Some(s), Some(t)) if s > t);
        (latency || psi) && !self.besteffort_idle(w)
    }

    /// Whether the BestEffort tier used too little CPU in `w` to be what the protected pods
    /// waited behind.
    pub(crate) fn besteffort_idle(&self, w: &Window) -> bool {
        let idle_below = f64::from(self.cfg.floor_percent) / 100.0 / IDLE_SHARE_OF_FLOOR;
        w.besteffort_share.is_some_and(|s| s < idle_below)
    }

    /// One window; the level change it caused, if any.
    pub(crate) fn observe(&mut self, w: &Window, available: Available) -> Option<Step> {
        let base = self.cfg.calm_windows.max(1);
        let max = self.cfg.max_calm_windows.max(base);
        if self.pressured(w) {
            self.calm = 0;
            // Pressure back within the calm run that allowed the last release: back off.
            if let Some(n) = self.since_release.take()
                && n < self.required
            {
                self.required = self.required.saturating_mul(2).min(max);
            }
            let from = self.level;
            self.level = from.up(available);
            return (self.level != from).then_some(Step::Engage {
                from,
                to: self.level,
            });
        }
        if let Some(n) = &mut self.since_release {
            *n += 1;
            if *n >= self.required {
                // A release that held: the next one needs only the base run again.
                self.since_release = None;
                self.required = base;
            }
        }
        if self.level == Level::None {
            self.calm = 0;
            return None;
        }
        self.calm += 1;
        if self.calm < self.required {
            return None;
        }
        self.calm = 0;
        let from = self.level;
        self.level = from.down(available);
        self.since_release = Some(0);
        Some(Step::Release {
            from,
            to: self.level,
        })
    }

    /// The tier's settings at the current level on a node with `cpu_millis` of CPU and the CPUs
    /// `pod_cpus` for pods.
    pub(crate) fn lever(
        &self,
        cpu_millis: i64,
        pod_cpus: &CpuSet,
        period_us: u64,
        available: Available,
    ) -> Lever {
        lever(
            &self.cfg, self.level, cpu_millis, pod_cpus, period_us, available,
        )
    }
}

/// The tier's settings at `level`.
pub(crate) fn lever(
    cfg: &CpuPressureConfig,
    level: Level,
    cpu_millis: i64,
    pod_cpus: &CpuSet,
    period_us: u64,
    available: Available,
) -> Lever {
    let quota = |percent: u32| {
        let q = i128::from(cpu_millis.max(0)) * i128::from(period_us) * i128::from(percent)
            / (1000 * 100);
        // The kernel's smallest quota is 1 ms.
        (q as i64).max(MIN_QUOTA_PERIOD_US)
    };
    Lever {
        idle: available.idle.then_some(level >= Level::Idle),
        quota_us: match level {
            Level::None | Level::Idle | Level::Cpuset => None,
            Level::Cap => Some(quota(cfg.cap_percent.max(cfg.floor_percent))),
            Level::Floor => Some(quota(cfg.floor_percent)),
        },
        period_us,
        cpus: available.cpuset.then(|| {
            if level >= Level::Cpuset {
                besteffort_cpus(pod_cpus, cfg.cap_percent)
            } else {
                pod_cpus.clone()
            }
        }),
    }
}

/// The CPUs the tier keeps at the cpuset level: `percent` of `pod_cpus` rounded up, at least
/// one and never all of them: the highest-numbered, a fixed choice so every pass writes the
/// same list.
pub fn besteffort_cpus(pod_cpus: &CpuSet, percent: u32) -> CpuSet {
    let n = pod_cpus.len();
    if n < 2 {
        return pod_cpus.clone();
    }
    let keep = (n * percent as usize).div_ceil(100).clamp(1, n - 1);
    pod_cpus.iter().skip(n - keep).collect()
}

/// The CPU the tier may use under `lever`, in millicores (`cpu_millis` when unconstrained): the
/// least of its quota and its CPUs.
pub(crate) fn granted_millis(lever: &Lever, cpu_millis: i64) -> i64 {
    let by_quota = match lever.quota_us {
        None => cpu_millis,
        Some(q) if lever.period_us > 0 => {
            (i128::from(q) * 1000 / i128::from(lever.period_us)).min(i128::from(cpu_millis)) as i64
        }
        Some(_) => 0,
    };
    let by_cpus = lever
        .cpus
        .as_ref()
        .map_or(cpu_millis, |c| (c.len() as i64).saturating_mul(1000));
    by_quota.min(by_cpus)
}

/// The bucket-by-bucket growth of a cumulative histogram since `before` (a counter that went
/// back, a cgroup made again, counts as its new value).
pub(crate) fn histogram_delta(before: &Histogram, now: &Histogram) -> Histogram {
    let mut out = [0; RUNQ_HIST_BUCKETS];
    for (o, (b, n)) in out.iter_mut().zip(before.iter().zip(now)) {
        *o = if n >= b { n - b } else { *n };
    }
    out
}

/// The `q` quantile of a window's histogram, interpolated linearly inside its log2 bucket;
/// `None` with fewer than `min_count` samples. The bucket's upper bound alone would be off by
/// up to 2x (a 5 ms target would read 8.2 ms for any p99 from 4.1 ms on).
pub(crate) fn quantile(hist: &Histogram, q: f64, min_count: u64) -> Option<Duration> {
    let total: u64 = hist.iter().sum();
    if total == 0 || total < min_count {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0);
    let mut seen = 0.0;
    for (i, &n) in hist.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let n = n as f64;
        if seen + n >= rank {
            let lower = if i == 0 { 0.0 } else { (1u64 << i) as f64 };
            let upper = (1u64 << (i + 1)) as f64;
            let us = lower + (upper - lower) * (rank - seen) / n;
            return Some(Duration::from_nanos((us * 1000.0) as u64));
        }
        seen += n;
    }
    None
}

/// The PSI `some` share of a window from two readings of `total` (µs) `elapsed` apart.
pub(crate) fn psi_share(before_us: u64, now_us: u64, elapsed: Duration) -> Option<f64> {
    let elapsed_us = elapsed.as_micros();
    if elapsed_us == 0 || now_us < before_us {
        return None;
    }
    Some(((now_us - before_us) as f64 / elapsed_us as f64).min(1.0))
}

/// The `some` line's `total=` of a `cpu.pressure` / `/proc/pressure/cpu` text.
pub(crate) fn parse_psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests;
