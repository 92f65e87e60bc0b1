//! Debian packages that xtask's commands need on the host, installed when missing.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// Installs the packages of `packages` that dpkg does not know as installed; `who` prefixes the
/// progress lines. When everything is there it only asks dpkg (well under 1 s).
pub fn ensure(who: &str, packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    // `apt-get update` is slow and only needed when something has to be fetched.
    println!("{who}: installing {}", missing.join(" "));
    let installing = run(apt_get().arg("update").arg("-q")).and_then(|()| {
        run(apt_get()
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))
    });
    if let Err(e) = installing {
        // Another install beside this one (a second xtask on a shared machine) may have held
        // the lock past the wait, and installed these very packages meanwhile.
        if missing.iter().any(|p| !installed(p)) {
            return Err(e);
        }
        println!("{who}: installed by another apt meanwhile ({e:#})");
    }
    println!("{who}: installed {}", missing.join(" "));
    Ok(())
}

/// `apt-get` that waits up to 10 minutes for dpkg's lock: on a shared machine another apt (a
/// second xtask, unattended-upgrades) often holds it for a while, and without the wait apt-get
/// fails at once (exit 100, "Could not get lock /var/lib/dpkg/lock-frontend").
fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.args(["-o", "DPkg::Lock::Timeout=600"]);
    cmd
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b"install ok installed"))
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
