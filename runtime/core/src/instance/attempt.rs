//! Running one won attempt: the handler, its heartbeats, fencing, finish and hand-over.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    lock, AbortReason, ActiveAttempt, BootTime, EventKind, Inner, Job, LeaseDeadline, RunContext,
    Signal,
};
use crate::lease::{ClaimKind, Finish, HeartbeatOutcome, Lease, RunState, TokenOutcome};

/// How an attempt ended, as far as this instance is concerned.
enum End {
    /// The handler returned.
    Returned(Result<(), String>),
    /// A heartbeat was refused.
    Lost,
    /// The local lease deadline passed without a renewal.
    Fenced,
    /// Stop gave up on it.
    Abandoned,
}

/// What the instance does about the run once one of its attempts is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Afterwards {
    /// The attempt ended the run (finished it), or handed it over on stop: nothing to watch.
    Done,
    /// The attempt ended without ending the run (lost, self-fenced, its claim answered too
    /// late, or its end not recorded): the instance goes on watching the run as a backup, so
    /// that the run is taken over once its lease runs out, by this instance or another.
    Watch,
}

/// Starts an attempt on the engine runtime; its handler runs on the work runtime.
pub(super) fn spawn(
    inner: Arc<Inner>,
    job: Arc<Job>,
    slot: i64,
    lease: Lease,
    reason: ClaimKind,
    claim_sent: Option<BootTime>,
) {
    let signal = Signal::new();
    let abandon = Arc::new(Notify::new());
    let key = (job.name.clone(), slot);
    lock(&inner.attempts).insert(
        key.clone(),
        ActiveAttempt {
            signal: signal.clone(),
            abandon: abandon.clone(),
        },
    );
    if inner.is_stopping() {
        signal.abort(AbortReason::Stopping);
    }
    let task_inner = inner.clone();
    inner.spawn(async move {
        let inner = task_inner;
        let afterwards = run(
            &inner, &job, slot, lease, reason, claim_sent, signal, abandon,
        )
        .await;
        lock(&inner.attempts).remove(&key);
        inner.attempt_ended.notify_waiters();
        if afterwards == Afterwards::Watch && !inner.is_stopping() {
            super::job::spawn_watch(&inner, &job, slot, ClaimKind::Takeover);
        }
    });
}

#[allow(clippy::too_many_arguments)]
async fn run(
    inner: &Arc<Inner>,
    job: &Arc<Job>,
    slot: i64,
    lease: Lease,
    reason: ClaimKind,
    claim_sent: Option<BootTime>,
    signal: Signal,
    abandon: Arc<Notify>,
) -> Afterwards {
    let name = &job.name;
    // The lease holds until the claim's send time + lease; a win whose claim was sent earlier
    // than this instance knows (`None`: a claim sent again) is renewed before it runs.
    let at = claim_sent.map_or(BootTime::from_nanos(0), |sent| {
        sent.after(job.options.lease)
    });
    let deadline = LeaseDeadline::on_clock(at, inner.env.clock.clone());
    if deadline.has_passed() && !renew_late_claim(inner, job, slot, &lease, &deadline).await {
        return Afterwards::Watch;
    }
    let ctx = RunContext {
        job: name.clone(),
        slot,
        attempt: lease.attempt,
        reason,
        runner: inner.runner.clone(),
        fence: lease.fence,
        signal: signal.clone(),
        deadline: deadline.clone(),
        state: Some(crate::state::StateHandle::new(
            inner.store.clone(),
            name,
            slot,
            lease.token,
            signal.clone(),
            deadline.clone(),
        )),
    };
    inner.events.emit(
        EventKind::Started,
        name,
        slot,
        Some(lease.attempt),
        reason.as_str(),
    );
    let handler = job.handler.clone();
    let mut task = inner.work.spawn(async move { handler.run(ctx).await });

    let renewing = Arc::new(AtomicBool::new(true));
    let lost = Arc::new(Notify::new());
    let heartbeats = inner.spawn(heartbeat_loop(
        inner.clone(),
        job.clone(),
        slot,
        lease,
        deadline.clone(),
        renewing.clone(),
        lost.clone(),
    ));

    let end = tokio::select! {
        biased;
        joined = &mut task => End::Returned(match joined {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err("the handler panicked".to_owned()),
            Err(_) => Err("the handler was cancelled".to_owned()),
        }),
        _ = lost.notified() => End::Lost,
        _ = fence_timer(&deadline) => End::Fenced,
        _ = abandon.notified() => End::Abandoned,
    };
    renewing.store(false, Ordering::Release);
    heartbeats.abort();

    match end {
        End::Returned(result) => {
            // The lease may have run out while the handler returned, or a host watchdog may
            // have fenced the attempt (e.g. on waking from a freeze) before a late heartbeat
            // moved the deadline again: either way nothing it returns may change the run.
            if deadline.has_passed() || signal.reason() == Some(AbortReason::Fenced) {
                fence(inner, name, slot, &lease, &signal, AbortReason::Fenced);
                return Afterwards::Watch;
            }
            // The store refused one of the attempt's state writes: it is no longer the current
            // attempt of a live run, so it is lost, whatever its handler returned.
            if signal.reason() == Some(AbortReason::Lost) {
                fence(inner, name, slot, &lease, &signal, AbortReason::Lost);
                return Afterwards::Watch;
            }
            settle(inner, job, slot, &lease, &signal, &deadline, result).await
        }
        End::Lost => {
            fence(inner, name, slot, &lease, &signal, AbortReason::Lost);
            wait_for_handler(task, &abandon).await;
            Afterwards::Watch
        }
        End::Fenced => {
            fence(inner, name, slot, &lease, &signal, AbortReason::Fenced);
            wait_for_handler(task, &abandon).await;
            Afterwards::Watch
        }
        End::Abandoned => {
            // The signal aborted with StopTimeout: a handler that can be interrupted ends now,
            // and its lease is released so a backup takes over within two heartbeats.
            match tokio::time::timeout(super::STOP_GRACE, &mut task).await {
                Ok(_) if !deadline.has_passed() => {
                    release_after_stop_timeout(inner, name, slot, &lease, &deadline).await;
                }
                Ok(_) => fence(inner, name, slot, &lease, &signal, AbortReason::Fenced),
                Err(_) => {
                    task.abort();
                    tracing::warn!(job = %name, slot, attempt = lease.attempt,
                        "still running after the stop timeout: no longer renewed; a backup takes over when the lease runs out");
                }
            }
            Afterwards::Done
        }
    }
}

