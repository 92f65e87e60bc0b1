//! Debian kernel packages: picks the newest of a series, downloads and unpacks it once.
//!
//! The cloud flavour has everything the VM needs built in (8250 serial console, devtmpfs,
//! initramfs, every cgroup v2 controller, PSI, BTF, BPF LSM), so only `vmlinuz` is kept: no
//! modules are loaded in the VM.

use std::{
    cmp::Ordering,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::deps::run;

const PREFIX: &str = "linux-image-";
const SUFFIX: &str = "-cloud-amd64-unsigned";

/// A kernel unpacked in the cache.
pub struct Kernel {
    /// The Debian package, e.g. `linux-image-6.1.0-57-cloud-amd64-unsigned 6.1.192-3`.
    pub package: String,
    pub vmlinuz: PathBuf,
}

/// `$XDG_CACHE_HOME/qoslet/vm` or `~/.cache/qoslet/vm`.
pub fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    Ok(base.join("qoslet").join("vm"))
}

/// Finds the newest cloud kernel of `series` ("6.1", "6.12" or an exact "6.1.0-57") and makes
/// sure it is unpacked in `cache`.
pub fn fetch(series: &str, cache: &Path) -> Result<Kernel> {
    let version = match newest_in_apt(series)? {
        Some(v) => v,
        // Without apt lists (offline, fresh container) a kernel cached earlier still works.
        None => newest_cached(series, cache)?.with_context(|| {
            format!("no {PREFIX}{series}*{SUFFIX} in the configured apt sources nor in {cache:?}")
        })?,
    };
    let dir = cache.join(&version);
    let vmlinuz = dir.join("vmlinuz");
    let package_file = dir.join("package");
    if !vmlinuz.is_file() || !package_file.is_file() {
        download(&version, &dir)?;
    }
    let package = fs::read_to_string(&package_file)?.trim().to_owned();
    Ok(Kernel { package, vmlinuz })
}

fn download(version: &str, dir: &Path) -> Result<()> {
    let package = format!("{PREFIX}{version}{SUFFIX}");
    let work = dir.with_extension("download");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    println!("vm-test: downloading {package}");
    // The sandbox user `_apt` cannot write into root's cache; stay root instead of warning.
    run(Command::new("apt-get")
        .args(["download", "-q", "-o", "APT::Sandbox::User=root", &package])
        .current_dir(&work))?;
    let deb = fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {work:?}"))?;
    let root = work.join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    let deb_version = Command::new("dpkg-deb")
        .args(["-f"])
        .arg(&deb)
        .arg("Version")
        .output()?;
    let deb_version = String::from_utf8(deb_version.stdout)?.trim().to_owned();

    let boot = root.join("boot");
    let abi = format!("{version}-cloud-amd64");
    fs::create_dir_all(dir)?;
    fs::copy(boot.join(format!("config-{abi}")), dir.join("config"))?;
    fs::copy(boot.join(format!("vmlinuz-{abi}")), dir.join("vmlinuz.tmp"))?;
    fs::write(dir.join("package"), format!("{package} {deb_version}\n"))?;
    // Renamed last: its presence marks a complete cache entry.
    fs::rename(dir.join("vmlinuz.tmp"), dir.join("vmlinuz"))?;
    fs::remove_dir_all(&work)?;
    Ok(())
}

/// `6.1.0-57` for series `6.1`, `6.12.117+deb12` for `6.12`, from the apt package lists.
fn newest_in_apt(series: &str) -> Result<Option<String>> {
    let out = Command::new("apt-cache")
        .args(["search", "--names-only"])
        .arg(format!("^{PREFIX}.*{SUFFIX}$"))
        .output()
        .context("running apt-cache search")?;
    if !out.status.success() {
        bail!(
            "apt-cache search failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let versions = text.lines().filter_map(|line| {
        let name = line.split_whitespace().next()?;
        name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)
    });
    Ok(newest(series, versions))
}

fn newest_cached(series: &str, cache: &Path) -> Result<Option<String>> {
    let Ok(entries) = fs::read_dir(cache) else {
        return Ok(None);
    };
    let names: Vec<String> = entries
        .filter_map(std::result::Result::ok)
        .filter(|e| e.path().join("vmlinuz").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    Ok(newest(series, names.iter().map(String::as_str)))
}

fn newest<'a>(series: &str, versions: impl Iterator<Item = &'a str>) -> Option<String> {
    versions
        .filter(|v| in_series(series, v))
        .max_by(|a, b| compare_versions(a, b))
        .map(str::to_owned)
}

/// "6.1" takes "6.1.0-57" but not "6.12.117+deb12".
fn in_series(series: &str, version: &str) -> bool {
    version
        .strip_prefix(series)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '-', '+']))
}

/// Compares the numbers in two versions in order, so 6.1.0-100 is newer than 6.1.0-99.
fn compare_versions(a: &str, b: &str) -> Ordering {
    let numbers = |s: &str| -> Vec<u64> {
        s.split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    numbers(a).cmp(&numbers(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_newest_of_series() {
        let v = [
            "6.1.0-9",
            "6.1.0-57",
            "6.1.0-100",
            "6.12.9+deb12",
            "6.12.117+deb12",
        ];
        assert_eq!(newest("6.1", v.into_iter()).as_deref(), Some("6.1.0-100"));
        assert_eq!(
            newest("6.12", v.into_iter()).as_deref(),
            Some("6.12.117+deb12")
        );
        assert_eq!(
            newest("6.1.0-57", v.into_iter()).as_deref(),
            Some("6.1.0-57")
        );
        assert_eq!(newest("6.6", v.into_iter()), None);
    }
}
