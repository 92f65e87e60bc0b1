//! qoslet's kernel-side programs. Each program is a thin wrapper around a `try_*` function; the
//! kernel-specific offsets come from globals the agent sets at load time (see
//! `qoslet_common::config`).
#![no_std]
#![no_main]

mod diag;
mod kernel;
mod lifecycle;
mod maps;
mod memcg;
mod oom;
mod reclaim;
mod sched;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach this; it exists only to satisfy `no_std`.
    loop {}
}

// SAFETY: the section and symbol the loader reads the program license from; nothing else is
// placed there or named so.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
