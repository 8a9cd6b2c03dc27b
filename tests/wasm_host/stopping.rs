//! Stopping an instance whose guest ignores the signal: interrupted at the stop timeout and
//! handed over, so a backup takes over within two heartbeats instead of after the lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::instance::{EventKind, Instance, InstanceConfig, Job};
use baton_core::lease::{AttemptOutcome, LeaseOptions};
use baton_core::schedule::Schedule;

use crate::jobs_dir::wait_event;
use crate::support::{host, job, sandbox};

fn busy_job() -> Job {
    let mut options = LeaseOptions::with_lease(Duration::from_secs(10));
    options.heartbeat = Duration::from_millis(300);
    options.catch_up = Duration::ZERO;
    Job {
        name: "spin".to_owned(),
        schedule: Schedule::parse("* * * * * *", "UTC").expect("every second"),
        options,
        handler: Arc::new(job(env!("GUEST_BUSY_LOOP"), sandbox())),
    }
}

async fn instance(f: &baton_tests::Fixture, runner: &str) -> Instance {
    let config = InstanceConfig {
        store_url: f.url.clone(),
        namespace: f.namespace.clone(),
        runner: runner.to_owned(),
    };
    Instance::start(config, vec![busy_job()])
        .await
        .expect("instance starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_ignoring_the_signal_is_interrupted_at_the_stop_timeout_and_handed_over() {
    let _ = host();
    let f = baton_tests::backends::sqlite().await;
    let a = instance(&f, "a").await;
    let mut a_events = a.subscribe();
    let started = wait_event(&mut a_events, Duration::from_secs(10), "a's attempt", |e| {
        e.kind == EventKind::Started
    })
    .await;
    let b = instance(&f, "b").await;
    let mut b_events = b.subscribe();

    let stop_at = Instant::now();
    let report = a.stop(Duration::from_millis(300)).await;
    let stop_took = stop_at.elapsed();
    assert_eq!(report.abandoned, 1, "the busy loop ignores the signal");
    let released = wait_event(&mut a_events, Duration::from_secs(1), "the release", |e| {
        e.kind == EventKind::Released && e.slot == started.slot
    })
    .await;
    assert_eq!(released.reason, "stop-timeout");
    assert!(
        stop_took < Duration::from_secs(2),
        "stop took {stop_took:?}"
    );

    // Within two heartbeats (600 ms) plus slack, not after the 10 s lease.
    wait_event(&mut b_events, Duration::from_secs(3), "b's takeover", |e| {
        e.kind == EventKind::Takeover && e.slot == started.slot
    })
    .await;
    let run = f
        .store
        .get("spin", started.slot)
        .await
        .expect("get")
        .expect("the run");
    assert_eq!(run.attempts[0].runner, "a");
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::HandedOver));
    assert_eq!(run.attempts[1].runner, "b");
    b.stop(Duration::from_millis(100)).await;
}
