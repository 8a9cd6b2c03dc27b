//! A long store outage under a job due every second: what the instance keeps waiting, and that
//! the job runs again once the store is back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::env::{Clock, Env, TokioClock};
use baton_core::instance::{handler_fn, EventKind, Instance, Job};
use baton_core::schedule::Schedule;
use baton_core::store::sqlite::SqliteStore;
use baton_core::store::Store;
use rand::SeedableRng;

use crate::faults::FaultyStore;
use crate::world::{options, Faults, History, Spans, START_MS};

/// The most checks one instance keeps waiting for a job due every second while the store is
/// out of reach for a minute: the backups of the runs it knew, and one claim to send again.
const MOST_WATCHES: usize = 4;

#[test]
fn a_minute_long_outage_keeps_one_claim_to_resend_per_job_not_one_per_slot() {
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
        let outage = (10_000, 70_000);
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
        let job = Job {
            name: "every-second".into(),
            schedule: Schedule::parse("* * * * * *", "UTC").expect("valid"),
            options: options(),
            handler: handler_fn(|_| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(())
            }),
        };
        let instance = Instance::start_on(faulty, "n1", vec![job], Env::simulated(clock, 1))
            .await
            .expect("the instance starts");
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
        let back_by = outage.1 + (options().lease + 2 * options().heartbeat).as_millis() as i64;
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
