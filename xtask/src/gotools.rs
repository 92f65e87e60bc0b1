//! Go programs built from the Go module proxy at pinned versions: the real cluster's parts
//! (kube-apiserver, kubelet, etcd, containerd, ...), kustomize and helm. None is packaged for
//! these machines at the versions qoslet is checked against, and nothing else may be downloaded.
//!
//! Each [`GoBuild`] gets a small module of its own under `<cache>/go/build/<name>-<version>`
//! whose `go.mod` requires the pinned module (plus its `replace` lines: `k8s.io/kubernetes`
//! needs one per staging module), and `go build` writes the binaries to its `bin/`. A stamp
//! records what was built, so a second run only compares it (well under a second). The module
//! cache and the build cache live under `<cache>/go` too, so they leave the user's own Go caches
//! alone; the module cache persists with the rest of `~/.cache/qoslet`, the build cache is
//! emptied after each build (see [`drop_build_cache`]).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::toolchain;

/// One `go build` of main packages from one pinned module.
pub struct GoBuild<'a> {
    /// The build's own directory name (with the version appended).
    pub name: &'a str,
    /// The module that is required, e.g. `k8s.io/kubernetes`.
    pub module: &'a str,
    /// Its pinned version, e.g. `v1.37.2`.
    pub version: &'a str,
    /// Main packages, each written to `bin/` under its last path element.
    pub packages: &'a [&'a str],
    /// `replace` lines of go.mod: (module, module@version or a local path).
    pub replaces: &'a [(String, String)],
    /// Build tags (`-tags`).
    pub tags: &'a [&'a str],
    /// Whether cgo is on (off gives static binaries).
    pub cgo: bool,
    /// String variables set at link time (`-ldflags -X package.name=value`): what a project's
    /// own release build stamps in, e.g. its version, which a plain `go build` leaves at a
    /// placeholder.
    pub link_vars: &'a [(&'a str, &'a str)],
}

impl GoBuild<'_> {
    /// What was built, in a form that changes when anything of the build changes.
    fn stamp(&self) -> String {
        format!(
            "{} {}\npackages {:?}\nreplaces {:?}\ntags {:?}\ncgo {}\nlink_vars {:?}\n",
            self.module,
            self.version,
            self.packages,
            self.replaces,
            self.tags,
            self.cgo,
            self.link_vars
        )
    }

    fn ldflags(&self) -> String {
        let mut s = "-s -w".to_owned();
        for (var, value) in self.link_vars {
            s.push_str(&format!(" -X {var}={value}"));
        }
        s
    }

    fn go_mod(&self) -> String {
        let mut s = format!(
            "module qoslet.local/tools/{}\n\ngo 1.25\n\nrequire {} {}\n",
            self.name, self.module, self.version
        );
        if !self.replaces.is_empty() {
            s.push_str("\nreplace (\n");
            for (from, to) in self.replaces {
                match to.split_once('@') {
                    Some((m, v)) => s.push_str(&format!("\t{from} => {m} {v}\n")),
                    None => s.push_str(&format!("\t{from} => {to}\n")),
                }
            }
            s.push_str(")\n");
        }
        s
    }
}

/// The directory of the Go caches and builds.
pub fn go_dir() -> Result<PathBuf> {
    Ok(toolchain::cache_dir()?.join("go"))
}

/// Where this machine kind installs Go; a shell that did not read the profile that puts it on
/// PATH (CI's `bash .ci/run`) still finds it there.
const GO_INSTALL: &str = "/usr/local/go/bin/go";

/// `go` from PATH, else from [`GO_INSTALL`].
fn go_program() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("go").is_file()));
    if !on_path && Path::new(GO_INSTALL).is_file() {
        PathBuf::from(GO_INSTALL)
    } else {
        PathBuf::from("go")
    }
}

/// The `go` command with qoslet's caches and the proxy's module checks.
pub fn go() -> Result<Command> {
    let dir = go_dir()?;
    let mut cmd = Command::new(go_program());
    cmd.env("GOMODCACHE", dir.join("mod"))
        .env("GOCACHE", dir.join("cache"))
        .env("GOFLAGS", "-mod=mod -buildvcs=false")
        // The installed Go builds every module here; never fetch another toolchain.
        .env("GOTOOLCHAIN", "local");
    Ok(cmd)
}

/// The module cache and build cache at their largest in a cold build of the cluster's parts
/// (measured: 1.5 GB of modules, 5.1 GB of compiled packages, 0.6 GB of binaries). The build
/// cache is emptied after each build ([`drop_build_cache`]).
const COLD_BUILD_BYTES: u64 = 7_200_000_000;

