//! Claims and the backups' checks: a claim sent for a slot and acted on as the spec says (won:
//! the attempt starts; running: this instance becomes a backup; overlap, late, superseded,
//! interrupted, finished, paused), and the watches that check a run as its backup and send a
//! takeover claim, or a claim whose answer was lost, again.

use std::sync::Arc;

use super::attempt::{self, Afterwards};
use super::job::Job;
use super::shared::Inner;
use crate::event::EventKind;
use crate::lease::{ClaimKind, ClaimOutcome, ClaimRequest, Status, Token};
use crate::store::StoreError;

/// Sends a claim (retried with the same token, so a retry cannot win twice) and acts on the
/// answer as the spec says. A claim that still fails with an error worth retrying is not
/// dropped: the instance watches the slot as a backup, and its next check sends the claim
/// again, until the store answers it.
pub(super) async fn claim_and_handle(
    inner: &Arc<Inner>,
    job: &Arc<Job>,
    slot: i64,
    kind: ClaimKind,
) {
    claim_with(inner, job, slot, kind, inner.token(), false).await;
}

/// [`claim_and_handle`] with a given token: a fresh one, or the token of a claim whose answer
/// never came. A claim can take effect in the store and its answer still be lost (a response
/// timeout while the store fails over, a connection cut after the write); sent again with the
/// same token it gets that win back, instead of finding its win held under a token it no longer
/// knows and leaving the run unattended until that lease runs out.
///
/// A win got back so (`resent`) is as old as the lost claim's arrival, which this instance never
/// saw: the store answers it with the lease that claim started, not one from this send. Its
/// local deadline is therefore taken as passed, and the attempt renews its lease before the
/// handler starts, as a claim answered late does.
async fn claim_with(
    inner: &Arc<Inner>,
    job: &Arc<Job>,
    slot: i64,
    kind: ClaimKind,
    token: Token,
    resent: bool,
) {
    if inner.is_stopping() {
        return;
    }
    inner.watches.saw_claimed(&job.name, slot);
    let digest = job.handler.digest();
    let sent = inner.env.clock.lease_now();
    let request = ClaimRequest {
        job: &job.name,
        slot,
        kind,
        runner: &inner.runner,
        token,
        digest: digest.as_deref(),
        options: &job.options,
    };
    // Each send after the first follows one that failed, and a claim that failed on the way may
    // still arrive: while it could, a skipped slot is watched for it (see below).
    let mut sends = 0u32;
    let outcome = match inner
        .link
        .retry(
            || {
                sends += 1;
                inner.store().claim(&request)
            },
            || inner.is_stopping(),
        )
        .await
    {
        Ok(outcome) => outcome,
        Err(e @ StoreError::NotAcknowledged { .. }) => {
            // Won on a primary whose replicas do not hold the win: a failover could lose it and
            // hand the run to another runner as well, so the job does not start on it. The
            // release (a hand-over) lets a backup claim it again; should it fail, the lease
            // runs out. Either way this instance goes on watching the run as a backup, so the
            // run is not orphaned when every runner's claim ends so.
            tracing::warn!(job = %job.name, slot, error = %e, "claim not acknowledged by the store's replicas; not running it");
            inner
                .events
                .emit(EventKind::Skip, &job.name, slot, None, "not-acknowledged");
            if let Err(e) = inner.store().release(&job.name, slot, token).await {
                tracing::warn!(job = %job.name, slot, error = %e, "cannot release the claim that was not acknowledged; its lease runs out");
            }
            spawn_watch(inner, job, slot, ClaimKind::Takeover);
            return;
        }
        Err(e) if e.is_retryable() => {
            tracing::debug!(job = %job.name, slot, error = %e, "claim failed; sent again with its token at the next backup check");
            watch(inner, job, slot, kind, Some(token));
            return;
        }
        Err(e) => {
            tracing::error!(job = %job.name, slot, error = %e, "claim failed");
            return;
        }
    };
    let name = &job.name;
    if matches!(
        outcome,
        ClaimOutcome::Won(_) | ClaimOutcome::Running { .. } | ClaimOutcome::Finished { .. }
    ) {
        inner.watches.saw_started(name, slot);
    }
    match outcome {
        ClaimOutcome::Won(lease) => {
            // A lease won before stop began is still run; stop then aborts it at once.
            inner.events.emit(
                EventKind::Won,
                name,
                slot,
                Some(lease.attempt),
                kind.as_str(),
            );
            let reason = if lease.attempt > 1 {
                inner.events.emit(
                    EventKind::Takeover,
                    name,
                    slot,
                    Some(lease.attempt),
                    kind.as_str(),
                );
                ClaimKind::Takeover
            } else {
                kind
            };
            let sent = (!resent).then_some(sent);
            let (watcher, watched) = (inner.clone(), job.clone());
            attempt::spawn(inner, job, slot, lease, reason, sent, move |afterwards| {
                // An attempt that ended without ending the run leaves it watched.
                if afterwards == Afterwards::Watch && !watcher.is_stopping() {
                    spawn_watch(&watcher, &watched, slot, ClaimKind::Takeover);
                }
            });
        }
        ClaimOutcome::Running { attempt, .. } => {
            if kind != ClaimKind::Takeover {
                inner
                    .events
                    .emit(EventKind::Backup, name, slot, Some(attempt), kind.as_str());
            }
            spawn_watch(inner, job, slot, ClaimKind::Takeover);
        }
        ClaimOutcome::Overlap { blocking_slot } => {
            inner
                .events
                .emit(EventKind::Skip, name, slot, None, "overlap");
            spawn_watch(inner, job, blocking_slot, ClaimKind::Takeover);
            // An earlier send of this claim that went unanswered may still arrive after the
            // blocking run ended and win the slot for a token nobody runs: until it would be
            // too late to, the slot stays watched.
            let in_flight = (resent || sends > 1).then(|| InFlight {
                until: slot
                    + crate::lease::millis(
                        job.options.lateness_limit(kind) + 2 * job.options.heartbeat,
                    ),
                token,
                kind,
            });
            spawn_watch_skipped(inner, job, slot, blocking_slot, in_flight);
        }
        ClaimOutcome::Late => inner
            .events
            .emit(EventKind::Late, name, slot, None, kind.as_str()),
        ClaimOutcome::Superseded { .. } => {
            inner
                .events
                .emit(EventKind::Skip, name, slot, None, "superseded")
        }
        ClaimOutcome::Interrupted => {
            inner
                .events
                .emit(EventKind::Interrupted, name, slot, None, kind.as_str())
        }
        ClaimOutcome::Finished { status } => {
            tracing::debug!(job = %name, slot, %status, "the run has ended");
        }
        // No attempt starts, and a run another node holds is not watched: its runner goes on
        // to its end, and a dead one is not taken over while the job is paused.
        ClaimOutcome::Paused => inner
            .events
            .emit(EventKind::Skip, name, slot, None, "paused"),
    }
}

