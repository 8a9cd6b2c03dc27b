//! The conformance cases of operating a cluster: `paused_*` (a pause is read in the claim's
//! atomic step, on every node) and `manual_*` (a triggered run is claimed under every rule a
//! scheduled one follows).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_core::lease::{
    ClaimKind, ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, LeaseOptions, Token,
    TokenOutcome,
};
use baton_core::operate::{Action, OperateOutcome, Operation, Operator, Request};
use baton_core::store::Store;
use baton_tests::{store_now, unique, wait_past, Fixture};

use crate::cases::{claim_as, job_and_slot, opts, run_of, won};

fn operator(reason: Option<&str>) -> Operator {
    Operator {
        host: "ops-box".into(),
        user: "alice".into(),
        reason: reason.map(str::to_owned),
    }
}

async fn operate(store: &dyn Store, job: &str, request: Request) -> OperateOutcome {
    store
        .operate(job, request, &operator(Some("maintenance")))
        .await
        .expect("operate reaches the store")
}

fn done(outcome: OperateOutcome) -> Operation {
    match outcome {
        OperateOutcome::Done(op) => op,
        other => panic!("expected the operation to be done, got {other:?}"),
    }
}

pub async fn paused_job_claims_answer_paused_on_every_node_and_start_nothing(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    done(operate(&*f.store, &job, Request::Pause { stop: false }).await);
    let other = f.another().await;
    for (store, kind) in [
        (&f.store, ClaimKind::Scheduled),
        (&other, ClaimKind::Scheduled),
        (&other, ClaimKind::CatchUp),
        (&f.store, ClaimKind::Manual),
    ] {
        let (outcome, _) = claim_as(&**store, &job, slot, kind, "api-1", &opts()).await;
        assert_eq!(outcome, ClaimOutcome::Paused, "a {kind} claim");
    }
    assert_eq!(f.store.get(&job, slot).await.expect("get"), None);
}

pub async fn paused_job_is_not_taken_over_but_its_running_attempt_finishes(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
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
    done(operate(&*f.store, &job, Request::Pause { stop: false }).await);
    let renewed = f
        .store
        .heartbeat(&job, slot, token, Duration::from_millis(300))
        .await
        .expect("heartbeat");
    assert!(
        matches!(renewed, HeartbeatOutcome::Renewed { .. }),
        "{renewed:?}"
    );
    let (takeover, _) =
        claim_as(&*f.store, &job, slot, ClaimKind::Takeover, "api-2", &opts()).await;
    assert_eq!(takeover, ClaimOutcome::Paused);
    let finished = f
        .store
        .finish(&job, slot, token, Finish::Success)
        .await
        .expect("finish");
    assert_eq!(finished, TokenOutcome::Accepted);
    assert_eq!(run_of(&*f.store, &job, slot).await.attempt, lease.attempt);

    // A runner that dies while the job is paused is not taken over either.
    let next = slot + 1;
    let (outcome, _) = claim_as(&*f.store, &job, next, ClaimKind::Manual, "api-1", &opts()).await;
    assert_eq!(outcome, ClaimOutcome::Paused);
}

pub async fn paused_claim_sent_again_with_its_token_keeps_the_win_it_had(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let options = opts();
    let request = ClaimRequest {
        job: &job,
        slot,
        kind: ClaimKind::Scheduled,
        runner: "api-1",
        token: Token::random(),
        digest: None,
        options: &options,
    };
    let first = won(f.store.claim(&request).await.expect("claim"));
    done(operate(&*f.store, &job, Request::Pause { stop: false }).await);
    let again = won(f.store.claim(&request).await.expect("claim"));
    assert_eq!((first.attempt, first.fence), (again.attempt, again.fence));
}

pub async fn paused_trigger_is_refused_with_the_pause_in_force(f: &Fixture) {
    let (job, _) = job_and_slot(f).await;
    let pause = done(operate(&*f.store, &job, Request::Pause { stop: true }).await);
    match operate(&*f.store, &job, Request::Trigger).await {
        OperateOutcome::Paused(op) => assert_eq!(op, pause),
        other => panic!("expected the trigger to be refused, got {other:?}"),
    }
    let ops = f
        .store
        .operations(Some(&job), 0, 10)
        .await
        .expect("operations");
    assert_eq!(ops, vec![pause], "a refused trigger is not recorded");
}

pub async fn paused_jobs_are_listed_with_who_when_and_why_until_resumed(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    let before = store_now(&*f.store).await;
    let pause = done(operate(&*f.store, &job, Request::Pause { stop: true }).await);
    let after = store_now(&*f.store).await;
    assert_eq!(pause.action, Action::Paused);
    assert!(
        before <= pause.at && pause.at <= after,
        "{before} <= {} <= {after}",
        pause.at
    );
    assert_eq!(
        (
            pause.host.as_str(),
            pause.user.as_str(),
            pause.reason.as_deref(),
            pause.stop
        ),
        ("ops-box", "alice", Some("maintenance"), true)
    );
    let listed = f.another().await.paused().await.expect("paused");
    assert!(listed.contains(&pause), "{listed:?}");

    let resume = done(operate(&*f.store, &job, Request::Resume).await);
    assert_eq!(resume.action, Action::Resumed);
    let listed = f.store.paused().await.expect("paused");
    assert!(listed.iter().all(|p| p.job != job), "{listed:?}");
    let ops = f
        .store
        .operations(Some(&job), before, 10)
        .await
        .expect("operations");
    assert_eq!(ops, vec![resume, pause], "newest first");
    let (outcome, _) = claim_as(
        &*f.store,
        &job,
        slot,
        ClaimKind::Scheduled,
        "api-1",
        &opts(),
    )
    .await;
    won(outcome);
}

