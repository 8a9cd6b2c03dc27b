//! The cases of the conformance suite: one per rule and per diagram of `spec/leases.md`, each
//! generic over the store. Every case uses short leases and waits on the store's own clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use baton_core::lease::{
    AttemptOutcome, ClaimKind, ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, Lease,
    LeaseOptions, Overlap, Status, Token, TokenOutcome,
};
use baton_core::store::Store;
use baton_tests::{store_now, unique, wait_past, Fixture};

/// The cases of pause, resume and trigger, in a file of their own.
pub use crate::operate::*;
/// The job state's cases, `state_*`.
pub use crate::state::*;

/// Lease options for tests: a 300 ms lease, 50 ms heartbeat, the spec's other defaults.
pub(crate) fn opts() -> LeaseOptions {
    LeaseOptions::with_lease(Duration::from_millis(300))
}

pub(crate) async fn claim_as(
    store: &dyn Store,
    job: &str,
    slot: i64,
    kind: ClaimKind,
    runner: &str,
    options: &LeaseOptions,
) -> (ClaimOutcome, Token) {
    let token = Token::random();
    let request = ClaimRequest {
        job,
        slot,
        kind,
        runner,
        token,
        digest: Some("sha256:test"),
        options,
    };
    let outcome = store
        .claim(&request)
        .await
        .expect("claim reaches the store");
    (outcome, token)
}

async fn claim(store: &dyn Store, job: &str, slot: i64, runner: &str) -> ClaimOutcome {
    claim_as(store, job, slot, ClaimKind::Scheduled, runner, &opts())
        .await
        .0
}

async fn takeover(store: &dyn Store, job: &str, slot: i64, runner: &str) -> ClaimOutcome {
    claim_as(store, job, slot, ClaimKind::Takeover, runner, &opts())
        .await
        .0
}

pub(crate) fn won(outcome: ClaimOutcome) -> Lease {
    match outcome {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected the claim to win, got {other:?}"),
    }
}

/// A job of its own and a slot one second ago by the store's clock.
pub(crate) async fn job_and_slot(f: &Fixture) -> (String, i64) {
    (unique("job"), store_now(&*f.store).await - 1_000)
}

pub(crate) async fn run_of(store: &dyn Store, job: &str, slot: i64) -> baton_core::lease::Run {
    store
        .get(job, slot)
        .await
        .expect("get reaches the store")
        .expect("the run has state")
}

// ---- Rule 1: a claim for a run with no state wins and gets a lease ----

pub async fn claim_with_no_state_wins_attempt_one(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let before = store_now(&*f.store).await;
    let (outcome, token) = claim_as(
        &*f.store,
        &job,
        slot,
        ClaimKind::Scheduled,
        "api-1",
        &opts(),
    )
    .await;
    let lease = won(outcome);
    assert_eq!(lease.attempt, 1);
    assert_eq!(lease.token, token, "the lease carries the claim's token");
    assert!(lease.lease_end >= before + 300, "lease end is now + lease");
    assert!(lease.lease_end <= store_now(&*f.store).await + 300);
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.status, Status::Running);
    assert_eq!(run.runner, "api-1");
    assert_eq!(run.attempt, 1);
}

pub async fn second_claim_of_the_same_slot_sees_running(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    let other = f.another().await;
    match claim(&*other, &job, slot, "api-2").await {
        ClaimOutcome::Running {
            attempt,
            runner,
            lease_end,
        } => {
            assert_eq!(attempt, 1);
            assert_eq!(runner, "api-1");
            assert_eq!(lease_end, lease.lease_end);
        }
        other => panic!("expected running, got {other:?}"),
    }
}

pub async fn retried_claim_with_the_same_token_returns_the_same_win(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let options = opts();
    let token = Token::random();
    let request = ClaimRequest {
        job: &job,
        slot,
        kind: ClaimKind::Scheduled,
        runner: "api-1",
        token,
        digest: None,
        options: &options,
    };
    let first = won(f.store.claim(&request).await.expect("claim"));
    // The answer was lost on the way back; the client sends the same claim again.
    let again = won(f.store.claim(&request).await.expect("claim"));
    assert_eq!(first.token, again.token);
    assert_eq!(first.attempt, again.attempt);
    assert_eq!(
        first.fence, again.fence,
        "a retry does not win a second time"
    );
    let other = claim(&*f.store, &job, slot, "api-2").await;
    assert!(matches!(other, ClaimOutcome::Running { .. }), "{other:?}");
}

// ---- Rule 2: heartbeats ----

pub async fn heartbeat_with_the_current_token_extends_the_lease(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = store_now(&*f.store).await;
    match f
        .store
        .heartbeat(&job, slot, lease.token, Duration::from_millis(300))
        .await
        .expect("heartbeat reaches the store")
    {
        HeartbeatOutcome::Renewed { lease_end } => {
            assert!(lease_end > lease.lease_end, "the lease end moved forward");
            assert!(lease_end >= before + 300);
        }
        other => panic!("expected renewed, got {other:?}"),
    }
    // Kept alive past the first lease end, the run is still running for others.
    wait_past(&*f.store, lease.lease_end).await;
    assert!(matches!(
        takeover(&*f.store, &job, slot, "api-2").await,
        ClaimOutcome::Running { .. }
    ));
}

pub async fn heartbeats_keep_a_run_alive_longer_than_its_lease(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let hb = f
            .store
            .heartbeat(&job, slot, lease.token, Duration::from_millis(300))
            .await
            .expect("heartbeat");
        assert!(matches!(hb, HeartbeatOutcome::Renewed { .. }), "{hb:?}");
    }
    assert!(matches!(
        takeover(&*f.store, &job, slot, "api-2").await,
        ClaimOutcome::Running { .. }
    ));
}

