//! Store round trips per successful run, counted on a real [`Instance`]: one job every second
//! whose handler works for a few heartbeats, run by one instance whose store is wrapped in a
//! [`Tally`]. The tally says which operation each request was; the backend's own counter
//! ([`Store::round_trips`]) says how many requests went out. Both are read between the
//! `success` events of consecutive runs, so the window holds exactly the runs' claims,
//! heartbeats and finishes.
//!
//! [`Store::round_trips`]: baton_core::store::Store::round_trips

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::broadcast;

use super::{BenchError, OpCounts, Tally, TallyHandle};
use baton_core::instance::{handler_fn, Event, EventKind, Instance, InstanceConfig, Job};
use baton_core::lease::LeaseOptions;
use baton_core::schedule::Schedule;
use baton_core::store::Store;

/// How the round trips are counted.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How many runs are counted (after one that warms up). Defaults to 5.
    pub runs: usize,
    /// The job's lease. Defaults to 600 ms.
    pub lease: Duration,
    /// The job's heartbeat. Defaults to 100 ms.
    pub heartbeat: Duration,
    /// How long each run works: 350 ms is three heartbeats. Defaults to 350 ms.
    pub work: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            runs: 5,
            lease: Duration::from_millis(600),
            heartbeat: Duration::from_millis(100),
            work: Duration::from_millis(350),
        }
    }
}

/// What the counted runs sent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoundTrips {
    /// Runs counted, each ended by an accepted finish.
    pub runs: u64,
    /// What they sent, by operation, and the backend's request count.
    pub counted: OpCounts,
    /// Round trips per run, on average.
    pub per_run: f64,
    /// Heartbeats per run, on average.
    pub heartbeats_per_run: f64,
    /// Whether every run sent exactly one claim and one finish, and the backend's requests were
    /// exactly those plus one per heartbeat: `round_trips == 2 × runs + heartbeats`.
    pub exact: bool,
    /// The first run, which also carries the instance's start (clock read, unfinished runs)
    /// and one-time costs (the job's name registered, statements prepared): not in the counts
    /// above.
    pub warm_up: OpCounts,
}

/// Counts the round trips of `settings.runs` runs of a job on the store at `config`; `store`
/// is another client of the same store and namespace, which forgets the job at the end (the
/// instance's own client ends with its lease engine).
pub async fn measure(
    config: InstanceConfig,
    store: &dyn Store,
    settings: &Settings,
) -> Result<RoundTrips, BenchError> {
    let name = super::unique_name("bench-rt");
    let schedule = Schedule::parse("* * * * * *", "UTC").map_err(|e| BenchError::Unexpected {
        what: "the every-second schedule".into(),
        expected: "a valid cron expression".into(),
        got: e.to_string(),
    })?;
    let mut options = LeaseOptions::with_lease(settings.lease);
    options.heartbeat = settings.heartbeat;
    // No catch-up claim at start: its run could overlap the next slot's and make it a skip.
    options.catch_up = Duration::ZERO;
    let work = settings.work;
    let job = Job {
        name: name.clone(),
        schedule,
        options,
        handler: handler_fn(move |ctx| async move {
            tokio::select! {
                _ = tokio::time::sleep(work) => Ok(()),
                _ = ctx.signal.aborted() => Err("aborted".to_owned()),
            }
        }),
    };
    let handle: Arc<Mutex<Option<TallyHandle>>> = Arc::new(Mutex::new(None));
    let slot_for_handle = handle.clone();
    let instance = Instance::start_with(config, vec![job], move |store| {
        let (store, tally) = Tally::wrap(store);
        *slot_for_handle.lock().unwrap_or_else(|p| p.into_inner()) = Some(tally);
        store
    })
    .await?;
    let tally = handle
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| BenchError::Unexpected {
            what: "the instance's store".into(),
            expected: "to be wrapped".into(),
            got: "no store".into(),
        })?;
    let mut events = instance.subscribe();
    let counted = async {
        let zero = OpCounts::default();
        let within = settings.lease * 4 + Duration::from_secs(3);
        wait_success(&mut events, &name, within).await?;
        let first = tally.counts();
        for _ in 0..settings.runs {
            wait_success(&mut events, &name, within).await?;
        }
        let last = tally.counts();
        Ok::<_, BenchError>((first.since(&zero), last.since(&first)))
    }
    .await;
    instance.stop(Duration::from_secs(2)).await;
    drop(instance);
    let forgotten = store.forget_job(&name).await;
    let (warm_up, counted) = counted?;
    forgotten?;
    let runs = settings.runs as u64;
    Ok(RoundTrips {
        runs,
        per_run: super::ratio(counted.round_trips as f64, runs as f64),
        heartbeats_per_run: super::ratio(counted.heartbeats as f64, runs as f64),
        exact: counted.claims == runs
            && counted.finishes == runs
            && counted.releases == 0
            && counted.other == 0
            && counted.round_trips == 2 * runs + counted.heartbeats,
        counted,
        warm_up,
    })
}

/// Waits for the next `success` of `job`; any other end of a run is an error.
async fn wait_success(
    events: &mut broadcast::Receiver<Event>,
    job: &str,
    within: Duration,
) -> Result<(), BenchError> {
    let wait = async {
        loop {
            match events.recv().await {
                Ok(e) if e.job != job => {}
                Ok(e) if e.kind == EventKind::Success => return Ok(()),
                Ok(e)
                    if matches!(
                        e.kind,
                        EventKind::Won | EventKind::Started | EventKind::Takeover
                    ) => {}
                Ok(e) => {
                    return Err(BenchError::Unexpected {
                        what: "a counted run".into(),
                        expected: "won, started, success".into(),
                        got: format!("{} {}", e.kind, e.reason),
                    })
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(BenchError::Unexpected {
                        what: "the instance's events".into(),
                        expected: "a success".into(),
                        got: "the instance ended".into(),
                    })
                }
            }
        }
    };
    tokio::time::timeout(within, wait)
        .await
        .map_err(|_| BenchError::Timeout {
            what: format!("a successful run of {job}"),
            within,
        })?
}
