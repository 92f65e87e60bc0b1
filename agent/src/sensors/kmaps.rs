//! The agent's view of the kernel maps: the watch list it fills, the per-cgroup statistics the
//! programs aggregate, map sizes, and each program's cost from kernel BPF statistics.

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues};
use qoslet_common::{
    event::{MemcgCounter, MemcgCounterKey},
    sched::{CpuStats, ReclaimStats, SlotIndexEntry, WATCH_FLAG_WATCHED, watch_filter_slot},
};

use super::{SensorError, ebpf::EbpfSensors, slots::StatsHome};

/// Maps keyed by cgroup id, which must return to their size once the cgroups are removed.
pub const PER_CGROUP_MAPS: [&str; 4] = [
    "WATCHED_CGROUPS",
    "CPU_STATS",
    "RECLAIM_STATS",
    "MEMCG_COUNTERS",
];

/// A program's cumulative cost since it was loaded (kernel BPF statistics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramCost {
    pub program: String,
    pub run_time_ns: u64,
    pub run_count: u64,
}

impl ProgramCost {
    /// Mean nanoseconds per run, `None` before the first run.
    pub fn mean_ns(&self) -> Option<f64> {
        (self.run_count > 0).then(|| self.run_time_ns as f64 / self.run_count as f64)
    }
}

/// `CPU_STATS`: per-CPU statistics by cgroup v2 id.
type CpuStatsMap<T> = PerCpuHashMap<T, u64, CpuStats>;

/// `BPF_NOEXIST` map update flag.
const BPF_NOEXIST: u64 = 1;

fn map_err(name: &'static str) -> impl Fn(MapError) -> SensorError {
    move |source| SensorError::Map { name, source }
}

impl EbpfSensors {
    /// One of the object's maps, as the typed aya map `M`.
    fn typed<'a, M>(&'a self, name: &'static str) -> Result<M, SensorError>
    where
        M: TryFrom<&'a Map, Error = MapError>,
    {
        let map = self.ebpf.map(name).ok_or(SensorError::MissingMap(name))?;
        M::try_from(map).map_err(map_err(name))
    }

    /// [`Self::typed`], writable.
    fn typed_mut<'a, M>(&'a mut self, name: &'static str) -> Result<M, SensorError>
    where
        M: TryFrom<&'a mut Map, Error = MapError>,
    {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(SensorError::MissingMap(name))?;
        M::try_from(map).map_err(map_err(name))
    }

    /// Writes the `WATCH_FILTER` word holding `cgroup_id`'s bit, from the watched ids.
    fn update_watch_filter(&mut self, cgroup_id: u64) -> Result<(), SensorError> {
        const NAME: &str = "WATCH_FILTER";
        let (word, _) = watch_filter_slot(cgroup_id);
        let value = self
            .slots
            .ids()
            .map(watch_filter_slot)
            .filter(|&(w, _)| w == word)
            .fold(0, |v, (_, bit)| v | bit);
        let mut filter: Array<&mut MapData, u64> = self.typed_mut(NAME)?;
        filter.set(word, value, 0).map_err(map_err(NAME))
    }

    /// Bits set in `WATCH_FILTER`: back to 0 once nothing is watched.
    pub fn watch_filter_bits(&self) -> Result<u32, SensorError> {
        const NAME: &str = "WATCH_FILTER";
        let filter: Array<&MapData, u64> = self.typed(NAME)?;
        filter
            .iter()
            .try_fold(0, |n, w| w.map(|w| n + w.count_ones()))
            .map_err(map_err(NAME))
    }

    /// Entries of `SLOT_INDEX` in use: the watched cgroups whose statistics have a slot.
    pub fn slot_index_entries(&self) -> Result<usize, SensorError> {
        const NAME: &str = "SLOT_INDEX";
        let index: Array<&MapData, SlotIndexEntry> = self.typed(NAME)?;
        index
            .iter()
            .try_fold(0, |n, e| e.map(|e| n + usize::from(e.cgroup_id != 0)))
            .map_err(map_err(NAME))
    }