pub async fn heartbeat_with_an_old_token_is_refused(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let first = won(claim(&*f.store, &job, slot, "api-1").await);
    wait_past(&*f.store, first.lease_end).await;
    let second = won(takeover(&*f.store, &job, slot, "api-2").await);
    let hb = f
        .store
        .heartbeat(&job, slot, first.token, Duration::from_millis(300))
        .await
        .expect("heartbeat reaches the store");
    match hb {
        HeartbeatOutcome::Lost(Some(state)) => {
            assert_eq!(state.attempt, 2);
            assert_eq!(state.status, Status::Running);
        }
        other => panic!("expected lost, got {other:?}"),
    }
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(
        run.lease_end, second.lease_end,
        "a refused heartbeat changed nothing"
    );
}

pub async fn heartbeat_for_a_run_without_state_is_lost(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let hb = f
        .store
        .heartbeat(&job, slot, Token::random(), Duration::from_millis(300))
        .await
        .expect("heartbeat reaches the store");
    assert_eq!(hb, HeartbeatOutcome::Lost(None));
    assert!(f.store.get(&job, slot).await.expect("get").is_none());
}

// ---- Hand-over: release ----

pub async fn release_ends_the_lease_at_once(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    let released = f
        .store
        .release(&job, slot, lease.token)
        .await
        .expect("release");
    assert_eq!(released, TokenOutcome::Accepted);
    // Long before the lease would have run out, a backup takes over.
    let now = store_now(&*f.store).await;
    assert!(now < lease.lease_end, "the test is still inside the lease");
    let next = won(takeover(&*f.store, &job, slot, "api-2").await);
    assert_eq!(next.attempt, 2);
}

pub async fn heartbeat_after_release_does_not_renew(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    f.store
        .release(&job, slot, lease.token)
        .await
        .expect("release");
    // A heartbeat sent before the release arrives after it.
    let hb = f
        .store
        .heartbeat(&job, slot, lease.token, Duration::from_millis(300))
        .await
        .expect("heartbeat");
    match hb {
        HeartbeatOutcome::Lost(Some(state)) => assert!(state.released),
        other => panic!("expected lost, got {other:?}"),
    }
    assert!(
        matches!(
            takeover(&*f.store, &job, slot, "api-2").await,
            ClaimOutcome::Won(_)
        ),
        "a released lease stays released"
    );
}

pub async fn hand_over_records_the_attempt_as_handed_over(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    f.store
        .release(&job, slot, lease.token)
        .await
        .expect("release");
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(
        run.status,
        Status::Running,
        "released is expired, not finished"
    );
    assert!(run.released);
    assert!(run.handed_over());
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::HandedOver));
    assert!(run.attempts[0].ended_at.is_some());
    assert_eq!(run.deaths(), 0);
}

// ---- Rule 4: finish and release only with the current token ----

pub async fn finish_with_the_current_token_records_success(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    let done = f
        .store
        .finish(&job, slot, lease.token, Finish::Success)
        .await
        .expect("finish");
    assert_eq!(done, TokenOutcome::Accepted);
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.status, Status::Success);
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::Success));
    assert_eq!(
        claim(&*f.store, &job, slot, "api-2").await,
        ClaimOutcome::Finished {
            status: Status::Success
        }
    );
}

pub async fn failed_run_is_finished_and_not_retried(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    f.store
        .finish(&job, slot, lease.token, Finish::Failed)
        .await
        .expect("finish");
    wait_past(&*f.store, lease.lease_end).await;
    assert_eq!(
        takeover(&*f.store, &job, slot, "api-2").await,
        ClaimOutcome::Finished {
            status: Status::Failed
        },
        "a handler that throws is failed and is not retried"
    );
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.attempts.len(), 1);
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::Failed));
}

pub async fn finish_with_a_stale_token_is_refused(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let first = won(claim(&*f.store, &job, slot, "api-1").await);
    wait_past(&*f.store, first.lease_end).await;
    let second = won(takeover(&*f.store, &job, slot, "api-2").await);
    let refused = f
        .store
        .finish(&job, slot, first.token, Finish::Success)
        .await
        .expect("finish reaches the store");
    assert!(
        matches!(refused, TokenOutcome::Refused(Some(s)) if s.attempt == 2),
        "{refused:?}"
    );
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(
        run.status,
        Status::Running,
        "the stale finish changed nothing"
    );
    assert_eq!(run.token, second.token);
    let ok = f
        .store
        .finish(&job, slot, second.token, Finish::Success)
        .await
        .expect("finish");
    assert_eq!(ok, TokenOutcome::Accepted);
}

pub async fn release_with_a_stale_token_is_refused(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let first = won(claim(&*f.store, &job, slot, "api-1").await);
    wait_past(&*f.store, first.lease_end).await;
    let second = won(takeover(&*f.store, &job, slot, "api-2").await);
    let refused = f
        .store
        .release(&job, slot, first.token)
        .await
        .expect("release reaches the store");
    assert!(
        matches!(refused, TokenOutcome::Refused(Some(_))),
        "{refused:?}"
    );
    let run = run_of(&*f.store, &job, slot).await;
    assert!(!run.released);
    assert_eq!(run.lease_end, second.lease_end);
}

pub async fn finish_after_release_is_refused(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    f.store
        .release(&job, slot, lease.token)
        .await
        .expect("release");
    let refused = f
        .store
        .finish(&job, slot, lease.token, Finish::Success)
        .await
        .expect("finish");
    assert!(
        matches!(refused, TokenOutcome::Refused(Some(_))),
        "{refused:?}"
    );
}

