//! Takeover after a killed runner and hand-over after stop, on the store under test, with
//! instances in this process running native handlers and short leases.
//!
//! Takeover: a runner instance starts one run of each of `jobs` jobs, a backup instance
//! watches them, and the runner is dropped without a release (in-process, that is a killed
//! runner: its heartbeats stop at once). The figure is the time from the runner's last renewed
//! heartbeat (its lease end minus the lease, on the store's clock) to the backup's takeover
//! claim (the new attempt's start). The spec's bound is lease + 2 × heartbeat.
//!
//! Hand-over: the same, but the runner stops; its handlers return once their signal aborts, so
//! each run is released. The figure is release to the backup's takeover, bounded by
//! 2 × heartbeat.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::broadcast;

use super::{once_at, BenchError, Stats};
use baton_core::instance::{handler_fn, Event, EventKind, Handler, Instance, InstanceConfig, Job};
use baton_core::lease::{AttemptOutcome, LeaseOptions, Run, Status};
use baton_core::store::Store;

/// How failover is measured.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How many runs are taken over (and as many handed over). Defaults to 10.
    pub jobs: usize,
    /// The jobs' lease. Defaults to 600 ms.
    pub lease: Duration,
    /// The jobs' heartbeat. Defaults to 100 ms.
    pub heartbeat: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            jobs: 10,
            lease: Duration::from_millis(600),
            heartbeat: Duration::from_millis(100),
        }
    }
}

/// One failover measurement against its bound.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Recovery {
    /// The measured times, from the store's clock (ms resolution).
    pub latency: Stats,
    /// The spec's bound, ms.
    pub bound_ms: u64,
    /// How many were within the bound.
    pub within_bound: usize,
}

/// Both failover figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Failover {
    /// The jobs' lease, ms.
    pub lease_ms: u64,
    /// The jobs' heartbeat, ms.
    pub heartbeat_ms: u64,
    /// Last heartbeat to takeover, for a killed runner.
    pub takeover: Recovery,
    /// Release to takeover, on stop.
    pub hand_over: Recovery,
}

