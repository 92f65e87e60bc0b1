//! `cargo xtask fuzz [--time S] [TARGET...]`: the libFuzzer targets of `fuzz/` (cargo-fuzz,
//! nightly), each for S seconds, seeded from deploy/ and the tests' corpora. cargo-fuzz is
//! installed into the toolchain cache on first use (`cargo install --locked`, about two minutes
//! here). Crashes stay in `fuzz/artifacts/<target>/`; turn each into a unit test of the agent.
//! Not part of `cargo xtask test`.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo::workspace_root, toolchain};

/// The targets, and whether YAML seeds fit them.
pub const TARGETS: &[(&str, Seeds)] = &[
    ("quantity", Seeds::Quantities),
    ("manifest_plan", Seeds::Yaml),
    ("kubelet_config", Seeds::Yaml),
    ("qoslet_config", Seeds::Yaml),
    ("workload", Seeds::Yaml),
];

#[derive(Debug, Clone, Copy)]
pub enum Seeds {
    Quantities,
    Yaml,
}

/// Quantity seeds: every suffix, signs, fractions, exponents, the extremes.
const QUANTITY_SEEDS: &[&str] = &[
    "100m",
    "1",
    "0.5",
    "1Gi 512Mi",
    "5Ei 5Ei",
    "-64Mi",
    "-2",
    "1e3",
    "1E-3",
    "129e6",
    "1n",
    "1u",
    "1k",
    "1M",
    "1G",
    "1T",
    "1P",
    "1E",
    "1Ki",
    "1Mi",
    "1Ti",
    "1Pi",
    "1.5Gi",
    "+3",
    ".5",
    "9223372036854775807m",
    "9223372036854775807 1",
    "0.000000001",
    "123456789012345678901234567890",
];

#[derive(Debug)]
pub struct Outcome {
    pub target: String,
    pub runs: Option<u64>,
    pub seconds: f64,
    pub crashes: Vec<PathBuf>,
}

pub fn run(seconds: u64, only: &[String]) -> Result<Vec<Outcome>> {
    let cargo_fuzz = ensure_cargo_fuzz()?;
    let root = workspace_root();
    let fuzz = root.join("fuzz");
    let mut outcomes = Vec::new();
    for (target, seeds) in TARGETS {
        if !only.is_empty() && !only.iter().any(|o| o == target) {
            continue;
        }
        let seed_dir = fuzz.join("seeds").join(target);
        write_seeds(root, &seed_dir, *seeds)?;
        let corpus = fuzz.join("corpus").join(target);
        fs::create_dir_all(&corpus)?;
        let artifacts = fuzz.join("artifacts").join(target);
        let before = list(&artifacts);
        println!("xtask: fuzzing {target} for {seconds} s");
        let started = Instant::now();
        let mut cmd = cargo_nightly(&cargo_fuzz)?;
        // -a: debug assertions and overflow checks on, so an overflow is a crash.
        cmd.args(["fuzz", "run", "-a", target])
            .arg(&corpus)
            .arg(&seed_dir)
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                "-rss_limit_mb=2048",
                "-max_len=65536",
                "-print_final_stats=1",
            ])
            .current_dir(root)
            // The kernel programs are not needed to fuzz the pure code.
            .env("AYA_BUILD_SKIP", "1")
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("running {cmd:?}"))?;
        let mut runs = None;
        if let Some(err) = child.stderr.take() {
            for line in BufReader::new(err).lines() {
                let line = line?;
                // libFuzzer's last words: "Done 123456 runs in 60 second(s)".
                if let Some(n) = line
                    .strip_prefix("Done ")
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|n| n.parse().ok())
                {
                    runs = Some(n);
                }
                if line.starts_with("stat::number_of_executed_units:") {
                    runs = line
                        .rsplit(' ')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .or(runs);
                }
                eprintln!("{line}");
            }
        }
        let status = child.wait()?;
        let crashes: Vec<PathBuf> = list(&artifacts)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        if !status.success() && crashes.is_empty() {
            bail!("fuzzing {target} failed ({status}) without leaving a crash input");
        }
        outcomes.push(Outcome {
            target: (*target).to_owned(),
            runs,
            seconds: started.elapsed().as_secs_f64(),
            crashes,
        });
    }
    Ok(outcomes)
}

fn list(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Seeds copied at run time, so they follow the examples and the test corpora.
fn write_seeds(root: &Path, dir: &Path, seeds: Seeds) -> Result<()> {
    fs::create_dir_all(dir)?;
    match seeds {
        Seeds::Quantities => {
            for (i, q) in QUANTITY_SEEDS.iter().enumerate() {
                fs::write(dir.join(format!("q{i}")), q)?;
            }
        }
        Seeds::Yaml => {
            let mut files = Vec::new();
            for top in ["deploy", "agent/tests/corpus"] {
                yaml_files(&root.join(top), &mut files);
            }
            for (i, f) in files.iter().enumerate() {
                let name = format!(
                    "{i:03}-{}",
                    f.file_name().unwrap_or_default().to_string_lossy()
                );
                fs::copy(f, dir.join(name)).with_context(|| format!("copying {}", f.display()))?;
            }
        }
    }
    Ok(())
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = list(dir);
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
}

/// `cargo +nightly` with the cached cargo-fuzz first on PATH.
fn cargo_nightly(cargo_fuzz: &Path) -> Result<Command> {
    let bin = cargo_fuzz.parent().context("cargo-fuzz has a directory")?;
    let mut paths = vec![bin.to_path_buf()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let mut cmd = Command::new("cargo");
    cmd.arg("+nightly")
        .env("PATH", std::env::join_paths(paths)?);
    Ok(cmd)
}

/// cargo-fuzz, installed into `<cache>/cargo-fuzz` unless a working one is there.
fn ensure_cargo_fuzz() -> Result<PathBuf> {
    let works = |cargo_fuzz: &Path| {
        cargo_fuzz.exists()
            && cargo_nightly(cargo_fuzz).is_ok_and(|mut c| {
                c.args(["fuzz", "--version"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
    };
    let root = toolchain::cache_dir()?.join("cargo-fuzz");
    let cached = root.join("bin/cargo-fuzz");
    if works(&cached) {
        return Ok(cached);
    }
    println!(
        "xtask: installing cargo-fuzz into {} (once)",
        root.display()
    );
    let started = Instant::now();
    let status = Command::new("cargo")
        .args(["install", "--locked", "cargo-fuzz", "--root"])
        .arg(&root)
        .status()
        .context("running cargo install cargo-fuzz")?;
    if !status.success() || !works(&cached) {
        bail!("installing cargo-fuzz failed ({status})");
    }
    println!(
        "xtask: cargo-fuzz installed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(cached)
}