pub async fn second_finish_of_a_run_is_refused(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let lease = won(claim(&*f.store, &job, slot, "api-1").await);
    f.store
        .finish(&job, slot, lease.token, Finish::Success)
        .await
        .expect("finish");
    let again = f
        .store
        .finish(&job, slot, lease.token, Finish::Failed)
        .await
        .expect("finish");
    assert!(
        matches!(again, TokenOutcome::Refused(Some(s)) if s.status == Status::Success),
        "{again:?}"
    );
}

// ---- Rule 3: takeover, attempts and max_attempts ----

pub async fn takeover_claim_while_the_lease_is_alive_sees_running(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    won(claim(&*f.store, &job, slot, "runner").await);
    for backup in ["backup-1", "backup-2"] {
        let outcome = takeover(&*f.store, &job, slot, backup).await;
        assert!(
            matches!(&outcome, ClaimOutcome::Running { runner, .. } if runner == "runner"),
            "{outcome:?}"
        );
    }
}

pub async fn takeover_after_lease_expiry_starts_attempt_two_with_new_token_and_fence(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let first = won(claim(&*f.store, &job, slot, "api-1").await);
    wait_past(&*f.store, first.lease_end).await;
    let (outcome, token) =
        claim_as(&*f.store, &job, slot, ClaimKind::Takeover, "api-2", &opts()).await;
    let second = won(outcome);
    assert_eq!(second.attempt, 2);
    assert_eq!(second.token, token);
    assert_ne!(second.token, first.token);
    assert!(
        second.fence > first.fence,
        "the fence grows with every won claim"
    );
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.runner, "api-2");
    assert_eq!(run.attempts.len(), 2);
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::Died));
    assert_eq!(run.attempts[1].reason, ClaimKind::Takeover);
}

pub async fn max_attempts_interrupts_after_three_dead_runners(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let mut lease = won(claim(&*f.store, &job, slot, "r1").await);
    for (n, runner) in [(2, "r2"), (3, "r3")] {
        wait_past(&*f.store, lease.lease_end).await;
        lease = won(takeover(&*f.store, &job, slot, runner).await);
        assert_eq!(lease.attempt, n);
    }
    wait_past(&*f.store, lease.lease_end).await;
    assert_eq!(
        takeover(&*f.store, &job, slot, "r4").await,
        ClaimOutcome::Interrupted,
        "die, die, die: no fourth attempt"
    );
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.status, Status::Interrupted);
    assert_eq!(run.deaths(), 3);
    assert_eq!(
        takeover(&*f.store, &job, slot, "r5").await,
        ClaimOutcome::Finished {
            status: Status::Interrupted
        }
    );
}

/// `max_attempts = 1`: the first death ends the run; no runner takes it over.
pub async fn max_attempts_of_one_interrupts_after_the_first_dead_runner(f: &Fixture) {
    dead_runners_until_interrupted(f, 1).await;
}

/// `max_attempts = 5`: five runners may die, each taken over; the sixth claim is refused.
pub async fn max_attempts_of_five_allows_five_attempts_then_interrupts(f: &Fixture) {
    dead_runners_until_interrupted(f, 5).await;
}

/// Runners die one after the other on a run of a job with `max_attempts`: each death is taken
/// over until `max_attempts` attempts died, then the run is interrupted.
async fn dead_runners_until_interrupted(f: &Fixture, max_attempts: u32) {
    let options = LeaseOptions {
        max_attempts,
        ..opts()
    };
    let (job, slot) = job_and_slot(f).await;
    let store = &*f.store;
    let mut lease = won(
        claim_as(store, &job, slot, ClaimKind::Scheduled, "r1", &options)
            .await
            .0,
    );
    for n in 2..=max_attempts {
        wait_past(store, lease.lease_end).await;
        let runner = format!("r{n}");
        lease = won(
            claim_as(store, &job, slot, ClaimKind::Takeover, &runner, &options)
                .await
                .0,
        );
        assert_eq!(lease.attempt, n);
    }
    wait_past(store, lease.lease_end).await;
    assert_eq!(
        claim_as(
            store,
            &job,
            slot,
            ClaimKind::Takeover,
            "one-too-many",
            &options
        )
        .await
        .0,
        ClaimOutcome::Interrupted,
        "{max_attempts} deaths: no attempt {}",
        max_attempts + 1
    );
    let run = run_of(store, &job, slot).await;
    assert_eq!(run.status, Status::Interrupted);
    assert_eq!(run.deaths(), max_attempts);
    assert_eq!(run.attempts.len(), max_attempts as usize);
}

/// A takeover is not a new claim: a run whose slot is older than `max_late` plus the 10 s
/// tolerance is still taken over, while a new claim of a slot that old is late.
pub async fn takeover_of_a_run_older_than_max_late_plus_tolerance_starts_the_next_attempt(
    f: &Fixture,
) {
    let options = LeaseOptions {
        max_late: Duration::ZERO,
        ..opts()
    };
    let store = &*f.store;
    let job = unique("old");
    // Claimed 9.5 s after its slot: within max_late (0) + 10 s.
    let slot = store_now(store).await - 9_500;
    let first = won(
        claim_as(store, &job, slot, ClaimKind::Scheduled, "r1", &options)
            .await
            .0,
    );
    wait_past(store, first.lease_end.max(slot + 10_500)).await;
    let other = unique("old");
    assert_eq!(
        claim_as(store, &other, slot, ClaimKind::Scheduled, "r2", &options)
            .await
            .0,
        ClaimOutcome::Late,
        "a new claim of a slot this old is late"
    );
    let second = won(
        claim_as(store, &job, slot, ClaimKind::Takeover, "r2", &options)
            .await
            .0,
    );
    assert_eq!(second.attempt, 2);
    assert!(second.fence > first.fence);
}

