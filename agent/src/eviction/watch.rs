//! Wake-ups of the eviction manager. Any source sends [`Wake`]s down one channel: the sensors'
//! memcg events (see [`Wake::from_sensor`]), PSI triggers, and the watcher here on the node root:
//!
//! - v1: a memory threshold notification (`cgroup.event_control` + eventfd on
//!   `memory.usage_in_bytes`), the kernel's own mechanism, which the kubelet also uses
//!   (pkg/kubelet/eviction/threshold_notifier_linux.go);
//! - v2: inotify on `memory.events` (high/max/oom changes; the kubelet has no v2 notifier);
//! - the v2 root (the whole machine as the node) has no `memory.events` and no notification of
//!   its own: the sensors' wake-ups (the PSI trigger on `/proc/pressure/memory`, and the eBPF
//!   reclaim wake-ups: kswapd woken, direct reclaim begun; see [`Wake::from_sensor`]) and the
//!   level check, which there reads the working set itself from `/proc/meminfo`
//!   ([`MemoryCgroup::level_usage`]);
//! - all: a cheap level check of the usage (one read), because usage can sit above the
//!   notification level on page cache and a notification only fires on a crossing. Its interval
//!   follows the headroom, as earlyoom's does (`sleep_time_ms`: the free memory above its
//!   threshold over a fill rate of 6000 MiB/s, clamped): memory cannot run out sooner than the
//!   headroom at that rate, so a node far from its level is read once a second and one near it
//!   every `poll`.
//!
//! The watcher only wakes the manager; the manager reads every signal afresh.

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::PathBuf,
    time::{Duration, Instant},
};

use thiserror::Error;
use tokio::{io::unix::AsyncFd, sync::mpsc, task::JoinHandle};

use super::signals::MemoryCgroup;
use crate::cgroup::{Access, CgroupBeneath};
use crate::sensors::{
    SensorEvent,
    event::{PressureScope, ReclaimKind, boot_now_ns},
};

/// The id of a cgroup hierarchy's root directory (kernfs numbers it 1, on v1 and v2): a node
/// root with this id is the whole machine.
pub(crate) const ROOT_CGROUP_ID: u64 = 1;

/// Where a wake-up came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WakeSource {
    /// A memcg event of the eBPF sensors (high, max, oom) on the node root or kubepods.
    Memcg,
    /// A PSI trigger (the system's or the node root's).
    Pressure,
    /// The eBPF reclaim wake-up: kswapd woken or direct reclaim begun on a node that is the
    /// whole machine, or memcg reclaim by a task of the node's own cgroup.
    Reclaim,
    /// `memory.events` changed (v2).
    MemoryEvents,
    /// The v1 usage threshold notification fired.
    UsageThreshold,
    /// The watcher's level check saw usage at or above the level.
    UsageLevel,
    /// Anything else (the pod inventory changed, a test).
    Other,
}

impl WakeSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Memcg => "memcg",
            Self::Pressure => "pressure",
            Self::Reclaim => "reclaim",
            Self::MemoryEvents => "memory_events",
            Self::UsageThreshold => "usage_threshold",
            Self::UsageLevel => "usage_level",
            Self::Other => "other",
        }
    }
}

/// One wake-up: what and when it was seen (the start of the decision latency).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    pub source: WakeSource,
    pub(crate) at: Instant,
}

impl Wake {
    pub(crate) fn now(source: WakeSource) -> Self {
        Self {
            source,
            at: Instant::now(),
        }
    }

    /// A wake-up seen by the kernel at `boot_ns` (CLOCK_BOOTTIME, the clock of the eBPF
    /// records): `at` is that moment on the [`Instant`] clock, so the wake stage of the decision
    /// latency starts when the kernel saw it, not when the agent read the record.
    pub(crate) fn at_boot_ns(source: WakeSource, boot_ns: u64) -> Self {
        let now = Instant::now();
        let age = Duration::from_nanos(boot_now_ns().saturating_sub(boot_ns));
        Self {
            source,
            at: now.checked_sub(age).unwrap_or(now),
        }
    }

