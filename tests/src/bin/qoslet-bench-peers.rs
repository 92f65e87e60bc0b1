//! Peers bench driver: runs inside the 6.12 VM that `cargo xtask bench peers` boots (the whole VM
//! is the node, pure cgroup v2, no swap), never on a host. In each repetition, for each system in
//! turn (qoslet as shipped, qoslet with the kubelet's 10 s housekeeping and no event wake-ups,
//! Debian's earlyoom, oomd and nohang, the kernel alone) it runs the same workloads as pods of
//! the standalone node, and prints one markdown table per scenario on lines starting with
//! `QOSLET-VM-PEERS| `.
//!
//! The pods always run under qoslet's standalone node, so every system sees the same processes
//! in the same cgroups with the same oom_score_adj; for the peers and the kernel qoslet's hard
//! threshold is `0%`, which the kubelet's rules read as no threshold (qoslet then only runs the
//! pods). The bench samples the node itself every few milliseconds: `memory.available` as the
//! kubelet defines it (MemTotal - working set, the working set of the root being MemTotal -
//! MemFree - inactive_file), each pod's `memory.current`, and `/proc/vmstat`'s `oom_kill`.
//!
//! Invoked through a symlink named after a pod role (`guaranteed`, `burstable`, `be-hog`,
//! `bu-hog`) it is that pod's process: the name becomes the process's `comm`, which earlyoom's
//! `--prefer` / `--avoid` match, as an operator's would match their workloads' names.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

const MI: u64 = 1 << 20;
const RUN: &str = "/run/peers";
const CGROUP: &str = "/sys/fs/cgroup";
/// Every system's headroom: qoslet's hard `memory.available` and earlyoom's `-M`.
const THRESHOLD_MIB: u64 = 128;
const SAMPLE: Duration = Duration::from_millis(10);
/// What a run may last after the crossing: the kubelet-like loop needs up to its 10 s interval.
const AFTER_CROSSING: Duration = Duration::from_secs(14);
/// A victim's memory is back when its pod holds less than this share of its peak.
const BACK_FRACTION: f64 = 0.1;
/// A victim's memory starts to come back when its pod holds less than this share of its peak.
const DROP_FRACTION: f64 = 0.95;
const ROLES: &[&str] = &["guaranteed", "burstable", "be-hog", "bu-hog"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum System {
    Qoslet,
    KubeletLike,
    Earlyoom,
    Oomd,
    Nohang,
    Kernel,
}

impl System {
    const ALL: [System; 6] = [
        System::Qoslet,
        System::KubeletLike,
        System::Earlyoom,
        System::Oomd,
        System::Nohang,
        System::Kernel,
    ];
    fn name(self) -> &'static str {
        match self {
            Self::Qoslet => "qoslet (event-driven)",
            Self::KubeletLike => "qoslet, kubelet-like (10 s housekeeping, no events)",
            Self::Earlyoom => "earlyoom",
            Self::Oomd => "oomd",
            Self::Nohang => "nohang",
            Self::Kernel => "kernel alone",
        }
    }
    /// The key of `QOSLET_BENCH_PEERS_SYSTEMS`.
    fn key(self) -> &'static str {
        match self {
            Self::Qoslet => "qoslet",
            Self::KubeletLike => "kubelet",
            Self::Earlyoom => "earlyoom",
            Self::Oomd => "oomd",
            Self::Nohang => "nohang",
            Self::Kernel => "kernel",
        }
    }
    fn evicts(self) -> bool {
        matches!(self, Self::Qoslet | Self::KubeletLike)
    }
}

#[derive(Clone, Copy)]
enum Qos {
    BestEffort,
    /// Request in MiB, no limit.
    Burstable(u64),
}

/// One allocating pod: its share of the fast prefill, then its paced ramp.
struct HogSpec {
    name: &'static str,
    qos: Qos,
    prefill_share: f64,
}

struct Scenario {
    key: &'static str,
    title: &'static str,
    hogs: Vec<HogSpec>,
    /// MiB/s of all hogs together; `None`: as fast as they can.
    rate: Option<f64>,
    churn: bool,
}

fn scenarios() -> Vec<Scenario> {
    let one = || {
        vec![HogSpec {
            name: "be-hog",
            qos: Qos::BestEffort,
            prefill_share: 1.0,
        }]
    };
    vec![
        Scenario {
            key: "fast",
            title: "one BestEffort hog, fastest ramp",
            hogs: one(),
            rate: None,
            churn: false,
        },
        Scenario {
            key: "100",
            title: "one BestEffort hog at 100 MiB/s",
            hogs: one(),
            rate: Some(100.0),
            churn: false,
        },
        Scenario {
            key: "20",
            title: "one BestEffort hog at 20 MiB/s",
            hogs: one(),
            rate: Some(20.0),
            churn: false,
        },
        Scenario {
            key: "four",
            title: "four hogs (two BestEffort, two Burstable over a 32 MiB request), 40 MiB/s together",
            // Usage minus request decides the kubelet's order: bu-a (60 % of the prefill - 32
            // MiB) first, then be-a (18 %); an operator's earlyoom prefers BestEffort instead, and
            // the kernel weighs oom_score_adj (1000 for BestEffort) against size.
            hogs: vec![
                HogSpec {
                    name: "bu-a",
                    qos: Qos::Burstable(32),
                    prefill_share: 0.60,
                },
                HogSpec {
                    name: "be-a",
                    qos: Qos::BestEffort,
                    prefill_share: 0.18,
                },
                HogSpec {
                    name: "be-b",
                    qos: Qos::BestEffort,
                    prefill_share: 0.12,
                },
                HogSpec {
                    name: "bu-b",
                    qos: Qos::Burstable(32),
                    prefill_share: 0.10,
                },
            ],
            rate: Some(40.0),
            churn: false,
        },
        Scenario {
            key: "churn",
            title: "page-cache churn (a BestEffort pod writes, then reads, once a quarter more than the free memory)",
            hogs: Vec::new(),
            rate: None,
            churn: true,
        },
    ]
}