/// A heartbeat that reaches the store after the lease ran out, before any backup took the run
/// over, is refused by the store's clock: the lease is not brought back to life, and the run
/// stays up for its next attempt.
pub async fn heartbeat_after_the_lease_ran_out_before_any_takeover_is_refused(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let store = &*f.store;
    let first = won(claim(store, &job, slot, "r1").await);
    wait_past(store, first.lease_end).await;
    let hb = store
        .heartbeat(&job, slot, first.token, Duration::from_secs(30))
        .await
        .expect("heartbeat reaches the store");
    assert!(
        matches!(hb, HeartbeatOutcome::Lost(_)),
        "a heartbeat after the lease end renewed it: {hb:?}"
    );
    let run = run_of(store, &job, slot).await;
    assert_eq!(
        run.lease_end, first.lease_end,
        "the refused heartbeat changed nothing"
    );
    let second = won(takeover(store, &job, slot, "r2").await);
    assert_eq!(second.attempt, 2);
}

pub async fn hand_overs_do_not_count_toward_max_attempts(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let mut lease = won(claim(&*f.store, &job, slot, "deploy-0").await);
    // Five deploys in a row hand the run over; each hand-over keeps the attempts.
    for n in 2..=6 {
        f.store
            .release(&job, slot, lease.token)
            .await
            .expect("release");
        lease = won(takeover(&*f.store, &job, slot, &format!("deploy-{n}")).await);
        assert_eq!(lease.attempt, n);
    }
    // Then runners die: max_attempts (3) deaths are still allowed.
    for _ in 0..2 {
        wait_past(&*f.store, lease.lease_end).await;
        lease = won(takeover(&*f.store, &job, slot, "survivor").await);
    }
    wait_past(&*f.store, lease.lease_end).await;
    assert_eq!(
        takeover(&*f.store, &job, slot, "late").await,
        ClaimOutcome::Interrupted
    );
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.deaths(), 3);
    assert!(run.handed_over());
}

pub async fn several_backups_race_one_takeover_wins(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let first = won(claim(&*f.store, &job, slot, "runner").await);
    wait_past(&*f.store, first.lease_end).await;
    let mut backups = Vec::new();
    for _ in 0..4 {
        backups.push(f.another().await);
    }
    let claims = backups.iter().enumerate().map(|(i, store)| {
        let job = job.clone();
        let store = store.clone();
        async move { takeover(&*store, &job, slot, &format!("backup-{i}")).await }
    });
    let outcomes = futures::future::join_all(claims).await;
    let winners: Vec<_> = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Won(_)))
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    for o in &outcomes {
        match o {
            ClaimOutcome::Won(lease) => assert_eq!(lease.attempt, 2),
            ClaimOutcome::Running { attempt, .. } => assert_eq!(*attempt, 2),
            other => panic!("unexpected {other:?}"),
        }
    }
}

// ---- A dead run and the next slot: the three orders ----

pub async fn next_slot_while_the_dead_runs_lease_is_alive_is_an_overlap(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let dead = won(claim(&*f.store, &job, slot, "a").await);
    // The runner died, but nobody can know yet: the next slot is skipped.
    assert_eq!(
        claim(&*f.store, &job, slot + 1, "b").await,
        ClaimOutcome::Overlap {
            blocking_slot: slot
        }
    );
    wait_past(&*f.store, dead.lease_end).await;
    let taken = won(takeover(&*f.store, &job, slot, "b").await);
    assert_eq!(taken.attempt, 2, "a backup takes over the old run");
}

pub async fn backup_takeover_first_then_the_next_slot_is_an_overlap(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let dead = won(claim(&*f.store, &job, slot, "a").await);
    wait_past(&*f.store, dead.lease_end).await;
    won(takeover(&*f.store, &job, slot, "b").await);
    assert_eq!(
        claim(&*f.store, &job, slot + 1, "c").await,
        ClaimOutcome::Overlap {
            blocking_slot: slot
        }
    );
}

pub async fn next_slot_first_interrupts_the_dead_run_and_it_is_not_retried(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let dead = won(claim(&*f.store, &job, slot, "a").await);
    wait_past(&*f.store, dead.lease_end).await;
    let next = won(claim(&*f.store, &job, slot + 1, "b").await);
    assert_eq!(next.attempt, 1);
    let old = run_of(&*f.store, &job, slot).await;
    assert_eq!(old.status, Status::Interrupted);
    assert_eq!(old.attempts[0].outcome, Some(AttemptOutcome::Died));
    assert_eq!(
        takeover(&*f.store, &job, slot, "c").await,
        ClaimOutcome::Finished {
            status: Status::Interrupted
        },
        "the old run is not taken over afterwards"
    );
}

pub async fn takeover_of_a_dead_run_with_a_newer_run_marks_it_interrupted(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let options = LeaseOptions {
        overlap: Overlap::Allow,
        ..opts()
    };
    let dead = won(
        claim_as(&*f.store, &job, slot, ClaimKind::Scheduled, "a", &options)
            .await
            .0,
    );
    won(claim_as(
        &*f.store,
        &job,
        slot + 1,
        ClaimKind::Scheduled,
        "b",
        &options,
    )
    .await
    .0);
    wait_past(&*f.store, dead.lease_end).await;
    assert_eq!(
        claim_as(&*f.store, &job, slot, ClaimKind::Takeover, "c", &options)
            .await
            .0,
        ClaimOutcome::Interrupted,
        "a newer run started first"
    );
}

