//! `baton run`: the jobs of a directory, as components, on an instance of the cluster.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

use super::config::Settings;
use crate::http::{JobView, RunningView};
use baton_core::instance::{Instance, InstanceConfig};
use baton_core::lease::Run;
use baton_core::operate::{OperateOutcome, Operator, Request};
use baton_core::schedule::format_utc;
use baton_wasm::jobs::directory::{Change, JobsDirectory, POLL_EVERY};
use baton_wasm::{AllowedDirs, HostConfig, WasmHost};

/// The options of `baton run`. None has a default here: [`Settings::resolve`] fills in the
/// config file's value, then the default, for each one left unset.
#[derive(clap::Args)]
pub struct RunArgs {
    /// A TOML file with any of the options below (keys as the long flags, `_` for `-`).
    #[arg(long, env = "BATON_CONFIG")]
    pub config: Option<PathBuf>,
    /// The jobs directory: `<name>.wasm` beside `<name>.toml`, watched for changes.
    /// [default: ./jobs]
    #[arg(long, env = "BATON_JOBS")]
    pub jobs: Option<PathBuf>,
    /// The shared store: sqlite://PATH, redis://HOST:PORT, valkey://HOST:PORT,
    /// redis+cluster://HOST:PORT,HOST:PORT, postgres://USER@HOST:PORT/DB.
    /// [default: sqlite://baton.db]
    #[arg(long, env = "BATON_STORE")]
    pub store: Option<String>,
    /// This host's runner id, unique in the cluster. [default: HOSTNAME-PID]
    #[arg(long, env = "BATON_RUNNER")]
    pub runner: Option<String>,
    /// The namespace in the store; clusters that share a store use different ones.
    /// [default: baton]
    #[arg(long, env = "BATON_NAMESPACE")]
    pub namespace: Option<String>,
    /// How long running jobs get to stop on SIGTERM/Ctrl-C before they are interrupted and
    /// handed over, e.g. 30s, 500ms, 2m. [default: 30s]
    #[arg(long, env = "BATON_STOP_TIMEOUT", value_parser = parse_duration)]
    pub stop_timeout: Option<Duration>,
    /// Serve the dashboard (/), the JSON API (/api/jobs), /metrics (OpenMetrics), /healthz,
    /// /readyz and /runs on this address, e.g. 127.0.0.1:9464; a bare port (9464) is on
    /// 127.0.0.1. [default: off]
    #[arg(long, env = "BATON_HTTP")]
    pub http: Option<String>,
    /// The bearer token the HTTP API's pause, resume and trigger need (`Authorization: Bearer
    /// TOKEN`); without one configured they are refused (403). [default: none]
    #[arg(long, env = "BATON_HTTP_TOKEN", hide_env_values = true)]
    pub http_token: Option<String>,
    /// Keep compiled components here, so a restart does not compile them again; `off` for
    /// none. [default: $XDG_CACHE_HOME/baton, or ~/.cache/baton]
    #[arg(long, env = "BATON_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    #[command(flatten)]
    pub allow: AllowDirArgs,
}

/// The directories outside the jobs directory that this node grants its jobs.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AllowDirArgs {
    /// Grant jobs a directory outside the jobs directory, under a name: a job file then names
    /// it as `data_dir = "@NAME"` (or `"@NAME/sub"`), or a config file as `{ file = "@NAME/key" }`.
    /// Every other path a job file names must stay beneath the jobs directory. Repeat it for
    /// more (in BATON_ALLOW_DIR, separate them with commas). [default: none]
    #[arg(long = "allow-dir", value_name = "NAME=PATH", env = "BATON_ALLOW_DIR", value_delimiter = ',', value_parser = parse_allow_dir)]
    pub allow_dir: Vec<(String, PathBuf)>,
}

impl AllowDirArgs {
    /// The grants as the jobs directory takes them.
    pub fn to_allowed(&self) -> anyhow::Result<AllowedDirs> {
        let mut allowed = AllowedDirs::new();
        for (name, path) in &self.allow_dir {
            allowed
                .insert(name, path.clone())
                .map_err(|e| anyhow::anyhow!("--allow-dir {name}={}: {e}", path.display()))?;
        }
        Ok(allowed)
    }
}

fn parse_allow_dir(s: &str) -> Result<(String, PathBuf), String> {
    AllowedDirs::parse_entry(s)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    baton_core::duration::parse_duration(s)
}

