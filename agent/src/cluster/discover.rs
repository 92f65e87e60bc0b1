//! The kubelet's configuration as the node has it, with no file placed by hand: cluster mode's
//! default when `--kubelet-config` is not given.
//!
//! The DaemonSet has `hostPID`, so the kubelet is one of the processes in `/proc`. This finds it
//! (`comm` and the base name of `argv[0]` both `kubelet`), reads its command line and builds its
//! configuration as the kubelet itself does (`cmd/kubelet/app/server.go` v1.37.2,
//! `NewKubeletCommand`): the `--config` file, then the `*.conf` drop-ins of `--config-dir` merged
//! over it in lexical order (`mergeKubeletConfigurations`, a JSON merge patch each), then the
//! command-line flags over both (`kubeletConfigFlagPrecedence`). So flags beat drop-ins, which
//! beat the file; only the ~20 flags that set a field qoslet reads are read.
//!
//! The files are read beneath the kubelet's own root, `/proc/<pid>/root`, as the kubelet sees
//! them (absolute paths and symlinks resolve inside that root: `RESOLVE_IN_ROOT`). Opening that
//! root needs ptrace access to the kubelet, which a container without `SYS_PTRACE` lacks
//! (`EACCES`); then the same paths are read beneath `--host-root` (the DaemonSet mounts the
//! host's `/` read-only at `/host`), which is the kubelet's root wherever the kubelet runs in
//! the host's mount namespace.

use std::{
    collections::BTreeSet,
    fs,
    io::{self, Read as _},
    os::{
        fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
        unix::fs::OpenOptionsExt as _,
    },
    path::{Path, PathBuf},
};

use serde_json::{Map, Value};
use thiserror::Error;

use crate::{
    config::{ConfigError, KUBELET_API_VERSION, KubeletConfig},
    policy::eviction::DEFAULT_HARD,
    source::{file::DEFAULT_MAX_BYTES, nesting::check_nesting},
    support::beneath,
};

/// The most of a command line read (Linux caps argv and envp together at a quarter of the stack
/// limit; a kubelet's is a few KiB).
pub(crate) const CMDLINE_MAX: u64 = 1 << 20;
/// `comm` is at most 16 bytes (TASK_COMM_LEN); anything longer is not a `comm` file.
const COMM_MAX: u64 = 64;
/// The most drop-in files read, and how deep `--config-dir` is walked.
const MAX_DROPINS: usize = 128;
const MAX_DEPTH: usize = 8;

/// How pflag reads a flag's value (`cliflag` types in k8s.io/component-base/cli/flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Bool,
    Int32,
    Int64,
    /// `MapStringString`: `k=v,k=v`; the first use replaces the file's map, later ones add.
    Map,
    /// `LangleSeparatedMapStringString`: `signal<value,...`, as `Map` otherwise.
    LangleMap,
    /// `MapStringBool` for `--feature-gates`: gates the flag does not name keep the file's value
    /// (`kubeletConfigFlagPrecedence` adds them back).
    Gates,
    /// pflag's `StringSlice`: `a,b`; the first use replaces, later ones append.
    Slice,
}