/// Becomes a backup of a run: checks it after a random time in [heartbeat, 2 × heartbeat]
/// with a claim of `kind` (a takeover claim, or the claim of the slot that failed and is sent
/// again), until the run ends, this instance wins it, or a newer slot of the job has started
/// (the store would answer the takeover interrupted: nothing is left to take over, and the
/// newer run's claim interrupts the run if its lease has run out).
///
/// A check answered running arms the next one; so does a check that fails for a store error,
/// and so does an attempt of this instance that ends without ending the run (lost, self-fenced,
/// or its claim answered too late): whoever has seen a run, and not seen it end, watches it.
pub(super) fn spawn_watch(inner: &Arc<Inner>, job: &Arc<Job>, slot: i64, kind: ClaimKind) {
    watch(inner, job, slot, kind, None);
}

/// [`spawn_watch`], whose claim is sent with `resend`'s token when given (a claim whose answer
/// never came), else with a fresh one.
fn watch(inner: &Arc<Inner>, job: &Arc<Job>, slot: i64, kind: ClaimKind, resend: Option<Token>) {
    if !inner.watches.begin(&job.name, slot) {
        return;
    }
    let task_inner = inner.clone();
    let job = job.clone();
    inner.spawn(async move {
        let inner = task_inner;
        let stopping = inner.sleep_or_stop(inner.backup_delay(&job)).await;
        // Let go of the watch before the claim: the claim, or the attempt it wins, arms the
        // next one.
        inner.watches.end(&job.name, slot);
        if stopping || inner.attempts.is_running(&job.name, slot) {
            return;
        }
        if inner.watches.newer_started(&job.name, slot) {
            tracing::debug!(job = %job.name, slot, "a newer slot has started; no takeover to watch for");
            return;
        }
        // A claim that went unanswered yields to a newer slot's claim: the newer run comes
        // first, and a win the older claim may have had is interrupted by it, or taken over
        // through the newer claim's own watch of it while its lease lives.
        if resend.is_some() && inner.watches.newer_claimed(&job.name, slot) {
            tracing::debug!(job = %job.name, slot, "a newer slot's claim is out; this one is not sent again");
            return;
        }
        // A takeover runs the job's current version; a removed job is no longer watched.
        let Some(job) = inner.jobs.current(&job.name) else {
            return;
        };
        claim_with(
            &inner,
            &job,
            slot,
            kind,
            resend.unwrap_or_else(|| inner.token()),
            resend.is_some(),
        )
        .await;
    });
}

