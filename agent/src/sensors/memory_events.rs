//! Fallback memcg events: deltas of `memory.events` (cgroup v2) or of `memory.failcnt` and
//! `memory.oom_control` (cgroup v1), read when no kernel hook reports them.
//!
//! Nothing is read on a fast timer: a cgroup's counters are read when the kernel says they
//! changed ([`MemoryNotifier`]), and every watch is read again at a slow resync. Each watch
//! holds its files open and reads them with one `pread` (reopening cost five system calls a
//! file: open, statx, two reads, close; at 110 pods and the old 100 ms poll that was most of
//! the agent's idle cost). Every file is opened beneath the node root ([`CgroupBeneath`]): the
//! directories are named from pod UIDs and container ids.

use std::{
    fs::File,
    io,
    os::{
        fd::{AsFd as _, AsRawFd as _},
        unix::fs::FileExt as _,
    },
};

use nix::{
    errno::Errno,
    sys::{
        eventfd::{EfdFlags, EventFd},
        inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor},
    },
};
use tokio::io::{Interest, unix::AsyncFd};

use super::event::{MemcgEventKind, SensorEvent};
use crate::{
    cgroup::{Access, CgroupBeneath, value::flat_keyed},
    support::inotify::InotifyFd,
};

/// The counters of one memory cgroup, as last read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MemoryCounts {
    pub(crate) high: u64,
    pub(crate) max: u64,
    pub(crate) oom: u64,
    pub(crate) oom_kill: u64,
    pub(crate) oom_group_kill: u64,
}

/// A cgroup's counter files, held open.
#[derive(Debug)]
enum CounterFiles {
    V2 { events: File },
    V1 { failcnt: File, oom_control: File },
}

impl CounterFiles {
    /// `dir` is a v2 cgroup with `memory.events` or a v1 memory cgroup.
    fn open(dir: &CgroupBeneath) -> io::Result<Self> {
        match dir.open_file("memory.events", Access::Read) {
            Ok(events) => Ok(Self::V2 { events }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::V1 {
                failcnt: dir.open_file("memory.failcnt", Access::Read)?,
                oom_control: dir.open_file("memory.oom_control", Access::Read)?,
            }),
            Err(e) => Err(e),
        }
    }

    fn read(&self) -> io::Result<MemoryCounts> {
        let mut buf = [0u8; 1024];
        match self {
            Self::V2 { events } => Ok(parse_memory_events(read_whole(events, &mut buf)?)),
            Self::V1 {
                failcnt,
                oom_control,
            } => {
                let mut other = [0u8; 1024];
                Ok(parse_v1(
                    read_whole(failcnt, &mut buf)?,
                    read_whole(oom_control, &mut other)?,
                ))
            }
        }
    }
}

/// The whole of a small cgroup file in one `pread` from its start (cgroupfs produces the text
/// anew at offset 0); a file that fills the buffer is refused rather than read in part.
fn read_whole<'b>(file: &File, buf: &'b mut [u8]) -> io::Result<&'b str> {
    let n = file.read_at(buf, 0)?;
    if n == buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "counter file larger than expected",
        ));
    }
    std::str::from_utf8(&buf[..n]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// `memory.events`: `high N`, `max N`, `oom N`, `oom_kill N`, `oom_group_kill N`, ...
pub(crate) fn parse_memory_events(text: &str) -> MemoryCounts {
    let mut c = MemoryCounts::default();
    for (key, v) in flat_keyed(text) {
        match key {
            "high" => c.high = v,
            "max" => c.max = v,
            "oom" => c.oom = v,
            "oom_kill" => c.oom_kill = v,
            "oom_group_kill" => c.oom_group_kill = v,
            _ => {}
        }
    }
    c
}

/// v1: `memory.failcnt` counts charges that hit the limit (`max`); `memory.oom_control` has
/// `under_oom 0|1` and, since Linux 4.13, `oom_kill N`. `oom` counts being under OOM now.
pub(crate) fn parse_v1(failcnt: &str, oom_control: &str) -> MemoryCounts {
    let mut c = MemoryCounts {
        max: failcnt.trim().parse().unwrap_or(0),
        ..MemoryCounts::default()
    };
    for (key, v) in flat_keyed(oom_control) {
        match key {
            "under_oom" => c.oom = v,
            "oom_kill" => c.oom_kill = v,
            _ => {}
        }
    }
    c
}

/// One watched memory cgroup.
#[derive(Debug)]
pub(crate) struct MemoryEventsWatch {
    pub(crate) memcg_id: u64,
    pub(crate) dir: CgroupBeneath,
    files: CounterFiles,
    last: MemoryCounts,
    /// Its inotify watch (v2) once registered with a [`MemoryNotifier`].
    pub(crate) notify_wd: Option<WatchDescriptor>,
}

impl MemoryEventsWatch {
    /// Starts from the current counts, so only later events are reported.
    pub(crate) fn new(dir: CgroupBeneath) -> io::Result<Self> {
        let memcg_id = dir.inode()?;
        let files = CounterFiles::open(&dir)?;
        let last = files.read()?;
        Ok(Self {
            memcg_id,
            dir,
            files,
            last,
            notify_wd: None,
        })
    }

    /// A cgroup v1 memory cgroup (its OOM notification names no cgroup).
    pub(crate) fn is_v1(&self) -> bool {
        matches!(self.files, CounterFiles::V1 { .. })
    }

    /// Appends one event per counter that grew since the last read.
    pub(crate) fn poll(&mut self, boot_ns: u64, out: &mut Vec<SensorEvent>) -> io::Result<()> {
        let now = self.files.read()?;
        let deltas = [
            (MemcgEventKind::High, now.high, self.last.high),
            (MemcgEventKind::Max, now.max, self.last.max),
            // v1 `under_oom` is a level (0 or 1), not a counter: a rise is one OOM.
            (MemcgEventKind::Oom, now.oom, self.last.oom),
            (MemcgEventKind::OomKill, now.oom_kill, self.last.oom_kill),
            (
                MemcgEventKind::OomGroupKill,
                now.oom_group_kill,
                self.last.oom_group_kill,
            ),
        ];
        for (kind, now, before) in deltas {
            if now > before {
                out.push(SensorEvent::Memcg {
                    memcg_id: self.memcg_id,
                    kind,
                    count: now - before,
                    pid: 0,
                    boot_ns,
                });
            }
        }
        self.last = now;
        Ok(())
    }
}

/// What the kernel said changed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Notified {
    /// These v2 `memory.events` files were modified.
    Files(Vec<WatchDescriptor>),
    /// Some v1 memory cgroup went under OOM (the kernel signals before its OOM killer acts).
    V1Oom,
}

