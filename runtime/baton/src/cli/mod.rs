//! The `baton` command line: parsing, logging, and one module per command.
//!
//! Exit codes: 0 when the command did what it was asked (for `run`: stopped on a signal, with
//! hand-over); 1 when it failed (the message says why and how to fix it; for `check`: some job
//! is invalid); 2 for a command line that does not parse; 130 when `run` got a second signal
//! and stopped at once.

use clap::{Parser, Subcommand, ValueEnum};

mod bench;
mod check;
mod config;
mod next;
mod operate;
mod run;
mod runs;
mod state;

/// Baton: a distributed cron runtime for WebAssembly components.
///
/// Put each job's component `<name>.wasm` beside its `<name>.toml` in a jobs directory and run
/// `baton run` on every node; the nodes share one store, and for every slot exactly one of
/// them runs the job while the others stand by as backups.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// How log lines look: `pretty` (for people) or `json` (one object per line, with `event`,
    /// `job`, `slot`, `attempt` and `runner` where they apply). Defaults to pretty.
    #[arg(long, global = true, env = "BATON_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the jobs of a jobs directory against a shared store, until SIGTERM or Ctrl-C.
    ///
    /// Every option can also be set by a `BATON_*` environment variable or in the `--config`
    /// file; a flag wins over the environment, which wins over the file, which wins over the
    /// default.
    Run(run::RunArgs),
    /// List the jobs of a jobs directory, valid or not, with their next slots.
    Jobs(check::JobsArgs),
    /// Check components and job files without a store: a `.wasm`, a `.toml`, or a directory.
    Check(check::CheckArgs),
    /// Print the next slots of a cron expression, one RFC 3339 time per line in its zone.
    Next(next::NextArgs),
    /// Show the recorded runs of one job, newest first.
    History(runs::HistoryArgs),
    /// Show the latest run of every job in the store, or the runs running now.
    Runs(runs::RunsArgs),
    /// Show a job's state: its keys with the slot, attempt and fence that wrote each, or one
    /// key's value; `--delete KEY` deletes a key.
    State(state::StateArgs),
    /// Pause a job (or `--all`) on every node: its claims answer paused until it is resumed.
    Pause(operate::PauseArgs),
    /// Resume a paused job (or `--all`): its next slot runs by the schedule; slots missed while
    /// it was paused are not caught up.
    Resume(operate::ResumeArgs),
    /// Run a job now: a manual run at the store's current time, which exactly one node runs.
    Trigger(operate::TriggerArgs),
    /// Measure this store: claim, heartbeat and finish against the store's raw primitive at 1,
    /// 8 and 64 clients, round trips per run, the Wasm per-run overhead against a native
    /// process, the zombie stop, takeover and hand-over; `baton bench scale` for several hosts.
    Bench(bench::BenchArgs),
}

/// Parses the command line, sets up logging and runs the command.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let log_format = cli.log_format;
    let plain = || init_logging(log_format.unwrap_or_default());
    match cli.command {
        Command::Run(args) => {
            let settings = config::Settings::resolve(args, log_format)?;
            init_logging(settings.log_format);
            run::run(settings).await
        }
        Command::Jobs(args) => {
            plain();
            check::jobs(args).await
        }
        Command::Check(args) => {
            plain();
            check::check(args)
        }
        Command::Next(args) => {
            plain();
            next::next(args)
        }
        Command::History(args) => {
            plain();
            runs::history(args).await
        }
        Command::Runs(args) => {
            plain();
            runs::runs(args).await
        }
        Command::State(args) => {
            plain();
            state::state(args).await
        }
        Command::Pause(args) => {
            plain();
            operate::pause(args).await
        }
        Command::Resume(args) => {
            plain();
            operate::resume(args).await
        }
        Command::Trigger(args) => {
            plain();
            operate::trigger(args).await
        }
        Command::Bench(args) => {
            // Warnings only: an event line per run would be part of the load measured, and
            // the zombie stops are interruptions on purpose.
            init_logging_with(log_format.unwrap_or_default(), "warn,baton_wasm=error");
            bench::bench(args).await
        }
    }
}

/// One structured line per event on stderr; `RUST_LOG` filters (defaults to `info`, with the
/// compiler's own chatter at `warn`).
fn init_logging(format: LogFormat) {
    init_logging_with(format, "info");
}

/// [`init_logging`], with `level` as the default instead of `info`.
fn init_logging_with(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},wasmtime=warn,cranelift=warn"))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}
