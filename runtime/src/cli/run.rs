//! `baton run`: the jobs of a directory, as components, on an instance of the cluster.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use baton::instance::{Instance, InstanceConfig};
use baton::jobs::directory::{Change, JobsDirectory, POLL_EVERY};
use baton::wasm::{HostConfig, WasmHost};

/// The options of `baton run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The jobs directory: `<name>.wasm` beside `<name>.toml`. Watched for changes.
    #[arg(long, default_value = "./jobs")]
    jobs: PathBuf,
    /// The shared store: sqlite://PATH, redis://HOST:PORT, postgres://USER@HOST:PORT/DB.
    #[arg(long, default_value = "sqlite://baton.db")]
    store: String,
    /// This host's runner id, unique in the cluster. Defaults to HOSTNAME-PID.
    #[arg(long)]
    runner: Option<String>,
    /// The namespace in the store; clusters that share a store use different ones.
    #[arg(long, default_value = baton::store::DEFAULT_NAMESPACE)]
    namespace: String,
    /// How long running jobs get to stop on SIGTERM/Ctrl-C before they are interrupted and
    /// handed over, e.g. 30s, 500ms, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    stop_timeout: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    baton::jobs::parse_duration(s)
}

/// This host's name and process id.
fn default_runner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .or_else(|_| std::fs::read_to_string("/etc/hostname"))
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "baton".to_owned());
    format!("{host}-{}", std::process::id())
}

/// Runs the jobs until the first SIGTERM or SIGINT, then stops with hand-over; a second signal
/// stops at once.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    if !args.jobs.is_dir() {
        bail!(
            "jobs directory {} does not exist; create it (one <name>.toml beside each <name>.wasm) or pass --jobs DIR",
            args.jobs.display()
        );
    }
    let redacted = baton::store::redact(&args.store);
    let runner = args.runner.unwrap_or_else(default_runner);
    let host = WasmHost::new(HostConfig::default()).context("starting the wasm host")?;
    let config = InstanceConfig {
        store_url: args.store.clone(),
        namespace: args.namespace.clone(),
        runner: runner.clone(),
    };
    let instance = Arc::new(
        Instance::start(config, Vec::new())
            .await
            .with_context(|| format!("opening store {redacted}"))?,
    );
    let mut dir = JobsDirectory::new(&args.jobs, host);
    // Compiling the components is CPU work: keep it off the async workers' backs.
    let changes = tokio::task::block_in_place(|| dir.sync(&instance))
        .with_context(|| format!("reading jobs directory {}", args.jobs.display()))?;
    let broken = changes
        .iter()
        .filter(|c| matches!(c, Change::Failed { .. }))
        .count();
    tracing::info!(
        runner = %runner,
        store = %redacted,
        namespace = %args.namespace,
        jobs = %args.jobs.display(),
        running = instance.job_names().len(),
        broken,
        "baton is running; SIGTERM or Ctrl-C stops it with hand-over"
    );
    let watcher = dir
        .watch(instance.clone(), POLL_EVERY)
        .context("starting the jobs directory watch")?;

    let mut signals = Signals::new()?;
    signals.next().await;
    drop(watcher);
    tracing::info!(
        stop_timeout = %baton::jobs::format_duration(args.stop_timeout),
        "stopping: running jobs are told to stop and handed over; a second signal stops at once"
    );
    tokio::select! {
        report = instance.stop(args.stop_timeout) => {
            tracing::info!(ended = report.ended, abandoned = report.abandoned, "stopped");
            Ok(())
        }
        _ = signals.next() => {
            tracing::warn!("second signal: stopping at once; running leases run out on their own");
            std::process::exit(130);
        }
    }
}

/// SIGTERM and SIGINT, as one stream.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
