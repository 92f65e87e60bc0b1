//! Builds the kernel programs (agent-ebpf) with aya-build and leaves the object in `OUT_DIR`.
//!
//! `AYA_BUILD_SKIP=1` skips the eBPF build (fast `cargo check`/`clippy`): an empty object is left
//! instead, and the agent then reports that its eBPF sensors are not built and uses the fallbacks.

use std::{env, fs, path::PathBuf};

use anyhow::Context as _;

const OBJECT: &str = "qoslet";

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?);
    let ebpf_dir = manifest_dir.join("../agent-ebpf");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");

    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        fs::write(out_dir.join(OBJECT), b"").context("writing the placeholder eBPF object")?;
        return Ok(());
    }

    // `cargo xtask` installs bpf-linker here; let plain `cargo build` find it too.
    if let Some(home) = env::var_os("HOME") {
        let linker_bin = PathBuf::from(home).join(".cache/qoslet/bpf-linker/bin");
        if linker_bin.join("bpf-linker").exists() {
            let path = env::var_os("PATH").unwrap_or_default();
            let mut paths = vec![linker_bin];
            paths.extend(env::split_paths(&path));
            // SAFETY: build scripts are single-threaded at this point.
            unsafe { env::set_var("PATH", env::join_paths(paths)?) };
        }
    }

    let root_dir = ebpf_dir
        .canonicalize()
        .with_context(|| format!("finding {}", ebpf_dir.display()))?;
    let root_dir = root_dir.to_str().context("non-UTF-8 path to agent-ebpf")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "qoslet-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF programs (run `cargo xtask build-ebpf` to install the toolchain)")
}
