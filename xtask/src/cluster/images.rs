//! The images the cluster runs besides qoslet's (which its registry serves), built locally: the pod
//! sandbox's pause program (pause.c, static) and the test pods' image (Debian's static busybox
//! and the tests' memory hog built for musl). Each is built with buildah from a scratch
//! Containerfile into an `oci-archive` that `ctr image import` loads.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::{apt, cargo, image, toolchain::Toolchain, vm};

pub const PAUSE: &str = "localhost/pause:latest";
/// busybox at /bin/busybox, the hog at /bin/qoslet-test-hog.
pub const TEST: &str = "localhost/qoslet-test:latest";

/// Builds both archives under `out` and returns them.
pub fn build(tc: &Toolchain, out: &Path) -> Result<Vec<PathBuf>> {
    apt::ensure("cluster", image::PACKAGES)?;
    let pause_ctx = out.join("pause");
    fresh_dir(&pause_ctx)?;
    apt::run(
        Command::new("gcc")
            .args(["-static", "-Os", "-s", "-o"])
            .arg(pause_ctx.join("pause"))
            .arg(cargo::workspace_root().join("xtask/src/cluster/pause.c")),
    )?;
    fs::write(
        pause_ctx.join("Containerfile"),
        "FROM scratch\nCOPY pause /pause\nENTRYPOINT [\"/pause\"]\n",
    )?;

    // The hog uses std alone: rustc builds it in a second, where a cargo build of its
    // package would build the agent and every test dependency for musl first.
    vm::ensure_musl_target()?;
    let hog = out.join("qoslet-test-hog");
    apt::run(
        Command::new("rustc")
            .args(["--edition", "2024", "-O", "--target", vm::MUSL_TARGET, "-o"])
            .arg(&hog)
            .arg(cargo::workspace_root().join("tests/src/bin/qoslet-test-hog.rs"))
            .env("PATH", &tc.path_env),
    )?;
    image::check_static(&hog)?;
    let test_ctx = out.join("test");
    fresh_dir(&test_ctx)?;
    fs::copy("/bin/busybox", test_ctx.join("busybox")).context("copying /bin/busybox")?;
    image::check_static(&test_ctx.join("busybox"))?;
    fs::copy(&hog, test_ctx.join("qoslet-test-hog"))?;
    fs::write(
        test_ctx.join("Containerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY qoslet-test-hog /bin/qoslet-test-hog\n",
    )?;

    [(PAUSE, pause_ctx), (TEST, test_ctx)]
        .into_iter()
        .map(|(name, ctx)| {
            let archive = out.join(format!("{}.oci.tar", ctx_name(&ctx)));
            buildah(name, &ctx, &archive)?;
            Ok(archive)
        })
        .collect()
}

fn ctx_name(ctx: &Path) -> String {
    ctx.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn fresh_dir(dir: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    Ok(())
}

fn buildah(name: &str, ctx: &Path, archive: &Path) -> Result<()> {
    apt::run(
        Command::new("buildah")
            .args(image::storage_args())
            .args(["bud", "--quiet", "--layers=false", "--tag", name, "--file"])
            .arg(ctx.join("Containerfile"))
            .arg(ctx),
    )?;
    let _ = fs::remove_file(archive);
    apt::run(
        Command::new("buildah")
            .args(image::storage_args())
            .args(["push", "--quiet", name])
            .arg(format!("oci-archive:{}:{name}", archive.display())),
    )
}
