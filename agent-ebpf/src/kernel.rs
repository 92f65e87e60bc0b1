//! Typed views of the kernel structures the programs read, and the helpers they call.
//!
//! A view is a kernel pointer and the load-time layout that gives its fields' offsets (the
//! layout globals, see `qoslet_common::config`); each field is a small `#[inline(always)]`
//! accessor, so a call site reads `task.cgroup_id()` instead of an offset. The `unsafe` reads
//! of kernel memory are the two functions below, and nothing else reads it:
//!
//! - [`load`]: a direct load through a BTF-typed pointer (a `tp_btf` or `fentry` argument, or
//!   a pointer read through one). The verifier checks each load against the kernel's own types
//!   and the JIT turns it into a fault-safe `BPF_PROBE_MEM` load: a NULL or stale pointer reads
//!   as 0. Used by `sched_switch`, which runs on every context switch and cannot afford a
//!   helper call per field.
//! - [`probe`]: `bpf_probe_read_kernel`, which checks the address and fails instead. Used by
//!   the rare programs (OOM victim, memcg events), which report what they could read.
//!
//! Classic tracepoints' records are read with [`record`] at offsets from tracefs.
//!
//! kunai reads its kernel structures the same way (`kunai-common/src/co_re/`), with CO-RE
//! relocations where qoslet has load-time offsets: Rust eBPF objects carry no CO-RE.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_current_cgroup_id, bpf_ktime_get_boot_ns, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    programs::TracePointContext,
};

/// Reads a `T` at `base + offset` with a direct load.
///
/// # Safety
/// `base` is a BTF-typed kernel pointer the verifier tracks (`PTR_TO_BTF_ID`) and `offset`,
/// from the kernel's BTF, is where a field of type `T` lies in the struct it points to.
#[inline(always)]
unsafe fn load<T: Copy>(base: *const u8, offset: u32) -> T {
    // SAFETY: by the contract, the verifier types this load as a field of the pointed-to struct
    // and the JIT emits it as BPF_PROBE_MEM, whose fault handler makes a bad address read 0:
    // the load cannot fault the kernel and yields a plain integer or pointer, valid for any bits.
    unsafe { core::ptr::read_volatile(base.add(offset as usize) as *const T) }
}

/// Reads a `T` at `base + offset` with `bpf_probe_read_kernel`; any address is allowed.
#[inline(always)]
fn probe<T: Copy>(base: *const u8, offset: u32) -> Result<T, i32> {
    // SAFETY: the helper checks the address and returns an error rather than fault; the callers
    // read plain integers, arrays of them and pointers, for which any bits are a valid value.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize) as *const T) }
}

/// A field of a classic tracepoint's record at `offset` (from its tracefs `format`).
#[inline(always)]
pub fn record<T: Copy>(ctx: &TracePointContext, offset: u32) -> Result<T, i32> {
    // SAFETY: `read_at` is `bpf_probe_read_kernel` from the record's address, which checks the
    // address; the callers read integers and byte arrays, valid for any bits.
    unsafe { ctx.read_at::<T>(offset as usize) }
}

/// A `__data_loc char[]` field of a classic tracepoint's record at `offset` (a u32: low 16
/// bits the string's offset in the record, high 16 its length), copied NUL-terminated into
/// `dest`; the string's length without the NUL.
#[inline(always)]
pub fn record_str(ctx: &TracePointContext, offset: u32, dest: &mut [u8]) -> Result<usize, i32> {
    let loc: u32 = record(ctx, offset)?;
    let src = (ctx.as_ptr() as *const u8).wrapping_add((loc & 0xffff) as usize);
    // SAFETY: the helper checks the source address and writes at most `dest.len()` bytes.
    unsafe { bpf_probe_read_kernel_str_bytes(src, dest) }.map(|s| s.len())
}

/// The cgroup v2 id of the current task.
#[inline(always)]
pub fn current_cgroup_id() -> u64 {
    // SAFETY: a helper without arguments that every program type qoslet uses may call.
    unsafe { bpf_get_current_cgroup_id() }
}

/// CLOCK_BOOTTIME in nanoseconds, the clock of the event records.
#[inline(always)]
pub fn boot_ns() -> u64 {
    // SAFETY: a helper without arguments, callable from every program type.
    unsafe { bpf_ktime_get_boot_ns() }
}

/// CLOCK_MONOTONIC in nanoseconds.
#[inline(always)]
pub fn monotonic_ns() -> u64 {
    // SAFETY: a helper without arguments, callable from every program type.
    unsafe { bpf_ktime_get_ns() }
}

/// Views for `tp_btf/sched_switch`, read with direct loads, offsets from `SchedBtfLayout`.
pub mod sched {
    use qoslet_common::SchedBtfLayout;

    use super::load;

