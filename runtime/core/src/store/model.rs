//! The store contract's algorithm on state already loaded, for stores that run it in Rust inside
//! their own atomic step (SQLite). Backends that run it on the server (the Lua scripts of Redis
//! and the functions of PostgreSQL) implement the same steps; the conformance suite holds all of
//! them to it.
//!
//! Each function takes the store's clock reading `now` (ms; a claim also its reading in µs, the
//! floor of a new fence) and returns the outcome together
//! with the records to write back; nothing here does I/O.

use crate::lease::{
    millis, next_fence, Attempt, AttemptOutcome, ClaimKind, ClaimOutcome, ClaimRequest, Finish,
    HeartbeatOutcome, Lease, Run, Status, Token, TokenOutcome,
};
use std::time::Duration;

/// What a claim needs to know of a job, read inside the atomic step.
#[derive(Debug, Default)]
pub(crate) struct ClaimView {
    /// The state of the claimed slot, if it has any.
    pub this: Option<Run>,
    /// The newest slot of the job that has state, if any.
    pub newest_slot: Option<i64>,
    /// Every other run of the job whose status is running (alive or expired).
    pub running: Vec<Run>,
    /// The job's fence counter: the fence of the last won claim (0 before the first).
    pub fence: u64,
    /// The store's clock in microseconds, read with `now`: the floor of a new fence (see
    /// [`next_fence`]).
    pub clock_us: i64,
    /// Whether the job is paused (`baton pause`).
    pub paused: bool,
}

/// What a claim decided: its outcome and the records to write.
#[derive(Debug)]
pub(crate) struct ClaimEffects {
    /// What the claim returns.
    pub outcome: ClaimOutcome,
    /// Runs to insert or replace.
    pub writes: Vec<Run>,
    /// The job's fence counter after the claim.
    pub fence: u64,
    /// Whether the claim created a run, so history is to be trimmed.
    pub created: bool,
}

impl ClaimEffects {
    fn answer(outcome: ClaimOutcome, fence: u64) -> Self {
        ClaimEffects {
            outcome,
            writes: Vec::new(),
            fence,
            created: false,
        }
    }
}

/// Ends the current attempt of an expired run as died (unless it was handed over, whose end is
/// recorded already).
fn end_expired_attempt(run: &mut Run) {
    let lease_end = run.lease_end;
    if let Some(current) = run.attempts.last_mut() {
        if current.outcome.is_none() {
            current.outcome = Some(AttemptOutcome::Died);
            current.ended_at = Some(lease_end);
        }
    }
}

/// Marks an expired run interrupted: its runner is recorded as died, no attempt follows.
fn interrupt(run: &mut Run) {
    end_expired_attempt(run);
    run.status = Status::Interrupted;
}

fn new_attempt(
    req: &ClaimRequest<'_>,
    attempt: u32,
    reason: ClaimKind,
    fence: u64,
    now: i64,
) -> Attempt {
    Attempt {
        attempt,
        runner: req.runner.to_owned(),
        token: req.token,
        reason,
        fence,
        started_at: now,
        ended_at: None,
        outcome: None,
        digest: req.digest.map(str::to_owned),
    }
}

/// The answer to the same claim sent again (its answer was lost): it won already, if the run's
/// live attempt has its token.
fn won_again(run: &Run, now: i64, token: Token) -> Option<ClaimOutcome> {
    (run.is_alive(now) && run.token == token).then_some(ClaimOutcome::Won(Lease {
        attempt: run.attempt,
        token: run.token,
        fence: run.fence,
        lease_end: run.lease_end,
    }))
}

