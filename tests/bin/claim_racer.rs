//! A claimer in a process of its own, for the suite's cross-process races.
//!
//! `baton-claim-racer URL NAMESPACE JOB BASE COUNT RUNNER START_AT`: waits until the store's
//! clock reaches START_AT (ms), then claims slot BASE + i of job `JOB-i` for i in 0..COUNT, and
//! prints `won SLOT RUNNER` for every claim it wins.

use std::io::Write;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, namespace, job, base, count, runner, start_at] = args.as_slice() else {
        anyhow::bail!("usage: baton-claim-racer URL NAMESPACE JOB BASE COUNT RUNNER START_AT");
    };
    let (base, count, start_at): (i64, i64, i64) =
        (base.parse()?, count.parse()?, start_at.parse()?);
    let store = baton_core::store::open(url, namespace).await?;
    let won = baton_tests::race_claims(&*store, job, base, count, runner, start_at).await?;
    let mut out = std::io::stdout().lock();
    for slot in won {
        writeln!(out, "won {slot} {runner}")?;
    }
    Ok(())
}