/// The kubelet flags that set a KubeletConfiguration field qoslet reads, with that field
/// (cmd/kubelet/app/options/options.go v1.37.2, `AddKubeletConfigFlags`). The fields with no
/// flag (`memoryThrottlingFactor`, `memoryReservationPolicy`, `mergeDefaultEvictionSettings`,
/// `singleProcessOOMKill`) come from the files alone.
const FLAGS: &[(&str, &str, Kind)] = &[
    ("cgroup-driver", "cgroupDriver", Kind::Str),
    ("cgroup-root", "cgroupRoot", Kind::Str),
    ("cgroups-per-qos", "cgroupsPerQOS", Kind::Bool),
    ("cpu-cfs-quota", "cpuCFSQuota", Kind::Bool),
    ("cpu-cfs-quota-period", "cpuCFSQuotaPeriod", Kind::Str),
    (
        "enforce-node-allocatable",
        "enforceNodeAllocatable",
        Kind::Slice,
    ),
    ("eviction-hard", "evictionHard", Kind::LangleMap),
    (
        "eviction-max-pod-grace-period",
        "evictionMaxPodGracePeriod",
        Kind::Int32,
    ),
    (
        "eviction-minimum-reclaim",
        "evictionMinimumReclaim",
        Kind::Map,
    ),
    (
        "eviction-pressure-transition-period",
        "evictionPressureTransitionPeriod",
        Kind::Str,
    ),
    ("eviction-soft", "evictionSoft", Kind::LangleMap),
    (
        "eviction-soft-grace-period",
        "evictionSoftGracePeriod",
        Kind::Map,
    ),
    ("feature-gates", "featureGates", Kind::Gates),
    ("kube-reserved", "kubeReserved", Kind::Map),
    ("kube-reserved-cgroup", "kubeReservedCgroup", Kind::Str),
    ("pod-max-pids", "podPidsLimit", Kind::Int64),
    ("qos-reserved", "qosReserved", Kind::Map),
    ("reserved-cpus", "reservedSystemCPUs", Kind::Str),
    ("system-reserved", "systemReserved", Kind::Map),
    ("system-reserved-cgroup", "systemReservedCgroup", Kind::Str),
];

#[derive(Debug, Error)]
pub(crate) enum DiscoverError {
    #[error("cannot list the processes in {proc}")]
    Proc {
        proc: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no kubelet process in {proc} (comm and argv[0] named kubelet)")]
    NotFound { proc: PathBuf },
    #[error("kubelet (pid {pid}): cannot read {what}")]
    Process {
        pid: u32,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("kubelet (pid {pid}): --{flag}={value:?}: {message}")]
    Flag {
        pid: u32,
        flag: String,
        value: String,
        message: String,
    },
    #[error(
        "kubelet (pid {pid}): cannot open its root {root} and no --host-root to read its files beneath"
    )]
    NoRoot {
        pid: u32,
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("kubelet (pid {pid}): cannot open --host-root {root}")]
    HostRoot {
        pid: u32,
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("kubelet (pid {pid}): cannot read {path} beneath {root}")]
    Read {
        pid: u32,
        path: String,
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("kubelet (pid {pid}): {path}: {message}")]
    File {
        pid: u32,
        path: String,
        message: String,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl DiscoverError {
    /// The error and its causes on one line, for the log and `/readyz`; without
    /// [`crate::support::error_chain`]'s privilege hint, which is about cgroups: the remedy for a closed
    /// root is `--host-root`.
    pub(crate) fn chain(&self) -> String {
        let mut line = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let text = c.to_string();
            if !line.contains(&text) {
                line = format!("{line}: {text}");
            }
            cause = c.source();
        }
        line
    }
}

/// The kubelet's configuration as found.
#[derive(Debug)]
pub(crate) struct Discovered {
    pub(crate) pid: u32,
    pub(crate) config: KubeletConfig,
    /// What it was built from, for the log, `/readyz` and errors: the root, the files and the
    /// flags read.
    pub(crate) source: String,
}

/// The configuration-bearing parts of a kubelet's command line.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct KubeletArgs {
    /// `--config`, the last one given (pflag keeps the last); an empty value is none.
    pub(crate) config: Option<String>,
    /// `--config-dir`, likewise.
    pub(crate) config_dir: Option<String>,
    /// The flags of [`FLAGS`] in command-line order, as (flag, value).
    pub(crate) flags: Vec<(&'static str, String)>,
}

