//! Running one won attempt: the handler on the work runtime, its lease kept by the lease
//! keeper, fencing, and the run's end: finish, or hand-over on stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::handler::RunContext;
use super::job::Job;
use super::lease_keeper::{self, LeaseKeeper};
use super::shared::Inner;
use crate::event::EventKind;
use crate::fence::{AbortReason, LeaseDeadline, Signal};
use crate::lease::{ClaimKind, Finish, Lease, RunState, TokenOutcome};

/// How long a handler may take to end once its signal aborts at the stop timeout before its
/// lease is left to run out instead of released: 500 ms.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

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
pub(super) enum Afterwards {
    /// The attempt ended the run (finished it), or handed it over on stop: nothing to watch.
    Done,
    /// The attempt ended without ending the run (lost, self-fenced, its claim answered too
    /// late, or its end not recorded): the instance goes on watching the run as a backup, so
    /// that the run is taken over once its lease runs out, by this instance or another.
    Watch,
}

/// Starts an attempt on the engine runtime; its handler runs on the work runtime. Once it is
/// over, `then` is told what the instance does about the run.
pub(super) fn spawn(
    inner: &Arc<Inner>,
    job: &Arc<Job>,
    slot: i64,
    lease: Lease,
    reason: ClaimKind,
    claim_sent: Option<crate::env::BootTime>,
    then: impl FnOnce(Afterwards) + Send + 'static,
) {
    let signal = Signal::new();
    let abandon = Arc::new(Notify::new());
    inner
        .attempts
        .begin(&job.name, slot, signal.clone(), abandon.clone());
    if inner.is_stopping() {
        signal.abort(AbortReason::Stopping);
    }
    let (task_inner, job) = (inner.clone(), job.clone());
    inner.spawn(async move {
        let inner = task_inner;
        let afterwards = run(
            &inner, &job, slot, lease, reason, claim_sent, signal, abandon,
        )
        .await;
        inner.attempts.end(&job.name, slot);
        then(afterwards);
    });
}

#[allow(clippy::too_many_arguments)]
async fn run(
    inner: &Arc<Inner>,
    job: &Arc<Job>,
    slot: i64,
    lease: Lease,
    reason: ClaimKind,
    claim_sent: Option<crate::env::BootTime>,
    signal: Signal,
    abandon: Arc<Notify>,
) -> Afterwards {
    let name = &job.name;
    let deadline = lease_keeper::deadline_of(inner, job, claim_sent);
    if deadline.has_passed()
        && !lease_keeper::renew_late_claim(inner, job, slot, &lease, &deadline).await
    {
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
        state: Some(crate::state_handle::StateHandle::new(
            inner.store().clone(),
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
    let mut task = inner.life.spawn_work(async move { handler.run(ctx).await });
    let keeper = LeaseKeeper::start(inner, job, slot, lease, deadline.clone());

    let end = tokio::select! {
        biased;
        joined = &mut task => End::Returned(match joined {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err("the handler panicked".to_owned()),
            Err(_) => Err("the handler was cancelled".to_owned()),
        }),
        () = keeper.lost() => End::Lost,
        () = keeper.fenced() => End::Fenced,
        _ = abandon.notified() => End::Abandoned,
    };
    keeper.stop();

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
            match tokio::time::timeout(STOP_GRACE, &mut task).await {
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
            .link
            .observed(inner.store().release(job, slot, lease.token))
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
                .link
                .observed(inner.store().release(name, slot, lease.token))
                .await
        } else {
            inner
                .link
                .observed(inner.store().finish(name, slot, lease.token, finish))
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