/// Runs the jobs until the first SIGTERM or SIGINT, then stops with hand-over; a second signal
/// stops at once.
pub async fn run(args: Settings) -> anyhow::Result<()> {
    if !args.jobs.is_dir() {
        bail!(
            "jobs directory {} does not exist; create it (one <name>.toml beside each <name>.wasm) or pass --jobs DIR",
            args.jobs.display()
        );
    }
    // Listen before anything can be told to stop us, so an early SIGTERM is a clean stop.
    let mut signals = Signals::new()?;
    let redacted = baton_core::store::redact(&args.store);
    let runner = args.runner.clone();
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
    instance
        .watch_operations(baton_core::operate::OPERATIONS_POLL)
        .context("starting the watch of operators' actions")?;
    let metrics = instance.metrics();
    let requests = metrics.clone();
    let host = WasmHost::new(HostConfig {
        trap_sink: Some(Arc::new(move |kind| metrics.guest_trap(kind))),
        outbound_sink: Some(Arc::new(move |outcome| requests.outbound_request(outcome))),
        cache_dir: args.cache_dir.clone(),
        ..HostConfig::default()
    })
    .context("starting the wasm host")?;
    let mut dir = JobsDirectory::new(&args.jobs, host).with_allowed_dirs(args.allow_dirs.clone());
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
        allowed_dirs = %describe_allowed(&args.allow_dirs),
        running = instance.job_names().len(),
        broken,
        "baton is running; SIGTERM or Ctrl-C stops it with hand-over"
    );
    let watcher = dir
        .watch(instance.clone(), POLL_EVERY)
        .context("starting the jobs directory watch")?;
    if let Some(addr) = &args.http {
        let status = Arc::new(HostStatus {
            instance: instance.clone(),
        });
        let bound =
            crate::http::serve(addr, instance.metrics(), status, args.http_token.clone()).await?;
        tracing::info!(
            http = %bound,
            token = args.http_token.is_some(),
            "serving /metrics, /healthz, /readyz, /runs, the dashboard (/) and /api/jobs"
        );
    }

    signals.next().await;
    drop(watcher);
    tracing::info!(
        stop_timeout = %baton_core::duration::format_duration(args.stop_timeout),
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

/// `@exports=/srv/exports, @logs=/var/log/jobs`, or `none`.
fn describe_allowed(allowed: &AllowedDirs) -> String {
    if allowed.is_empty() {
        return "none".to_owned();
    }
    let grants: Vec<String> = allowed
        .iter()
        .map(|(name, path)| format!("@{name}={}", path.display()))
        .collect();
    grants.join(", ")
}

/// What `/readyz` and `/runs` ask of this host.
struct HostStatus {
    instance: Arc<Instance>,
}

#[async_trait::async_trait]
impl crate::http::Status for HostStatus {
    async fn ready(&self) -> Result<(), String> {
        self.instance
            .store()
            .now()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn runs(&self) -> Result<serde_json::Value, String> {
        let store = self.instance.store();
        let mut runs = Vec::new();
        for job in self.instance.job_names() {
            for run in store.unfinished(&job).await.map_err(|e| e.to_string())? {
                runs.push(baton_core::report::run_json(&run));
            }
        }
        Ok(serde_json::Value::Array(runs))
    }

    async fn jobs(&self) -> Result<Vec<JobView>, String> {
        let store = self.instance.store();
        let paused = store.paused().await.map_err(|e| e.to_string())?;
        let now = store.now().await.map_err(|e| e.to_string())?;
        let mut views = Vec::new();
        for name in self.instance.job_names() {
            let Some(job) = self.instance.job(&name) else {
                continue;
            };
            let last = store.history(&name, 1).await.map_err(|e| e.to_string())?;
            let unfinished = store.unfinished(&name).await.map_err(|e| e.to_string())?;
            views.push(JobView {
                schedule: job.schedule.expr().to_owned(),
                zone: job.schedule.time_zone().to_string(),
                next_slot: job.schedule.next_after(now).map(format_utc),
                paused: paused.iter().find(|p| p.job == name).cloned(),
                last_run: last.first().map(baton_core::report::run_json),
                running: unfinished
                    .iter()
                    .map(|run| RunningView {
                        slot: format_utc(run.slot),
                        runner: run.runner.clone(),
                        attempt: run.attempt,
                        lease_remaining_ms: (run.lease_end - now).max(0),
                    })
                    .collect(),
                name,
            });
        }
        Ok(views)
    }

    async fn job_runs(&self, job: &str, limit: usize) -> Result<Option<Vec<Run>>, String> {
        if self.instance.job(job).is_none() {
            return Ok(None);
        }
        let runs = self.instance.store().history(job, limit).await;
        runs.map(Some).map_err(|e| e.to_string())
    }

    async fn operate(
        &self,
        job: &str,
        request: Request,
        by: Operator,
    ) -> Result<Option<OperateOutcome>, String> {
        if self.instance.job(job).is_none() {
            return Ok(None);
        }
        let outcome = self.instance.store().operate(job, request, &by).await;
        outcome.map(Some).map_err(|e| e.to_string())
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