impl KubeletArgs {
    /// Reads `argv` (argv[0] included) as pflag does: `--name=value`, `--name value` (a bool
    /// flag alone is `true`), `_` spelled as `-` (cliflag's `WordSepNormalizeFunc`), nothing
    /// after `--`. Other flags are skipped; an unknown flag's value, if any, is then a
    /// positional argument and skipped too.
    pub(crate) fn parse(argv: &[String]) -> Self {
        let mut out = Self::default();
        let mut it = argv.iter().skip(1);
        while let Some(arg) = it.next() {
            if arg == "--" {
                break;
            }
            let Some(rest) = arg.strip_prefix("--") else {
                continue;
            };
            let (name, inline) = match rest.split_once('=') {
                Some((n, v)) => (n.replace('_', "-"), Some(v)),
                None => (rest.replace('_', "-"), None),
            };
            let known = match name.as_str() {
                "config" => Some(("config", Kind::Str)),
                "config-dir" => Some(("config-dir", Kind::Str)),
                n => FLAGS.iter().find(|f| f.0 == n).map(|f| (f.0, f.2)),
            };
            let Some((flag, kind)) = known else {
                continue;
            };
            let value = match (inline, kind) {
                (Some(v), _) => v.to_owned(),
                (None, Kind::Bool) => "true".to_owned(),
                (None, _) => match it.next() {
                    Some(v) => v.clone(),
                    // pflag refuses it, so a running kubelet has no such line.
                    None => break,
                },
            };
            let nonempty = (!value.is_empty()).then_some(value);
            match flag {
                "config" => out.config = nonempty,
                "config-dir" => out.config_dir = nonempty,
                _ => out.flags.push((flag, nonempty.unwrap_or_default())),
            }
        }
        out
    }