    /// A wake-up for a memcg event of one of `memcg_ids` (the node root and kubepods), for a
    /// PSI memory trigger of the system or of one of them, or for the kernel's reclaim: global
    /// (kswapd, direct) when the node is the whole machine (`memcg_ids` holds a hierarchy's
    /// root), memcg reclaim by a task of one of `memcg_ids` itself. A pod's reclaim at its own
    /// limit is not the node's (and the tracepoint does not say which memcg reclaims: a node
    /// cgroup with a limit wakes the watcher through its own `memory.events`).
    pub fn from_sensor(e: &SensorEvent, memcg_ids: &[u64]) -> Option<Self> {
        match e {
            SensorEvent::Memcg {
                memcg_id, boot_ns, ..
            } if memcg_ids.contains(memcg_id) => {
                Some(Self::at_boot_ns(WakeSource::Memcg, *boot_ns))
            }
            SensorEvent::ReclaimWake {
                kind: ReclaimKind::Kswapd | ReclaimKind::Direct,
                boot_ns,
                ..
            } if memcg_ids.contains(&ROOT_CGROUP_ID) => {
                Some(Self::at_boot_ns(WakeSource::Reclaim, *boot_ns))
            }
            SensorEvent::ReclaimWake {
                kind: ReclaimKind::Memcg,
                cgroup_id,
                boot_ns,
                ..
            } if memcg_ids.contains(cgroup_id) => {
                Some(Self::at_boot_ns(WakeSource::Reclaim, *boot_ns))
            }
            SensorEvent::MemoryPressure {
                scope: PressureScope::System,
            } => Some(Self::now(WakeSource::Pressure)),
            SensorEvent::MemoryPressure {
                scope: PressureScope::Cgroup(id),
            } if memcg_ids.contains(id) => Some(Self::now(WakeSource::Pressure)),
            _ => None,
        }
    }
}

