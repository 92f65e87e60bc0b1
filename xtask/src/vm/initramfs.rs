//! The VM's root filesystem: busybox, the init script and the test binaries in a newc cpio.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

const INIT: &str = include_str!("init.sh");
/// From Debian's busybox-static: no shared libraries needed in the VM.
const BUSYBOX: &str = "/bin/busybox";

/// Writes `<out_dir>/initramfs.cpio` holding `/init`, busybox and `/tests/<name>`.
/// cargo puts test executables in `deps/`; helper binaries sit one level up.
pub fn is_test_binary(bin: &Path) -> bool {
    bin.parent().and_then(|p| p.file_name()) == Some("deps".as_ref())
}

pub fn build(test_binaries: &[PathBuf], out_dir: &Path) -> Result<PathBuf> {
    build_with(
        test_binaries,
        out_dir,
        Path::new(BUSYBOX),
        "strip",
        "initramfs",
    )
}

/// [`build`] for another architecture: its static `busybox`, the `strip` that reads its ELF
/// files, and `name` for the staging directory and `<out_dir>/<name>.cpio`.
pub fn build_with(
    test_binaries: &[PathBuf],
    out_dir: &Path,
    busybox: &Path,
    strip: &str,
    name: &str,
) -> Result<PathBuf> {
    let stage = out_dir.join(name);
    let _ = fs::remove_dir_all(&stage);
    for dir in ["bin", "tests", "dev", "proc", "sys", "tmp", "root"] {
        fs::create_dir_all(stage.join(dir))?;
    }
    install(busybox, &stage.join("bin/busybox"), strip)?;
    fs::write(stage.join("init"), INIT)?;
    fs::set_permissions(stage.join("init"), fs::Permissions::from_mode(0o755))?;
    for bin in test_binaries {
        // cargo puts test executables in deps/ (with a hash); helper binaries the tests start
        // (qoslet-test-hog) sit one level up and go to /bin.
        if is_test_binary(bin) {
            let name = test_name(bin)?;
            install(bin, &stage.join("tests").join(name), strip)?;
        } else {
            let name = bin.file_name().context("helper binary without a name")?;
            install(bin, &stage.join("bin").join(name), strip)?;
        }
    }

    pack(&stage, &out_dir.join(format!("{name}.cpio")))
}

/// Packs `stage` into the newc cpio `cpio` and removes it.
fn pack(stage: &Path, cpio: &Path) -> Result<PathBuf> {
    let file = fs::File::create(cpio)?;
    // Owned by root inside the VM whoever builds it; the kernel unpacks newc only.
    let status = Command::new("sh")
        .args([
            "-c",
            "find . -print0 | cpio --null --create --format=newc --owner=0:0 --quiet",
        ])
        .current_dir(stage)
        .stdout(file)
        .stderr(Stdio::inherit())
        .status()
        .context("running cpio")?;
    if !status.success() {
        bail!("building {cpio:?} failed: {status}");
    }
    fs::remove_dir_all(stage)?;
    Ok(cpio.to_owned())
}

/// Writes `<out_dir>/<name>.cpio` holding the test VM's `/init`, which runs the script `main`
/// (as `/main.sh`) instead of the tests once the system is mounted, busybox, and each
/// `(from, to)` of `files` at the absolute path `to` inside (for the peers bench: the agent, the
/// bench driver, Debian's earlyoom, oomd and nohang with their configs, python3 and the shared
/// libraries they link).
pub fn build_scripted(
    main: &str,
    files: &[(PathBuf, PathBuf)],
    out_dir: &Path,
    name: &str,
) -> Result<PathBuf> {
    let stage = out_dir.join(format!("{name}.stage"));
    let _ = fs::remove_dir_all(&stage);
    for dir in ["bin", "dev", "proc", "sys", "tmp", "root", "run"] {
        fs::create_dir_all(stage.join(dir))?;
    }
    install(Path::new(BUSYBOX), &stage.join("bin/busybox"), "strip")?;
    fs::write(stage.join("init"), INIT)?;
    fs::set_permissions(stage.join("init"), fs::Permissions::from_mode(0o755))?;
    fs::write(stage.join("main.sh"), main)?;
    for (from, to) in files {
        let to = stage.join(to.strip_prefix("/").unwrap_or(to));
        fs::create_dir_all(to.parent().context("a file without a directory")?)?;
        install(from, &to, "strip")?;
    }
    pack(&stage, &out_dir.join(format!("{name}.cpio")))
}

/// Copies a binary in without its debug info: the initramfs unpacks into the VM's RAM, and
/// debug builds of every test binary would not fit (symbols stay, so backtraces keep names).
fn install(from: &Path, to: &Path, strip: &str) -> Result<()> {
    let stripped = Command::new(strip)
        .arg("--strip-debug")
        .arg("-o")
        .arg(to)
        .arg(from)
        // A script or a config is no object file: strip refuses it, and it is copied as it is.
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        fs::copy(from, to).with_context(|| format!("copying {from:?} into the initramfs"))?;
    }
    fs::set_permissions(to, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// `cgroup_v2_smoke-0123456789abcdef` -> `cgroup_v2_smoke`: readable names in the results.
fn test_name(bin: &Path) -> Result<String> {
    let file = bin
        .file_name()
        .and_then(|f| f.to_str())
        .with_context(|| format!("bad test binary path {bin:?}"))?;
    Ok(match file.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            stem.to_owned()
        }
        _ => file.to_owned(),
    })
}