fn main() {
    let argv0 = std::env::args().next().unwrap_or_default();
    let role = Path::new(&argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if ROLES.contains(&role.as_str()) {
        pod_process(&args);
        return;
    }
    if std::env::var_os("QOSLET_VM").is_none() {
        eprintln!(
            "qoslet-bench-peers runs inside the VM only (it kills processes and fills the machine's memory): use `cargo xtask bench peers`"
        );
        std::process::exit(2);
    }
    let conf = fs::read_to_string("/peers.conf").unwrap_or_default();
    let value = |key: &str| {
        conf.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
            .map(str::to_owned)
    };
    let reps: usize = value("repetitions")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let only: Vec<String> = value("scenarios")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let systems: Vec<System> = match value("systems") {
        Some(v) => System::ALL
            .into_iter()
            .filter(|s| v.split(',').any(|k| k.trim() == s.key()))
            .collect(),
        None => System::ALL.to_vec(),
    };
    if let Err(e) = bench(reps, &only, &systems) {
        println!("QOSLET-VM-PEERS-ERROR {e:#}");
        std::process::exit(1);
    }
}

/// A pod's process. `static MIB`: allocate and hold. `ramp GOFILE`: wait for the go file
/// (`prefill_mib cap_mib rate`, rate 0 for as fast as it can), allocate the prefill at once, then
/// the rest at the rate, and hold.
fn pod_process(args: &[String]) {
    let (prefill, cap, rate) = match args.first().map(String::as_str) {
        Some("static") => {
            let mib = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
            (mib, mib, 0.0)
        }
        Some("ramp") => {
            let go = PathBuf::from(args.get(1).cloned().unwrap_or_default());
            let text = loop {
                if let Ok(t) = fs::read_to_string(&go)
                    && t.ends_with('\n')
                {
                    break t;
                }
                thread::sleep(Duration::from_millis(2));
            };
            let v: Vec<f64> = text
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v[0] as usize, v[1] as usize, v[2])
        }
        _ => return,
    };
    let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(cap);
    for _ in 0..prefill.min(cap) {
        blocks.push(vec![0x5a; MI as usize]);
    }
    let start = Instant::now();
    for i in 0..cap.saturating_sub(prefill) {
        if rate > 0.0
            && let Some(wait) =
                Duration::from_secs_f64(i as f64 / rate).checked_sub(start.elapsed())
        {
            thread::sleep(wait);
        }
        blocks.push(vec![0x5a; MI as usize]);
    }
    std::hint::black_box(&blocks);
    loop {
        thread::sleep(Duration::from_secs(60));
    }
}

/// One pod of a run.
#[derive(Clone)]
struct Pod {
    name: String,
    role: &'static str,
    uid: String,
    qos: &'static str,
    request_mib: u64,
    protected: bool,
    cgroup: Option<PathBuf>,
}

/// One sample of the node and the pods.
struct Sample {
    at: Instant,
    /// memory.available as the kubelet computes it.
    available: i64,
    /// MemAvailable of /proc/meminfo, earlyoom's signal.
    mem_available: i64,
    /// oomd's signal as a headroom: its pod tier limit plus the threshold, less the pod tier's
    /// anonymous memory (below the threshold exactly when the tier is over the limit).
    oomd_headroom: i64,
    /// Per pod: memory.current, or None once its cgroup is empty or gone.
    pods: Vec<Option<i64>>,
    oom_kills: u64,
}

impl Sample {
    /// The signal `system` compares with the threshold: MemAvailable for earlyoom and nohang,
    /// which read it, the pod tier's anonymous memory against its limit for oomd, the kubelet's
    /// memory.available for the others (the kernel has no threshold: the node's).
    fn signal(&self, system: System) -> i64 {
        match system {
            System::Earlyoom | System::Nohang => self.mem_available,
            System::Oomd => self.oomd_headroom,
            _ => self.available,
        }
    }
}

#[derive(Default, Clone)]
struct Outcome {
    oom_kills: u64,
    /// /proc/vmstat's oom_kill over the run.
    vmstat_oom_kills: u64,
    /// A protected pod killed, or a victim killed while another live pod ranked before it.
    wrong: bool,
    /// Pods killed where none should be (page-cache churn).
    false_kills: u64,
    /// Crossing -> the first victim's memory back.
    back: Option<Duration>,
    /// Crossing -> the first victim's memory starting to come back (the kill took effect): the
    /// part of `back` before the release.
    drop: Option<Duration>,
    /// MiB/s of the hogs together over the last second before the crossing.
    ramp: Option<f64>,
    protected_alive: bool,
    victims: Vec<String>,
    /// Each pod's largest memory.current in MiB, for reading a run's log.
    peaks: Vec<(String, i64)>,
    /// MemAvailable when the hogs were released.
    start_available_mib: i64,
    crossed: bool,
    setup: Duration,
    observed: Duration,
    teardown: Duration,
}

fn bench(reps: usize, only: &[String], systems: &[System]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    // The driver is the harness: never the kernel's victim.
    fs::write("/proc/self/oom_score_adj", "-1000")?;
    fs::create_dir_all(format!("{RUN}/bin"))?;
    fs::create_dir_all(format!("{RUN}/pods"))?;
    fs::create_dir_all(format!("{RUN}/go"))?;
    let exe = std::env::current_exe()?;
    for role in ROLES {
        let link = Path::new(RUN).join("bin").join(role);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&exe, &link)?;
    }
    let scenarios: Vec<Scenario> = scenarios()
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.key))
        .collect();
    let mem_total = meminfo("MemTotal").context("MemTotal")?;
    // What the machine has free before any node runs: every run starts within reach of it.
    let idle_available = meminfo("MemAvailable").context("MemAvailable")?;
    println!(
        "QOSLET-VM-PEERS-START memtotal_mib={} repetitions={reps} scenarios={} systems={}",
        mem_total / MI as i64,
        scenarios
            .iter()
            .map(|s| s.key)
            .collect::<Vec<_>>()
            .join(","),
        systems
            .iter()
            .map(|s| s.key())
            .collect::<Vec<_>>()
            .join(",")
    );
    let started = Instant::now();
    let mut results: BTreeMap<(usize, usize), Vec<Outcome>> = BTreeMap::new();
    let mut failed: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    // qoslet's decide stage of each eviction, ms, by system.
    let mut decides: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let mut run_no = 0;
    // Each repetition runs every system in turn, so a change in the host's load (and with it
    // TCG's speed) over the bench falls on every system alike.
    for rep in 0..reps {
        for (si, system) in systems.iter().enumerate() {
            let mut node = Node::start(*system)?;
            for (ci, sc) in scenarios.iter().enumerate() {
                run_no += 1;
                let o = match run_once(&mut node, sc, run_no, idle_available) {
                    Ok(o) => o,
                    Err(e) => {
                        // Counted in the table; the pods it left go with their manifests.
                        println!(
                            "QOSLET-VM-PEERS-RUN-FAILED system={system:?} scenario={} rep={rep} error={e:#} meminfo_mib={:?}",
                            sc.key,
                            [
                                "MemAvailable",
                                "MemFree",
                                "Cached",
                                "Shmem",
                                "Dirty",
                                "Slab"
                            ]
                            .map(|k| (k, meminfo(k).unwrap_or(0) / MI as i64))
                        );
                        for entry in fs::read_dir(format!("{RUN}/pods"))?.flatten() {
                            let name = entry.file_name().to_string_lossy().into_owned();
                            if !name.starts_with("guaranteed") && !name.starts_with("burstable-") {
                                let _ = fs::remove_file(entry.path());
                            }
                        }
                        thread::sleep(Duration::from_secs(2));
                        failed.entry((ci, si)).and_modify(|n| *n += 1).or_insert(1);
                        continue;
                    }
                };
                println!(
                    "QOSLET-VM-PEERS-RUN system={:?} scenario={} rep={rep} crossed={} oom_kills={} vmstat_oom_kills={} victims={:?} wrong={} false_kills={} back_ms={} drop_ms={} ramp_mib_s={} protected_alive={} setup_s={:.1} observed_s={:.1} teardown_s={:.1} start_available_mib={} peaks_mib={:?} t={:.0}s",
                    system,
                    sc.key,
                    o.crossed,
                    o.oom_kills,
                    o.vmstat_oom_kills,
                    o.victims,
                    o.wrong,
                    o.false_kills,
                    o.back
                        .map_or("-".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3)),
                    o.drop
                        .map_or("-".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3)),
                    o.ramp.map_or("-".into(), |r| format!("{r:.0}")),
                    o.protected_alive,
                    o.setup.as_secs_f64(),
                    o.observed.as_secs_f64(),
                    o.teardown.as_secs_f64(),
                    o.start_available_mib,
                    o.peaks,
                    started.elapsed().as_secs_f64()
                );
                results.entry((ci, si)).or_default().push(o);
            }
            decides.entry(si).or_default().extend(node.stop());
        }
    }
    let report = render(
        &scenarios,
        systems,
        &results,
        &failed,
        reps,
        mem_total,
        started.elapsed(),
    ) + &decide_lines(systems, &decides);
    for line in report.lines() {
        println!("QOSLET-VM-PEERS| {line}");
    }
    println!("QOSLET-VM-PEERS-DONE");
    Ok(())
}