// ---- Rule 5: overlap ----

pub async fn overlap_skip_refuses_a_new_slot_while_an_earlier_lease_is_alive(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let a = won(claim(&*f.store, &job, slot, "a").await);
    for next in [slot + 3_000, slot + 6_000] {
        assert_eq!(
            claim(&*f.store, &job, next, "b").await,
            ClaimOutcome::Overlap {
                blocking_slot: slot
            }
        );
        assert!(
            f.store.get(&job, next).await.expect("get").is_none(),
            "a skipped slot has no state"
        );
    }
    f.store
        .finish(&job, slot, a.token, Finish::Success)
        .await
        .expect("finish");
    won(claim(&*f.store, &job, slot + 9_000, "b").await);
}

pub async fn overlap_skip_lets_a_new_slot_start_once_the_earlier_lease_is_dead(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let a = won(claim(&*f.store, &job, slot, "a").await);
    wait_past(&*f.store, a.lease_end).await;
    won(claim(&*f.store, &job, slot + 1, "b").await);
    assert_eq!(
        run_of(&*f.store, &job, slot).await.status,
        Status::Interrupted
    );
}

pub async fn overlap_allow_runs_slots_side_by_side(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let options = LeaseOptions {
        overlap: Overlap::Allow,
        ..opts()
    };
    let a = won(
        claim_as(&*f.store, &job, slot, ClaimKind::Scheduled, "a", &options)
            .await
            .0,
    );
    let b = won(claim_as(
        &*f.store,
        &job,
        slot + 1,
        ClaimKind::Scheduled,
        "b",
        &options,
    )
    .await
    .0);
    assert!(b.fence > a.fence);
    let running = f.store.unfinished(&job).await.expect("unfinished");
    assert_eq!(
        running.iter().map(|r| r.slot).collect::<Vec<_>>(),
        vec![slot, slot + 1]
    );
}

// ---- Rule 6: late claims ----

pub async fn claim_later_than_max_late_plus_tolerance_is_late(f: &Fixture) {
    let job = unique("job");
    let options = LeaseOptions {
        max_late: Duration::from_secs(5),
        ..opts()
    };
    let now = store_now(&*f.store).await;
    let slot = now - 15_500; // 5 s + 10 s tolerance + 0.5 s
    assert_eq!(
        claim_as(&*f.store, &job, slot, ClaimKind::Scheduled, "a", &options)
            .await
            .0,
        ClaimOutcome::Late
    );
    assert!(
        f.store.get(&job, slot).await.expect("get").is_none(),
        "a late claim leaves no state"
    );
}

pub async fn claim_within_max_late_plus_tolerance_wins(f: &Fixture) {
    let job = unique("job");
    let options = LeaseOptions {
        max_late: Duration::from_secs(5),
        ..opts()
    };
    let slot = store_now(&*f.store).await - 14_000;
    won(
        claim_as(&*f.store, &job, slot, ClaimKind::Scheduled, "a", &options)
            .await
            .0,
    );
}

pub async fn catch_up_claim_within_the_catch_up_window_is_not_late(f: &Fixture) {
    let job = unique("job");
    let slot = store_now(&*f.store).await - 120_000; // two minutes ago; max late is 30 s
    assert_eq!(
        claim(&*f.store, &job, slot, "a").await,
        ClaimOutcome::Late,
        "as a scheduled claim it is late"
    );
    let lease = won(
        claim_as(&*f.store, &job, slot, ClaimKind::CatchUp, "a", &opts())
            .await
            .0,
    );
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.attempts[0].reason, ClaimKind::CatchUp);
    assert_eq!(lease.attempt, 1);
}

pub async fn catch_up_claim_older_than_the_window_is_late(f: &Fixture) {
    let job = unique("job");
    let slot = store_now(&*f.store).await - 311_000; // 5 min + 10 s + 1 s
    assert_eq!(
        claim_as(&*f.store, &job, slot, ClaimKind::CatchUp, "a", &opts())
            .await
            .0,
        ClaimOutcome::Late
    );
}

pub async fn catch_up_race_one_instance_wins_the_other_becomes_backup(f: &Fixture) {
    let job = unique("report");
    let slot = store_now(&*f.store).await - 120_000;
    let a = f.another().await;
    let b = f.another().await;
    assert!(a.unfinished(&job).await.expect("unfinished").is_empty());
    assert!(b.unfinished(&job).await.expect("unfinished").is_empty());
    won(claim_as(&*a, &job, slot, ClaimKind::CatchUp, "a", &opts())
        .await
        .0);
    let outcome = claim_as(&*b, &job, slot, ClaimKind::CatchUp, "b", &opts())
        .await
        .0;
    assert!(
        matches!(&outcome, ClaimOutcome::Running { runner, .. } if runner == "a"),
        "{outcome:?}"
    );
}

// ---- Superseded ----

pub async fn claim_for_a_slot_older_than_an_existing_run_is_superseded(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let newer = won(claim(&*f.store, &job, slot, "a").await);
    f.store
        .finish(&job, slot, newer.token, Finish::Success)
        .await
        .expect("finish");
    assert_eq!(
        claim(&*f.store, &job, slot - 20_000, "b").await,
        ClaimOutcome::Superseded { newer_slot: slot }
    );
}

// ---- Fencing diagram ----

