//! Debian kernel packages: picks the newest of a series, downloads and unpacks it once.
//!
//! The cloud flavour has everything the VM needs built in (8250 serial console, devtmpfs,
//! initramfs, every cgroup v2 controller, PSI, BTF, BPF LSM), so only `vmlinuz` is kept: no
//! modules are loaded in the VM.
//!
//! 6.1 and 6.12 come from the host's own apt sources (bookworm). Kernels of another release,
//! 5.10 from bullseye, come through a private apt source list under the cache
//! ([`PrivateSource`]): the host's sources and package lists are never changed.

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
/// The flavour of the host's own (amd64) kernels.
const AMD64: &str = "cloud-amd64";

/// A kernel unpacked in the cache.
pub struct Kernel {
    /// The Debian package, e.g. `linux-image-6.1.0-57-cloud-amd64-unsigned 6.1.192-3`.
    pub package: String,
    pub vmlinuz: PathBuf,
    /// The Debian architecture, `amd64` or `arm64`.
    pub arch: &'static str,
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
/// sure it is unpacked in `cache`. A package the archive lists but does not serve (a mirror
/// behind its own package lists answers 404) is skipped for the next older one.
pub fn fetch(series: &str, cache: &Path) -> Result<Kernel> {
    let source = PrivateSource::for_series(series);
    let apt = match source {
        Some(s) => s.options(cache)?,
        None => Vec::new(),
    };
    let flavour = source.map_or(AMD64, |s| s.flavour);
    let arch = source.map_or("amd64", |s| s.arch);
    // `--kernel arm64` names the architecture; the source knows the series.
    let series = source.map_or(series, |s| s.kernel_series);
    // amd64 kernels directly in the cache (as before arm64 came), others under their flavour.
    let kernels = if flavour == AMD64 {
        cache.to_owned()
    } else {
        cache.join(flavour)
    };
    let mut failures = Vec::new();
    for version in in_apt(series, flavour, &apt)? {
        let dir = kernels.join(&version);
        if !is_cached(&dir)
            && let Err(e) = download(&version, flavour, &dir, &apt)
        {
            // apt has said why above; the command line adds nothing.
            println!("vm-test: {version} could not be downloaded, trying an older one");
            failures.push(format!("{version}: {e:#}"));
            continue;
        }
        return cached_kernel(&dir, arch);
    }
    // Without apt lists (offline, fresh container) a kernel cached earlier still works.
    match newest_cached(series, &kernels)? {
        Some(version) => cached_kernel(&kernels.join(version), arch),
        None if failures.is_empty() => {
            bail!("no {PREFIX}{series}*{SUFFIX} in the apt sources nor in {cache:?}")
        }
        None => bail!(
            "no {PREFIX}{series}*{SUFFIX} could be downloaded: {}",
            failures.join("; ")
        ),
    }
}

fn is_cached(dir: &Path) -> bool {
    dir.join("vmlinuz").is_file() && dir.join("package").is_file()
}

fn cached_kernel(dir: &Path, arch: &'static str) -> Result<Kernel> {
    let package = fs::read_to_string(dir.join("package"))?.trim().to_owned();
    Ok(Kernel {
        package,
        vmlinuz: dir.join("vmlinuz"),
        arch,
    })
}

/// A Debian suite the host's apt sources do not carry, read through its own source list, package
/// lists and archive cache (`apt-get -o Dir::...`), so the host's apt is left as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateSource {
    /// The directory under `<cache>/apt/`.
    pub name: &'static str,
    /// What `--kernel` names to use it ("5.10", "arm64").
    pub series: &'static str,
    /// The kernel series taken from it ("5.10", "6.12").
    pub kernel_series: &'static str,
    /// The package flavour, `cloud-amd64` or `cloud-arm64`.
    pub flavour: &'static str,
    /// The Debian architecture of its packages.
    pub arch: &'static str,
    /// `deb` lines (signed by Debian's archive keyring, which holds the older releases' keys).
    pub lines: &'static [&'static str],
}

