//! `baton bench`: what Baton costs and how fast it recovers on a store, side by side with the
//! store's raw primitive and a native process start (see `baton_bench` and
//! `docs/BENCHMARKS.md`); `baton bench scale` for several host processes on one store.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use baton_bench::{capacity, failover, report, round_trips, scale, store_ops};
use baton_core::store;

use super::config::DEFAULT_STORE;

/// The options of `baton bench`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    scale: Option<BenchCommand>,
    #[command(flatten)]
    full: FullArgs,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Several host processes running many jobs every second on one store: slots run against
    /// slots due, duplicate runs, CPU and peak memory per host.
    Scale(ScaleArgs),
    /// The store's own time per due slot: every host's claim and the winner's finish, against
    /// a lock (each host's SET NX PX or INSERT … ON CONFLICT, the winner's delete) on the same
    /// slots and hosts, read from the server's counts (INFO commandstats, pg_stat_statements)
    /// or, where it keeps none, timed call by call. On Redis and Valkey it also measures the
    /// floor of a script on the server: the same steps making only the calls they cannot do
    /// without, and no logic.
    Capacity(CapacityArgs),
    /// One host of the scale run (started by `baton bench scale`).
    #[command(hide = true)]
    ScaleHost(ScaleHostArgs),
}

/// The options of a full `baton bench` run.
#[derive(clap::Args)]
struct FullArgs {
    /// The store to measure: sqlite://PATH, redis://HOST:PORT, valkey://HOST:PORT,
    /// postgres://USER@HOST:PORT/DB. The run works in a namespace of its own and leaves it
    /// empty. [default: sqlite://baton.db]
    #[arg(long, env = "BATON_STORE", default_value = DEFAULT_STORE, hide_default_value = true)]
    store: String,
    /// Print the report as one JSON object instead of Markdown tables.
    #[arg(long)]
    json: bool,
    /// The directory holding empty.wasm and busy-loop.wasm, built by
    /// bench/build-components.sh; without it the Wasm figures are skipped with a note.
    /// [default: none]
    #[arg(long)]
    components: Option<PathBuf>,
    /// The numbers of concurrent clients the store operations are measured at.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    clients: Vec<usize>,
    /// Operations of each kind measured at each number of clients.
    #[arg(long, default_value_t = 3000)]
    samples: usize,
    /// Measured rounds the operation kinds alternate in.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Runs counted for the round trips per run.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Runs of each side of the per-run overhead (Wasm and native).
    #[arg(long, default_value_t = 300)]
    wasm_runs: usize,
    /// Zombie stops measured.
    #[arg(long, default_value_t = 50)]
    zombie_stops: usize,
    /// Runs taken over, and as many handed over.
    #[arg(long, default_value_t = 10)]
    failover_jobs: usize,
}

/// The store and the hosts of `baton bench scale` and `baton bench capacity`.
#[derive(clap::Args)]
struct SharedStore {
    /// The store the hosts share. The run works in a namespace of its own and leaves it
    /// empty. [default: redis://127.0.0.1:6379]
    #[arg(
        long,
        env = "BATON_STORE",
        default_value = "redis://127.0.0.1:6379",
        hide_default_value = true
    )]
    store: String,
    /// Hosts claiming every slot: processes for scale, clients of the store for capacity.
    #[arg(long, default_value_t = 3)]
    hosts: usize,
}

/// The options of `baton bench scale`.
#[derive(clap::Args)]
struct ScaleArgs {
    #[command(flatten)]
    shared: SharedStore,
    /// Jobs per host, each due every second (the same jobs on every host).
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// The measured window, s.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// How long the hosts get to start their jobs before the window, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    warm_up: Duration,
    /// How many times to run it, one after the other; every run's result is printed.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Print the report as one JSON object instead of Markdown (with --repeat, one a line).
    #[arg(long)]
    json: bool,
}

/// The options of `baton bench capacity`.
#[derive(clap::Args)]
struct CapacityArgs {
    #[command(flatten)]
    shared: SharedStore,
    /// Jobs.
    #[arg(long, default_value_t = 200)]
    jobs: usize,
    /// Slots of each job measured.
    #[arg(long, default_value_t = 20)]
    slots: usize,
    /// Print the figures as one JSON object (fields store_us_per_slot, lock_us_per_slot,
    /// ratio, …, and floor on Redis and Valkey) instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ScaleHostArgs {
    #[arg(long)]
    store: String,
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    jobs: usize,
    #[arg(long)]
    start_ms: i64,
    #[arg(long)]
    seconds: u64,
    #[arg(long)]
    host: usize,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    baton_core::duration::parse_duration(s)
}

/// Runs `baton bench` or one of its subcommands and prints the report on stdout.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    match args.scale {
        None => full(args.full).await,
        Some(BenchCommand::Scale(a)) => scale_run(a).await,
        Some(BenchCommand::Capacity(a)) => capacity_run(a).await,
        Some(BenchCommand::ScaleHost(a)) => scale_host(a).await,
    }
}

async fn full(a: FullArgs) -> anyhow::Result<()> {
    let settings = report::Settings {
        store_url: a.store.clone(),
        store_ops: store_ops::Settings {
            clients: a.clients,
            samples: a.samples,
            rounds: a.rounds,
        },
        round_trips: round_trips::Settings {
            runs: a.runs,
            ..round_trips::Settings::default()
        },
        failover: failover::Settings {
            jobs: a.failover_jobs,
            ..failover::Settings::default()
        },
        components: a.components,
        wasm_runs: a.wasm_runs,
        zombie_stops: a.zombie_stops,
    };
    let report = report::run(&settings)
        .await
        .with_context(|| format!("benchmarking store {}", store::redact(&a.store)))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_markdown());
    }
    Ok(())
}

async fn scale_run(a: ScaleArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding the baton executable for the hosts")?;
    let settings = scale::Settings {
        store_url: a.shared.store.clone(),
        hosts: a.shared.hosts,
        jobs: a.jobs,
        seconds: a.seconds,
        warm_up: a.warm_up,
        exe,
    };
    let repeat = a.repeat.max(1);
    let mut reached = Vec::new();
    for n in 1..=repeat {
        let report = scale::run(&settings)
            .await
            .with_context(|| format!("scale run on store {}", store::redact(&a.shared.store)))?;
        if a.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            if repeat > 1 {
                println!("## Scale run {n} of {repeat}\n");
            }
            print!("{}", report::scale_markdown(&report));
        }
        reached.push(report.run_percent);
    }
    if repeat > 1 && !a.json {
        let shown: Vec<String> = reached.iter().map(|p| format!("{p:.2} %")).collect();
        println!(
            "\nSlots run in each of the {repeat} runs: {}",
            shown.join(", ")
        );
    }
    Ok(())
}

async fn capacity_run(a: CapacityArgs) -> anyhow::Result<()> {
    let settings = capacity::Settings {
        store_url: a.shared.store.clone(),
        hosts: a.shared.hosts,
        jobs: a.jobs,
        slots: a.slots,
    };
    let figures = capacity::run(&settings)
        .await
        .with_context(|| format!("capacity run on store {}", store::redact(&a.shared.store)))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        print!("{}", capacity::markdown(&figures));
    }
    Ok(())
}

async fn scale_host(a: ScaleHostArgs) -> anyhow::Result<()> {
    let settings = scale::HostSettings {
        store_url: a.store,
        namespace: a.namespace,
        jobs: a.jobs,
        start_ms: a.start_ms,
        seconds: a.seconds,
        host: a.host,
    };
    let report = scale::host(&settings).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