/// A claim answered after its local deadline, or a win got back by a claim sent again with its
/// token (its lease began when the lost claim arrived, which this instance never saw): the store
/// gave this instance the attempt, but the lease it knows of may already have run out, so the
/// handler must not start on it. Rather than
/// let the attempt die unstarted (a death that counts toward `max_attempts`, and a takeover only
/// once the lease runs out), the instance renews at once: a heartbeat whose own send time starts
/// a new local deadline, as every heartbeat's does. The store accepts it only with the current
/// token of a lease not released (rule 2), so a run that another attempt holds by now is never
/// run twice (rule 4 stands). If the store renews it, the attempt runs; if it refuses, the
/// attempt is lost. A renewal that fails is sent again, each with its own send time; if none
/// is answered within a lease, the attempt releases its lease (a hand-over: it does not count,
/// and the next takeover need not wait for the lease to run out); when that fails too, the
/// lease runs out as after any death. Returns whether to run.
async fn renew_late_claim(
    inner: &Inner,
    job: &Job,
    slot: i64,
    lease: &Lease,
    deadline: &LeaseDeadline,
) -> bool {
    let name = &job.name;
    let patience = job.options.lease;
    tracing::info!(job = %name, slot, attempt = lease.attempt,
        "the claim was answered after its local lease deadline, or its win came back to a claim sent again; renewing the lease before the handler starts");
    // A renewal that fails is sent again (the store may be reconnecting the leases' connection
    // as it comes back), each with its own send time, for up to one lease.
    let give_up = Instant::now() + patience;
    loop {
        let sent = Instant::now();
        let sent_on_lease_clock = inner.env.clock.lease_now();
        let left = give_up.saturating_duration_since(sent);
        if left.is_zero() {
            break;
        }
        let renewal = inner
            .store
            .heartbeat(name, slot, lease.token, job.options.lease);
        match tokio::time::timeout(left, inner.observed(renewal)).await {
            Ok(Ok(HeartbeatOutcome::Renewed { .. })) => {
                deadline.extend_to(sent_on_lease_clock.after(job.options.lease));
                if !deadline.has_passed() {
                    return true;
                }
                break;
            }
            Ok(Ok(HeartbeatOutcome::Lost(_))) => {
                inner
                    .events
                    .emit(EventKind::Lost, name, slot, Some(lease.attempt), "refused");
                return false;
            }
            Ok(Err(e)) if e.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(50).min(left)).await;
            }
            Ok(Err(_)) => break,
            Err(_) => {
                inner.store_failed(&"no answer to a heartbeat within the lease");
                break;
            }
        }
    }
    let release = inner.store.release(name, slot, lease.token);
    match tokio::time::timeout(patience, inner.observed(release)).await {
        Ok(Ok(TokenOutcome::Accepted)) => {
            inner.events.emit(
                EventKind::Released,
                name,
                slot,
                Some(lease.attempt),
                "late-claim",
            );
        }
        Ok(Ok(TokenOutcome::Refused(_))) => {
            inner
                .events
                .emit(EventKind::Lost, name, slot, Some(lease.attempt), "refused");
        }
        _ => inner.events.emit(
            EventKind::Lost,
            name,
            slot,
            Some(lease.attempt),
            "self-fenced",
        ),
    }
    false
}