/// Builds `b` unless its stamp says it is built; returns the directory of its binaries.
pub fn ensure(b: &GoBuild) -> Result<PathBuf> {
    let dir = go_dir()?
        .join("build")
        .join(format!("{}-{}", b.name, b.version));
    let bin = dir.join("bin");
    let stamp = dir.join("stamp");
    let built = || {
        fs::read_to_string(&stamp).is_ok_and(|s| s == b.stamp())
            && b.packages
                .iter()
                .all(|p| bin.join(binary_name(p)).is_file())
    };
    if built() {
        return Ok(bin);
    }
    // Held to the end of the build and its cache clean; another xtask may have built it meanwhile.
    let _lock = GoLock::acquire()?;
    if built() {
        return Ok(bin);
    }
    check_go()?;
    crate::disk::warn_if_short(&[crate::disk::Need {
        path: go_dir()?,
        bytes: COLD_BUILD_BYTES,
        what: "a cold Go build",
    }]);
    println!(
        "xtask: building {} from {} {} with Go (once; cached under {})",
        b.packages
            .iter()
            .map(|p| binary_name(p))
            .collect::<Vec<_>>()
            .join(", "),
        b.module,
        b.version,
        dir.display()
    );
    let t = Instant::now();
    fs::create_dir_all(&bin)?;
    let _ = fs::remove_file(&stamp);
    fs::write(dir.join("go.mod"), b.go_mod())?;
    let _ = fs::remove_file(dir.join("go.sum"));
    let mut cmd = go()?;
    cmd.current_dir(&dir)
        .env("CGO_ENABLED", if b.cgo { "1" } else { "0" })
        .args(["build", "-trimpath"])
        .arg(format!("-ldflags={}", b.ldflags()))
        .arg("-o")
        .arg(&bin);
    if !b.tags.is_empty() {
        cmd.arg(format!("-tags={}", b.tags.join(",")));
    }
    cmd.args(b.packages);
    run(&mut cmd)?;
    for p in b.packages {
        if !bin.join(binary_name(p)).is_file() {
            bail!(
                "go build of {p} wrote no {}",
                bin.join(binary_name(p)).display()
            );
        }
    }
    fs::write(&stamp, b.stamp())?;
    drop_build_cache()?;
    println!(
        "xtask: built {} {} in {:.0?}",
        b.module,
        b.version,
        t.elapsed()
    );
    Ok(bin)
}

/// The Go directory's lock: one `go build` and its cache clean at a time, across xtask processes.
/// A clean beside a running build deletes the packages it compiled (seen: `cargo xtask
/// validate-deploy` built helm beside a `cargo xtask cluster up`, and the Kubernetes build
/// failed "could not import ... no such file or directory").
struct GoLock(#[expect(dead_code, reason = "held for its descriptor's lock")] fs::File);

impl GoLock {
    fn acquire() -> Result<Self> {
        let dir = go_dir()?;
        fs::create_dir_all(&dir)?;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))?;
        // SAFETY: flock(2) on the descriptor this function just opened and owns; blocks until
        // the other holder closes its own.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(Self(file))
    }
}

/// Empties the Go build cache once a build's binaries are stamped: the binaries are what is
/// kept, and Kubernetes alone leaves about 5 GB of compiled packages there, on a disk the Rust
/// builds of `cargo xtask test` share. A later build of a new version starts cold but still finds
/// its modules in the module cache.
fn drop_build_cache() -> Result<()> {
    run(go()?.args(["clean", "-cache"]))
}

/// The binary `go build -o DIR` writes for a main package: its last path element, or the one
/// before a major-version suffix (`.../kustomize/v5` -> `kustomize`).
pub fn binary_name(package: &str) -> &str {
    let mut parts = package.rsplit('/');
    let last = parts.next().unwrap_or(package);
    let is_major =
        last.len() > 1 && last.starts_with('v') && last[1..].bytes().all(|c| c.is_ascii_digit());
    if is_major {
        parts.next().unwrap_or(last)
    } else {
        last
    }
}

fn check_go() -> Result<()> {
    let out = Command::new(go_program()).arg("version").output().context(
        "running `go version`: Go 1.25 or newer must be on PATH (this machine kind ships it)",
    )?;
    if !out.status.success() {
        bail!("`go version` failed: {}", out.status);
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Whether `path` is a Go build's binary that runs (`--version` or `version` exits 0).
pub fn runs(path: &Path, args: &[&str]) -> bool {
    Command::new(path)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_names_follow_go_build() {
        assert_eq!(binary_name("k8s.io/kubernetes/cmd/kubelet"), "kubelet");
        assert_eq!(
            binary_name("sigs.k8s.io/kustomize/kustomize/v5"),
            "kustomize"
        );
        assert_eq!(binary_name("helm.sh/helm/v3/cmd/helm"), "helm");
        assert_eq!(binary_name("go.etcd.io/etcd/server/v3"), "server");
    }

    #[test]
    fn go_mod_has_the_pin_and_the_replaces() {
        let replaces = vec![("k8s.io/api".to_owned(), "k8s.io/api@v0.37.2".to_owned())];
        let b = GoBuild {
            name: "kubernetes",
            module: "k8s.io/kubernetes",
            version: "v1.37.2",
            packages: &["k8s.io/kubernetes/cmd/kubelet"],
            replaces: &replaces,
            tags: &[],
            cgo: false,
            link_vars: &[("k8s.io/component-base/version.gitVersion", "v1.37.2")],
        };
        assert_eq!(
            b.ldflags(),
            "-s -w -X k8s.io/component-base/version.gitVersion=v1.37.2"
        );
        let m = b.go_mod();
        assert!(m.contains("require k8s.io/kubernetes v1.37.2\n"), "{m}");
        assert!(m.contains("\tk8s.io/api => k8s.io/api v0.37.2\n"), "{m}");
    }
}