/// A claim of this instance's that went unanswered and may still arrive.
#[derive(Clone, Copy)]
struct InFlight {
    /// After this (store clock, ms, with two heartbeats to spare) the store answers it late.
    until: i64,
    /// Its token.
    token: Token,
    /// Its kind.
    kind: ClaimKind,
}

/// Keeps an eye on a slot skipped as an overlap: if another instance claims it after the
/// earlier run ended, this instance becomes its backup; once a newer slot of the job has
/// started, there is nothing left to watch. Once the blocking run has ended and the slot has
/// no run, the watch ends, unless a claim of this instance's may still arrive: then it goes on
/// until the store would answer it late, and should it win, the claim is sent again with its
/// token so this instance gets its win back and runs it.
fn spawn_watch_skipped(
    inner: &Arc<Inner>,
    job: &Arc<Job>,
    slot: i64,
    blocking: i64,
    in_flight: Option<InFlight>,
) {
    let task_inner = inner.clone();
    let job = job.clone();
    inner.spawn(async move {
        let inner = task_inner;
        let mut blocking_ended = false;
        loop {
            if inner.sleep_or_stop(inner.backup_delay(&job)).await {
                return;
            }
            // A newer slot has started: a claim of this one could only be superseded, and
            // a run of it (if another instance won it) could not be taken over.
            if inner.watches.newer_started(&job.name, slot) {
                return;
            }
            let Some(job) = inner.jobs.current(&job.name) else {
                return;
            };
            match inner
                .link
                .observed(inner.store().get(&job.name, slot))
                .await
            {
                Ok(Some(run))
                    if run.status == Status::Running
                        && in_flight.is_some_and(|f| f.token == run.token) =>
                {
                    // Our claim that went unanswered arrived after all: get the win back.
                    if let Some(f) = in_flight {
                        watch(&inner, &job, slot, f.kind, Some(f.token));
                    }
                    return;
                }
                Ok(Some(run)) if run.status == Status::Running => {
                    inner.events.emit(
                        EventKind::Backup,
                        &job.name,
                        slot,
                        Some(run.attempt),
                        "overlap",
                    );
                    spawn_watch(&inner, &job, slot, ClaimKind::Takeover);
                    return;
                }
                Ok(Some(_)) => return,
                Ok(None)
                    if blocking_ended && in_flight.is_none_or(|f| inner.link.now() > f.until) =>
                {
                    return
                }
                Ok(None) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => tracing::warn!(job = %job.name, slot, error = %e, "check failed"),
            }
            if let Ok(Some(run)) = inner
                .link
                .observed(inner.store().get(&job.name, blocking))
                .await
            {
                blocking_ended = run.status.is_finished();
            }
        }
    });
}