/// bullseye's 5.10: the kernel of Debian 11 and Amazon Linux 2 node images.
pub const BULLSEYE: PrivateSource = PrivateSource {
    name: "bullseye-amd64",
    series: "5.10",
    kernel_series: "5.10",
    flavour: AMD64,
    arch: "amd64",
    lines: &[
        "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main",
        "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bullseye-security main",
    ],
};

/// bookworm's arm64 cloud kernel (6.12) and the arm64 busybox of the arm64 VM.
pub const BOOKWORM_ARM64: PrivateSource = PrivateSource {
    name: "bookworm-arm64",
    series: "arm64",
    kernel_series: "6.12",
    flavour: "cloud-arm64",
    arch: "arm64",
    lines: &[
        "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main",
        "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main",
    ],
};

const PRIVATE_SOURCES: &[PrivateSource] = &[BULLSEYE, BOOKWORM_ARM64];

/// Whether `--kernel <series>` boots an arm64 VM.
pub fn is_arm64(series: &str) -> bool {
    PrivateSource::for_series(series).is_some_and(|s| s.arch == "arm64")
}

/// Package lists older than this are fetched again (the security suite moves the ABI on).
const LISTS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl PrivateSource {
    /// The private source of `series` ("5.10" or an exact "5.10.0-46"), if it has one.
    pub fn for_series(series: &str) -> Option<&'static PrivateSource> {
        PRIVATE_SOURCES
            .iter()
            .find(|s| s.series == series || in_series(s.series, series))
    }

    /// Extracts `path` (e.g. `bin/busybox`) of the newest `package` of this source into
    /// `<cache>/apt/<name>/files/<package>/`, once; returns where it is.
    pub fn file_of(&self, cache: &Path, package: &str, path: &str) -> Result<PathBuf> {
        let dir = cache
            .join("apt")
            .join(self.name)
            .join("files")
            .join(package);
        let file = dir.join(path);
        if file.is_file() {
            return Ok(file);
        }
        let apt = self.options(cache)?;
        let work = dir.with_extension("download");
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(&work)?;
        println!("vm-test: downloading {package} ({})", self.arch);
        run(Command::new("apt-get")
            .args(["download", "-q"])
            .args(&apt)
            .arg(format!("{package}:{}", self.arch))
            .current_dir(&work))?;
        let deb = fs::read_dir(&work)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {work:?}"))?;
        let _ = fs::remove_dir_all(&dir);
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
        fs::remove_dir_all(&work)?;
        if !file.is_file() {
            bail!("{package} has no {path}");
        }
        Ok(file)
    }

    /// The `apt-get`/`apt-cache` options that read this source alone; fetches its package lists
    /// when they are missing or a day old. A failed fetch with lists already there only warns
    /// (offline runs keep working from the cache).
    pub fn options(&self, cache: &Path) -> Result<Vec<String>> {
        let dir = cache.join("apt").join(self.name);
        let lists = dir.join("lists");
        fs::create_dir_all(lists.join("partial"))?;
        fs::create_dir_all(dir.join("archives/partial"))?;
        let list_file = dir.join("sources.list");
        let mut text = self.lines.join("\n");
        text.push('\n');
        if fs::read_to_string(&list_file).ok().as_deref() != Some(text.as_str()) {
            fs::write(&list_file, &text)?;
            // Lists of another source list must not be mistaken for fresh ones.
            let _ = fs::remove_file(dir.join("updated"));
        }
        let options: Vec<String> = [
            format!("Dir::Etc::SourceList={}", list_file.display()),
            "Dir::Etc::SourceParts=/dev/null".to_owned(),
            format!("Dir::State::Lists={}", lists.display()),
            format!("Dir::Cache::Archives={}", dir.join("archives").display()),
            // Neither the host's package cache nor its AppStream metadata.
            format!(
                "Dir::Cache::pkgcache={}",
                dir.join("pkgcache.bin").display()
            ),
            format!(
                "Dir::Cache::srcpkgcache={}",
                dir.join("srcpkgcache.bin").display()
            ),
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false".to_owned(),
            "Acquire::IndexTargets::deb::CNF::DefaultEnabled=false".to_owned(),
            "APT::Sandbox::User=root".to_owned(),
            format!("APT::Architecture={}", self.arch),
            format!("APT::Architectures={}", self.arch),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_owned(), o])
        .collect();
        let stamp = dir.join("updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < LISTS_MAX_AGE));
        if !fresh {
            println!("vm-test: fetching the package lists of {}", self.name);
            match run(Command::new("apt-get")
                .args(["update", "-q"])
                .args(&options))
            {
                Ok(()) => fs::write(&stamp, "")?,
                Err(e) if has_lists(&lists) => {
                    println!("vm-test: {e:#}; using the package lists fetched earlier");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(options)
    }
}

fn has_lists(lists: &Path) -> bool {
    fs::read_dir(lists).is_ok_and(|d| {
        d.filter_map(std::result::Result::ok)
            .any(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
    })
}

fn download(version: &str, flavour: &str, dir: &Path, apt: &[String]) -> Result<()> {
    let package = format!("{PREFIX}{version}-{flavour}-unsigned");
    let work = dir.with_extension("download");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    println!("vm-test: downloading {package}");
    // The sandbox user `_apt` cannot write into root's cache; stay root instead of warning.
    run(Command::new("apt-get")
        .args(["download", "-q", "-o", "APT::Sandbox::User=root", &package])
        .args(apt)
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
    let abi = format!("{version}-{flavour}");
    fs::create_dir_all(dir)?;
    fs::copy(boot.join(format!("config-{abi}")), dir.join("config"))?;
    fs::copy(boot.join(format!("vmlinuz-{abi}")), dir.join("vmlinuz.tmp"))?;
    fs::write(dir.join("package"), format!("{package} {deb_version}\n"))?;
    // Renamed last: its presence marks a complete cache entry.
    fs::rename(dir.join("vmlinuz.tmp"), dir.join("vmlinuz"))?;
    fs::remove_dir_all(&work)?;
    Ok(())
}

/// The versions of `series` in the apt package lists, newest first (`6.1.0-57` for series `6.1`,
/// `6.12.117+deb12` for `6.12`; `apt`: options of a [`PrivateSource`], empty for the host's).
fn in_apt(series: &str, flavour: &str, apt: &[String]) -> Result<Vec<String>> {
    let suffix = format!("-{flavour}-unsigned");
    let out = Command::new("apt-cache")
        .args(apt)
        .args(["search", "--names-only"])
        .arg(format!("^{PREFIX}.*{suffix}$"))
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
        name.strip_prefix(PREFIX)?.strip_suffix(suffix.as_str())
    });
    Ok(newest_first(series, versions))
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
    newest_first(series, versions).into_iter().next()
}

fn newest_first<'a>(series: &str, versions: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut v: Vec<String> = versions
        .filter(|v| in_series(series, v))
        .map(str::to_owned)
        .collect();
    v.sort_by(|a, b| compare_versions(b, a));
    v.dedup();
    v
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

    #[test]
    fn private_sources_by_series() {
        assert_eq!(PrivateSource::for_series("5.10"), Some(&BULLSEYE));
        assert_eq!(PrivateSource::for_series("5.10.0-46"), Some(&BULLSEYE));
        assert_eq!(PrivateSource::for_series("5.1"), None);
        assert_eq!(PrivateSource::for_series("6.1"), None);
        assert_eq!(PrivateSource::for_series("arm64"), Some(&BOOKWORM_ARM64));
        assert!(is_arm64("arm64") && !is_arm64("5.10") && !is_arm64("6.12"));
    }
}