pub async fn frozen_runner_is_fenced_after_takeover(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let a_store = f.another().await;
    let b_store = f.another().await;
    let a = won(claim(&*a_store, &job, slot, "instance-a").await);
    // A is frozen: its lease runs out.
    wait_past(&*f.store, a.lease_end).await;
    let b = won(takeover(&*b_store, &job, slot, "instance-b").await);
    assert_eq!(b.attempt, 2);
    // A wakes up.
    let hb = a_store
        .heartbeat(&job, slot, a.token, Duration::from_millis(300))
        .await
        .expect("heartbeat");
    assert!(
        matches!(hb, HeartbeatOutcome::Lost(Some(s)) if s.attempt == 2),
        "{hb:?}"
    );
    let fin = a_store
        .finish(&job, slot, a.token, Finish::Success)
        .await
        .expect("finish");
    assert!(matches!(fin, TokenOutcome::Refused(_)), "{fin:?}");
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.status, Status::Running);
    assert_eq!(run.runner, "instance-b");
    assert_eq!(run.token, b.token);
}

// ---- Fences ----

pub async fn fence_grows_with_every_won_claim_of_the_job(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let mut last = 0;
    for i in 0..4 {
        let lease = won(claim(&*f.store, &job, slot + i, "a").await);
        assert!(lease.fence > last, "fence {} after {last}", lease.fence);
        last = lease.fence;
        f.store
            .finish(&job, slot + i, lease.token, Finish::Success)
            .await
            .expect("finish");
    }
}

/// A new fence is `max(previous + 1, the store's clock in µs)`: a store that lost the job's
/// last fences (a promoted replica, a restarted server without persistence) still hands out
/// larger ones. Checked on the first claim of a job and on a takeover.
pub async fn fence_is_never_below_the_stores_clock_in_microseconds_at_the_claim(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let before = store_now(&*f.store).await;
    let first = won(claim(&*f.store, &job, slot, "a").await);
    let after = store_now(&*f.store).await;
    let floor = u64::try_from(before * 1_000).expect("the clock is after 1970");
    let ceiling = u64::try_from((after + 1) * 1_000).expect("the clock is after 1970");
    assert!(
        (floor..ceiling).contains(&first.fence),
        "fence {} of a job's first claim is the clock in µs, between {floor} and {ceiling}",
        first.fence
    );
    wait_past(&*f.store, first.lease_end).await;
    let before = store_now(&*f.store).await;
    let second = won(takeover(&*f.store, &job, slot, "b").await);
    assert!(
        second.fence >= u64::try_from(before * 1_000).expect("the clock is after 1970"),
        "takeover fence {} below the clock {before} ms",
        second.fence
    );
    assert!(second.fence > first.fence);
    // The record keeps the fence exactly (16 digits, beyond a 14-digit JSON encoder).
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.fence, second.fence);
    let fences: Vec<u64> = run.attempts.iter().map(|a| a.fence).collect();
    assert_eq!(fences, vec![first.fence, second.fence]);
}

// ---- The record of a run ----

pub async fn attempt_record_keeps_runner_token_start_end_and_outcome(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let a = won(claim(&*f.store, &job, slot, "r-died").await);
    wait_past(&*f.store, a.lease_end).await;
    let b = won(takeover(&*f.store, &job, slot, "r-handed").await);
    f.store.release(&job, slot, b.token).await.expect("release");
    let c = won(takeover(&*f.store, &job, slot, "r-success").await);
    f.store
        .finish(&job, slot, c.token, Finish::Success)
        .await
        .expect("finish");
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.status, Status::Success);
    assert!(run.handed_over());
    let story: Vec<_> = run
        .attempts
        .iter()
        .map(|a| (a.attempt, a.runner.as_str(), a.token, a.outcome))
        .collect();
    assert_eq!(
        story,
        vec![
            (1, "r-died", a.token, Some(AttemptOutcome::Died)),
            (2, "r-handed", b.token, Some(AttemptOutcome::HandedOver)),
            (3, "r-success", c.token, Some(AttemptOutcome::Success)),
        ]
    );
    for attempt in &run.attempts {
        let end = attempt.ended_at.expect("every attempt has ended");
        assert!(end >= attempt.started_at, "{attempt:?}");
        assert_eq!(attempt.digest.as_deref(), Some("sha256:test"));
    }
    assert_eq!(
        run.attempts[0].ended_at,
        Some(a.lease_end),
        "a death ends at its lease end"
    );

    // And a failed one.
    let slot2 = slot + 1;
    let d = won(claim(&*f.store, &job, slot2, "r-failed").await);
    f.store
        .finish(&job, slot2, d.token, Finish::Failed)
        .await
        .expect("finish");
    let run = run_of(&*f.store, &job, slot2).await;
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::Failed));
}

pub async fn unfinished_lists_running_runs_oldest_first(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let options = LeaseOptions {
        overlap: Overlap::Allow,
        ..opts()
    };
    let a = won(
        claim_as(&*f.store, &job, slot, ClaimKind::Scheduled, "a", &options)
            .await
            .0,
    );
    won(claim_as(
        &*f.store,
        &job,
        slot + 1,
        ClaimKind::Scheduled,
        "a",
        &options,
    )
    .await
    .0);
    won(claim_as(
        &*f.store,
        &job,
        slot + 2,
        ClaimKind::Scheduled,
        "a",
        &options,
    )
    .await
    .0);
    f.store
        .finish(&job, slot, a.token, Finish::Success)
        .await
        .expect("finish");
    let slots: Vec<_> = f
        .store
        .unfinished(&job)
        .await
        .expect("unfinished")
        .iter()
        .map(|r| r.slot)
        .collect();
    assert_eq!(slots, vec![slot + 1, slot + 2]);
    let history: Vec<_> = f
        .store
        .history(&job, 10)
        .await
        .expect("history")
        .iter()
        .map(|r| r.slot)
        .collect();
    assert_eq!(
        history,
        vec![slot + 2, slot + 1, slot],
        "history is newest first"
    );
    assert!(f.store.jobs().await.expect("jobs").contains(&job));
}

