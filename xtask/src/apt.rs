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
    run(Command::new("apt-get").arg("update").arg("-q"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    println!("{who}: installed {}", missing.join(" "));
    Ok(())
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
