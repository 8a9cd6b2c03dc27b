//! Nodes, handlers and waiting, for the instance tests.

use std::sync::Arc;
use std::time::Duration;

use baton_core::instance::{handler_fn, Event, EventKind, Handler, Instance, InstanceConfig, Job};
use baton_core::lease::{LeaseOptions, Run};
use baton_core::schedule::Schedule;
use baton_tests::Fixture;
use tokio::sync::broadcast;

/// Lease options with this lease and heartbeat (ms).
pub fn options(lease_ms: u64, heartbeat_ms: u64) -> LeaseOptions {
    let mut o = LeaseOptions::with_lease(Duration::from_millis(lease_ms));
    o.heartbeat = Duration::from_millis(heartbeat_ms);
    o
}

/// A handler that works for `work`, or until its signal aborts, when it returns an error.
pub fn worker(work: Duration) -> Arc<dyn Handler> {
    handler_fn(move |ctx| async move {
        tokio::select! {
            _ = tokio::time::sleep(work) => Ok(()),
            _ = ctx.signal.aborted() => Err("aborted".to_owned()),
        }
    })
}

/// A cron expression (UTC, with seconds) that matches only the whole second `slot_ms`.
pub fn once_at(slot_ms: i64) -> Schedule {
    let t = chrono_like(slot_ms);
    Schedule::parse(&t, "UTC").expect("valid one-slot schedule")
}

fn chrono_like(slot_ms: i64) -> String {
    // sec min hour day month: the slot's own second, once a year.
    let secs = slot_ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    let (_, month, day) = civil_from_days(days);
    format!("{s} {m} {h} {day} {month} *")
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The first whole second at least `ahead_ms` after the store's now.
pub async fn slot_ahead(f: &Fixture, ahead_ms: i64) -> i64 {
    let now = baton_tests::store_now(&*f.store).await;
    ((now + ahead_ms) / 1000 + 1) * 1000
}

/// A job.
pub fn job(
    name: &str,
    schedule: Schedule,
    options: LeaseOptions,
    handler: Arc<dyn Handler>,
) -> Job {
    Job {
        name: name.to_owned(),
        schedule,
        options,
        handler,
    }
}

/// An instance in this process, with its event stream.
pub struct Node {
    pub instance: Instance,
    pub events: broadcast::Receiver<Event>,
}

/// Starts an instance on the fixture's store.
pub async fn node(f: &Fixture, runner: &str, jobs: Vec<Job>) -> Node {
    let config = InstanceConfig {
        store_url: f.url.clone(),
        namespace: f.namespace.clone(),
        runner: runner.to_owned(),
    };
    let instance = Instance::start(config, jobs)
        .await
        .expect("instance starts");
    let events = instance.subscribe();
    Node { instance, events }
}

/// Waits for the first event that `pred` accepts.
pub async fn wait_event(
    events: &mut broadcast::Receiver<Event>,
    within: Duration,
    what: &str,
    pred: impl Fn(&Event) -> bool,
) -> Event {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(within, async {
        loop {
            match events.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(e) => seen.push(format!(
                    "{} {} {} {:?} {}",
                    e.kind, e.job, e.slot, e.attempt, e.reason
                )),
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    panic!("events closed waiting for {what}")
                }
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no {what} within {within:?}; saw {seen:#?}"))
}

/// Whether an event is of this kind for this job and slot.
pub fn is(e: &Event, kind: EventKind, job: &str, slot: i64) -> bool {
    e.kind == kind && e.job == job && e.slot == slot
}

/// Polls the store until `pred` holds for the run, or panics after `within`.
pub async fn wait_run(
    f: &Fixture,
    job: &str,
    slot: i64,
    within: Duration,
    what: &str,
    pred: impl Fn(&Run) -> bool,
) -> Run {
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Some(run) = f.store.get(job, slot).await.expect("get") {
            if pred(&run) {
                return run;
            }
        }
        if tokio::time::Instant::now() > until {
            let run = f.store.get(job, slot).await.expect("get");
            panic!("{what}: not within {within:?}; run is {run:#?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Min, median and max of some figures (ms).
pub fn summary(mut xs: Vec<i64>) -> (i64, i64, i64) {
    xs.sort_unstable();
    (xs[0], xs[xs.len() / 2], xs[xs.len() - 1])
}