#[derive(Debug, Error)]
pub enum MemoryWatchError {
    #[error("{what} failed")]
    Sys {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("registering the threshold notification in {path}")]
    Register {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the watcher watches.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    pub node_root: MemoryCgroup,
    /// Usage in bytes at which to wake: capacity minus the largest memory.available amount.
    /// Usage >= working set, so it crosses no later than the signal does (on the v2 root the
    /// working set itself is compared: [`MemoryCgroup::level_usage`]).
    pub level_bytes: i64,
    /// The level check's shortest interval (at or above the level); it lengthens with the
    /// headroom up to [`LEVEL_CHECK_MAX`]. `None` for notifications only.
    pub poll: Option<Duration>,
}

/// The level check's longest interval (earlyoom's `max_sleep`).
pub(crate) const LEVEL_CHECK_MAX: Duration = Duration::from_secs(1);
/// The fastest memory is assumed to fill, bytes per second: earlyoom's `mem_fill_rate` (6000
/// MiB/s, "seen with stress -m 4 --vm-bytes 4G").
const FILL_RATE: u64 = 6000 << 20;

/// How long the level check may sleep with `headroom` bytes below the level: the time memory
/// takes to fill it at [`FILL_RATE`], between `shortest` and [`LEVEL_CHECK_MAX`].
pub(crate) fn level_check_interval(headroom: i64, shortest: Duration) -> Duration {
    let headroom = u64::try_from(headroom).unwrap_or(0);
    let fill = Duration::from_secs_f64(headroom as f64 / FILL_RATE as f64);
    fill.clamp(shortest, LEVEL_CHECK_MAX.max(shortest))
}

fn sys(what: &'static str) -> impl FnOnce(std::io::Error) -> MemoryWatchError {
    move |source| MemoryWatchError::Sys { what, source }
}

/// Starts the watcher; it stops when the receiver is dropped.
pub fn spawn_watcher(
    cfg: WatchConfig,
    tx: mpsc::Sender<Wake>,
) -> Result<JoinHandle<()>, MemoryWatchError> {
    spawn_watcher_pausing(cfg, tx, None)
}

/// [`spawn_watcher`] whose level check pauses while `releasing` names an eviction
/// (`Manager::releasing`): the manager, waiting for that eviction's release, takes no wake-up
/// meanwhile (it drops those queued during an eviction), and a read every 10 ms would only take
/// CPU from the victim's exit. It checks at once when the release ends.
pub(crate) fn spawn_watcher_pausing(
    cfg: WatchConfig,
    tx: mpsc::Sender<Wake>,
    releasing: Option<tokio::sync::watch::Receiver<Option<u64>>>,
) -> Result<JoinHandle<()>, MemoryWatchError> {
    let dir = cfg.node_root.dir();
    let has = |file| dir.has_file(file).ok();
    let notifier = if !cfg.node_root.is_v2() {
        Notifier::Threshold(threshold_eventfd(dir, cfg.level_bytes)?)
    } else if cfg.poll.is_some()
        && has("cgroup.procs") == Some(true)
        && has("cgroup.type") == Some(false)
    {
        Notifier::None
    } else {
        Notifier::Events(inotify_events(dir, "memory.events")?)
    };
    Ok(tokio::spawn(run(cfg, notifier, tx, releasing)))
}

enum Notifier {
    Threshold(AsyncFd<OwnedFd>),
    Events(AsyncFd<OwnedFd>),
    /// The v2 root: no notification of its own (the sensors' PSI wake-ups and the level check).
    None,
}

impl Notifier {
    /// Waits for the next notification and consumes it.
    async fn next(&self) -> Result<WakeSource, std::io::Error> {
        match self {
            Self::Threshold(fd) => drain(fd, WakeSource::UsageThreshold).await,
            Self::Events(fd) => drain(fd, WakeSource::MemoryEvents).await,
            Self::None => std::future::pending().await,
        }
    }
}

/// [`next_event`] of `fd`, said as `source`.
async fn drain(fd: &AsyncFd<OwnedFd>, source: WakeSource) -> Result<WakeSource, std::io::Error> {
    next_event(fd).await.map(|()| source)
}

/// Waits until `fd` (an eventfd or inotify descriptor) is readable and empties it.
pub(super) async fn next_event(fd: &AsyncFd<OwnedFd>) -> Result<(), std::io::Error> {
    loop {
        let mut g = fd.readable().await?;
        let mut buf = [0u8; 4096];
        // SAFETY: read(2) into a buffer of the length given, from a descriptor we own.
        let n = unsafe { libc::read(fd.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if n < 0 && e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(e);
        }
        g.clear_ready();
    }
}

/// Registers an owned descriptor with the runtime.
fn register(fd: OwnedFd) -> Result<AsyncFd<OwnedFd>, MemoryWatchError> {
    // SAFETY: the AsyncFd owns the descriptor, so it stays open and unchanged while registered.
    unsafe { AsyncFd::register(fd) }
        .map_err(|e| sys("registering with the runtime")(e.into_parts().1))
}

/// An inotify descriptor watching `file` of `dir` for modifications (memory.events or
/// cgroup.events changes: the kernel announces a new value of either as one).
/// The file is opened beneath the node root and the watch added through its descriptor's
/// `/proc/self/fd` link (inotify takes only a path), so it lands on the file opened.
pub(super) fn inotify_events(
    dir: &CgroupBeneath,
    file: &str,
) -> Result<AsyncFd<OwnedFd>, MemoryWatchError> {
    let register_err = |source| MemoryWatchError::Register {
        path: dir.file_display(file),
        source,
    };
    let target = dir.open_file(file, Access::Read).map_err(register_err)?;
    // SAFETY: inotify_init1(2) with valid flags; the result is checked before it is owned.
    let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if raw < 0 {
        return Err(MemoryWatchError::Sys {
            what: "inotify_init1",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let link = std::ffi::CString::new(format!("/proc/self/fd/{}", target.as_raw_fd()))
        .expect("no NUL in a number");
    // SAFETY: a valid descriptor and a NUL-terminated path.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), link.as_ptr(), libc::IN_MODIFY) } < 0 {
        return Err(register_err(std::io::Error::last_os_error()));
    }
    // The watch holds the inode; the descriptor that named it may close.
    drop(target);
    register(fd)
}

async fn run(
    cfg: WatchConfig,
    notifier: Notifier,
    tx: mpsc::Sender<Wake>,
    mut releasing: Option<tokio::sync::watch::Receiver<Option<u64>>>,
) {
    // The first check at once; each check sets the next one's time from the headroom it saw.
    let mut next_check = cfg.poll.map(|_| tokio::time::Instant::now());
    loop {
        let paused = releasing
            .as_mut()
            .is_some_and(|r| r.borrow_and_update().is_some());
        let source = tokio::select! {
            Ok(()) = async { releasing.as_mut().expect("guarded").changed().await }, if releasing.is_some() => {
                // Released (or another eviction): the level is checked at once.
                next_check = next_check.map(|_| tokio::time::Instant::now());
                None
            }
            n = notifier.next() => match n {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "The memory notification failed; the level check and housekeeping remain.");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    None
                }
            },
            _ = async { tokio::time::sleep_until(next_check.expect("guarded")).await }, if next_check.is_some() && !paused => {
                let shortest = cfg.poll.expect("a level check has an interval");
                let usage = cfg.node_root.level_usage();
                let headroom = usage.as_ref().map_or(0, |u| cfg.level_bytes.saturating_sub(*u));
                next_check = Some(tokio::time::Instant::now() + level_check_interval(headroom, shortest));
                // Keep waking while above: usage may sit above the level on page cache while the
                // working set climbs, and the manager decides on fresh stats each time.
                usage.is_ok_and(|u| u >= cfg.level_bytes).then_some(WakeSource::UsageLevel)
            }
        };
        if let Some(source) = source {
            match tx.try_send(Wake::now(source)) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// Registers `memory.usage_in_bytes >= level` (either crossing) on a v1 memory cgroup; both
/// files are opened beneath the node root.
fn threshold_eventfd(
    dir: &CgroupBeneath,
    level: i64,
) -> Result<AsyncFd<OwnedFd>, MemoryWatchError> {
    // SAFETY: eventfd(2) with valid flags; the result is checked before it is owned.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(MemoryWatchError::Sys {
            what: "eventfd",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let efd = unsafe { OwnedFd::from_raw_fd(raw) };
    let usage = dir
        .open_file("memory.usage_in_bytes", Access::Read)
        .map_err(sys("opening memory.usage_in_bytes"))?;
    let control = "cgroup.event_control";
    let line = format!("{} {} {}", efd.as_raw_fd(), usage.as_raw_fd(), level.max(0));
    dir.write_file(control, &line)
        .map_err(|source| MemoryWatchError::Register {
            path: dir.file_display(control),
            source,
        })?;
    // The kernel holds its own reference to the usage file; ours may close.
    drop(usage);
    register(efd)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::cgroup::Tree;

    /// The v2 watcher's inotify watch is added through the descriptor opened beneath the node
    /// root: a change of that `memory.events` wakes the manager, and a `memory.events` that is
    /// a symlink out of the root is refused at the start.
    #[tokio::test]
    async fn memory_events_are_watched_through_the_file_opened_beneath_the_root() {
        let dir = std::env::temp_dir().join(format!("qoslet-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (root, outside) = (dir.join("root"), dir.join("outside"));
        std::fs::create_dir_all(root.join("link")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("memory.events"), "oom_kill 0\n").unwrap();
        std::fs::write(outside.join("memory.events"), "oom_kill 0\n").unwrap();
        std::os::unix::fs::symlink(
            outside.join("memory.events"),
            root.join("link/memory.events"),
        )
        .unwrap();
        let cfg = |path: &Path| WatchConfig {
            node_root: MemoryCgroup::own(path, Tree::V2).unwrap(),
            level_bytes: i64::MAX,
            poll: None,
        };

        let (tx, mut rx) = mpsc::channel(4);
        let task = spawn_watcher(cfg(&root), tx).unwrap();
        std::fs::write(root.join("memory.events"), "oom_kill 1\n").unwrap();
        let wake = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(
            wake.ok().flatten().map(|w| w.source),
            Some(WakeSource::MemoryEvents)
        );
        task.abort();

        let (tx, _rx) = mpsc::channel(4);
        let e = spawn_watcher(cfg(&root.join("link")), tx).expect_err("a symlinked memory.events");
        assert!(
            matches!(&e, MemoryWatchError::Register { source, .. } if source.raw_os_error() == Some(libc::ELOOP)),
            "{e:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    const MI: i64 = 1 << 20;

    /// While an eviction is being released the level check reads nothing and wakes no one,
    /// though usage is over the level; it checks, and wakes the manager, as soon as the release
    /// ends.
    #[tokio::test]
    async fn the_level_check_pauses_while_an_eviction_is_released() {
        let dir = std::env::temp_dir().join(format!("qoslet-watch-pause-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
        std::fs::write(dir.join("memory.current"), (900 * MI).to_string()).unwrap();
        let cfg = WatchConfig {
            node_root: MemoryCgroup::own(&dir, Tree::V2).unwrap(),
            level_bytes: 500 * MI,
            poll: Some(Duration::from_millis(10)),
        };
        let (releasing_tx, releasing) = tokio::sync::watch::channel(Some(1));
        let (tx, mut rx) = mpsc::channel(64);
        let task = spawn_watcher_pausing(cfg, tx, Some(releasing)).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(rx.try_recv().is_err(), "no check while released");
        releasing_tx.send_replace(None);
        let wake = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(
            wake.ok().flatten().map(|w| w.source),
            Some(WakeSource::UsageLevel)
        );
        task.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_level_check_sleeps_in_proportion_to_the_headroom() {
        let shortest = Duration::from_millis(10);
        // At or past the level: the shortest interval.
        assert_eq!(level_check_interval(0, shortest), shortest);
        assert_eq!(level_check_interval(-5 * MI, shortest), shortest);
        // 600 MiB at 6000 MiB/s: 100 ms, earlyoom's figure for the same headroom.
        assert_eq!(
            level_check_interval(600 * MI, shortest),
            Duration::from_millis(100)
        );
        // 30 MiB would fill in 5 ms: never below the shortest.
        assert_eq!(level_check_interval(30 * MI, shortest), shortest);
        // A large node far from its level: once a second.
        assert_eq!(level_check_interval(64 << 30, shortest), LEVEL_CHECK_MAX);
        // A shortest interval above the maximum wins.
        let slow = Duration::from_secs(2);
        assert_eq!(level_check_interval(64 << 30, slow), slow);
    }

    #[test]
    fn psi_triggers_of_the_system_and_the_node_wake_the_manager() {
        let node = [7, 9];
        let wake = |scope| {
            Wake::from_sensor(&SensorEvent::MemoryPressure { scope }, &node).map(|w| w.source)
        };
        assert_eq!(wake(PressureScope::System), Some(WakeSource::Pressure));
        assert_eq!(wake(PressureScope::Cgroup(9)), Some(WakeSource::Pressure));
        // A pod's own pressure is not the node's.
        assert_eq!(wake(PressureScope::Cgroup(42)), None);
    }

    fn reclaim(kind: ReclaimKind, cgroup_id: u64, boot_ns: u64) -> SensorEvent {
        SensorEvent::ReclaimWake {
            kind,
            cgroup_id,
            pid: 1,
            boot_ns,
        }
    }

    #[test]
    fn global_reclaim_wakes_a_node_that_is_the_whole_machine_only() {
        let now = boot_now_ns();
        for kind in [ReclaimKind::Kswapd, ReclaimKind::Direct] {
            let e = reclaim(kind, 42, now);
            let root = Wake::from_sensor(&e, &[ROOT_CGROUP_ID]).map(|w| w.source);
            assert_eq!(root, Some(WakeSource::Reclaim), "{kind:?}");
            // A node cgroup with its own limit: the machine's reclaim is not its pressure.
            assert_eq!(Wake::from_sensor(&e, &[7]), None, "{kind:?}");
        }
    }

    #[test]
    fn memcg_reclaim_wakes_for_the_node_cgroup_not_for_a_pod() {
        let now = boot_now_ns();
        let node = [7];
        assert_eq!(
            Wake::from_sensor(&reclaim(ReclaimKind::Memcg, 7, now), &node).map(|w| w.source),
            Some(WakeSource::Reclaim)
        );
        assert_eq!(
            Wake::from_sensor(&reclaim(ReclaimKind::Memcg, 42, now), &node),
            None
        );
    }

    #[test]
    fn a_kernel_wake_starts_when_the_kernel_saw_it() {
        let before = Instant::now();
        let seen = boot_now_ns().saturating_sub(30_000_000);
        let w = Wake::at_boot_ns(WakeSource::Reclaim, seen);
        let after = Instant::now();
        // 30 ms before the call, give or take the time the call took.
        assert!(w.at <= before - Duration::from_millis(30) + (after - before));
        assert!(w.at >= before - Duration::from_millis(31) - (after - before));
        // A timestamp from the future (a clock read out of order) is now, never later.
        let future = Wake::at_boot_ns(WakeSource::Reclaim, boot_now_ns() + 1_000_000_000);
        assert!(future.at <= Instant::now());
    }
}