    /// A `struct task_struct *`.
    #[derive(Clone, Copy)]
    pub struct Task<'l> {
        ptr: *const u8,
        l: &'l SchedBtfLayout,
    }

    impl<'l> Task<'l> {
        /// # Safety
        /// `ptr` is a BTF-typed `struct task_struct *`, an argument of a `tp_btf` program, and
        /// `l` was resolved from the running kernel's BTF.
        #[inline(always)]
        pub unsafe fn new(ptr: *const u8, l: &'l SchedBtfLayout) -> Self {
            Self { ptr, l }
        }

        /// Field of this task at `offset`.
        #[inline(always)]
        fn field<T: Copy>(self, offset: u32) -> T {
            // SAFETY: `ptr` is a BTF-typed task_struct pointer (see `new`) and the offsets
            // used below come from the same kernel's BTF, for fields of type `T`.
            unsafe { load(self.ptr, offset) }
        }

        /// `pid`: 0 for the idle task of every CPU.
        #[inline(always)]
        pub fn pid(self) -> i32 {
            self.field(self.l.task_pid)
        }

        /// `cgroups`.
        #[inline(always)]
        pub fn css_set(self) -> CssSet<'l> {
            CssSet {
                ptr: self.field(self.l.task_cgroups),
                l: self.l,
            }
        }

        /// `sched_info.last_queued`: the run-queue clock when the task was enqueued; 0 when it
        /// was not queued through `enqueue_task`.
        #[inline(always)]
        pub fn sched_info_last_queued(self) -> u64 {
            self.field(self.l.task_last_queued)
        }

        /// `sched_info.last_arrival`: the run-queue clock when it last got a CPU; 0 before.
        #[inline(always)]
        pub fn sched_info_last_arrival(self) -> u64 {
            self.field(self.l.task_last_arrival)
        }

        /// `se.sum_exec_runtime`.
        #[inline(always)]
        pub fn se_sum_exec_runtime(self) -> u64 {
            self.field(self.l.task_se_runtime)
        }

        /// `se.prev_sum_exec_runtime`: `sum_exec_runtime` when the fair class last picked it.
        #[inline(always)]
        pub fn se_prev_sum_exec_runtime(self) -> u64 {
            self.field(self.l.task_se_prev_runtime)
        }

        /// `se.cfs_rq->rq->clock`: the clock of the task's CPU run queue (`se.cfs_rq` is set
        /// for tasks of every class and for the idle task).
        #[inline(always)]
        pub fn rq_clock(self) -> u64 {
            let cfs_rq: *const u8 = self.field(self.l.task_se_cfs_rq);
            // SAFETY: pointers read through BTF-typed pointers are BTF-typed themselves, and
            // the offsets are those of `cfs_rq.rq` and `rq.clock` in the kernel's BTF.
            unsafe {
                let rq: *const u8 = load(cfs_rq, self.l.cfs_rq_rq);
                load(rq, self.l.rq_clock)
            }
        }
    }

    /// A `struct css_set *`: the cgroups of a task, shared by the threads of a process.
    #[derive(Clone, Copy)]
    pub struct CssSet<'l> {
        ptr: *const u8,
        l: &'l SchedBtfLayout,
    }

    impl<'l> CssSet<'l> {
        /// No css_set: what a task without one (the idle task) is given.
        #[inline(always)]
        pub fn none(l: &'l SchedBtfLayout) -> Self {
            Self {
                ptr: core::ptr::null(),
                l,
            }
        }

        #[inline(always)]
        pub fn is_none(self) -> bool {
            self.ptr.is_null()
        }

        /// Whether both are the same css_set.
        #[inline(always)]
        pub fn same(self, other: Self) -> bool {
            self.ptr == other.ptr
        }

        /// `dfl_cgrp->kn->id`: the cgroup v2 id.
        #[inline(always)]
        pub fn cgroup_id(self) -> u64 {
            // SAFETY: `ptr` was read through a BTF-typed task pointer, so it is BTF-typed too;
            // the offsets are those of `css_set.dfl_cgrp`, `cgroup.kn` and `kernfs_node.id`.
            unsafe {
                let cgroup: *const u8 = load(self.ptr, self.l.css_set_dfl_cgrp);
                let kn: *const u8 = load(cgroup, self.l.cgroup_kn);
                load(kn, self.l.kernfs_node_id)
            }
        }
    }
}

/// Views for `tp_btf/mark_victim`, read with `bpf_probe_read_kernel`, offsets from
/// `OomBtfLayout`. Each read may fail; the program decides which failures drop the record.
pub mod oom {
    use qoslet_common::{OomBtfLayout, TASK_COMM_LEN};

    use super::probe;