    /// The flags laid over `cfg` (a KubeletConfiguration as JSON) as the kubelet re-parses its
    /// command line over the loaded configuration; `Err((flag, value, message))` for a value
    /// pflag would refuse.
    pub(crate) fn apply(
        &self,
        cfg: &mut Map<String, Value>,
    ) -> Result<(), (String, String, String)> {
        let mut used = BTreeSet::new();
        for (flag, value) in &self.flags {
            let Some(&(_, field, kind)) = FLAGS.iter().find(|f| f.0 == *flag) else {
                continue;
            };
            let err = |m: String| ((*flag).to_owned(), value.clone(), m);
            let first = used.insert(*flag);
            match kind {
                Kind::Str => {
                    cfg.insert(field.into(), Value::String(value.clone()));
                }
                Kind::Bool => {
                    cfg.insert(field.into(), Value::Bool(go_bool(value).map_err(err)?));
                }
                Kind::Int32 => {
                    let n: i32 = value.trim().parse().map_err(|e| err(format!("{e}")))?;
                    cfg.insert(field.into(), n.into());
                }
                Kind::Int64 => {
                    let n: i64 = value.trim().parse().map_err(|e| err(format!("{e}")))?;
                    cfg.insert(field.into(), n.into());
                }
                Kind::Map | Kind::LangleMap | Kind::Gates => {
                    let sep = if kind == Kind::LangleMap { '<' } else { '=' };
                    let slot = cfg.entry(field).or_insert(Value::Null);
                    if !slot.is_object() || (first && kind != Kind::Gates) {
                        *slot = Value::Object(Map::new());
                    }
                    let Value::Object(map) = slot else {
                        continue;
                    };
                    for pair in value.split(',').filter(|s| !s.is_empty()) {
                        let (k, v) = pair.split_once(sep).ok_or_else(|| {
                            err(format!("malformed pair, expect string{sep}string"))
                        })?;
                        let v = if kind == Kind::Gates {
                            Value::Bool(go_bool(v.trim()).map_err(err)?)
                        } else {
                            Value::String(v.trim().to_owned())
                        };
                        map.insert(k.trim().to_owned(), v);
                    }
                }
                Kind::Slice => {
                    let slot = cfg.entry(field).or_insert(Value::Null);
                    if !slot.is_array() || first {
                        *slot = Value::Array(Vec::new());
                    }
                    if let Value::Array(list) = slot
                        && !value.is_empty()
                    {
                        list.extend(value.split(',').map(|s| Value::String(s.to_owned())));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Go's `strconv.ParseBool`.
fn go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean")),
    }
}

/// RFC 7386 JSON merge patch (`jsonpatch.MergePatch`, as `mergeKubeletConfigurations` applies
/// each drop-in): objects merge key by key, `null` removes a key, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return;
    };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// A KubeletConfiguration file's text as JSON: YAML or JSON, nesting bounded, an object.
fn to_json(text: &str) -> Result<Map<String, Value>, String> {
    check_nesting(text).map_err(|e| e.to_string())?;
    match serde_yaml_ng::from_str::<Value>(text).map_err(|e| e.to_string())? {
        Value::Object(m) => Ok(m),
        Value::Null => Ok(Map::new()),
        _ => Err("not a mapping".into()),
    }
}

/// The base configuration after `loadConfigFile`: an unset `evictionHard` is the kubelet's
/// default, and with `mergeDefaultEvictionSettings` the default fills the signals it does not
/// name; this matters when a drop-in then sets part of `evictionHard`.
fn with_default_eviction(cfg: &mut Map<String, Value>) {
    let merge = cfg.get("mergeDefaultEvictionSettings") == Some(&Value::Bool(true));
    match cfg.get_mut("evictionHard") {
        None | Some(Value::Null) => {
            let defaults = DEFAULT_HARD
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
                .collect();
            cfg.insert("evictionHard".into(), Value::Object(defaults));
        }
        Some(Value::Object(m)) if merge => {
            for (k, v) in DEFAULT_HARD {
                m.entry(*k).or_insert(Value::String((*v).to_owned()));
            }
        }
        Some(_) => {}
    }
}

/// Where the kubelet's files are read: a directory held open, and how to name it.
struct Root {
    fd: OwnedFd,
    shown: PathBuf,
}

/// What discovery opens the kubelet's root with; a parameter so tests can refuse it as a
/// container without `SYS_PTRACE` is refused.
pub(crate) type OpenDir<'a> = &'a dyn Fn(&Path) -> io::Result<OwnedFd>;

/// Opens a directory (following a magic link such as `/proc/<pid>/root`) for use as a root.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)?
        .into())
}

/// The KubeletConfiguration file at `path` inside `root` ([`beneath::read_in_root`], at most
/// 4 MiB), named `shown` in errors.
pub(crate) fn load_in_root(
    root: &Path,
    path: &Path,
    shown: &Path,
) -> Result<KubeletConfig, ConfigError> {
    let unreadable = |source| ConfigError::Unreadable {
        file: shown.into(),
        source,
    };
    let fd = open_dir(root).map_err(unreadable)?;
    let path = path
        .to_str()
        .ok_or_else(|| unreadable(io::Error::from_raw_os_error(libc::EINVAL)))?;
    let bytes = beneath::read_in_root(fd.as_fd(), path, DEFAULT_MAX_BYTES).map_err(unreadable)?;
    let text = String::from_utf8(bytes).map_err(|e| ConfigError::Invalid {
        file: shown.into(),
        kind: "KubeletConfiguration",
        field: String::new(),
        message: e.to_string(),
        line: None,
    })?;
    KubeletConfig::parse(shown, &text)
}

/// Finds the kubelet in `proc` and builds its configuration.
pub(crate) struct Discover<'a> {
    /// The process table: `/proc` (the host's, with `hostPID`).
    pub(crate) proc: &'a Path,
    /// Where the host's `/` is mounted, for when the kubelet's own root cannot be opened.
    pub(crate) host_root: Option<&'a Path>,
    /// This node's name: of several kubelets, those whose `--hostname-override` names it are
    /// preferred (a test machine may run several nodes' kubelets).
    pub(crate) node_name: Option<&'a str>,
}

