//! Store outages against one node, scripted rather than drawn: what the instance keeps waiting
//! during a long outage under a job due every second, and that a run whose only runner fenced
//! itself in an outage is taken over by that runner once the store is back.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::env::{Clock, Env, TokioClock};
use baton_core::instance::{handler_fn, EventKind, Instance, Job};
use baton_core::lease::Status;
use baton_core::schedule::Schedule;
use baton_core::store::sqlite::SqliteStore;
use baton_core::store::Store;
use rand::SeedableRng;

use crate::faults::FaultyStore;
use crate::world::{options, Faults, History, Spans, START_MS};

/// The most checks one instance keeps waiting for a job due every second while the store is
/// out of reach for a minute: the backups of the runs it knew, and one claim to send again.
const MOST_WATCHES: usize = 4;

/// How long until a run is taken over once the store is reachable again: a lease and two
/// heartbeats (ms).
fn takeover_bound() -> i64 {
    (options().lease + 2 * options().heartbeat).as_millis() as i64
}

/// Runs `test` on paused time with one node "n1" running `job` on a simulated store that is out
/// of reach during `outage` (ms since the start); `test` gets the instance, the history and the
/// store itself.
fn one_node<F, Fut>(job: Job, outage: (i64, i64), test: F)
where
    F: FnOnce(Instance, History, Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let history = History::new();
        let clock = Arc::new(TokioClock::new(START_MS));
        let store_clock = clock.clone();
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::simulated("outage", Arc::new(move || store_clock.wall_ms() * 1_000))
                .expect("the store opens"),
        );
        let faults = Faults {
            rng: Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(1))),
            outages: Arc::new(Spans::new(vec![outage])),
            failovers: Arc::default(),
            lost_writes: Arc::default(),
            rates: [0, 0, 0, 0],
        };
        let faulty: Arc<dyn Store> = Arc::new(FaultyStore::new(
            store.clone(),
            "n1",
            faults,
            history.clone(),
        ));
        let instance = Instance::start_on(faulty, "n1", vec![job], Env::simulated(clock, 1))
            .await
            .expect("the instance starts");
        test(instance, history, store).await;
    });
}

#[test]
fn a_minute_long_outage_keeps_one_claim_to_resend_per_job_not_one_per_slot() {
    let job = Job {
        name: "every-second".into(),
        schedule: Schedule::parse("* * * * * *", "UTC").expect("valid"),
        options: options(),
        handler: handler_fn(|_| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(())
        }),
    };
    let outage = (10_000, 70_000);
    one_node(job, outage, |instance, history, _| async move {
        let mut events = instance.subscribe();
        let mut most = 0;
        while history.now_ms() < outage.1 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            most = most.max(instance.watching());
        }
        assert!(
            most <= MOST_WATCHES,
            "{most} checks waiting at once during the outage, at most {MOST_WATCHES} expected"
        );
        // Back within a lease and two heartbeats of the store's return.
        let back_by = outage.1 + takeover_bound();
        let success = loop {
            let event = events.recv().await.expect("the instance's events");
            if event.kind == EventKind::Success && event.slot >= START_MS + outage.1 - 1_000 {
                break history.now_ms();
            }
        };
        assert!(
            success <= back_by,
            "the first success after the outage came at {success} ms"
        );
        instance.stop(Duration::from_secs(2)).await;
    });
}

#[test]
fn a_runner_that_fenced_itself_in_an_outage_takes_its_run_over_when_the_store_is_back() {
    // One run a minute, of 30 s; the store is out of reach from 5 s to 20 s, longer than the
    // lease, so the only runner fences itself. No other node knows the run: unless the runner
    // goes on watching it, it stays dead until the next slot interrupts it.
    let job = Job {
        name: "nightly".into(),
        schedule: Schedule::parse("0 * * * * *", "UTC").expect("valid"),
        options: options(),
        handler: handler_fn(|ctx| async move {
            for _ in 0..30 {
                if ctx.signal.is_aborted() || ctx.deadline.has_passed() {
                    return Err("fenced".to_owned());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(())
        }),
    };
    let outage = (5_000, 20_000);
    one_node(job, outage, |instance, history, store| async move {
        let mut events = instance.subscribe();
        let taken_over = loop {
            let event = events.recv().await.expect("the instance's events");
            if event.kind == EventKind::Takeover && event.slot == START_MS {
                break history.now_ms();
            }
            assert!(
                history.now_ms() < 60_000,
                "no takeover of the fenced run before the next slot"
            );
        };
        assert!(
            taken_over <= outage.1 + takeover_bound(),
            "taken over at {taken_over} ms, the store was back at {} ms",
            outage.1
        );
        tokio::time::sleep(Duration::from_secs(35)).await;
        let run = store
            .get("nightly", START_MS)
            .await
            .expect("the store answers")
            .expect("the run");
        assert_eq!(run.status, Status::Success, "{run:?}");
        assert_eq!(run.attempt, 2, "{run:?}");
        instance.stop(Duration::from_secs(2)).await;
    });
}
