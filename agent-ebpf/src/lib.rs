//! Nothing to link from the host: this crate is a build-dependency of the agent only so that
//! cargo rebuilds the agent when the kernel programs change. The programs are in `src/bin`-style
//! `main.rs` and its modules.
#![no_std]