    /// Adds a cgroup v2 id to the programs' watch list and gives it a home for its CPU
    /// statistics (zeroed), then sets its `WATCH_FILTER` bit: the scheduler program tests the
    /// bit first. Watching a cgroup again keeps its statistics.
    pub(crate) fn watch_cgroup(&mut self, cgroup_id: u64) -> Result<(), SensorError> {
        let mut watched: HashMap<&mut MapData, u64, u32> = self.typed_mut("WATCHED_CGROUPS")?;
        watched
            .insert(cgroup_id, WATCH_FLAG_WATCHED, 0)
            .map_err(map_err("WATCHED_CGROUPS"))?;
        let Some(home) = self.slots.place(cgroup_id) else {
            return Ok(());
        };
        if let Err(e) = self.publish_home(cgroup_id, home) {
            self.slots.remove(cgroup_id);
            return Err(e);
        }
        self.update_watch_filter(cgroup_id)
    }

    /// Creates the kernel side of a cgroup's statistics home.
    fn publish_home(&mut self, cgroup_id: u64, home: StatsHome) -> Result<(), SensorError> {
        let zeros = || {
            aya::util::nr_cpus()
                .map_err(|(_, e)| e)
                .and_then(|cpus| PerCpuValues::try_from(vec![CpuStats::ZERO; cpus]))
                .map_err(|e| map_err("CPU_STATS")(MapError::IoError(e)))
        };
        match home {
            StatsHome::Slot { slot, place } => {
                // Zeroed before the index names it, so the program never adds to a previous
                // owner's figures through the new entry.
                let mut stats: PerCpuArray<&mut MapData, CpuStats> =
                    self.typed_mut("CPU_SLOT_STATS")?;
                stats
                    .set(slot, zeros()?, 0)
                    .map_err(map_err("CPU_SLOT_STATS"))?;
                let mut index: Array<&mut MapData, SlotIndexEntry> =
                    self.typed_mut("SLOT_INDEX")?;
                let entry = SlotIndexEntry {
                    cgroup_id,
                    slot,
                    _pad: 0,
                };
                index.set(place, entry, 0).map_err(map_err("SLOT_INDEX"))
            }
            StatsHome::Hash => {
                let mut stats: CpuStatsMap<&mut MapData> = self.typed_mut("CPU_STATS")?;
                match stats.insert(cgroup_id, zeros()?, BPF_NOEXIST) {
                    Ok(()) => Ok(()),
                    Err(MapError::SyscallError(e))
                        if e.io_error.raw_os_error() == Some(libc::EEXIST) =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(map_err("CPU_STATS")(e)),
                }
            }
        }
    }

    /// Removes a cgroup from the watch list and frees its statistics home. Also called once the
    /// cgroup is gone, after the `cgroup_rmdir` program has deleted its hash entries.
    pub(crate) fn unwatch_cgroup(&mut self, cgroup_id: u64) -> Result<(), SensorError> {
        remove(
            self.typed_mut::<HashMap<_, u64, u32>>("WATCHED_CGROUPS")?,
            cgroup_id,
            "WATCHED_CGROUPS",
        )?;
        let Some(home) = self.slots.remove(cgroup_id) else {
            return Ok(());
        };
        // The filter bit first: unless another watched id shares it, the program stops there.
        self.update_watch_filter(cgroup_id)?;
        match home {
            StatsHome::Slot { place, .. } => {
                let mut index: Array<&mut MapData, SlotIndexEntry> =
                    self.typed_mut("SLOT_INDEX")?;
                index
                    .set(place, SlotIndexEntry::default(), 0)
                    .map_err(map_err("SLOT_INDEX"))
            }
            StatsHome::Hash => {
                let mut stats: CpuStatsMap<&mut MapData> = self.typed_mut("CPU_STATS")?;
                absent_ok(stats.remove(&cgroup_id)).map_err(map_err("CPU_STATS"))
            }
        }
    }

    /// Run-queue latency and on-CPU time of a watched cgroup (summed over the CPUs), `None`
    /// when it is not watched or its hash entry went with the cgroup.
    pub(crate) fn cpu_stats(&self, cgroup_id: u64) -> Result<Option<CpuStats>, SensorError> {
        let sum = |per_cpu: PerCpuValues<CpuStats>| {
            per_cpu.iter().fold(CpuStats::ZERO, |mut sum, s| {
                sum.merge(s);
                sum
            })
        };
        match self.slots.home(cgroup_id) {
            None => Ok(None),
            Some(StatsHome::Slot { slot, .. }) => {
                const NAME: &str = "CPU_SLOT_STATS";
                let stats: PerCpuArray<&MapData, CpuStats> = self.typed(NAME)?;
                stats
                    .get(&slot, 0)
                    .map(|v| Some(sum(v)))
                    .map_err(map_err(NAME))
            }
            Some(StatsHome::Hash) => {
                const NAME: &str = "CPU_STATS";
                let stats: CpuStatsMap<&MapData> = self.typed(NAME)?;
                match stats.get(&cgroup_id, 0) {
                    Ok(per_cpu) => Ok(Some(sum(per_cpu))),
                    Err(MapError::KeyNotFound) => Ok(None),
                    Err(e) => Err(map_err(NAME)(e)),
                }
            }
        }
    }