/// The claim algorithm of the store contract, steps 1 and 2 (step 3, the trim, is the store's,
/// when `created` is set).
pub(crate) fn claim(now: i64, req: &ClaimRequest<'_>, view: ClaimView) -> ClaimEffects {
    let lease = millis(req.options.lease);
    let ClaimView {
        this,
        newest_slot,
        running,
        fence,
        clock_us,
        paused,
    } = view;

    // A paused job starts no attempt: only the same claim sent again gets its win back (it
    // won before the pause).
    if paused {
        let outcome = this
            .as_ref()
            .and_then(|run| won_again(run, now, req.token))
            .unwrap_or(ClaimOutcome::Paused);
        return ClaimEffects::answer(outcome, fence);
    }

    // Step 1: the slot has state.
    if let Some(mut run) = this {
        if run.status.is_finished() {
            return ClaimEffects::answer(ClaimOutcome::Finished { status: run.status }, fence);
        }
        if let Some(won) = won_again(&run, now, req.token) {
            return ClaimEffects::answer(won, fence);
        }
        if run.is_alive(now) {
            return ClaimEffects::answer(
                ClaimOutcome::Running {
                    attempt: run.attempt,
                    runner: run.runner.clone(),
                    lease_end: run.lease_end,
                },
                fence,
            );
        }
        // Expired: a takeover, unless a newer run started first or the attempts are used up.
        let newer_exists = newest_slot.is_some_and(|s| s > run.slot);
        end_expired_attempt(&mut run);
        if newer_exists || run.deaths() >= req.options.max_attempts {
            interrupt(&mut run);
            return ClaimEffects {
                outcome: ClaimOutcome::Interrupted,
                writes: vec![run],
                fence,
                created: false,
            };
        }
        let fence = next_fence(fence, clock_us);
        let attempt = run.attempt + 1;
        run.attempt = attempt;
        run.token = req.token;
        run.runner = req.runner.to_owned();
        run.lease_end = now + lease;
        run.released = false;
        run.fence = fence;
        run.attempts
            .push(new_attempt(req, attempt, ClaimKind::Takeover, fence, now));
        return ClaimEffects {
            outcome: ClaimOutcome::Won(Lease {
                attempt,
                token: req.token,
                fence,
                lease_end: run.lease_end,
            }),
            writes: vec![run],
            fence,
            created: false,
        };
    }

    // Step 2: no state.
    if now - req.slot > millis(req.options.lateness_limit(req.kind)) {
        return ClaimEffects::answer(ClaimOutcome::Late, fence);
    }
    if let Some(newer_slot) = newest_slot.filter(|s| *s > req.slot) {
        return ClaimEffects::answer(ClaimOutcome::Superseded { newer_slot }, fence);
    }
    if req.options.overlap == crate::lease::Overlap::Skip {
        if let Some(blocking) = running
            .iter()
            .filter(|r| r.is_alive(now))
            .map(|r| r.slot)
            .min()
        {
            return ClaimEffects::answer(
                ClaimOutcome::Overlap {
                    blocking_slot: blocking,
                },
                fence,
            );
        }
    }
    let mut writes: Vec<Run> = running
        .into_iter()
        .filter(|r| r.slot < req.slot && r.is_expired(now))
        .map(|mut r| {
            interrupt(&mut r);
            r
        })
        .collect();
    let fence = next_fence(fence, clock_us);
    let reason = match req.kind {
        ClaimKind::Takeover => ClaimKind::Scheduled,
        kind => kind,
    };
    let run = Run {
        job: req.job.to_owned(),
        slot: req.slot,
        status: Status::Running,
        attempt: 1,
        token: req.token,
        runner: req.runner.to_owned(),
        lease_end: now + lease,
        released: false,
        fence,
        attempts: vec![new_attempt(req, 1, reason, fence, now)],
    };
    let lease = Lease {
        attempt: 1,
        token: req.token,
        fence,
        lease_end: run.lease_end,
    };
    writes.push(run);
    ClaimEffects {
        outcome: ClaimOutcome::Won(lease),
        writes,
        fence,
        created: true,
    }
}

/// Whether `token` may act on `run`: rules 2 and 4 (current token, running, not released).
fn holds(run: &Run, token: Token) -> bool {
    run.status == Status::Running && run.token == token && !run.released
}

/// Rule 2: a heartbeat extends the lease, only with the current token and only while the lease
/// was not released, and only while it is alive by the store's clock: one that arrives after
/// the lease ran out is refused even when no backup has taken the run over yet.
pub(crate) fn heartbeat(
    now: i64,
    run: Option<Run>,
    token: Token,
    lease: Duration,
) -> (HeartbeatOutcome, Option<Run>) {
    match run {
        Some(mut run) if holds(&run, token) && run.lease_end > now => {
            run.lease_end = now + millis(lease);
            (
                HeartbeatOutcome::Renewed {
                    lease_end: run.lease_end,
                },
                Some(run),
            )
        }
        other => (HeartbeatOutcome::Lost(other.map(|r| r.state())), None),
    }
}

/// Rule 4: finish only with the current token.
pub(crate) fn finish(
    now: i64,
    run: Option<Run>,
    token: Token,
    result: Finish,
) -> (TokenOutcome, Option<Run>) {
    match run {
        Some(mut run) if holds(&run, token) => {
            run.status = result.status();
            run.lease_end = now;
            if let Some(current) = run.attempts.last_mut() {
                current.outcome = Some(result.outcome());
                current.ended_at = Some(now);
            }
            (TokenOutcome::Accepted, Some(run))
        }
        other => (TokenOutcome::Refused(other.map(|r| r.state())), None),
    }
}

/// Rule 4 and the hand-over: release only with the current token; it ends the lease at once and
/// records the attempt as handed over, so it does not count toward `max_attempts`.
pub(crate) fn release(now: i64, run: Option<Run>, token: Token) -> (TokenOutcome, Option<Run>) {
    match run {
        Some(mut run) if holds(&run, token) => {
            run.released = true;
            run.lease_end = now;
            if let Some(current) = run.attempts.last_mut() {
                current.outcome = Some(AttemptOutcome::HandedOver);
                current.ended_at = Some(now);
            }
            (TokenOutcome::Accepted, Some(run))
        }
        other => (TokenOutcome::Refused(other.map(|r| r.state())), None),
    }
}
