//! Running cargo with the eBPF toolchain on PATH, and reading libtest's summary lines.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::toolchain::Toolchain;

pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
}

/// Where cargo puts its output: `CARGO_TARGET_DIR`, else `target/` of the workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn command(tc: &Toolchain, args: &[&str]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.args(args)
        .current_dir(workspace_root())
        .env("PATH", &tc.path_env)
        // xtask's own; build scripts that track it would rebuild after every plain cargo run.
        .env_remove("CARGO_MANIFEST_DIR");
    cmd
}

pub fn run(tc: &Toolchain, args: &[&str]) -> Result<()> {
    run_env(tc, args, &[])
}

/// [`run`] with extra environment variables.
pub fn run_env(tc: &Toolchain, args: &[&str], env: &[(String, String)]) -> Result<()> {
    let mut cmd = command(tc, args);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("cargo {} failed: {status}", args.join(" "));
    }
    Ok(())
}

#[derive(Debug, Default, Clone)]
pub struct TestCounts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    pub ok: bool,
}

impl TestCounts {
    pub fn add(&mut self, other: &TestCounts) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }

    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} ignored",
            self.passed, self.failed, self.ignored
        )
    }
}

/// Runs `cargo test ...`, echoing its output, and sums its `test result:` lines. A failing
/// run is reported in the counts (`ok == false`), not as an error, so the report still prints.
pub fn test(tc: &Toolchain, args: &[&str]) -> Result<TestCounts> {
    test_keeping(tc, args, None).map(|(counts, _)| counts)
}

/// [`test`], also returning the output lines that contain `marker`.
pub fn test_keeping(
    tc: &Toolchain,
    args: &[&str],
    marker: Option<&str>,
) -> Result<(TestCounts, Vec<String>)> {
    summed(command(tc, args), marker)
}

/// [`test`] with `wrapper` before cargo (e.g. `nsenter --net=...`) and extra environment.
pub fn test_through(
    tc: &Toolchain,
    wrapper: &[String],
    args: &[&str],
    env: &[(String, String)],
) -> Result<TestCounts> {
    let inner = command(tc, args);
    let (first, rest) = wrapper.split_first().context("an empty wrapper")?;
    let mut cmd = Command::new(first);
    cmd.args(rest)
        .arg(inner.get_program())
        .args(inner.get_args())
        .current_dir(workspace_root())
        .env("PATH", &tc.path_env)
        .env_remove("CARGO_MANIFEST_DIR")
        .envs(env.iter().map(|(k, v)| (k, v)));
    summed(cmd, None).map(|(counts, _)| counts)
}

fn summed(mut cmd: Command, marker: Option<&str>) -> Result<(TestCounts, Vec<String>)> {
    cmd.stdout(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("running {cmd:?}"))?;
    let stdout = child.stdout.take().context("cargo stdout")?;
    let mut counts = TestCounts::default();
    let mut kept = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if marker.is_some_and(|m| line.contains(m)) {
            kept.push(line.clone());
        }
        if let Some((p, f, i)) = parse_result_line(&line) {
            counts.passed += p;
            counts.failed += f;
            counts.ignored += i;
        }
    }
    let status = child.wait()?;
    counts.ok = status.success();
    if !status.success() && counts.failed == 0 {
        // A build failure or a crashed test binary prints no failing summary line.
        counts.failed += 1;
    }
    Ok((counts, kept))
}

/// `test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; ...`
fn parse_result_line(line: &str) -> Option<(u64, u64, u64)> {
    let rest = line.strip_prefix("test result: ")?;
    let rest = rest.split_once(". ")?.1;
    let mut nums = rest.split(';').map(|part| {
        part.split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
    });
    Some((nums.next()??, nums.next()??, nums.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libtest_summary_lines() {
        assert_eq!(
            parse_result_line(
                "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s"
            ),
            Some((3, 0, 1))
        );
        assert_eq!(
            parse_result_line("test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured"),
            Some((1, 2, 0))
        );
        assert_eq!(parse_result_line("running 3 tests"), None);
    }
}