/// qoslet's standalone node (and the peer beside it) for one system.
struct Node {
    system: System,
    qoslet: Child,
    /// earlyoom, oomd or nohang.
    peer: Option<Child>,
    /// oomd's pod tier limit of the current run, bytes of anonymous memory.
    oomd_limit: Option<i64>,
    /// The Guaranteed pod and the Burstable pod under its request.
    protected: Vec<Pod>,
}

impl Node {
    fn start(system: System) -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!("{RUN}/{system:?}"));
        fs::create_dir_all(&dir)?;
        let threshold = if system.evicts() {
            format!("{THRESHOLD_MIB}Mi")
        } else {
            // The kubelet's rules: a 0% threshold is no threshold.
            "\"0%\"".to_owned()
        };
        fs::write(
            dir.join("kubelet.yaml"),
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\nevictionHard: {{memory.available: {threshold}}}\nevictionPressureTransitionPeriod: 1s\nenforceNodeAllocatable: []\n"
            ),
        )?;
        let (housekeeping, wakeups) = match system {
            System::KubeletLike => ("10s", "housekeeping"),
            _ => ("1s", "events"),
        };
        fs::write(
            dir.join("qoslet.yaml"),
            format!(
                "apiVersion: qoslet.dev/v1alpha1\nkind: QosletConfiguration\nstateDir: {}\nhousekeepingInterval: {housekeeping}\nevictionWakeups: {wakeups}\n",
                dir.join("state").display()
            ),
        )?;
        let log = fs::File::create(dir.join("qoslet.log"))?;
        let qoslet = Command::new("/bin/qoslet")
            .args(["run", "--kubelet-config"])
            .arg(dir.join("kubelet.yaml"))
            .arg("--config")
            .arg(dir.join("qoslet.yaml"))
            .args(["--standalone", &format!("{RUN}/pods")])
            .args(["--log-dir", &format!("{RUN}/logs")])
            .args(["--shutdown-grace-seconds", "2"])
            .env("RUST_LOG", "info")
            // Plain log lines: the driver reads its eviction lines back.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let t = Instant::now();
        while !Path::new(CGROUP).join("kubepods").is_dir() {
            if t.elapsed() > Duration::from_secs(120) {
                anyhow::bail!(
                    "qoslet made no kubepods cgroup in 120 s (log: {})",
                    tail(&dir.join("qoslet.log"))
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
        println!(
            "QOSLET-VM-PEERS-NODE system={system:?} qoslet_ready_s={:.1}",
            t.elapsed().as_secs_f64()
        );
        let peer = if system == System::Earlyoom {
            let log = fs::File::create(dir.join("earlyoom.log"))?;
            // Debian's earlyoom with the same headroom as qoslet's hard threshold (SIGTERM below
            // it, SIGKILL below half of it, its defaults), the operator's protection of the
            // Guaranteed pod (and of the node agent), and BestEffort preferred; -p as its
            // systemd unit runs it (niceness -20, oom_score_adj -100).
            Some(
                Command::new("/usr/bin/earlyoom")
                    .args(["-M", &(THRESHOLD_MIB * 1024).to_string()])
                    .args(["-r", "0", "-p"])
                    .args(["--avoid", "^(guaranteed|qoslet)$"])
                    .args(["--prefer", "^be-hog$"])
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()?,
            )
        } else if system == System::Nohang {
            Some(start_nohang(&dir)?)
        } else {
            // oomd starts before each run, with that run's pod tier limit (see `restart_oomd`).
            None
        };
        Ok(Self {
            system,
            qoslet,
            peer,
            oomd_limit: None,
            protected: Vec::new(),
        })
    }

    /// oomd anew for a run: its config's pod tier limit is the tier's anonymous memory at which
    /// the node's memory.available reaches the headroom, from the node as it is now (the
    /// protected pods running, caches dropped). A fresh oomd per run also keeps its 15 s pause
    /// after a kill (`post_action_delay`, left at its default) from reaching into the next run,
    /// which on a real node would be another incident.
    fn restart_oomd(&mut self) -> anyhow::Result<()> {
        self.stop_peer();
        let dir = PathBuf::from(format!("{RUN}/{:?}", self.system));
        let anon = pod_tier_anon().unwrap_or(0);
        let available = available().unwrap_or(0);
        let limit_mib = (anon + available - (THRESHOLD_MIB * MI) as i64) / MI as i64;
        self.oomd_limit = Some(limit_mib * MI as i64);
        let template = fs::read_to_string("/etc/oomd/oomd.json.in")?;
        let conf = dir.join("oomd.json");
        fs::write(
            &conf,
            template.replace("@POD_TIER_ANON_LIMIT@", &format!("{limit_mib}M")),
        )?;
        let path = dir.join("oomd.log");
        let from = fs::metadata(&path).map_or(0, |m| m.len()) as usize;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        // Debian's unit: `oomd --interval 1 --config /etc/oomd/oomd.json` (its /etc/default/oomd
        // without --cgroup-fs, which is for a hybrid hierarchy).
        let child = Command::new("/usr/bin/oomd")
            .args(["--interval", "1", "--config"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.peer = Some(child);
        let t = Instant::now();
        loop {
            let text = fs::read_to_string(&path).unwrap_or_default();
            if text.get(from..).is_some_and(|t| t.contains("Running oomd")) {
                break;
            }
            if t.elapsed() > Duration::from_secs(60) {
                anyhow::bail!("oomd not running after 60 s (log: {})", tail(&path));
            }
            thread::sleep(Duration::from_millis(20));
        }
        println!(
            "QOSLET-VM-PEERS-OOMD ready_s={:.2} pod_tier_anon_limit_mib={limit_mib} anon_mib={} available_mib={}",
            t.elapsed().as_secs_f64(),
            anon / MI as i64,
            available / MI as i64
        );
        Ok(())
    }

    fn stop_peer(&mut self) {
        if let Some(mut e) = self.peer.take() {
            let _ = e.kill();
            let _ = e.wait();
        }
    }

    /// Starts the protected pods, or those of them that are gone, and waits for their memory.
    fn ensure_protected(&mut self, n: usize) -> anyhow::Result<()> {
        let specs = [
            ("guaranteed", "guaranteed", 160),
            ("burstable", "burstable", 96),
        ];
        for (k, (role, qos, mib)) in specs.into_iter().enumerate() {
            let alive = self
                .protected
                .get(k)
                .and_then(|p| p.cgroup.as_ref())
                .is_some_and(|c| populated(c));
            if alive {
                continue;
            }
            if let Some(old) = self.protected.get(k) {
                let _ = fs::remove_file(format!("{RUN}/pods/{}.yaml", old.name));
            }
            let mut pod = Pod {
                name: format!("{role}-{n}"),
                role,
                uid: uid(n, k),
                qos,
                request_mib: 256,
                protected: true,
                cgroup: None,
            };
            pod.cgroup = Some(pod_cgroup(&pod));
            let cmd = vec![
                format!("{RUN}/bin/{role}"),
                "static".into(),
                mib.to_string(),
            ];
            fs::write(
                format!("{RUN}/pods/{}.yaml", pod.name),
                manifest(&pod, &cmd),
            )?;
            if k < self.protected.len() {
                self.protected[k] = pod;
            } else {
                self.protected.push(pod);
            }
        }
        let t = Instant::now();
        while !self.protected.iter().zip([150, 90]).all(|(p, mib)| {
            let cg = p.cgroup.as_ref().expect("set");
            populated(cg) && current(cg).unwrap_or(0) >= mib * MI as i64
        }) {
            if t.elapsed() > Duration::from_secs(60) {
                anyhow::bail!("the protected pods are not running after 60 s");
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops the node; returns qoslet's decide stage of each eviction, ms.
    fn stop(mut self) -> Vec<f64> {
        let mut decides = Vec::new();
        // qoslet's own account of its decisions (wake-up seen -> first signal), for the report.
        if self.system.evicts()
            && let Ok(out) = Command::new("wget")
                .args(["-qO-", "http://127.0.0.1:9479/metrics"])
                .output()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            let get = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            };
            if let (Some(sum), Some(count)) = (
                get("qoslet_eviction_decision_latency_seconds_sum"),
                get("qoslet_eviction_decision_latency_seconds_count"),
            ) && count > 0.0
            {
                // Its parts: wake-up seen -> pass, -> action, -> first signal.
                let stages: Vec<String> = ["wake", "decide", "kill"]
                    .iter()
                    .map(|s| {
                        let series = |part: &str| {
                            get(&format!(
                                "qoslet_eviction_stage_latency_seconds_{part}{{stage=\"{s}\"}}"
                            ))
                        };
                        match (series("sum"), series("count")) {
                            (Some(sum), Some(n)) if n > 0.0 => {
                                format!("{s}_mean_ms={:.1}", sum / n * 1e3)
                            }
                            _ => format!("{s}_mean_ms=-"),
                        }
                    })
                    .collect();
                println!(
                    "QOSLET-VM-PEERS-DECISION system={:?} decisions={count} mean_ms={:.1} {}",
                    self.system,
                    sum / count * 1e3,
                    stages.join(" ")
                );
            }
            // After the first signal: until the victim's processes are gone and its memory is
            // back, as the manager saw it (its "Released." log lines).
            let log = fs::read_to_string(format!("{RUN}/{:?}/qoslet.log", self.system))
                .unwrap_or_default();
            let released: Vec<String> = log
                .lines()
                .filter(|l| l.contains("Released."))
                .filter_map(|l| {
                    let v = l.split("release_ms=").nth(1)?.split_whitespace().next()?;
                    v.parse::<f64>().ok().map(|ms| format!("{ms:.0}"))
                })
                .collect();
            println!(
                "QOSLET-VM-PEERS-RELEASE system={:?} first_signal_to_released_ms=[{}]",
                self.system,
                released.join(",")
            );
            // Each one whole: the part of it until the action returned (`acted_ms`) and the
            // release waits' polls.
            for l in log.lines().filter(|l| l.contains("Released.")) {
                println!("QOSLET-VM-PEERS-RELEASED system={:?} {l}", self.system);
            }
            for l in log.lines().filter(|l| l.contains("Evicting to relieve")) {
                println!("QOSLET-VM-PEERS-EVICTING system={:?} {l}", self.system);
            }
            // Each eviction's decide stage (pass started -> action called), from its
            // "Evicted." line: the metric's buckets are too coarse for a p99 of a few.
            decides = log
                .lines()
                .filter(|l| l.contains("Evicted."))
                .filter_map(|l| {
                    l.split("decide_ms=")
                        .nth(1)?
                        .split_whitespace()
                        .next()?
                        .parse::<f64>()
                        .ok()
                })
                .collect();
            println!(
                "QOSLET-VM-PEERS-DECIDE system={:?} decide_ms={:?}",
                self.system, decides
            );
        }
        self.stop_peer();
        // What the peer did, from its own log: its choices and kills.
        let (file, marks): (&str, &[&str]) = match self.system {
            System::Oomd => (
                "oomd.log",
                &["Picked", "Killed", "10s pressure", "hit threshold"],
            ),
            System::Nohang => (
                "nohang.log",
                &["Victim", "Sending", "Implement", "signal", "ERROR"],
            ),
            System::Earlyoom => ("earlyoom.log", &["sending", "killed", "escalating"]),
            _ => ("", &[]),
        };
        if !file.is_empty() {
            let text =
                fs::read_to_string(format!("{RUN}/{:?}/{file}", self.system)).unwrap_or_default();
            for l in text
                .lines()
                .filter(|l| marks.iter().any(|m| l.contains(m)))
                .take(40)
            {
                println!(
                    "QOSLET-VM-PEERS-PEERLOG system={:?} {}",
                    self.system,
                    l.trim()
                );
            }
        }
        // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
        unsafe { libc::kill(self.qoslet.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        let mut exited = false;
        while t.elapsed() < Duration::from_secs(30) {
            if self.qoslet.try_wait().ok().flatten().is_some() {
                exited = true;
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        if !exited {
            println!("QOSLET-VM-PEERS-WARN qoslet did not stop within 30 s of SIGTERM; killed");
            let _ = self.qoslet.kill();
            let _ = self.qoslet.wait();
        }
        // Every system starts from an empty node: processes qoslet left in the pods' cgroups
        // (the bench's own pods) are named, then killed.
        let kubepods = Path::new(CGROUP).join("kubepods");
        if populated(&kubepods) {
            let left = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "for f in $(find {} -name cgroup.procs); do for p in $(cat $f); do echo \"$(dirname $f | sed s,{CGROUP}/,,) $(cat /proc/$p/comm)\"; done; done",
                    kubepods.display()
                ))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).replace('\n', "; "))
                .unwrap_or_default();
            println!(
                "QOSLET-VM-PEERS-WARN system={:?} left processes after it stopped: {left}",
                self.system
            );
            let _ = fs::write(kubepods.join("cgroup.kill"), "1");
            let t = Instant::now();
            while populated(&kubepods) && t.elapsed() < Duration::from_secs(10) {
                thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = fs::remove_dir_all(format!("{RUN}/pods"));
        let _ = fs::create_dir_all(format!("{RUN}/pods"));
        decides
    }
}

/// Debian's nohang with the bench's config (`xtask/src/vm/nohang.conf`), as its unit runs it
/// (`nohang --monitor --config /etc/nohang/nohang.conf`), its interpreter isolated (`-I`) as
/// when xtask listed the modules it packed; waits for its "Monitoring has started!" (the
/// interpreter compiles the stdlib and the 4,000-line script first, under TCG).
fn start_nohang(dir: &Path) -> anyhow::Result<Child> {
    let path = dir.join("nohang.log");
    let log = fs::File::create(&path)?;
    let child = Command::new("/usr/bin/python3")
        .args([
            "-I",
            "/usr/sbin/nohang",
            "--monitor",
            "--config",
            "/etc/nohang/nohang.conf",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let t = Instant::now();
    while !fs::read_to_string(&path).is_ok_and(|t| t.contains("Monitoring has started")) {
        if t.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("nohang not monitoring after 120 s (log: {})", tail(&path));
        }
        thread::sleep(Duration::from_millis(50));
    }
    println!(
        "QOSLET-VM-PEERS-NOHANG ready_s={:.2}",
        t.elapsed().as_secs_f64()
    );
    Ok(child)
}

fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" / ")
}

fn uid(n: usize, i: usize) -> String {
    format!("00000000-0000-4000-8000-{n:06x}{i:06x}")
}

fn manifest(pod: &Pod, command: &[String]) -> String {
    let cmd = command
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let resources = match pod.qos {
        "guaranteed" => format!(
            "{{requests: {{cpu: 100m, memory: {m}Mi}}, limits: {{cpu: 100m, memory: {m}Mi}}}}",
            m = pod.request_mib
        ),
        "burstable" => format!("{{requests: {{memory: {}Mi}}}}", pod.request_mib),
        _ => "{}".to_owned(),
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {}, namespace: bench, uid: {}}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    command: [{cmd}]\n    resources: {resources}\n",
        pod.name, pod.uid
    )
}

fn pod_cgroup(pod: &Pod) -> PathBuf {
    let tier = match pod.qos {
        "guaranteed" => "",
        "burstable" => "burstable/",
        _ => "besteffort/",
    };
    PathBuf::from(format!("{CGROUP}/kubepods/{tier}pod{}", pod.uid))
}

fn run_once(
    node: &mut Node,
    sc: &Scenario,
    n: usize,
    idle_available: i64,
) -> anyhow::Result<Outcome> {
    let _ = fs::remove_file(format!("{RUN}/churn-done"));
    let bin = |role: &str| format!("{RUN}/bin/{role}");
    // The protected pods run through all of a system's runs; one killed comes back under a
    // new name before the next run.
    node.ensure_protected(n)?;
    // Start alike: the protected pods' 256 MiB (and a little) below the idle machine, caches
    // dropped; a run that cannot get there says so in its line.
    let want = idle_available - ((256 + 96) * MI) as i64;
    let t = Instant::now();
    while meminfo("MemAvailable").unwrap_or(0) < want && t.elapsed() < Duration::from_secs(20) {
        let _ = Command::new("sync").status();
        let _ = fs::write("/proc/sys/vm/drop_caches", "3");
        thread::sleep(Duration::from_millis(200));
    }
    if node.system == System::Oomd {
        node.restart_oomd()?;
    }
    let start_available = meminfo("MemAvailable").unwrap_or(0);
    let mut pods: Vec<Pod> = node.protected.clone();
    let mut commands: Vec<Vec<String>> = vec![Vec::new(); pods.len()];
    for (i, h) in sc.hogs.iter().enumerate() {
        let (qos, request_mib, role) = match h.qos {
            Qos::BestEffort => ("besteffort", 0, "be-hog"),
            Qos::Burstable(r) => ("burstable", r, "bu-hog"),
        };
        let name = format!("{}-{n}", h.name);
        commands.push(vec![bin(role), "ramp".into(), format!("{RUN}/go/{name}")]);
        pods.push(Pod {
            name,
            role,
            uid: uid(n, 2 + i),
            qos,
            request_mib,
            protected: false,
            cgroup: None,
        });
    }
    if sc.churn {
        // Written once, then read once: a quarter more than the free memory, through the page cache of
        // the emulated NVMe disk (a null device: writes vanish, reads are zeros).
        let mib = meminfo("MemFree").unwrap_or(0) / MI as i64 * 5 / 4;
        commands.push(vec![
            "/bin/sh".into(),
            "-c".into(),
            format!(
                "dd if=/dev/zero of=/dev/nvme0n1 bs=1M count={mib} 2>/dev/null; dd if=/dev/nvme0n1 of=/dev/null bs=1M count={mib} 2>/dev/null; touch {RUN}/churn-done; exec sleep 100000"
            ),
        ]);
        pods.push(Pod {
            name: format!("churn-{n}"),
            role: "churn",
            uid: uid(n, 9),
            qos: "besteffort",
            request_mib: 0,
            protected: false,
            cgroup: None,
        });
    }
    for (pod, cmd) in pods.iter_mut().zip(&commands).filter(|(p, _)| !p.protected) {
        fs::write(format!("{RUN}/pods/{}.yaml", pod.name), manifest(pod, cmd))?;
        pod.cgroup = Some(pod_cgroup(pod));
    }
    // Wait for every pod's process.
    let t = Instant::now();
    loop {
        let ready = pods
            .iter()
            .all(|p| populated(p.cgroup.as_ref().expect("set")));
        if ready {
            break;
        }
        if t.elapsed() > Duration::from_secs(60) {
            anyhow::bail!(
                "pods not running after 60 s (qoslet log: {})",
                tail(&PathBuf::from(format!(
                    "{RUN}/{:?}/qoslet.log",
                    node.system
                )))
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(100));
    let oom_before = vmstat_oom_kills();
    // The prefill brings the node to a few seconds of ramp before the threshold, on the lower
    // of the two signals (MemAvailable is the lower), so every system sees the paced ramp.
    let available0 = available()
        .unwrap_or(0)
        .min(meminfo("MemAvailable").unwrap_or(0));
    let room = (available0 - (THRESHOLD_MIB * MI) as i64).max(0) as f64 / MI as f64;
    let (prefill_total, cap_extra) = match sc.rate {
        None => (0.0, 4096.0),
        Some(r) => ((room - r * 3.0).max(0.0), r * 60.0),
    };
    let per_hog_rate = sc.rate.map(|r| r / sc.hogs.len().max(1) as f64);
    let go_at = Instant::now();
    for (h, pod) in sc.hogs.iter().zip(pods.iter().skip(2)) {
        let prefill = (prefill_total * h.prefill_share) as u64;
        let cap = prefill + (cap_extra / sc.hogs.len() as f64) as u64;
        fs::write(
            format!("{RUN}/go/{}", pod.name),
            format!("{prefill} {cap} {}\n", per_hog_rate.unwrap_or(0.0)),
        )?;
    }
    let setup = t.elapsed();
    // The kernel's ring buffer from here on holds this run's OOM reports only.
    let _ = Command::new("dmesg")
        .arg("-c")
        .stdout(Stdio::null())
        .status();
    let samples = observe(&pods, sc, node.system, node.oomd_limit, go_at);
    let mut outcome = judge(&pods, sc, node.system, &samples, oom_before);
    // The kernel's kills: one per process its reports name ("Killed process PID"); vmstat's
    // oom_kill counts a memory.oom.group kill's victim twice.
    outcome.vmstat_oom_kills = outcome.oom_kills;
    outcome.oom_kills = 0;
    if let Ok(out) = Command::new("dmesg").output() {
        let text = String::from_utf8_lossy(&out.stdout);
        let mut pids: Vec<&str> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.split("Killed process ").nth(1) {
                println!("QOSLET-VM-PEERS-OOM {}", line.trim());
                let pid = rest.split_whitespace().next().unwrap_or_default();
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
        outcome.oom_kills = pids.len() as u64;
    }
    outcome.observed = go_at.elapsed();
    // Tear down: the pods go with their manifests; caches go so the next run starts alike.
    for pod in pods.iter().filter(|p| !p.protected) {
        let _ = fs::remove_file(format!("{RUN}/pods/{}.yaml", pod.name));
        let _ = fs::remove_file(format!("{RUN}/go/{}", pod.name));
    }
    let t = Instant::now();
    while pods
        .iter()
        .filter(|p| !p.protected)
        .any(|p| p.cgroup.as_ref().is_some_and(|c| populated(c)))
    {
        if t.elapsed() > Duration::from_secs(60) {
            anyhow::bail!("pods still there 60 s after their manifests were removed");
        }
        thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("sync").status();
    let _ = fs::write("/proc/sys/vm/drop_caches", "3");
    thread::sleep(Duration::from_millis(200));
    outcome.setup = setup;
    outcome.start_available_mib = start_available / MI as i64;
    outcome.teardown = t.elapsed();
    Ok(outcome)
}

fn observe(
    pods: &[Pod],
    sc: &Scenario,
    system: System,
    oomd_limit: Option<i64>,
    go_at: Instant,
) -> Vec<Sample> {
    let mut samples: Vec<Sample> = Vec::with_capacity(8192);
    let mut crossing: Option<Instant> = None;
    let mut settled: Option<Instant> = None;
    let limit = if sc.churn {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(90)
    };
    loop {
        let now = Instant::now();
        let s = Sample {
            at: now,
            available: available().unwrap_or(i64::MAX),
            mem_available: meminfo("MemAvailable").unwrap_or(i64::MAX),
            oomd_headroom: oomd_limit.map_or(i64::MAX, |l| {
                l + (THRESHOLD_MIB * MI) as i64 - pod_tier_anon().unwrap_or(0)
            }),
            pods: pods
                .iter()
                .map(|p| {
                    let cg = p.cgroup.as_ref().expect("set");
                    populated(cg).then(|| current(cg).unwrap_or(0))
                })
                .collect(),
            oom_kills: vmstat_oom_kills(),
        };
        let below = s.signal(system) < (THRESHOLD_MIB * MI) as i64;
        if crossing.is_none() && below {
            crossing = Some(now);
        }
        let killed = pods.iter().enumerate().any(|(i, _)| {
            s.pods[i].is_none() && samples.iter().any(|x: &Sample| x.pods[i].is_some())
        });
        samples.push(s);
        if sc.churn {
            if Path::new(&format!("{RUN}/churn-done")).exists() {
                break;
            }
        } else {
            // Done a little after a kill once the node is back above the threshold, or when the
            // window after the crossing is over.
            if killed && !below && settled.is_none() {
                settled = Some(now);
            }
            if settled.is_some_and(|t| now - t > Duration::from_millis(500))
                || crossing.is_some_and(|c| now - c > AFTER_CROSSING)
            {
                break;
            }
        }
        if now - go_at > limit {
            break;
        }
        thread::sleep(SAMPLE);
    }
    samples
}

/// The kubelet's memory ranking key of a pod at a sample: pods above their request first, then
/// (equal priorities here) the largest usage above the request.
fn rank_key(pod: &Pod, usage: i64) -> (bool, i64) {
    let over = usage - (pod.request_mib * MI) as i64;
    (over > 0, over)
}

fn judge(
    pods: &[Pod],
    sc: &Scenario,
    system: System,
    samples: &[Sample],
    oom_before: u64,
) -> Outcome {
    let mut o = Outcome {
        oom_kills: samples
            .last()
            .map_or(0, |s| s.oom_kills.saturating_sub(oom_before)),
        protected_alive: true,
        ..Default::default()
    };
    let threshold = (THRESHOLD_MIB * MI) as i64;
    let crossing = samples.iter().position(|s| s.signal(system) < threshold);
    o.crossed = crossing.is_some();
    o.peaks = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let peak = samples.iter().filter_map(|s| s.pods[i]).max().unwrap_or(0);
            (p.role.to_owned() + ":" + &p.name, peak / MI as i64)
        })
        .collect();
    let hog_idx: Vec<usize> = pods
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.protected && p.role != "churn")
        .map(|(i, _)| i)
        .collect();
    if let Some(c) = crossing {
        let t = samples[c].at;
        let earlier = samples
            .iter()
            .position(|s| t.duration_since(s.at) <= Duration::from_secs(1))
            .unwrap_or(c);
        let sum = |s: &Sample| -> i64 { hog_idx.iter().filter_map(|&i| s.pods[i]).sum() };
        let dt = samples[c]
            .at
            .duration_since(samples[earlier].at)
            .as_secs_f64();
        if dt > 0.05 && !hog_idx.is_empty() {
            o.ramp = Some((sum(&samples[c]) - sum(&samples[earlier])) as f64 / MI as f64 / dt);
        }
    }
    // A victim: a pod whose cgroup emptied (or went) during the run. Its memory is back at the
    // first sample after its peak where it holds under a tenth of that peak, or nothing.
    // (sample index of back, of the drop, pod index)
    let mut firsts: Vec<(usize, usize, usize)> = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let seen = samples.iter().any(|s| s.pods[i].is_some());
        let gone = samples.last().is_some_and(|s| s.pods[i].is_none());
        if !(seen && gone) {
            continue;
        }
        let Some((peak_k, peak)) = samples
            .iter()
            .enumerate()
            .filter_map(|(k, s)| s.pods[i].map(|m| (k, m)))
            .max_by_key(|&(_, m)| m)
        else {
            continue;
        };
        let back_k = samples
            .iter()
            .enumerate()
            .skip(peak_k)
            .find(|(_, s)| s.pods[i].is_none_or(|m| (m as f64) < peak as f64 * BACK_FRACTION))
            .map_or(samples.len() - 1, |(k, _)| k);
        // Its memory starts to come back: the first sample after the peak a twentieth below it
        // (the victim is running its exit, or being reaped).
        let drop_k = samples
            .iter()
            .enumerate()
            .skip(peak_k)
            .find(|(_, s)| s.pods[i].is_none_or(|m| (m as f64) < peak as f64 * DROP_FRACTION))
            .map_or(back_k, |(k, _)| k);
        firsts.push((back_k, drop_k, i));
        o.victims.push(
            pod.name
                .rsplit_once('-')
                .map_or(pod.name.clone(), |(a, _)| a.to_owned()),
        );
        if pod.protected {
            o.protected_alive = false;
            o.wrong = true;
        }
        if sc.churn {
            o.false_kills += 1;
        }
        // Out of order: another live unprotected pod ranked before the victim at its peak.
        let at = &samples[peak_k];
        let mine = rank_key(pod, peak);
        let before = pods.iter().enumerate().any(|(j, q)| {
            j != i && !q.protected && at.pods[j].is_some_and(|m| rank_key(q, m) > mine)
        });
        if before {
            o.wrong = true;
        }
    }
    firsts.sort();
    // A victim already back at the crossing sample (the sampler stalled between its reads) has
    // no time to give: left out of the figures, not counted as 0 ms.
    if let (Some(c), Some(&(back_k, drop_k, _))) = (crossing, firsts.first())
        && back_k > c
    {
        o.back = Some(samples[back_k].at.duration_since(samples[c].at));
        o.drop = Some(samples[drop_k.max(c)].at.duration_since(samples[c].at));
    }
    o
}

fn render(
    scenarios: &[Scenario],
    systems: &[System],
    results: &BTreeMap<(usize, usize), Vec<Outcome>>,
    failed: &BTreeMap<(usize, usize), usize>,
    reps: usize,
    mem_total: i64,
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Peers: qoslet beside earlyoom, oomd, nohang, a kubelet-like loop and the kernel, in one VM\n"
    );
    let _ = writeln!(
        out,
        "The whole VM is the node ({} MiB MemTotal, pure cgroup v2, no swap, TCG); hard threshold memory.available<{THRESHOLD_MIB}Mi for qoslet, `-M {}` (KiB, MemAvailable) for earlyoom, SIGTERM below {THRESHOLD_MIB} MiB and SIGKILL below half of it (MemAvailable) for nohang, for oomd a limit on the pod tier's anonymous memory set before each run where memory.available would be {THRESHOLD_MIB} MiB (besides Debian's PSI detector, 60 for 30 s). Every scenario also runs a Guaranteed pod (160 MiB of 256Mi) and a Burstable pod under its request (96 MiB of 256Mi), which must survive. {reps} runs per row; {:.0} s for all runs.\n",
        mem_total / MI as i64,
        THRESHOLD_MIB * 1024,
        elapsed.as_secs_f64()
    );
    for (ci, sc) in scenarios.iter().enumerate() {
        let _ = writeln!(out, "### {}\n", sc.title);
        let _ = writeln!(
            out,
            "| system | runs (failed) | kernel OOM kills (runs with one) | runs with a wrong victim | false kills | protected pods survived | crossing to victim's memory back p50 ms | max ms | of which before its memory starts falling (detection and kill), p50 ms | max ms | then the release (falling to back), p50 ms | max ms | ramp reached MiB/s (median) |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        let mut figures: Vec<[Option<f64>; 5]> = Vec::new();
        for (si, system) in systems.iter().enumerate() {
            let runs = results.get(&(ci, si)).cloned().unwrap_or_default();
            let mut backs: Vec<f64> = runs
                .iter()
                .filter_map(|o| o.back.map(|d| d.as_secs_f64() * 1e3))
                .collect();
            backs.sort_by(f64::total_cmp);
            let mut drops: Vec<f64> = runs
                .iter()
                .filter_map(|o| o.drop.map(|d| d.as_secs_f64() * 1e3))
                .collect();
            drops.sort_by(f64::total_cmp);
            // The kernel's part: from the victim's memory starting to fall to its being back.
            let mut releases: Vec<f64> = runs
                .iter()
                .filter_map(|o| Some(o.back?.checked_sub(o.drop?)?.as_secs_f64() * 1e3))
                .collect();
            releases.sort_by(f64::total_cmp);
            let mut ramps: Vec<f64> = runs.iter().filter_map(|o| o.ramp).collect();
            ramps.sort_by(f64::total_cmp);
            let oom: u64 = runs.iter().map(|o| o.oom_kills).sum();
            let oom_runs = runs.iter().filter(|o| o.oom_kills > 0).count();
            let wrong = runs.iter().filter(|o| o.wrong).count();
            let false_kills: u64 = runs.iter().map(|o| o.false_kills).sum();
            let alive = runs.iter().filter(|o| o.protected_alive).count();
            let p50 = median(&backs);
            let max = backs.last().copied();
            // A run where nothing got the memory back has no time: count it as missing.
            let missing = runs
                .iter()
                .filter(|o| o.crossed && o.back.is_none())
                .count();
            let _ = writeln!(
                out,
                "| {} | {} ({}) | {oom} ({oom_runs}) | {wrong} | {} | {alive}/{} | {}{} | {} | {} | {} | {} | {} | {} |",
                system.name(),
                runs.len(),
                failed.get(&(ci, si)).copied().unwrap_or(0),
                if sc.churn {
                    false_kills.to_string()
                } else {
                    "-".into()
                },
                runs.len(),
                fmt(p50, 0),
                if missing > 0 {
                    format!(" ({missing} runs never)")
                } else {
                    String::new()
                },
                fmt(max, 0),
                fmt(median(&drops), 0),
                fmt(drops.last().copied(), 0),
                fmt(median(&releases), 0),
                fmt(releases.last().copied(), 0),
                fmt(median(&ramps), 0),
            );
            figures.push([
                Some(oom as f64),
                Some(wrong as f64),
                sc.churn.then_some(false_kills as f64),
                p50,
                max,
            ]);
        }
        // qoslet against the best peer (lower is better for every figure).
        if systems.first() != Some(&System::Qoslet) || figures.len() < 2 {
            let _ = writeln!(out);
            continue;
        }
        let mut ratio = Vec::new();
        for f in 0..5 {
            let q = figures[0][f];
            let best = figures[1..]
                .iter()
                .filter_map(|x| x[f])
                .min_by(f64::total_cmp);
            ratio.push(match (q, best) {
                (Some(q), Some(b)) if b > 0.0 => format!("{:.2}", q / b),
                (Some(0.0), Some(_)) => "= (0)".into(),
                (Some(q), Some(_)) => format!("{q:.0} vs 0"),
                _ => "-".into(),
            });
        }
        let _ = writeln!(
            out,
            "| qoslet / best peer | | {} | {} | {} | | {} | {} | | | | | |\n",
            ratio[0], ratio[1], ratio[2], ratio[3], ratio[4]
        );
    }
    let _ = writeln!(
        out,
        "Crossing: the bench's own sampling (every {} ms) of each system's signal going below {THRESHOLD_MIB} MiB: memory.available as the kubelet computes it (MemTotal - (MemTotal - MemFree - inactive_file)) for qoslet, the kubelet-like loop and the kernel, MemAvailable for earlyoom and nohang (lower by about the kernel's watermarks, so they act somewhat earlier at the same figure), the pod tier's anonymous memory (its memory.stat) going over oomd's limit for oomd (the limit set before each run where memory.available would be {THRESHOLD_MIB} MiB). Kernel OOM kills: the processes the kernel's own reports name (`Killed process PID` in its ring buffer); its /proc/vmstat oom_kill counts a memory.oom.group victim twice. Victim's memory back: its pod cgroup empty or below a tenth of its peak; its memory starts falling at the first sample 5% below its peak (the kill has taken effect: what follows is the release, the kernel freeing the victim's memory, the same work whoever killed it; qoslet adds process_mrelease to its cgroup.kill, and the kernel's OOM killer has its reaper). Wrong victim: a protected pod killed, or a pod killed while another live unprotected pod ranked before it in the kubelet's order (above request first, then usage above request). Ramp reached: the hogs' growth over the second before the crossing. The ratio row divides qoslet's figure by the best peer's (lower is better); `= (0)` means both are zero.",
        SAMPLE.as_millis()
    );
    out
}

/// qoslet's decide stage per evicting system: p50, p99 and max over its evictions.
fn decide_lines(systems: &[System], decides: &BTreeMap<usize, Vec<f64>>) -> String {
    let mut out = String::new();
    for (si, ms) in decides {
        let mut v = ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            continue;
        }
        // The nearest rank: with a few evictions p99 is the largest.
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        let _ = writeln!(
            out,
            "{}: decide stage (pass started to the action called) of its {} evictions: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms.\n",
            systems[*si].name(),
            v.len(),
            rank(0.5),
            rank(0.99),
            v[v.len() - 1]
        );
    }
    out
}

fn median(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v[(v.len() - 1) / 2])
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn meminfo(key: &str) -> Option<i64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map(|kib| kib * 1024)
}

/// memory.available of the whole machine as the kubelet computes it on cgroup v2:
/// MemTotal - (MemTotal - MemFree - inactive_file) = MemFree + inactive_file.
fn available() -> Option<i64> {
    let free = meminfo("MemFree")?;
    let stat = fs::read_to_string(format!("{CGROUP}/memory.stat")).ok()?;
    let inactive = stat
        .lines()
        .find_map(|l| l.strip_prefix("inactive_file "))
        .and_then(|v| v.trim().parse::<i64>().ok())?;
    Some(free + inactive)
}

/// The pod tier's anonymous memory, oomd's `memory_above` `threshold_anon` reading.
fn pod_tier_anon() -> Option<i64> {
    fs::read_to_string(Path::new(CGROUP).join("kubepods/memory.stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("anon ")?.trim().parse().ok())
}

fn vmstat_oom_kills() -> u64 {
    fs::read_to_string("/proc/vmstat")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("oom_kill "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn populated(cg: &Path) -> bool {
    fs::read_to_string(cg.join("cgroup.events"))
        .is_ok_and(|t| t.lines().any(|l| l == "populated 1"))
}

fn current(cg: &Path) -> Option<i64> {
    fs::read_to_string(cg.join("memory.current"))
        .ok()?
        .trim()
        .parse()
        .ok()
}
