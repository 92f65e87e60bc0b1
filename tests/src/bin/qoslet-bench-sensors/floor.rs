//! The floor under every `tp_btf/sched_switch` program on this machine: an empty program
//! (`r0 = 0; exit`) on the same hook, timed by the same kernel BPF statistics. Its mean is what
//! the kernel spends dispatching a program and timing it (two clock reads, an indirect call,
//! the return), so a program's cost above it is the program's own work.
//!
//! Loaded with raw bpf(2) calls: aya loads programs only from an ELF object, and an empty program
//! in qoslet's own object would ship a program the agent never uses.

use std::{
    ffi::CStr,
    io,
    os::fd::{FromRawFd as _, OwnedFd},
};

use btf_rs::Btf;
use qoslet::sensors::kmaps::ProgramCost;

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_RAW_TP: u32 = 23;

/// `union bpf_attr` for BPF_PROG_LOAD, up to `attach_prog_fd` (uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    _pad: u32,
}

/// `union bpf_attr` for BPF_RAW_TRACEPOINT_OPEN: no name, the hook is the program's BTF id.
#[repr(C)]
#[derive(Default)]
struct RawTracepointOpen {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

/// `union bpf_attr` for BPF_OBJ_GET_INFO_BY_FD.
#[repr(C)]
#[derive(Default)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `struct bpf_prog_info` up to `run_cnt`.
#[repr(C)]
struct ProgInfo {
    _head: [u8; 192],
    run_time_ns: u64,
    run_cnt: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, zero-padded `bpf_attr` prefix of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An empty program attached to `sched_switch`, detached on drop.
pub struct Floor {
    prog: OwnedFd,
    _link: OwnedFd,
}

impl Floor {
    pub fn attach() -> io::Result<Self> {
        let btf = Btf::from_file("/sys/kernel/btf/vmlinux").map_err(io::Error::other)?;
        let attach_btf_id = *btf
            .resolve_ids_by_name("btf_trace_sched_switch")
            .map_err(io::Error::other)?
            .first()
            .ok_or_else(|| io::Error::other("no btf_trace_sched_switch in vmlinux BTF"))?;
        // r0 = 0; exit
        let insns: [u64; 2] = [0xb7, 0x95];
        let license: &CStr = c"GPL";
        let mut name = [0u8; 16];
        name[..12].copy_from_slice(b"qoslet_floor");
        let mut load = ProgLoad {
            prog_type: BPF_PROG_TYPE_TRACING,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            expected_attach_type: BPF_TRACE_RAW_TP,
            attach_btf_id,
            ..Default::default()
        };
        // SAFETY: BPF_PROG_LOAD returns a new fd we own.
        let prog = unsafe { OwnedFd::from_raw_fd(bpf(BPF_PROG_LOAD, &mut load)? as i32) };
        let mut open = RawTracepointOpen {
            prog_fd: std::os::fd::AsRawFd::as_raw_fd(&prog) as u32,
            ..Default::default()
        };
        // SAFETY: BPF_RAW_TRACEPOINT_OPEN returns a new link fd we own.
        let link = unsafe { OwnedFd::from_raw_fd(bpf(BPF_RAW_TRACEPOINT_OPEN, &mut open)? as i32) };
        Ok(Self { prog, _link: link })
    }

    /// Its cost so far, from the kernel's BPF statistics, as qoslet reports its own programs'.
    pub fn cost(&self) -> io::Result<ProgramCost> {
        let mut info = ProgInfo {
            _head: [0; 192],
            run_time_ns: 0,
            run_cnt: 0,
        };
        let mut attr = InfoByFd {
            bpf_fd: std::os::fd::AsRawFd::as_raw_fd(&self.prog) as u32,
            info_len: size_of::<ProgInfo>() as u32,
            info: &mut info as *mut ProgInfo as u64,
        };
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
        Ok(ProgramCost {
            program: "empty".into(),
            run_time_ns: info.run_time_ns,
            run_count: info.run_cnt,
        })
    }
}