/// After a lost or fenced attempt: the handler may still run (it should watch its signal);
/// nothing it does changes the run. Waits for it so that `stop` sees it end.
async fn wait_for_handler(mut task: tokio::task::JoinHandle<Result<(), String>>, abandon: &Notify) {
    tokio::select! {
        biased;
        _ = &mut task => {}
        _ = abandon.notified() => task.abort(),
    }
}

/// Releases the lease of an attempt whose handler was stopped at the stop timeout: a hand-over.
/// A release that fails on the way (a busy or restarting store) is sent again every 100 ms
/// while the lease lasts; a refusal that shows the run released at this attempt is an earlier
/// release of ours whose answer was lost. When none is answered within the lease, the lease
/// runs out as after any death.
async fn release_after_stop_timeout(
    inner: &Inner,
    job: &str,
    slot: i64,
    lease: &Lease,
    deadline: &LeaseDeadline,
) {
    loop {
        let answer = inner
            .observed(inner.store.release(job, slot, lease.token))
            .await;
        let released = match answer {
            Ok(TokenOutcome::Accepted) => true,
            Ok(TokenOutcome::Refused(Some(state))) => {
                state.attempt == lease.attempt && state.released
            }
            Ok(TokenOutcome::Refused(None)) => false,
            Err(e) if e.is_retryable() && !deadline.has_passed() => {
                tracing::debug!(job = %job, slot, error = %e, "cannot release the lease after the stop timeout; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(job = %job, slot, error = %e,
                    "cannot release the lease after the stop timeout; a backup takes over when it runs out");
                return;
            }
        };
        if released {
            inner.events.emit(
                EventKind::Released,
                job,
                slot,
                Some(lease.attempt),
                "stop-timeout",
            );
        } else {
            inner
                .events
                .emit(EventKind::Lost, job, slot, Some(lease.attempt), "refused");
        }
        return;
    }
}

/// Aborts the signal and emits `lost`, once.
fn fence(inner: &Inner, job: &str, slot: i64, lease: &Lease, signal: &Signal, why: AbortReason) {
    signal.abort(why);
    let reason = match why {
        AbortReason::Lost => "refused",
        _ => "self-fenced",
    };
    inner
        .events
        .emit(EventKind::Lost, job, slot, Some(lease.attempt), reason);
}

/// Resolves when the local lease deadline has passed (it may move forward meanwhile). The timer
/// runs on the monotonic clock, which stands still while the machine is suspended, so it wakes
/// at least every [`FENCE_CHECK`] to read the deadline's own clock, which does not.
async fn fence_timer(deadline: &LeaseDeadline) {
    loop {
        tokio::time::sleep(deadline.remaining().min(FENCE_CHECK)).await;
        if deadline.has_passed() {
            return;
        }
    }
}