impl Discover<'_> {
    pub(crate) fn run(&self) -> Result<Discovered, DiscoverError> {
        self.run_with(&open_dir)
    }

    pub(crate) fn run_with(&self, open: OpenDir<'_>) -> Result<Discovered, DiscoverError> {
        let pid = self.find()?;
        let proc_fd = self.proc_fd()?;
        let cmdline = read_bounded(proc_fd.as_fd(), &format!("{pid}/cmdline"), CMDLINE_MAX)
            .map_err(|source| DiscoverError::Process {
                pid,
                what: "its command line",
                source,
            })?;
        let argv = split_cmdline(&cmdline);
        let args = KubeletArgs::parse(&argv);
        let root = self.root(pid, open)?;
        // Relative paths start at the kubelet's working directory (options.go, `--config`),
        // which needs the same ptrace access as its root; a kubelet under systemd runs in `/`.
        let cwd = fs::read_link(self.proc.join(pid.to_string()).join("cwd"))
            .ok()
            .and_then(|p| p.to_str().map(str::to_owned))
            .unwrap_or_else(|| {
                tracing::debug!(
                    pid,
                    "The kubelet's working directory is unreadable; taking /."
                );
                "/".into()
            });
        let absolute = |p: &str| {
            if p.starts_with('/') {
                p.to_owned()
            } else {
                format!("{}/{p}", cwd.trim_end_matches('/'))
            }
        };
        let mut read = Vec::new();
        let mut cfg = match &args.config {
            Some(c) => {
                let path = absolute(c);
                let mut m = self.read_json(pid, &root, &path)?;
                with_default_eviction(&mut m);
                read.push(path);
                m
            }
            None => {
                let mut m = Map::new();
                m.insert("apiVersion".into(), KUBELET_API_VERSION.into());
                m.insert("kind".into(), "KubeletConfiguration".into());
                m
            }
        };
        if let Some(d) = &args.config_dir {
            let dir = absolute(d);
            let mut files = Vec::new();
            self.dropins(pid, &root, &dir, 0, &mut files)?;
            let mut merged = Value::Object(cfg);
            for f in &files {
                let m = self.read_json(pid, &root, f)?;
                let gvk = (
                    m.get("apiVersion").and_then(Value::as_str),
                    m.get("kind").and_then(Value::as_str),
                );
                if gvk != (Some(KUBELET_API_VERSION), Some("KubeletConfiguration")) {
                    return Err(DiscoverError::File {
                        pid,
                        path: f.clone(),
                        message: format!(
                            "a drop-in must be apiVersion {KUBELET_API_VERSION}, kind KubeletConfiguration (the kubelet refuses it too)"
                        ),
                    });
                }
                merge_patch(&mut merged, &Value::Object(m));
            }
            // A merge patch of objects over an object is an object.
            cfg = match merged {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            read.push(format!("{dir}/ ({} drop-ins)", files.len()));
        }
        args.apply(&mut cfg)
            .map_err(|(flag, value, message)| DiscoverError::Flag {
                pid,
                flag,
                value,
                message,
            })?;
        if args.config.is_none() {
            // Only `loadConfigFile` gives an unset evictionHard the default (server.go,
            // v1.37.2): a kubelet without --config that names none has no hard threshold.
            cfg.entry("evictionHard")
                .or_insert_with(|| Value::Object(Map::new()));
        }
        // mergeDefaultEvictionSettings acts in `loadConfigFile` alone, on the base file (done
        // above), never over drop-ins or flags: what stands now is the kubelet's evictionHard.
        cfg.remove("mergeDefaultEvictionSettings");
        let flags: BTreeSet<String> = args.flags.iter().map(|(f, _)| format!("--{f}")).collect();
        if !flags.is_empty() {
            read.push(format!(
                "flags {}",
                flags.into_iter().collect::<Vec<_>>().join(" ")
            ));
        }
        if read.is_empty() {
            read.push(
                "no --config, --config-dir or flag qoslet reads: the kubelet's defaults".into(),
            );
        }
        let source = format!(
            "kubelet pid {pid}, beneath {}: {}",
            root.shown.display(),
            read.join(", ")
        );
        let text = serde_json::to_string(&Value::Object(cfg)).map_err(|e| DiscoverError::File {
            pid,
            path: "(merged)".into(),
            message: e.to_string(),
        })?;
        let config = KubeletConfig::parse(Path::new(&source), &text)?;
        Ok(Discovered {
            pid,
            config,
            source,
        })
    }

    fn proc_fd(&self) -> Result<OwnedFd, DiscoverError> {
        open_dir(self.proc).map_err(|source| DiscoverError::Proc {
            proc: self.proc.into(),
            source,
        })
    }

    /// The kubelet's pid: the lowest of the processes whose `comm` and argv[0]'s base name
    /// are both `kubelet` (not `kubelet-foo`, not a shell started as `kubelet`); of several,
    /// the lowest of those whose `--hostname-override` is this node's name, if any is.
    fn find(&self) -> Result<u32, DiscoverError> {
        let proc_err = |source| DiscoverError::Proc {
            proc: self.proc.into(),
            source,
        };
        let dir = self.proc_fd()?;
        let mut found = Vec::new();
        for entry in fs::read_dir(self.proc).map_err(proc_err)? {
            let entry = entry.map_err(proc_err)?;
            // Numeric entries only: the processes, nothing named by anything else.
            let Some(pid) = entry
                .file_name()
                .to_str()
                .filter(|n| !n.is_empty() && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // A process that ends meanwhile is simply not the kubelet.
            let Ok(comm) = read_bounded(dir.as_fd(), &format!("{pid}/comm"), COMM_MAX) else {
                continue;
            };
            if comm.strip_suffix(b"\n").unwrap_or(&comm) != b"kubelet" {
                continue;
            }
            let Ok(cmdline) = read_bounded(dir.as_fd(), &format!("{pid}/cmdline"), CMDLINE_MAX)
            else {
                continue;
            };
            let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            if argv0.rsplit(|b| *b == b'/').next() == Some(b"kubelet".as_slice()) {
                let names_node = self.node_name.is_some()
                    && hostname_override(&split_cmdline(&cmdline)).as_deref() == self.node_name;
                found.push((!names_node, pid));
            }
        }
        // This node's kubelets first, then by pid.
        found.sort_unstable();
        let found: Vec<u32> = found.into_iter().map(|(_, pid)| pid).collect();
        match found.as_slice() {
            [] => Err(DiscoverError::NotFound {
                proc: self.proc.into(),
            }),
            [pid] => Ok(*pid),
            [pid, ..] => {
                tracing::warn!(pids = ?found, chosen = pid, "Several kubelet processes; reading the lowest pid's configuration.");
                Ok(*pid)
            }
        }
    }

    /// The kubelet's root, or `--host-root` where the kubelet's cannot be opened for want of
    /// ptrace access.
    fn root(&self, pid: u32, open: OpenDir<'_>) -> Result<Root, DiscoverError> {
        let own = self.proc.join(pid.to_string()).join("root");
        match open(&own) {
            Ok(fd) => Ok(Root { fd, shown: own }),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                let Some(host) = self.host_root else {
                    return Err(DiscoverError::NoRoot {
                        pid,
                        root: own,
                        source: e,
                    });
                };
                tracing::debug!(pid, root = %own.display(), host_root = %host.display(), error = %e, "The kubelet's root is closed to qoslet; reading its files beneath --host-root.");
                let fd = open(host).map_err(|source| DiscoverError::HostRoot {
                    pid,
                    root: host.into(),
                    source,
                })?;
                Ok(Root {
                    fd,
                    shown: host.into(),
                })
            }
            Err(source) => Err(DiscoverError::NoRoot {
                pid,
                root: own,
                source,
            }),
        }
    }

    fn read_json(
        &self,
        pid: u32,
        root: &Root,
        path: &str,
    ) -> Result<Map<String, Value>, DiscoverError> {
        let bytes =
            beneath::read_in_root(root.fd.as_fd(), path, DEFAULT_MAX_BYTES).map_err(|source| {
                DiscoverError::Read {
                    pid,
                    path: path.into(),
                    root: root.shown.clone(),
                    source,
                }
            })?;
        let file_err = |message: String| DiscoverError::File {
            pid,
            path: path.into(),
            message,
        };
        let text = String::from_utf8(bytes).map_err(|e| file_err(e.to_string()))?;
        to_json(&text).map_err(file_err)
    }

    /// The `*.conf` files under `dir`, in the order `filepath.WalkDir` visits them (each
    /// directory's entries sorted by name, subdirectories entered where they sort); other files
    /// are skipped, as the kubelet skips them.
    fn dropins(
        &self,
        pid: u32,
        root: &Root,
        dir: &str,
        depth: usize,
        out: &mut Vec<String>,
    ) -> Result<(), DiscoverError> {
        let read_err = |source| DiscoverError::Read {
            pid,
            path: dir.into(),
            root: root.shown.clone(),
            source,
        };
        if depth > MAX_DEPTH {
            return Err(read_err(io::Error::other(format!(
                "drop-in directories nested deeper than {MAX_DEPTH}"
            ))));
        }
        let fd =
            beneath::open_in_root(root.fd.as_fd(), dir, libc::O_DIRECTORY).map_err(read_err)?;
        let mut entries = Vec::new();
        for entry in nix::dir::Dir::from_fd(fd.try_clone().map_err(read_err)?)
            .map_err(|e| read_err(e.into()))?
            .into_iter()
        {
            let entry = entry.map_err(|e| read_err(e.into()))?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if !beneath::is_plain_component(name) {
                continue;
            }
            let is_dir = match entry.file_type() {
                Some(t) => t == nix::dir::Type::Directory,
                // Some filesystems leave the type out of the listing.
                None => is_directory(fd.as_fd(), name),
            };
            entries.push((name.to_owned(), is_dir));
        }
        // Go's os.ReadDir sorts by name, byte by byte, as String's Ord does.
        entries.sort();
        let dir = dir.trim_end_matches('/');
        for (name, is_dir) in entries {
            let path = format!("{dir}/{name}");
            if is_dir {
                self.dropins(pid, root, &path, depth + 1, out)?;
            } else if Path::new(&name).extension().is_some_and(|e| e == "conf") {
                if out.len() == MAX_DROPINS {
                    return Err(read_err(io::Error::other(format!(
                        "more than {MAX_DROPINS} drop-in files"
                    ))));
                }
                out.push(path);
            } else {
                tracing::debug!(pid, file = %path, "Not a .conf drop-in; skipped, as the kubelet skips it.");
            }
        }
        Ok(())
    }
}

