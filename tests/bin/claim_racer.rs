//! A claimer in a process of its own, for the suite's cross-process races.
//!
//! `baton-claim-racer URL NAMESPACE JOB BASE COUNT RUNNER START_AT`: waits until the store's
//! clock reaches START_AT (ms), then claims slot BASE + i of job `JOB-i` for i in 0..COUNT, and
//! prints `won SLOT RUNNER` for every claim it wins.

use std::io::Write;
use std::time::Duration;

use baton_core::lease::{ClaimKind, ClaimOutcome, ClaimRequest, LeaseOptions, Overlap, Token};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, namespace, job, base, count, runner, start_at] = args.as_slice() else {
        anyhow::bail!("usage: baton-claim-racer URL NAMESPACE JOB BASE COUNT RUNNER START_AT");
    };
    let (base, count, start_at): (i64, i64, i64) =
        (base.parse()?, count.parse()?, start_at.parse()?);
    let store = baton_core::store::open(url, namespace).await?;
    while store.now().await? < start_at {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let options = LeaseOptions {
        overlap: Overlap::Allow,
        ..LeaseOptions::default()
    };
    let mut out = std::io::stdout().lock();
    for i in 0..count {
        let job = format!("{job}-{i}");
        let slot = base + i;
        let request = ClaimRequest {
            job: &job,
            slot,
            kind: ClaimKind::Scheduled,
            runner,
            token: Token::random(),
            digest: None,
            options: &options,
        };
        match store.claim(&request).await? {
            ClaimOutcome::Won(_) => writeln!(out, "won {slot} {runner}")?,
            ClaimOutcome::Running { .. } => {}
            other => anyhow::bail!("unexpected answer for slot {slot}: {other:?}"),
        }
    }
    Ok(())
}