/// Measures takeover and hand-over with instances of `config`; `store` is a client of the same
/// store and namespace, to read the runs back.
pub async fn measure(
    config: &InstanceConfig,
    store: &dyn Store,
    settings: &Settings,
) -> Result<Failover, BenchError> {
    let lease = settings.lease.as_millis() as u64;
    let heartbeat = settings.heartbeat.as_millis() as u64;
    let takeover = measure_one(config, store, settings, Kind::Takeover).await?;
    let hand_over = measure_one(config, store, settings, Kind::HandOver).await?;
    let recovery = |delays: Vec<i64>, bound: u64| Recovery {
        within_bound: delays.iter().filter(|d| **d <= bound as i64).count(),
        latency: Stats::of_ms(&delays),
        bound_ms: bound,
    };
    Ok(Failover {
        lease_ms: lease,
        heartbeat_ms: heartbeat,
        takeover: recovery(takeover, lease + 2 * heartbeat),
        hand_over: recovery(hand_over, 2 * heartbeat),
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Takeover,
    HandOver,
}

/// A handler that works for `work`, or until its signal aborts, when it returns an error.
fn worker(work: Duration) -> std::sync::Arc<dyn Handler> {
    handler_fn(move |ctx| async move {
        tokio::select! {
            _ = tokio::time::sleep(work) => Ok(()),
            _ = ctx.signal.aborted() => Err("aborted".to_owned()),
        }
    })
}

async fn measure_one(
    config: &InstanceConfig,
    store: &dyn Store,
    settings: &Settings,
    kind: Kind,
) -> Result<Vec<i64>, BenchError> {
    let tag = match kind {
        Kind::Takeover => "kill",
        Kind::HandOver => "hand",
    };
    let prefix = super::unique_name(&format!("bench-{tag}"));
    let names: Vec<String> = (0..settings.jobs.max(1))
        .map(|i| format!("{prefix}-{i}"))
        .collect();
    let slot = (store.now().await? / 1000 + 2) * 1000;
    let mut options = LeaseOptions::with_lease(settings.lease);
    options.heartbeat = settings.heartbeat;
    let schedule = once_at(slot)?;
    let jobs = |work: Duration| {
        names
            .iter()
            .map(|name| Job {
                name: name.clone(),
                schedule: schedule.clone(),
                options,
                handler: worker(work),
            })
            .collect::<Vec<_>>()
    };
    let as_runner = |runner: &str| InstanceConfig {
        runner: runner.to_owned(),
        ..config.clone()
    };
    let result = async {
        let runner =
            Instance::start(as_runner("bench-runner"), jobs(Duration::from_secs(60))).await?;
        let mut events = runner.subscribe();
        let within = Duration::from_secs(10);
        for _ in &names {
            wait_started(&mut events, within).await?;
        }
        let backup =
            Instance::start(as_runner("bench-backup"), jobs(Duration::from_millis(50))).await?;
        // Let the backup find the runs and become their backup (unfinished runs on start).
        tokio::time::sleep(settings.heartbeat * 3).await;
        match kind {
            Kind::Takeover => drop(runner),
            Kind::HandOver => {
                runner.stop(Duration::from_secs(2)).await;
            }
        }
        let mut delays = Vec::with_capacity(names.len());
        for name in &names {
            let run = wait_taken_over(store, name, slot, settings.lease * 4 + within).await?;
            delays.push(delay(&run, kind, settings.lease)?);
        }
        backup.stop(Duration::from_secs(2)).await;
        Ok::<_, BenchError>(delays)
    }
    .await;
    for name in &names {
        store.forget_job(name).await?;
    }
    result
}

async fn wait_started(
    events: &mut broadcast::Receiver<Event>,
    within: Duration,
) -> Result<(), BenchError> {
    let wait = async {
        loop {
            match events.recv().await {
                Ok(e) if e.kind == EventKind::Started => return Ok(()),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(BenchError::Unexpected {
                        what: "the runner's events".into(),
                        expected: "started".into(),
                        got: "the instance ended".into(),
                    })
                }
            }
        }
    };
    tokio::time::timeout(within, wait)
        .await
        .map_err(|_| BenchError::Timeout {
            what: "every run to start on the runner".into(),
            within,
        })?
}

/// Polls the run until its second attempt has started.
async fn wait_taken_over(
    store: &dyn Store,
    job: &str,
    slot: i64,
    within: Duration,
) -> Result<Run, BenchError> {
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Some(run) = store.get(job, slot).await? {
            if run.attempts.len() >= 2 {
                return Ok(run);
            }
            if run.status != Status::Running {
                return Err(BenchError::Unexpected {
                    what: format!("the run of {job}"),
                    expected: "a takeover".into(),
                    got: format!(
                        "status {} after {} attempt(s)",
                        run.status,
                        run.attempts.len()
                    ),
                });
            }
        }
        if tokio::time::Instant::now() > until {
            return Err(BenchError::Timeout {
                what: format!("the takeover of {job}"),
                within,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The measured time of a taken-over run, ms on the store's clock.
fn delay(run: &Run, kind: Kind, lease: Duration) -> Result<i64, BenchError> {
    let first = &run.attempts[0];
    let second = &run.attempts[1];
    let (expected, from) = match kind {
        // A died attempt ends at its lease end: its last renewal plus the lease.
        Kind::Takeover => (
            AttemptOutcome::Died,
            first.ended_at.map(|end| end - lease.as_millis() as i64),
        ),
        Kind::HandOver => (AttemptOutcome::HandedOver, first.ended_at),
    };
    match (first.outcome, from) {
        (Some(outcome), Some(from)) if outcome == expected => Ok(second.started_at - from),
        (outcome, _) => Err(BenchError::Unexpected {
            what: format!("the first attempt of {}", run.job),
            expected: expected.to_string(),
            got: format!("{outcome:?}"),
        }),
    }
}