/// The kubelet's `--hostname-override`, the last given, as pflag reads it.
fn hostname_override(argv: &[String]) -> Option<String> {
    let mut found = None;
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        match a.strip_prefix("--") {
            Some("hostname-override" | "hostname_override") => found = it.next().cloned(),
            Some(rest) => {
                if let Some(v) = rest
                    .strip_prefix("hostname-override=")
                    .or_else(|| rest.strip_prefix("hostname_override="))
                {
                    found = Some(v.to_owned());
                }
            }
            None => {}
        }
    }
    found
}

/// Whether `name` in `dir` is a directory itself (not a symlink to one: `WalkDir` does not
/// follow those).
fn is_directory(dir: BorrowedFd<'_>, name: &str) -> bool {
    nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// `path` beneath the directory `dir` (a pid's own file: `<pid>/comm`), at most `max` bytes.
/// Files of /proc report no size, so the read is bounded, not the size checked.
fn read_bounded(dir: BorrowedFd<'_>, path: &str, max: u64) -> io::Result<Vec<u8>> {
    let fd = beneath::openat2(
        dir.as_raw_fd(),
        path,
        libc::O_RDONLY,
        0,
        beneath::RESOLVE_STRICT,
    )?;
    let mut buf = Vec::new();
    fs::File::from(fd).take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    Ok(buf)
}

/// A NUL-separated command line as its arguments; one not valid UTF-8 is read lossily (the
/// flags qoslet reads are ASCII).
fn split_cmdline(raw: &[u8]) -> Vec<String> {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    if raw.is_empty() {
        return Vec::new();
    }
    raw.split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

#[cfg(test)]
mod tests;