// ---- History ----

/// Runs `n` finished runs of `job`, one a minute, ending a minute before now.
async fn finished_runs(f: &Fixture, job: &str, n: i64, options: &LeaseOptions) -> Vec<i64> {
    let now = store_now(&*f.store).await;
    let mut slots = Vec::new();
    for i in (1..=n).rev() {
        let slot = now - i * 60_000;
        let lease = won(
            claim_as(&*f.store, job, slot, ClaimKind::Scheduled, "a", options)
                .await
                .0,
        );
        f.store
            .finish(job, slot, lease.token, Finish::Success)
            .await
            .expect("finish");
        slots.push(slot);
    }
    slots
}

pub async fn history_is_trimmed_to_its_size(f: &Fixture) {
    let job = unique("job");
    let wide = LeaseOptions {
        max_late: Duration::from_secs(3_600),
        ..opts()
    };
    let slots = finished_runs(f, &job, 6, &wide).await;
    // A new run with history size 2 and a retention of 30 s + 10 s trims all but two.
    let narrow = LeaseOptions {
        history_size: 2,
        max_late: Duration::from_secs(30),
        catch_up: Duration::from_secs(30),
        ..opts()
    };
    let now = store_now(&*f.store).await;
    won(
        claim_as(&*f.store, &job, now, ClaimKind::Scheduled, "a", &narrow)
            .await
            .0,
    );
    let kept: Vec<_> = f
        .store
        .history(&job, 100)
        .await
        .expect("history")
        .iter()
        .map(|r| r.slot)
        .collect();
    assert_eq!(
        kept,
        vec![now, slots[5], slots[4]],
        "the running run plus two finished"
    );
}

pub async fn history_never_loses_a_run_a_late_claim_could_ask_about(f: &Fixture) {
    let job = unique("job");
    let options = LeaseOptions {
        history_size: 1,
        max_late: Duration::from_secs(3_600),
        ..opts()
    };
    let slots = finished_runs(f, &job, 5, &options).await;
    let now = store_now(&*f.store).await;
    won(
        claim_as(&*f.store, &job, now, ClaimKind::Scheduled, "a", &options)
            .await
            .0,
    );
    let kept = f.store.history(&job, 100).await.expect("history");
    assert_eq!(
        kept.len(),
        6,
        "all five are within max late, so none is trimmed"
    );
    // A late claim of one of them still finds its state and does not win it again.
    assert_eq!(
        claim_as(
            &*f.store,
            &job,
            slots[0],
            ClaimKind::Scheduled,
            "late",
            &options
        )
        .await
        .0,
        ClaimOutcome::Finished {
            status: Status::Success
        }
    );
}

// ---- Races ----

pub async fn sixteen_concurrent_claimers_get_exactly_one_winner_500_times(f: &Fixture) {
    let mut clients: Vec<Arc<dyn Store>> = vec![f.store.clone()];
    for _ in 0..3 {
        clients.push(f.another().await);
    }
    // A lease and a lateness limit no loaded machine outlasts: a claim that arrives after the
    // winner's lease ran out would rightly win a takeover, and that is not this race.
    let options = LeaseOptions {
        max_late: Duration::from_secs(3_600),
        ..LeaseOptions::with_lease(Duration::from_secs(600))
    };
    let base = store_now(&*f.store).await;
    for round in 0..500 {
        let job = format!("race-{round}");
        let claims = (0..16).map(|i| {
            let store = clients[i % clients.len()].clone();
            let job = job.clone();
            let runner = format!("claimer-{i}");
            async move {
                claim_as(&*store, &job, base, ClaimKind::Scheduled, &runner, &options)
                    .await
                    .0
            }
        });
        let outcomes = futures::future::join_all(claims).await;
        let winners = outcomes
            .iter()
            .filter(|o| matches!(o, ClaimOutcome::Won(_)))
            .count();
        assert_eq!(winners, 1, "round {round}: {outcomes:?}");
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, ClaimOutcome::Won(_) | ClaimOutcome::Running { .. })),
            "round {round}: {outcomes:?}"
        );
    }
}