/// Tells when counters changed. On cgroup v2 the kernel reports every change of a cgroup's
/// `memory.events` as a modification (inotify `IN_MODIFY`), naming the file. On v1 only
/// `memory.oom_control` notifies, through an eventfd registered in the cgroup's
/// `cgroup.event_control`; one eventfd serves every v1 cgroup, so a signal means "some v1
/// cgroup", and `memory.failcnt` (the `max` count) notifies nothing: it waits for the resync.
pub(crate) struct MemoryNotifier {
    inotify: AsyncFd<InotifyFd>,
    v1_oom: AsyncFd<EventFd>,
}

impl MemoryNotifier {
    /// Call inside a tokio runtime.
    pub(crate) fn new() -> io::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let v1_oom = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Self {
            inotify: crate::support::inotify::register(inotify)?,
            // SAFETY: the EventFd owns its descriptor, which stays open and unchanged until the
            // AsyncFd (and the EventFd inside it) is dropped.
            v1_oom: unsafe { AsyncFd::register_with_interest(v1_oom, Interest::READABLE) }
                .map_err(|e| e.into_parts().1)?,
        })
    }

    /// Asks the kernel to notify changes of `watch`'s counters. inotify takes only a path: the
    /// watch is added through the held `memory.events` descriptor's `/proc/self/fd` link, so it
    /// lands on the file opened beneath the node root.
    pub(crate) fn register(&self, watch: &mut MemoryEventsWatch) -> io::Result<()> {
        match &watch.files {
            CounterFiles::V2 { events } => {
                let link = format!("/proc/self/fd/{}", events.as_raw_fd());
                watch.notify_wd = Some(
                    self.inotify
                        .get_ref()
                        .0
                        .add_watch(link.as_str(), AddWatchFlags::IN_MODIFY)?,
                );
            }
            CounterFiles::V1 { oom_control, .. } => {
                // The kernel takes its own references to both descriptors.
                let line = format!(
                    "{} {}",
                    self.v1_oom.get_ref().as_raw_fd(),
                    oom_control.as_fd().as_raw_fd()
                );
                watch.dir.write_file("cgroup.event_control", &line)?;
            }
        }
        Ok(())
    }

    /// Drops `watch`'s inotify watch (a v1 registration ends with its cgroup).
    pub(crate) fn unregister(&self, watch: &MemoryEventsWatch) {
        if let Some(wd) = watch.notify_wd {
            // EINVAL when the cgroup is already gone: the kernel dropped the watch itself.
            let _ = self.inotify.get_ref().0.rm_watch(wd);
        }
    }

    /// Waits for the next notification and consumes it.
    pub(crate) async fn next(&self) -> io::Result<Notified> {
        loop {
            tokio::select! {
                guard = self.inotify.readable() => {
                    let mut guard = guard?;
                    match guard.get_inner().0.read_events() {
                        Ok(events) => {
                            return Ok(Notified::Files(events.into_iter().map(|e| e.wd).collect()));
                        }
                        Err(Errno::EAGAIN) => guard.clear_ready(),
                        Err(e) => return Err(e.into()),
                    }
                }
                guard = self.v1_oom.readable() => {
                    let mut guard = guard?;
                    match guard.get_inner().read() {
                        Ok(_) => return Ok(Notified::V1Oom),
                        Err(Errno::EAGAIN) => guard.clear_ready(),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v2_and_v1_counters() {
        let v2 =
            parse_memory_events("low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n");
        assert_eq!(
            v2,
            MemoryCounts {
                high: 12,
                max: 3,
                oom: 1,
                oom_kill: 1,
                oom_group_kill: 0
            }
        );
        let v1 = parse_v1("42\n", "oom_kill_disable 0\nunder_oom 1\noom_kill 2\n");
        assert_eq!((v1.max, v1.oom, v1.oom_kill), (42, 1, 2));
    }
}
