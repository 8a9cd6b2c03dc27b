//! One Baton instance in a process of its own, running a native job, for the instance and fault
//! tests (which kill, freeze and stop it).
//!
//! `baton-test-instance URL NAMESPACE RUNNER JOB CRON LEASE_MS HEARTBEAT_MS WORK_MS`: runs JOB on
//! CRON (UTC) with that lease and heartbeat; each attempt works WORK_MS (or until its signal
//! aborts, when it returns an error). Every event is printed as one JSON line. SIGTERM stops the
//! instance with hand-over (timeout 5 s).

use std::io::Write;
use std::time::Duration;

use baton_core::instance::{handler_fn, Instance, InstanceConfig, Job};
use baton_core::lease::LeaseOptions;
use baton_core::schedule::Schedule;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, namespace, runner, job, cron, lease_ms, heartbeat_ms, work_ms] = args.as_slice()
    else {
        anyhow::bail!("usage: baton-test-instance URL NAMESPACE RUNNER JOB CRON LEASE_MS HEARTBEAT_MS WORK_MS");
    };
    let mut options = LeaseOptions::with_lease(Duration::from_millis(lease_ms.parse()?));
    options.heartbeat = Duration::from_millis(heartbeat_ms.parse()?);
    let work = Duration::from_millis(work_ms.parse()?);
    let handler = handler_fn(move |ctx| async move {
        tokio::select! {
            _ = tokio::time::sleep(work) => Ok(()),
            _ = ctx.signal.aborted() => Err("aborted".to_owned()),
        }
    });
    let config = InstanceConfig {
        store_url: url.clone(),
        namespace: namespace.clone(),
        runner: runner.clone(),
    };
    let jobs = vec![Job {
        name: job.clone(),
        schedule: Schedule::parse(cron, "UTC")?,
        options,
        handler,
    }];
    let instance = Instance::start(config, jobs).await?;
    let mut events = instance.subscribe();
    let printer = tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            let line = serde_json::to_string(&event).unwrap_or_default();
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    });
    println!("{{\"event\":\"ready\"}}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    term.recv().await;
    instance.stop(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    printer.abort();
    Ok(())
}