/// Four processes race; on a store no other process reaches (the simulation's in-memory
/// store), four clients of this process race in four tasks, through the same claims.
pub async fn four_processes_racing_on_200_slots_get_one_winner_each(f: &Fixture) {
    let job = unique("job");
    let base = store_now(&*f.store).await;
    let start_at = base + 500; // all four start claiming at the same store instant
    if !f.reaches_other_processes() {
        let mut racers = Vec::new();
        for i in 0..4 {
            let (store, job) = (f.another().await, job.clone());
            racers.push(tokio::spawn(async move {
                let runner = format!("proc-{i}");
                let won = baton_tests::race_claims(&*store, &job, base, 200, &runner, start_at)
                    .await
                    .expect("racer ends");
                (runner, won)
            }));
        }
        let mut winners: HashMap<i64, Vec<String>> = HashMap::new();
        for racer in racers {
            let (runner, won) = racer.await.expect("racer task");
            for slot in won {
                winners.entry(slot).or_default().push(runner.clone());
            }
        }
        return assert_one_winner_each(f, &job, base, &winners).await;
    }
    let children: Vec<_> = (0..4)
        .map(|i| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_baton-claim-racer"))
                .args([
                    &f.url,
                    &f.namespace,
                    &job,
                    &base.to_string(),
                    "200",
                    &format!("proc-{i}"),
                    &start_at.to_string(),
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .expect("start the claim racer")
        })
        .collect();
    let mut winners: HashMap<i64, Vec<String>> = HashMap::new();
    for child in children {
        let out = child.wait_with_output().await.expect("racer ends");
        assert!(out.status.success(), "racer failed: {:?}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let mut parts = line.split_whitespace();
            if let (Some("won"), Some(slot), Some(runner)) =
                (parts.next(), parts.next(), parts.next())
            {
                winners
                    .entry(slot.parse().expect("slot"))
                    .or_default()
                    .push(runner.to_owned());
            }
        }
    }
    assert_one_winner_each(f, &job, base, &winners).await;
}

/// Every one of the 200 slots has one winner, and the store agrees who.
async fn assert_one_winner_each(
    f: &Fixture,
    job: &str,
    base: i64,
    winners: &HashMap<i64, Vec<String>>,
) {
    assert_eq!(winners.len(), 200, "every slot has a winner");
    for (slot, who) in winners {
        assert_eq!(who.len(), 1, "slot {slot} won by {who:?}");
        let run = run_of(&*f.store, &format!("{job}-{}", slot - base), *slot).await;
        assert_eq!(&run.runner, &who[0], "the store agrees who won slot {slot}");
    }
}

// The operations `baton bench` adds to the contract.

/// Once a job's first runs have warmed the client up (a script loaded, a statement prepared on
/// every warm connection, the job's name registered), a run costs exactly one round trip per
/// claim, per heartbeat and per finish, counted at the wire: 2 + heartbeats.
pub async fn a_run_costs_one_round_trip_per_claim_heartbeat_and_finish(f: &Fixture) {
    // Counted at a TCP proxy between the client and the server where there is a wire.
    let counted = f.counted().await;
    let store = &*counted.store;
    let job = unique("rt");
    let options = LeaseOptions::with_lease(Duration::from_secs(30));
    let now = store_now(store).await;
    let run = |slot: i64, heartbeats: usize| {
        let job = job.clone();
        async move {
            let (outcome, token) =
                claim_as(store, &job, slot, ClaimKind::Scheduled, "a", &options).await;
            won(outcome);
            for _ in 0..heartbeats {
                let renewed = store
                    .heartbeat(&job, slot, token, options.lease)
                    .await
                    .expect("heartbeat");
                assert!(matches!(renewed, HeartbeatOutcome::Renewed { .. }));
            }
            let finished = store
                .finish(&job, slot, token, Finish::Success)
                .await
                .expect("finish");
            assert_eq!(finished, TokenOutcome::Accepted);
        }
    };
    // Every connection of a pool prepares a statement the first time it runs it (PostgreSQL
    // keeps two warm): warm them all.
    for k in 0..3 {
        run(now - 10 + k, 1).await;
    }
    for (i, heartbeats) in [0usize, 1, 3].into_iter().enumerate() {
        let (before, pings) = (counted.round_trips(), counted.pings());
        run(now + 1 + i as i64, heartbeats).await;
        let sent = counted.round_trips() - before;
        println!(
            "a run with {heartbeats} heartbeats: {sent} round trips, {} connection tests after them (counted at the {})",
            counted.pings() - pings,
            counted.counted_where()
        );
        assert_eq!(
            sent,
            2 + heartbeats as u64,
            "a run with {heartbeats} heartbeats sent {sent} requests (counted at the {})",
            counted.counted_where()
        );
        assert_eq!(
            counted.pings() - pings,
            0,
            "connection tests crossed the wire besides the run's own round trips"
        );
    }
}

/// The raw primitive writes a new key and refuses an existing one; clearing by prefix removes
/// what it wrote (a cluster leaves its keys to expire).
pub async fn raw_primitive_writes_a_new_key_once(f: &Fixture) {
    let store = &*f.store;
    let prefix = unique("raw");
    let key = format!("{prefix}-1");
    let before = store.round_trips();
    assert!(store.raw_primitive(&key).await.expect("raw primitive"));
    assert_eq!(store.round_trips() - before, 1, "one request");
    assert!(!store.raw_primitive(&key).await.expect("raw primitive"));
    let other = format!("{}-1", unique("raw"));
    assert!(store.raw_primitive(&other).await.expect("raw primitive"));
    store
        .clear_raw_primitive(&prefix)
        .await
        .expect("clear the raw keys");
    if !f.url.contains("+cluster") {
        assert!(
            store.raw_primitive(&key).await.expect("raw primitive"),
            "the cleared key is new again"
        );
        assert!(
            !store.raw_primitive(&other).await.expect("raw primitive"),
            "a key of another prefix stays"
        );
    }
}

/// Forgetting a job deletes its runs, its fence and its name; its next claim starts afresh, as
/// attempt 1 with a fence from the store's clock, as a new job's.
pub async fn forget_job_deletes_its_runs_and_name(f: &Fixture) {
    let store = &*f.store;
    let job = unique("forget");
    let slot = store_now(store).await;
    let (outcome, token) = claim_as(store, &job, slot, ClaimKind::Scheduled, "a", &opts()).await;
    won(outcome);
    store
        .finish(&job, slot, token, Finish::Success)
        .await
        .expect("finish");
    assert!(store.jobs().await.expect("jobs").contains(&job));
    store.forget_job(&job).await.expect("forget");
    assert!(store.get(&job, slot).await.expect("get").is_none());
    assert!(!store.jobs().await.expect("jobs").contains(&job));
    let before = store_now(store).await;
    let again = won(claim(store, &job, slot, "b").await);
    assert_eq!(again.attempt, 1);
    assert!(
        again.fence >= u64::try_from(before * 1_000).expect("the clock is after 1970"),
        "fence {} below the clock {before} ms",
        again.fence
    );
}
