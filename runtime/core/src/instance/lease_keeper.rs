//! An attempt's lease keeper: it renews the lease every heartbeat, moves the attempt's local
//! deadline with each renewal's send time, tells the attempt when a heartbeat is refused (lost)
//! or the deadline passes unrenewed (self-fenced), and renews a claim answered too late before
//! its handler starts.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::job::Job;
use super::shared::Inner;
use crate::env::BootTime;
use crate::event::EventKind;
use crate::fence::LeaseDeadline;
use crate::lease::{HeartbeatOutcome, Lease, TokenOutcome};

/// The heartbeats of one attempt, from its start to its end.
pub(super) struct LeaseKeeper {
    deadline: LeaseDeadline,
    /// Cleared once the attempt is over: a renewal answered later no longer moves the deadline.
    renewing: Arc<AtomicBool>,
    /// Notified when a heartbeat is refused.
    lost: Arc<Notify>,
    heartbeats: JoinHandle<()>,
}

/// The local deadline of a won lease: the claim's send time + lease, on the instance's lease
/// clock. A win whose claim was sent earlier than this instance knows (`None`: a claim sent
/// again, whose lost first send started the lease) is taken as passed, so it is renewed before
/// it runs ([`renew_late_claim`]).
pub(super) fn deadline_of(inner: &Inner, job: &Job, claim_sent: Option<BootTime>) -> LeaseDeadline {
    let at = claim_sent.map_or(BootTime::from_nanos(0), |sent| {
        sent.after(job.options.lease)
    });
    LeaseDeadline::on_clock(at, inner.env.clock.clone())
}

impl LeaseKeeper {
    /// Starts renewing `lease` every heartbeat, moving `deadline`.
    pub(super) fn start(
        inner: &Arc<Inner>,
        job: &Arc<Job>,
        slot: i64,
        lease: Lease,
        deadline: LeaseDeadline,
    ) -> LeaseKeeper {
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
        LeaseKeeper {
            deadline,
            renewing,
            lost,
            heartbeats,
        }
    }

    /// Resolves once a heartbeat was refused: another attempt holds the run (fencing).
    pub(super) async fn lost(&self) {
        self.lost.notified().await;
    }

    /// Resolves once the local deadline has passed without a renewal (see [`fence_timer`]).
    pub(super) async fn fenced(&self) {
        fence_timer(&self.deadline).await;
    }

    /// Stops renewing: the attempt is over.
    pub(super) fn stop(self) {
        self.renewing.store(false, Ordering::Release);
        self.heartbeats.abort();
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
pub(super) async fn renew_late_claim(
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
            .store()
            .heartbeat(name, slot, lease.token, job.options.lease);
        match tokio::time::timeout(left, inner.link.observed(renewal)).await {
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
                inner
                    .link
                    .failed(&"no answer to a heartbeat within the lease");
                break;
            }
        }
    }
    let release = inner.store().release(name, slot, lease.token);
    match tokio::time::timeout(patience, inner.link.observed(release)).await {
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
                .store()
                .heartbeat(&job.name, slot, lease.token, job.options.lease);
            let answer = tokio::time::timeout(patience, inner.link.observed(call)).await;
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
                    inner.link.failed(&"no answer to a heartbeat before the lease deadline");
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