pub async fn paused_racing_claims_never_start_an_attempt_after_the_pause(f: &Fixture) {
    let job = unique("job");
    let options = LeaseOptions {
        overlap: baton_core::lease::Overlap::Allow,
        max_late: Duration::from_secs(3_600),
        ..LeaseOptions::with_lease(Duration::from_secs(600))
    };
    let base = store_now(&*f.store).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut claimers = Vec::new();
    for i in 0..4 {
        let store = if i % 2 == 0 {
            f.store.clone()
        } else {
            f.another().await
        };
        let (job, stop) = (job.clone(), stop.clone());
        claimers.push(tokio::spawn(async move {
            let mut won_slots = Vec::new();
            let mut slot = base + i;
            while !stop.load(Ordering::Acquire) {
                let runner = format!("claimer-{i}");
                let (outcome, _) =
                    claim_as(&*store, &job, slot, ClaimKind::Scheduled, &runner, &options).await;
                if matches!(outcome, ClaimOutcome::Won(_)) {
                    won_slots.push(slot);
                }
                slot += 4;
                // A store whose calls complete at once (the simulated one) never makes this
                // loop wait: let the test's own task run.
                tokio::task::yield_now().await;
            }
            won_slots
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pause = done(operate(&*f.store, &job, Request::Pause { stop: false }).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Release);
    let mut started = 0;
    for claimer in claimers {
        for slot in claimer.await.expect("claimer") {
            let run = run_of(&*f.store, &job, slot).await;
            let at = run.attempts[0].started_at;
            assert!(
                at <= pause.at,
                "slot {slot} started at {at}, after the pause at {}",
                pause.at
            );
            started += 1;
        }
    }
    assert!(started > 0, "some claims won before the pause");
}

pub async fn manual_trigger_is_a_slot_at_the_stores_clock_in_the_record(f: &Fixture) {
    let (job, _) = job_and_slot(f).await;
    let before = store_now(&*f.store).await;
    let op = done(operate(&*f.store, &job, Request::Trigger).await);
    let after = store_now(&*f.store).await;
    assert_eq!(op.action, Action::Triggered);
    let slot = op.slot.expect("a trigger has a slot");
    assert!(
        before <= slot && slot <= after,
        "{before} <= {slot} <= {after}"
    );
    assert_eq!(op.at, slot);
    let all = f
        .another()
        .await
        .operations(None, before, 100)
        .await
        .expect("operations");
    assert!(
        all.contains(&op),
        "the namespace's record holds it: {all:?}"
    );
}

pub async fn manual_claims_of_a_trigger_have_one_winner_with_reason_manual(f: &Fixture) {
    let (job, _) = job_and_slot(f).await;
    let slot = done(operate(&*f.store, &job, Request::Trigger).await)
        .slot
        .expect("slot");
    let other = f.another().await;
    let claims = [f.store.clone(), other.clone(), f.store.clone(), other].map(|store| {
        let job = job.clone();
        async move {
            claim_as(&*store, &job, slot, ClaimKind::Manual, "api", &opts())
                .await
                .0
        }
    });
    let outcomes = futures::future::join_all(claims).await;
    let winners = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Won(_)))
        .count();
    assert_eq!(winners, 1, "{outcomes:?}");
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.attempts[0].reason, ClaimKind::Manual);
}

pub async fn manual_claim_is_an_overlap_while_a_scheduled_run_holds_a_live_lease(f: &Fixture) {
    let (job, slot) = job_and_slot(f).await;
    won(claim_as(
        &*f.store,
        &job,
        slot,
        ClaimKind::Scheduled,
        "api-1",
        &opts(),
    )
    .await
    .0);
    let manual = done(operate(&*f.store, &job, Request::Trigger).await)
        .slot
        .expect("slot");
    let (outcome, _) = claim_as(&*f.store, &job, manual, ClaimKind::Manual, "api-2", &opts()).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Overlap {
            blocking_slot: slot
        }
    );
}

pub async fn manual_run_whose_runner_dies_is_taken_over_as_attempt_two(f: &Fixture) {
    let (job, _) = job_and_slot(f).await;
    let slot = done(operate(&*f.store, &job, Request::Trigger).await)
        .slot
        .expect("slot");
    let first = won(
        claim_as(&*f.store, &job, slot, ClaimKind::Manual, "api-1", &opts())
            .await
            .0,
    );
    wait_past(&*f.store, first.lease_end).await;
    let second = won(
        claim_as(&*f.store, &job, slot, ClaimKind::Takeover, "api-2", &opts())
            .await
            .0,
    );
    assert_eq!(second.attempt, 2);
    assert!(second.fence > first.fence);
    let run = run_of(&*f.store, &job, slot).await;
    assert_eq!(run.attempts[0].reason, ClaimKind::Manual);
    assert_eq!(run.attempts[1].reason, ClaimKind::Takeover);
}

pub async fn manual_claim_later_than_max_late_plus_tolerance_is_late(f: &Fixture) {
    let (job, _) = job_and_slot(f).await;
    let options = LeaseOptions {
        max_late: Duration::ZERO,
        ..opts()
    };
    let slot = store_now(&*f.store).await - 10_500;
    let (outcome, _) = claim_as(&*f.store, &job, slot, ClaimKind::Manual, "api-1", &options).await;
    assert_eq!(outcome, ClaimOutcome::Late);
}
