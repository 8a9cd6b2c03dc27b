//! `baton pause`, `baton resume` and `baton trigger`: an operator's three buttons, recorded in
//! the store with who pressed them, from which host, when and why.

use std::sync::Arc;

use anyhow::{bail, Context};
use baton_core::operate::{OperateOutcome, Operation, Operator, Request};
use baton_core::schedule::format_utc;
use baton_core::store::{self, Store};

use super::config::{hostname, DEFAULT_STORE};

/// Where the jobs are, and who asks.
#[derive(clap::Args)]
pub struct OperateArgs {
    /// The shared store. [default: sqlite://baton.db]
    #[arg(long, env = "BATON_STORE", default_value = DEFAULT_STORE, hide_default_value = true)]
    store: String,
    /// The namespace in the store.
    #[arg(long, env = "BATON_NAMESPACE", default_value = store::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Why, recorded with the operation and shown by `baton history`, `baton runs` and the
    /// dashboard. [default: none]
    #[arg(long)]
    reason: Option<String>,
}

/// The options of `baton pause`.
#[derive(clap::Args)]
pub struct PauseArgs {
    /// The job's name (its file's stem).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    job: Option<String>,
    /// Every job of the namespace.
    #[arg(long)]
    all: bool,
    /// Tell the attempts running now to stop (their signal aborts); they are recorded as
    /// failed, not handed over. Without it they run to their end.
    #[arg(long)]
    stop: bool,
    #[command(flatten)]
    target: OperateArgs,
}

/// The options of `baton resume`.
#[derive(clap::Args)]
pub struct ResumeArgs {
    /// The job's name (its file's stem).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    job: Option<String>,
    /// Every paused job of the namespace.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    target: OperateArgs,
}

/// The options of `baton trigger`.
#[derive(clap::Args)]
pub struct TriggerArgs {
    /// The job's name (its file's stem).
    job: String,
    #[command(flatten)]
    target: OperateArgs,
}

/// The user who runs this command: `$USER`, else `$LOGNAME`, else `unknown`.
fn user() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned())
}

impl OperateArgs {
    async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        store::open(&self.store, &self.namespace)
            .await
            .with_context(|| format!("opening store {}", store::redact(&self.store)))
    }

    fn operator(&self) -> Operator {
        Operator {
            host: hostname(),
            user: user(),
            reason: self.reason.clone(),
        }
    }

    /// The jobs named: every job of the namespace with `all`, else the one given, which the
    /// store must know (it has runs, or is paused).
    async fn jobs(&self, store: &dyn Store, job: Option<&str>) -> anyhow::Result<Vec<String>> {
        let mut known = store.jobs().await.context("listing the store's jobs")?;
        known.extend(store.paused().await?.into_iter().map(|p| p.job));
        known.sort();
        known.dedup();
        match job {
            None => Ok(known),
            Some(job) if known.iter().any(|k| k == job) => Ok(vec![job.to_owned()]),
            Some(job) => bail!(
                "job {job:?} is unknown to store {} in namespace {:?}: it has no runs there; \
                 check the name (`baton runs` lists the jobs the store has), or, for a job that \
                 has never run, use the HTTP API of a node that runs it (POST /api/jobs/{job}/...)",
                store::redact(&self.store),
                self.namespace
            ),
        }
    }
}

/// One line that says what was done: `paused hello at … by alice@box (stop): why`.
pub fn describe(op: &Operation) -> String {
    let mut line = format!(
        "{} {} at {} by {}@{}",
        op.action,
        op.job,
        format_utc(op.at),
        op.user,
        op.host
    );
    if op.stop {
        line.push_str(" (stop)");
    }
    if let Some(reason) = &op.reason {
        line.push_str(": ");
        line.push_str(reason);
    }
    line
}

async fn apply(target: &OperateArgs, job: Option<&str>, request: Request) -> anyhow::Result<()> {
    let store = target.open().await?;
    let by = target.operator();
    for job in target.jobs(&*store, job).await? {
        let outcome = store
            .operate(&job, request, &by)
            .await
            .with_context(|| format!("job {job:?}"))?;
        match outcome {
            OperateOutcome::Done(op) => println!("{}", describe(&op)),
            OperateOutcome::Paused(pause) => bail!(
                "job {job:?} is paused ({}); `baton resume {job}` first",
                describe(&pause)
            ),
        }
    }
    Ok(())
}

/// Pauses one job, or every job of the namespace.
pub async fn pause(args: PauseArgs) -> anyhow::Result<()> {
    let request = Request::Pause { stop: args.stop };
    apply(&args.target, args.job.as_deref(), request).await
}

/// Resumes one job, or every paused job of the namespace.
pub async fn resume(args: ResumeArgs) -> anyhow::Result<()> {
    if !args.all {
        return apply(&args.target, args.job.as_deref(), Request::Resume).await;
    }
    // Every paused job, not every job: resuming one that runs records nothing useful.
    let store = args.target.open().await?;
    let by = args.target.operator();
    for pause in store.paused().await.context("listing the paused jobs")? {
        let outcome = store
            .operate(&pause.job, Request::Resume, &by)
            .await
            .with_context(|| format!("job {:?}", pause.job))?;
        if let OperateOutcome::Done(op) = outcome {
            println!("{}", describe(&op));
        }
    }
    Ok(())
}

/// Records a manual run of a job now; the nodes that run it claim it within a second.
pub async fn trigger(args: TriggerArgs) -> anyhow::Result<()> {
    apply(&args.target, Some(&args.job), Request::Trigger).await
}
