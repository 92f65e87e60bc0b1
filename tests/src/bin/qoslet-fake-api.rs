//! Runs qoslet's fake Kubernetes API server (a test fake, see `qoslet_tests::fake_api`) seeded
//! from JSON or YAML files, for manual runs and the cluster bench:
//!
//! ```text
//! qoslet-fake-api [--port PORT] [--kubeconfig FILE] [--bookmark-interval-ms N] SEED...
//! ```
//!
//! Prints `listening on http://127.0.0.1:PORT` once ready, writes the kubeconfig if asked, and
//! serves until SIGINT or SIGTERM.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use qoslet_tests::fake_api::{FakeApi, Options, load_seed};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut options = Options::default();
    let mut kubeconfig: Option<PathBuf> = None;
    let mut seeds = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--port" => options
                .addr
                .set_port(value("--port")?.parse().context("--port")?),
            "--kubeconfig" => kubeconfig = Some(value("--kubeconfig")?.into()),
            "--bookmark-interval-ms" => {
                let ms = value("--bookmark-interval-ms")?
                    .parse()
                    .context("--bookmark-interval-ms")?;
                options.bookmark_interval = Duration::from_millis(ms);
            }
            "-h" | "--help" => {
                println!(
                    "usage: qoslet-fake-api [--port PORT] [--kubeconfig FILE] [--bookmark-interval-ms N] SEED..."
                );
                return Ok(());
            }
            flag if flag.starts_with("--") => bail!("unknown option {flag}"),
            seed => seeds.push(PathBuf::from(seed)),
        }
    }
    let fake = FakeApi::start(options).await?;
    for seed in &seeds {
        fake.seed(load_seed(seed)?)
            .with_context(|| format!("seeding from {}", seed.display()))?;
    }
    if let Some(path) = &kubeconfig {
        fake.write_kubeconfig(path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("listening on {}", fake.url());
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
