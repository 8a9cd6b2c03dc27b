//! `baton:job/state` through the Wasm host, on a real SQLite store: the example `counter`
//! counts its successful runs, and a zombie attempt's writes are refused by the store even
//! though its host believes its lease alive.

use std::sync::Arc;
use std::time::Duration;

use baton_core::instance::AbortReason;
use baton_core::lease::{
    ClaimKind, ClaimOutcome, ClaimRequest, Finish, Lease, LeaseOptions, Token,
};
use baton_core::state_handle::StateHandle;
use baton_core::store::Store;

use crate::support::{context, job, run, sandbox, unique};

async fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let url = format!("sqlite://{}", dir.path().join("baton.db").display());
    baton_core::store::open(&url, "baton").await.expect("open")
}

async fn win(store: &dyn Store, name: &str, slot: i64, kind: ClaimKind) -> Lease {
    let options = LeaseOptions::with_lease(Duration::from_millis(300));
    let request = ClaimRequest {
        job: name,
        slot,
        kind,
        runner: "wasm-test",
        token: Token::random(),
        digest: None,
        options: &options,
    };
    match store.claim(&request).await.expect("claim") {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected a win, got {other:?}"),
    }
}

/// The context of the attempt that holds `lease`, with its state handle; its local lease
/// deadline is an hour away, as a host that does not know it was fenced believes.
fn attempt(
    store: &Arc<dyn Store>,
    name: &str,
    slot: i64,
    lease: &Lease,
) -> baton_core::instance::RunContext {
    let mut ctx = context(name);
    ctx.slot = slot;
    ctx.attempt = lease.attempt;
    ctx.fence = lease.fence;
    ctx.state = Some(StateHandle::new(
        store.clone(),
        name,
        slot,
        lease.token,
        ctx.signal.clone(),
        ctx.deadline.clone(),
    ));
    ctx
}

async fn count(store: &dyn Store, name: &str) -> Option<String> {
    store
        .state_get(name, "successful-runs")
        .await
        .expect("read")
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
}

#[tokio::test]
async fn counter_keeps_a_count_of_its_successful_runs_in_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite(&dir).await;
    let name = unique("counter");
    let counter = job(env!("GUEST_COUNTER"), sandbox());
    let first = store.now().await.expect("clock");
    let mut last = None;
    for n in 0..3 {
        let slot = first + n;
        let lease = win(&*store, &name, slot, ClaimKind::Scheduled).await;
        let ctx = attempt(&store, &name, slot, &lease);
        run(&counter, ctx, Duration::from_secs(60))
            .await
            .expect("the counter succeeds");
        store
            .finish(&name, slot, lease.token, Finish::Success)
            .await
            .expect("finish");
        last = Some((slot, lease));
    }
    assert_eq!(count(&*store, &name).await.as_deref(), Some("3"));
    let (slot, lease) = last.expect("three runs");
    let entry = store
        .state_get(&name, "successful-runs")
        .await
        .expect("read")
        .expect("a count");
    assert_eq!((entry.writer.slot, entry.writer.fence), (slot, lease.fence));
}

#[tokio::test]
async fn a_zombie_guests_state_write_is_fenced_by_the_store_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite(&dir).await;
    let name = unique("zombie");
    let counter = job(env!("GUEST_COUNTER"), sandbox());
    let slot = store.now().await.expect("clock") - 1_000;
    let zombie = win(&*store, &name, slot, ClaimKind::Scheduled).await;
    // The zombie's host is frozen past its lease, and a backup takes the run over.
    baton_tests::wait_past(&*store, zombie.lease_end).await;
    let backup = win(&*store, &name, slot, ClaimKind::Takeover).await;
    let ctx = attempt(&store, &name, slot, &backup);
    run(&counter, ctx, Duration::from_secs(60))
        .await
        .expect("the backup's attempt counts");
    // The zombie wakes, believing its lease alive for another hour.
    let ctx = attempt(&store, &name, slot, &zombie);
    let signal = ctx.signal.clone();
    let ended = run(&counter, ctx, Duration::from_secs(60)).await;
    // The store refused the increment; the host aborted the signal and stopped the guest.
    let error = ended.expect_err("the zombie's run fails");
    assert!(
        error.contains("lost its lease (the store refused a heartbeat or a state write)"),
        "{error}"
    );
    assert_eq!(
        signal.reason(),
        Some(AbortReason::Lost),
        "the host aborted the signal"
    );
    assert_eq!(
        count(&*store, &name).await.as_deref(),
        Some("1"),
        "counted once"
    );
}
