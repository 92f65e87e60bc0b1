//! Kernel layouts read from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF objects have no CO-RE relocations, so struct offsets and enum values the programs
//! need are resolved here and handed to them as load-time globals. Uses btf-rs because aya keeps
//! its BTF lookups private.

use btf_rs::{Backend, Btf, Type};
use fallible_iterator::FallibleIterator as _;
use qoslet_common::{MemcgEventLayout, OomBtfLayout, SchedBtfLayout};
use thiserror::Error;

pub(crate) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, Error)]
pub(crate) enum BtfError {
    #[error("kernel BTF could not be read from {path}")]
    Read {
        path: String,
        #[source]
        source: btf_rs::Error,
    },
    #[error("kernel BTF has no {0}")]
    Missing(String),
}

/// The running kernel's type information, read in place: dropped once the layouts are resolved.
pub(crate) struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    /// Maps the file and indexes only type offsets (about 1 MiB for vmlinux): btf-rs's default
    /// cache of every parsed type and name held tens of MiB, the agent's peak memory. Falls back
    /// to that cache where the file cannot be mapped (sysfs BTF is mappable since Linux 6.16).
    pub(crate) fn from_file(path: &str) -> Result<Self, BtfError> {
        let btf = Btf::from_file_with_backend(path, Backend::Mmap)
            .or_else(|_| Btf::from_file(path))
            .map_err(|source| BtfError::Read {
                path: path.into(),
                source,
            })?;
        Ok(Self { btf })
    }

    pub(crate) fn vmlinux() -> Result<Self, BtfError> {
        Self::from_file(VMLINUX_BTF)
    }

    /// Strips typedefs and qualifiers.
    fn resolve(&self, mut ty: Type) -> Result<Type, BtfError> {
        for _ in 0..32 {
            let next = match &ty {
                Type::Typedef(t) => self.btf.resolve_chained_type(t),
                Type::Const(t) => self.btf.resolve_chained_type(t),
                Type::Volatile(t) => self.btf.resolve_chained_type(t),
                Type::Restrict(t) => self.btf.resolve_chained_type(t),
                Type::TypeTag(t) => self.btf.resolve_chained_type(t),
                _ => return Ok(ty),
            };
            ty = next.map_err(|_| BtfError::Missing("a typedef target".into()))?;
        }
        Ok(ty)
    }

    fn struct_by_name(&self, name: &str) -> Result<btf_rs::Struct, BtfError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|_| BtfError::Missing(format!("struct {name}")))?;
        types
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| BtfError::Missing(format!("struct {name}")))
    }

    /// Size in bytes of a resolved type.
    fn size_of(&self, ty: &Type) -> Result<u32, BtfError> {
        Ok(match self.resolve(ty.clone())? {
            Type::Struct(s) | Type::Union(s) => s.size() as u32,
            Type::Int(i) => i.size() as u32,
            Type::Enum(e) => e.size() as u32,
            Type::Ptr(_) => 8,
            Type::Array(a) => {
                let elem = self
                    .btf
                    .resolve_chained_type(&a)
                    .map_err(|_| BtfError::Missing("an array element type".into()))?;
                self.size_of(&elem)? * a.len() as u32
            }
            _ => return Err(BtfError::Missing("a sized type".into())),
        })
    }

    /// Finds `member` in `st`, descending into anonymous structs and unions. Returns the byte
    /// offset and the member's resolved type.
    fn find_member(&self, st: &btf_rs::Struct, member: &str) -> Option<(u32, Type)> {
        for m in &st.members {
            let name = self.btf.resolve_name(m).unwrap_or_default();
            let ty = self.btf.resolve_chained_type(m).ok()?;
            let ty = self.resolve(ty).ok()?;
            let offset = m.bit_offset() / 8;
            if name == member {
                return Some((offset, ty));
            }
            if name.is_empty()
                && let Type::Struct(inner) | Type::Union(inner) = &ty
                && let Some((o, t)) = self.find_member(inner, member)
            {
                return Some((offset + o, t));
            }
        }
        None
    }

    /// Byte offset of `struct_name.member` (anonymous members are looked through).
    pub(crate) fn offset_of(&self, struct_name: &str, member: &str) -> Result<u32, BtfError> {
        self.member(struct_name, member).map(|(o, _)| o)
    }

    fn member(&self, struct_name: &str, member: &str) -> Result<(u32, Type), BtfError> {
        let st = self.struct_by_name(struct_name)?;
        self.find_member(&st, member)
            .ok_or_else(|| BtfError::Missing(format!("{struct_name}.{member}")))
    }

    /// Value of enumerator `name`, in the enum called `enum_name`, or in any enum when `None`
    /// (for anonymous enums such as the one holding `MM_FILEPAGES`).
    pub(crate) fn enum_value(&self, enum_name: Option<&str>, name: &str) -> Result<i64, BtfError> {
        let missing = || BtfError::Missing(format!("enumerator {name}"));
        match enum_name {
            Some(e) => self
                .btf
                .resolve_types_by_name(e)
                .map_err(|_| missing())?
                .iter()
                .find_map(|t| self.enumerator(t, name)),
            // One type at a time: collecting every type first parsed all of vmlinux at once.
            None => {
                let mut iter = self.btf.type_iter();
                let mut found = None;
                while let Ok(Some(t)) = iter.next() {
                    found = self.enumerator(&t, name);
                    if found.is_some() {
                        break;
                    }
                }
                found
            }
        }
        .ok_or_else(missing)
    }

    /// The value of enumerator `name` when `t` is an enum that has it.
    fn enumerator(&self, t: &Type, name: &str) -> Option<i64> {
        match t {
            Type::Enum(e) => e
                .members
                .iter()
                .find(|m| self.btf.resolve_name(*m).is_ok_and(|n| n == name))
                .map(|m| {
                    if e.is_signed() {
                        m.val() as i32 as i64
                    } else {
                        m.val() as i64
                    }
                }),
            Type::Enum64(e) => e
                .members
                .iter()
                .find(|m| self.btf.resolve_name(*m).is_ok_and(|n| n == name))
                .map(|m| m.val() as i64),
            _ => None,
        }
    }

    /// Offsets of the `i`-th RSS counter (an i64) inside `mm_struct`. Handles both layouts:
    /// `struct percpu_counter rss_stat[NR_MM_COUNTERS]` (Linux 6.2+) and
    /// `struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; } rss_stat` (older).
    fn rss_counter_offset(&self, index: u32) -> Result<u32, BtfError> {
        let (base, ty) = self.member("mm_struct", "rss_stat")?;
        match ty {
            Type::Array(a) => {
                let elem = self
                    .btf
                    .resolve_chained_type(&a)
                    .map_err(|_| BtfError::Missing("mm_struct.rss_stat element".into()))?;
                let elem_size = self.size_of(&elem)?;
                let count = self.offset_of("percpu_counter", "count")?;
                Ok(base + index * elem_size + count)
            }
            Type::Struct(s) => {
                let (count_off, count_ty) = self
                    .find_member(&s, "count")
                    .ok_or_else(|| BtfError::Missing("mm_rss_stat.count".into()))?;
                let Type::Array(a) = count_ty else {
                    return Err(BtfError::Missing("mm_rss_stat.count array".into()));
                };
                let elem = self
                    .btf
                    .resolve_chained_type(&a)
                    .map_err(|_| BtfError::Missing("mm_rss_stat.count element".into()))?;
                Ok(base + count_off + index * self.size_of(&elem)?)
            }
            _ => Err(BtfError::Missing(
                "a known mm_struct.rss_stat layout".into(),
            )),
        }
    }

    /// Everything the `tp_btf/mark_victim` program reads from a victim task.
    pub(crate) fn oom_layout(&self) -> Result<OomBtfLayout, BtfError> {
        let u32_of = |v: i64| -> Result<u32, BtfError> {
            u32::try_from(v).map_err(|_| BtfError::Missing("a non-negative enumerator".into()))
        };
        let memory_cgrp_id = self.enum_value(Some("cgroup_subsys_id"), "memory_cgrp_id");
        let subsys = self.offset_of("css_set", "subsys")?;
        let (css_set_memory_css, has_memcg) = match memory_cgrp_id {
            Ok(id) => (subsys + 8 * u32_of(id)?, 1),
            Err(_) => (0, 0),
        };
        Ok(OomBtfLayout {
            valid: 1,
            task_pid: self.offset_of("task_struct", "pid")?,
            task_tgid: self.offset_of("task_struct", "tgid")?,
            task_comm: self.offset_of("task_struct", "comm")?,
            task_cgroups: self.offset_of("task_struct", "cgroups")?,
            css_set_dfl_cgrp: self.offset_of("css_set", "dfl_cgrp")?,
            css_set_memory_css,
            css_cgroup: self.offset_of("cgroup_subsys_state", "cgroup")?,
            cgroup_kn: self.offset_of("cgroup", "kn")?,
            kernfs_node_id: self.offset_of("kernfs_node", "id")?,
            task_signal: self.offset_of("task_struct", "signal")?,
            signal_oom_score_adj: self.offset_of("signal_struct", "oom_score_adj")?,
            task_mm: self.offset_of("task_struct", "mm")?,
            mm_file_pages: self
                .rss_counter_offset(u32_of(self.enum_value(None, "MM_FILEPAGES")?)?)?,
            mm_anon_pages: self
                .rss_counter_offset(u32_of(self.enum_value(None, "MM_ANONPAGES")?)?)?,
            mm_shmem_pages: self
                .rss_counter_offset(u32_of(self.enum_value(None, "MM_SHMEMPAGES")?)?)?,
            has_memcg,
        })
    }

    /// Everything the scheduler program reads from a task: its pid, its cgroup v2 id, the
    /// kernel's `sched_info` timestamps and the run-queue clock they come from. A kernel without
    /// `CONFIG_SCHED_INFO` (no `task_struct.sched_info`) or `CONFIG_FAIR_GROUP_SCHED` (no
    /// `cfs_rq.rq`) has no such layout, and the CPU sensor falls back to the cgroup files.
    pub(crate) fn sched_layout(&self) -> Result<SchedBtfLayout, BtfError> {
        let sched_info = self.offset_of("task_struct", "sched_info")?;
        let se = self.offset_of("task_struct", "se")?;
        Ok(SchedBtfLayout {
            valid: 1,
            task_pid: self.offset_of("task_struct", "pid")?,
            task_cgroups: self.offset_of("task_struct", "cgroups")?,
            css_set_dfl_cgrp: self.offset_of("css_set", "dfl_cgrp")?,
            cgroup_kn: self.offset_of("cgroup", "kn")?,
            kernfs_node_id: self.offset_of("kernfs_node", "id")?,
            task_last_queued: sched_info + self.offset_of("sched_info", "last_queued")?,
            task_last_arrival: sched_info + self.offset_of("sched_info", "last_arrival")?,
            task_se_cfs_rq: se + self.offset_of("sched_entity", "cfs_rq")?,
            task_se_runtime: se + self.offset_of("sched_entity", "sum_exec_runtime")?,
            task_se_prev_runtime: se + self.offset_of("sched_entity", "prev_sum_exec_runtime")?,
            cfs_rq_rq: self.offset_of("cfs_rq", "rq")?,
            rq_clock: self.offset_of("rq", "clock")?,
        })
    }

    /// Everything the `fentry/__memcg_memory_event` program needs.
    pub(crate) fn memcg_event_layout(&self) -> Result<MemcgEventLayout, BtfError> {
        let event = |name: &str| -> Result<i32, BtfError> {
            let v = self.enum_value(Some("memcg_memory_event"), name)?;
            i32::try_from(v).map_err(|_| BtfError::Missing(format!("a small {name}")))
        };
        Ok(MemcgEventLayout {
            valid: 1,
            memcg_css_cgroup: self.offset_of("mem_cgroup", "css")?
                + self.offset_of("cgroup_subsys_state", "cgroup")?,
            cgroup_kn: self.offset_of("cgroup", "kn")?,
            kernfs_node_id: self.offset_of("kernfs_node", "id")?,
            high: event("MEMCG_HIGH")?,
            max: event("MEMCG_MAX")?,
            oom: event("MEMCG_OOM")?,
            oom_kill: event("MEMCG_OOM_KILL")?,
            oom_group_kill: event("MEMCG_OOM_GROUP_KILL").unwrap_or(-1),
            _pad: 0,
        })
    }
}
