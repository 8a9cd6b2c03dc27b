//! `baton history` and `baton runs`: what the store recorded, as a table or one JSON object
//! per line.

use std::sync::Arc;

use anyhow::Context;
use baton_core::lease::{Run, Status};
use baton_core::report::{run_json, runs_table};
use baton_core::store::{self, Store};

use super::config::DEFAULT_STORE;

/// Where the runs are.
#[derive(clap::Args)]
pub struct StoreArgs {
    /// The shared store. [default: sqlite://baton.db]
    #[arg(long, env = "BATON_STORE", default_value = DEFAULT_STORE, hide_default_value = true)]
    store: String,
    /// The namespace in the store.
    #[arg(long, env = "BATON_NAMESPACE", default_value = store::DEFAULT_NAMESPACE)]
    namespace: String,
    /// One JSON object per run and line (job, slot, status, handed_over, fence, attempts, …)
    /// instead of a table.
    #[arg(long)]
    json: bool,
}

impl StoreArgs {
    async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        store::open(&self.store, &self.namespace)
            .await
            .with_context(|| format!("opening store {}", store::redact(&self.store)))
    }

    fn print(&self, runs: &[Run]) {
        if self.json {
            for run in runs {
                println!("{}", run_json(run));
            }
        } else {
            print!("{}", runs_table(runs));
        }
    }
}

/// The options of `baton history`.
#[derive(clap::Args)]
pub struct HistoryArgs {
    /// The job's name (its file's stem).
    job: String,
    /// How many runs, newest first.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    #[command(flatten)]
    store: StoreArgs,
}

/// Prints the runs of one job, newest first.
pub async fn history(args: HistoryArgs) -> anyhow::Result<()> {
    let store = args.store.open().await?;
    let runs = store
        .history(&args.job, args.limit)
        .await
        .with_context(|| format!("reading the history of job {:?}", args.job))?;
    let operations = store
        .operations(Some(&args.job), 0, args.limit)
        .await
        .with_context(|| format!("reading the operations on job {:?}", args.job))?;
    if runs.is_empty() && operations.is_empty() && !store.jobs().await?.contains(&args.job) {
        anyhow::bail!(
            "the store has no runs of job {:?} in namespace {:?}; `baton runs` lists the jobs it has",
            args.job,
            args.store.namespace
        );
    }
    args.store.print(&runs);
    if !args.store.json && !operations.is_empty() {
        println!("\noperations, newest first:");
        for op in &operations {
            println!("  {}", super::operate::describe(op));
        }
    }
    Ok(())
}

/// The options of `baton runs`.
#[derive(clap::Args)]
pub struct RunsArgs {
    /// Only the runs running now (their lease alive or run out, not yet taken over).
    #[arg(long)]
    running: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// Prints the latest run of every job, or every run still running.
pub async fn runs(args: RunsArgs) -> anyhow::Result<()> {
    let store = args.store.open().await?;
    let mut runs = Vec::new();
    for job in store.jobs().await.context("listing the store's jobs")? {
        if args.running {
            runs.extend(store.unfinished(&job).await?);
        } else {
            runs.extend(store.history(&job, 1).await?);
        }
    }
    runs.retain(|r| !args.running || r.status == Status::Running);
    args.store.print(&runs);
    if !args.store.json {
        for pause in store.paused().await.context("listing the paused jobs")? {
            println!("{}", super::operate::describe(&pause));
        }
    }
    Ok(())
}