    /// Reclaim stalls of a watched cgroup, `None` before its first stall.
    pub(crate) fn reclaim_stats(
        &self,
        cgroup_id: u64,
    ) -> Result<Option<ReclaimStats>, SensorError> {
        lookup(self.typed("RECLAIM_STATS")?, cgroup_id, "RECLAIM_STATS")
    }

    /// Number of entries of one of [`PER_CGROUP_MAPS`] (walks its keys).
    pub fn map_len(&self, name: &'static str) -> Result<usize, SensorError> {
        fn count<K: aya::Pod>(
            keys: impl Iterator<Item = Result<K, MapError>>,
        ) -> Vec<Result<(), MapError>> {
            keys.map(|k| k.map(drop)).collect()
        }
        let keys = match name {
            "MEMCG_COUNTERS" => count(
                self.typed::<HashMap<_, MemcgCounterKey, MemcgCounter>>(name)?
                    .keys(),
            ),
            "WATCHED_CGROUPS" => count(self.typed::<HashMap<_, u64, u32>>(name)?.keys()),
            "CPU_STATS" => count(self.typed::<CpuStatsMap<_>>(name)?.keys()),
            "RECLAIM_STATS" => count(self.typed::<HashMap<_, u64, ReclaimStats>>(name)?.keys()),
            _ => return Err(SensorError::MissingMap(name)),
        };
        keys.into_iter()
            .try_fold(0, |n, k| k.map(|()| n + 1))
            .map_err(map_err(name))
    }

    /// Each attached program's run time and run count (zero while statistics are off).
    pub(crate) fn program_costs(&self) -> Vec<ProgramCost> {
        let mut costs = Vec::new();
        for (name, program) in self.ebpf.programs() {
            if !self.is_attached(name) {
                continue;
            }
            if let Ok(info) = program.info() {
                costs.push(ProgramCost {
                    program: name.to_owned(),
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                    run_count: info.run_count(),
                });
            }
        }
        costs.sort_by(|a, b| a.program.cmp(&b.program));
        costs
    }

    /// The size in bytes of a ring buffer map as the kernel made it; `None` for another kind of
    /// map or once a reader has taken it.
    pub fn ring_bytes(&self, name: &str) -> Option<u32> {
        match self.ebpf.map(name)? {
            Map::RingBuf(data) => data.info().ok().map(|i| i.max_entries()),
            _ => None,
        }
    }

    /// The size in bytes of an attached program as the kernel runs it: (bytecode after the
    /// verifier, JIT-compiled code). The verifier removes branches it proves dead, such as the
    /// logging of a program loaded with diagnostics off.
    pub fn program_size(&self, program: &str) -> Option<(u32, u32)> {
        if !self.is_attached(program) {
            return None;
        }
        let info = self.ebpf.program(program)?.info().ok()?;
        Some((info.size_translated().unwrap_or(0), info.size_jitted()))
    }
}

/// A deletion of an entry that is not there succeeds: the `cgroup_rmdir` program may have
/// deleted it first. (aya reports a missing key on delete as the syscall's ENOENT.)
fn absent_ok(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

fn remove<V: aya::Pod>(
    mut map: HashMap<&mut MapData, u64, V>,
    key: u64,
    name: &'static str,
) -> Result<(), SensorError> {
    absent_ok(map.remove(&key)).map_err(map_err(name))
}

fn lookup<V: aya::Pod>(
    map: HashMap<&MapData, u64, V>,
    key: u64,
    name: &'static str,
) -> Result<Option<V>, SensorError> {
    match map.get(&key, 0) {
        Ok(v) => Ok(Some(v)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(e) => Err(map_err(name)(e)),
    }
}
