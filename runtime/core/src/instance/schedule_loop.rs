//! A job's schedule loop: catch-up on start, then a claim at every slot as it falls due, by the
//! store's clock as this host estimates it.

use std::sync::Arc;
use std::time::Duration;

use super::claim;
use super::job::Job;
use super::shared::Inner;
use crate::event::EventKind;
use crate::lease::{ClaimKind, Run, Status};

/// The random wait before a catch-up claim: up to two heartbeats, at most 2 s.
fn catch_up_jitter(inner: &Inner, job: &Job) -> Duration {
    let max = (job.options.heartbeat * 2).min(Duration::from_secs(2));
    max.mul_f64(inner.env.entropy.unit())
}

/// Catch-up, then a claim at every slot until the instance stops.
pub(super) async fn run(inner: Arc<Inner>, job: Arc<Job>) {
    // Slots that fall due during catch-up are claimed by the loop, not lost.
    let start = inner.link.now();
    catch_up(&inner, &job, start).await;
    let mut cursor = start;
    loop {
        let Some(next) = job.schedule.next_after(cursor) else {
            tracing::info!(job = %job.name, "the schedule has no more slots");
            return;
        };
        let wait = u64::try_from(next - inner.link.now()).unwrap_or(0);
        if inner
            .sleep_or_retired(&job, Duration::from_millis(wait))
            .await
        {
            return;
        }
        // After a long pause (a frozen host), only the latest due slot is claimed.
        let due = job
            .schedule
            .latest_at_or_before(inner.link.now())
            .unwrap_or(next)
            .max(next);
        cursor = due;
        claim::claim_and_handle(&inner, &job, due, ClaimKind::Scheduled).await;
    }
}

/// Catch-up on start: unfinished runs first, then the latest missed slot.
async fn catch_up(inner: &Arc<Inner>, job: &Arc<Job>, now: i64) {
    let unfinished = match inner
        .link
        .retry(
            || inner.store().unfinished(&job.name),
            || inner.is_stopping(),
        )
        .await
    {
        Ok(runs) => runs,
        Err(e) => {
            tracing::error!(job = %job.name, error = %e, "cannot read unfinished runs; no catch-up");
            Vec::new()
        }
    };
    for run in &unfinished {
        let now = inner.link.now();
        if run.lease_end > now {
            back_up(inner, job, run);
        } else if job.schedule.next_after(run.slot).is_some_and(|n| n <= now) {
            tracing::info!(job = %job.name, slot = run.slot, "a newer slot is due; the dead run is left to it");
        } else {
            claim::claim_and_handle(inner, job, run.slot, ClaimKind::Takeover).await;
        }
    }
    let Some(latest) = job.schedule.latest_at_or_before(now) else {
        return;
    };
    let window = crate::lease::millis(job.options.catch_up);
    if now - latest > window || unfinished.iter().any(|r| r.slot >= latest) {
        return;
    }
    match inner
        .link
        .retry(
            || inner.store().get(&job.name, latest),
            || inner.is_stopping(),
        )
        .await
    {
        Ok(None) => {}
        // Claimed by another node since the unfinished runs were read: this node is its backup
        // as every node that knows a live run is, so that it is taken over if its runner dies.
        Ok(Some(run)) if run.status == Status::Running => {
            back_up(inner, job, &run);
            return;
        }
        Ok(Some(_)) => return,
        Err(e) => {
            tracing::error!(job = %job.name, error = %e, "cannot read the latest run; no catch-up");
            return;
        }
    }
    if inner
        .sleep_or_retired(job, catch_up_jitter(inner, job))
        .await
    {
        return;
    }
    claim::claim_and_handle(inner, job, latest, ClaimKind::CatchUp).await;
}

/// Becomes the backup of a live run found on start.
fn back_up(inner: &Arc<Inner>, job: &Arc<Job>, run: &Run) {
    inner.events.emit(
        EventKind::Backup,
        &job.name,
        run.slot,
        Some(run.attempt),
        "catch-up",
    );
    claim::spawn_watch(inner, job, run.slot, ClaimKind::Takeover);
}