/// Renews the lease every heartbeat. Each heartbeat is sent on its own, so one that hangs does
/// not hold back the next (at most [`MAX_IN_FLIGHT`] at once); a renewal moves the local deadline
/// to its send time + lease. A refused heartbeat notifies `lost`; an I/O error is only logged,
/// and the local deadline fences the attempt if no heartbeat gets through.
async fn heartbeat_loop(
    inner: Arc<Inner>,
    job: Arc<Job>,
    slot: i64,
    lease: Lease,
    deadline: LeaseDeadline,
    renewing: Arc<AtomicBool>,
    lost: Arc<Notify>,
) {
    let every = job.options.heartbeat;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut next = Instant::now() + every;
    loop {
        tokio::time::sleep_until(next).await;
        // A tick missed by a long pause is not sent twice.
        next = (next + every).max(Instant::now());
        if !renewing.load(Ordering::Acquire) {
            return;
        }
        if in_flight.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
            continue;
        }
        in_flight.fetch_add(1, Ordering::AcqRel);
        let (inner, job, deadline, renewing, lost, in_flight) = (
            inner.clone(),
            job.clone(),
            deadline.clone(),
            renewing.clone(),
            lost.clone(),
            in_flight.clone(),
        );
        let task_inner = inner.clone();
        task_inner.spawn(async move {
            let sent = Instant::now();
            let sent_on_lease_clock = inner.env.clock.lease_now();
            let patience = deadline.remaining();
            let call = inner
                .store
                .heartbeat(&job.name, slot, lease.token, job.options.lease);
            let answer = tokio::time::timeout(patience, inner.observed(call)).await;
            if let Ok(Ok(_)) = &answer {
                inner.metrics.heartbeat_latency(sent.elapsed());
            }
            match answer {
                Ok(Ok(HeartbeatOutcome::Renewed { .. })) => {
                    if renewing.load(Ordering::Acquire) {
                        deadline.extend_to(sent_on_lease_clock.after(job.options.lease));
                    }
                }
                Ok(Ok(HeartbeatOutcome::Lost(state))) => {
                    tracing::warn!(job = %job.name, slot, attempt = lease.attempt, ?state, "heartbeat refused");
                    lost.notify_one();
                }
                Ok(Err(e)) => {
                    // A retryable failure is part of a store outage, logged once as such.
                    if !e.is_retryable() {
                        tracing::warn!(job = %job.name, slot, error = %e, "heartbeat failed; the next one retries");
                    }
                }
                Err(_) if !patience.is_zero() => {
                    inner.store_failed(&"no answer to a heartbeat before the lease deadline");
                }
                Err(_) => {}
            }
            in_flight.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// How often at most a running attempt reads its lease deadline while waiting for it: 1 s, so
/// a runner woken from a suspend fences itself within a second.
const FENCE_CHECK: Duration = Duration::from_secs(1);

/// How many heartbeats of one attempt may wait for an answer at once: 3.
const MAX_IN_FLIGHT: usize = 3;

/// The handler returned: release on an error after stop began (a hand-over), finish otherwise.
async fn settle(
    inner: &Arc<Inner>,
    job: &Arc<Job>,
    slot: i64,
    lease: &Lease,
    signal: &Signal,
    deadline: &LeaseDeadline,
    result: Result<(), String>,
) -> Afterwards {
    let name = &job.name;
    let hand_over = result.is_err()
        && matches!(
            signal.reason(),
            Some(AbortReason::Stopping | AbortReason::StopTimeout)
        );
    let finish = if result.is_ok() {
        Finish::Success
    } else {
        Finish::Failed
    };
    // Only this attempt's token can end it, so a refusal that shows the run ended as we asked,
    // at our attempt, is our own earlier call whose answer was lost (a retry after a timeout).
    let ours = |state: &RunState| {
        state.attempt == lease.attempt
            && if hand_over {
                state.released
            } else {
                state.status == finish.status()
            }
    };
    loop {
        let answer = if hand_over {
            inner
                .observed(inner.store.release(name, slot, lease.token))
                .await
        } else {
            inner
                .observed(inner.store.finish(name, slot, lease.token, finish))
                .await
        };
        match answer {
            Ok(outcome) => {
                let accepted = match &outcome {
                    TokenOutcome::Accepted => true,
                    TokenOutcome::Refused(Some(state)) => ours(state),
                    TokenOutcome::Refused(None) => false,
                };
                if !accepted {
                    fence(inner, name, slot, lease, signal, AbortReason::Lost);
                    return Afterwards::Watch;
                }
                let (kind, reason) = match (&result, hand_over) {
                    (_, true) => (EventKind::Released, "stopping"),
                    (Ok(()), false) => (EventKind::Success, ""),
                    (Err(msg), false) => (EventKind::Failed, msg.as_str()),
                };
                inner
                    .events
                    .emit(kind, name, slot, Some(lease.attempt), reason);
                return Afterwards::Done;
            }
            Err(e) if !deadline.has_passed() => {
                tracing::debug!(job = %name, slot, error = %e, "cannot record the end of the run; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                tracing::error!(job = %name, slot, error = %e,
                    "cannot record the end of the run before the lease ran out; a backup will run it again");
                fence(inner, name, slot, lease, signal, AbortReason::Fenced);
                return Afterwards::Watch;
            }
        }
    }
}