    /// A `struct task_struct *`.
    #[derive(Clone, Copy)]
    pub struct Task<'l> {
        ptr: *const u8,
        l: &'l OomBtfLayout,
    }

    impl<'l> Task<'l> {
        #[inline(always)]
        pub fn new(ptr: *const u8, l: &'l OomBtfLayout) -> Self {
            Self { ptr, l }
        }

        #[inline(always)]
        pub fn pid(self) -> Result<i32, i32> {
            probe(self.ptr, self.l.task_pid)
        }

        #[inline(always)]
        pub fn tgid(self) -> Result<i32, i32> {
            probe(self.ptr, self.l.task_tgid)
        }

        #[inline(always)]
        pub fn comm(self) -> Result<[u8; TASK_COMM_LEN], i32> {
            probe(self.ptr, self.l.task_comm)
        }

        /// `cgroups`.
        #[inline(always)]
        pub fn css_set(self) -> Result<CssSet<'l>, i32> {
            Ok(CssSet {
                ptr: probe(self.ptr, self.l.task_cgroups)?,
                l: self.l,
            })
        }

        /// `signal`.
        #[inline(always)]
        pub fn signal(self) -> Result<Signal<'l>, i32> {
            Ok(Signal {
                ptr: probe(self.ptr, self.l.task_signal)?,
                l: self.l,
            })
        }

        /// `mm`: `None` for a kernel thread or a task that already let go of it.
        #[inline(always)]
        pub fn mm(self) -> Result<Option<Mm<'l>>, i32> {
            let ptr: *const u8 = probe(self.ptr, self.l.task_mm)?;
            Ok((!ptr.is_null()).then_some(Mm { ptr, l: self.l }))
        }
    }

    /// A `struct css_set *`.
    #[derive(Clone, Copy)]
    pub struct CssSet<'l> {
        ptr: *const u8,
        l: &'l OomBtfLayout,
    }

    impl<'l> CssSet<'l> {
        /// `dfl_cgrp`: the cgroup v2 cgroup.
        #[inline(always)]
        pub fn dfl_cgroup(self) -> Result<Cgroup<'l>, i32> {
            Ok(Cgroup {
                ptr: probe(self.ptr, self.l.css_set_dfl_cgrp)?,
                l: self.l,
            })
        }

        /// `subsys[memory_cgrp_id]->cgroup`: the memory cgroup (v1 or v2); `None` when the
        /// memory controller is not known or not bound.
        #[inline(always)]
        pub fn memory_cgroup(self) -> Result<Option<Cgroup<'l>>, i32> {
            if self.l.has_memcg == 0 {
                return Ok(None);
            }
            let css: *const u8 = probe(self.ptr, self.l.css_set_memory_css)?;
            if css.is_null() {
                return Ok(None);
            }
            Ok(Some(Cgroup {
                ptr: probe(css, self.l.css_cgroup)?,
                l: self.l,
            }))
        }
    }

    /// A `struct cgroup *`.
    #[derive(Clone, Copy)]
    pub struct Cgroup<'l> {
        ptr: *const u8,
        l: &'l OomBtfLayout,
    }

    impl Cgroup<'_> {
        /// `kn->id`.
        #[inline(always)]
        pub fn id(self) -> Result<u64, i32> {
            let kn: *const u8 = probe(self.ptr, self.l.cgroup_kn)?;
            probe(kn, self.l.kernfs_node_id)
        }
    }

    /// A `struct signal_struct *`.
    #[derive(Clone, Copy)]
    pub struct Signal<'l> {
        ptr: *const u8,
        l: &'l OomBtfLayout,
    }

    impl Signal<'_> {
        #[inline(always)]
        pub fn oom_score_adj(self) -> Result<i16, i32> {
            probe(self.ptr, self.l.signal_oom_score_adj)
        }
    }

    /// A `struct mm_struct *`. The page counters are per-CPU counters' totals, which may run
    /// slightly negative before they are folded.
    #[derive(Clone, Copy)]
    pub struct Mm<'l> {
        ptr: *const u8,
        l: &'l OomBtfLayout,
    }

    impl Mm<'_> {
        #[inline(always)]
        pub fn file_pages(self) -> Result<i64, i32> {
            probe(self.ptr, self.l.mm_file_pages)
        }

        #[inline(always)]
        pub fn anon_pages(self) -> Result<i64, i32> {
            probe(self.ptr, self.l.mm_anon_pages)
        }

        #[inline(always)]
        pub fn shmem_pages(self) -> Result<i64, i32> {
            probe(self.ptr, self.l.mm_shmem_pages)
        }
    }
}

/// Views for `fentry/__memcg_memory_event`, read with `bpf_probe_read_kernel`, offsets from
/// `MemcgEventLayout`.
pub mod memcg {
    use qoslet_common::MemcgEventLayout;

    use super::probe;

    /// A `struct mem_cgroup *`.
    #[derive(Clone, Copy)]
    pub struct MemCgroup<'l> {
        ptr: *const u8,
        l: &'l MemcgEventLayout,
    }

    impl<'l> MemCgroup<'l> {
        #[inline(always)]
        pub fn new(ptr: *const u8, l: &'l MemcgEventLayout) -> Self {
            Self { ptr, l }
        }

        /// `css.cgroup->kn->id`: the id of the memory cgroup's directory.
        #[inline(always)]
        pub fn cgroup_id(self) -> Result<u64, i32> {
            let cgroup: *const u8 = probe(self.ptr, self.l.memcg_css_cgroup)?;
            let kn: *const u8 = probe(cgroup, self.l.cgroup_kn)?;
            probe(kn, self.l.kernfs_node_id)
        }
    }
}
