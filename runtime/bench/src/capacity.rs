//! The capacity run: the store's own time per due slot, for Baton and for a ShedLock-style lock
//! on the same slots and the same hosts, measured in one run.
//!
//! `hosts` clients of the store (one each, as `hosts` nodes have) share `jobs` jobs. For each
//! of `slots` rounds every job has a new slot due, and every host claims it at once, as every
//! node does when a slot comes due: one claim wins, the others are answered that it runs; the
//! winner finishes it (a job that does nothing: no heartbeat falls due within the default lease
//! of 30 s). That is everything every host sends for a due slot, the trim of old runs included:
//! before the measured slots every job gets a history as long as it keeps, plus a run for each
//! measured slot to trim, old enough to go (see [`HISTORY_SIZE`]). The lock does the same with the backend's raw primitive
//! ([`Store::raw_primitive`]: `SET key NX PX`, or `INSERT … ON CONFLICT DO NOTHING`) from every
//! host, and the winner's release ([`Store::raw_release`]).
//!
//! The store's own time is read from the server where it keeps such counts
//! ([`Store::server_time`]: Redis and Valkey `INFO commandstats`, PostgreSQL
//! `pg_stat_statements`), as the difference of two readings around each side. Elsewhere (SQLite,
//! where the write lock is held for a statement's whole call; a PostgreSQL without the
//! extension) each call is timed as the caller sees it, one call at a time, so that no call
//! waits behind another: the time the store spends on it plus a loopback round trip, on both
//! sides alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::StreamExt;
use serde::Serialize;

use super::{claim_request, ratio, BenchError};
use baton_core::lease::{millis, ClaimOutcome, Finish, LeaseOptions, Token, TokenOutcome};
use baton_core::store::{self, StepFloor, Store};

/// What the capacity run does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The store's URL.
    pub store_url: String,
    /// How many hosts claim every slot, each with a client of its own. Defaults to 3.
    pub hosts: usize,
    /// How many jobs. Defaults to 200.
    pub jobs: usize,
    /// How many slots of each job come due. Defaults to 20.
    pub slots: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            store_url: String::new(),
            hosts: 3,
            jobs: 200,
            slots: 20,
        }
    }
}

/// How many jobs' slots are claimed at once when the server keeps counts.
const CONCURRENT_JOBS: usize = 32;

/// The capacity run's result.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Capacity {
    /// The store, password removed.
    pub store: String,
    /// The backend (`redis`, `postgres`, `sqlite`).
    pub backend: String,
    /// Hosts claiming every slot.
    pub hosts: usize,
    /// Jobs.
    pub jobs: usize,
    /// Slots of each job.
    pub slots_per_job: usize,
    /// Slots due in all: jobs × slots, for each side.
    pub due_slots: u64,
    /// Where the times come from: `INFO commandstats`, `pg_stat_statements`, or `calls timed
    /// one at a time`.
    pub measured_by: String,
    /// The store's own time per due slot for Baton: every host's claim, the winner's finish,
    /// µs.
    pub store_us_per_slot: f64,
    /// The same for the lock: every host's raw primitive and the winner's release, µs.
    pub lock_us_per_slot: f64,
    /// `store_us_per_slot` over `lock_us_per_slot`.
    pub ratio: f64,
    /// Due slots per second that one server core carries at this cost, for Baton: 10⁶ over
    /// `store_us_per_slot`. An upper bound: the server's networking is not counted on Redis.
    pub baton_slots_per_s_per_core: f64,
    /// The same for the lock.
    pub lock_slots_per_s_per_core: f64,
    /// Requests Baton's clients sent per due slot.
    pub baton_requests_per_slot: f64,
    /// Requests the lock's clients sent per due slot.
    pub lock_requests_per_slot: f64,
    /// What the steps would cost with no logic of their own, where they are scripts that the
    /// server times (Redis and Valkey); absent elsewhere.
    pub floor: Option<Floor>,
}

/// The floor of a script on the server, measured in the same run: what a due slot would cost
/// if every step made only the calls it cannot do without ([`StepFloor`]).
#[derive(Clone, Debug, Serialize)]
pub struct Floor {
    /// Each bare step's time, µs a call.
    #[serde(flatten)]
    pub steps: StepFloor,
    /// One won claim, the other hosts' losing claims and the finish, µs per due slot.
    pub us_per_slot: f64,
    /// `us_per_slot` over the lock's time per due slot.
    pub ratio: f64,
}

/// Runs the capacity measurement on the store at `settings.store_url`.
pub async fn run(settings: &Settings) -> Result<Capacity, BenchError> {
    let namespace = super::unique_name("bench-capacity");
    let hosts = settings.hosts.max(1);
    let mut clients = Vec::with_capacity(hosts);
    for _ in 0..hosts {
        clients.push(store::open(&settings.store_url, &namespace).await?);
    }
    let run_id = super::unique_name("cap");
    let jobs: Vec<String> = (0..settings.jobs.max(1))
        .map(|j| format!("{run_id}-j{j}"))
        .collect();
    let result = measure(&clients, &jobs, settings.slots.max(1), &run_id).await;
    let steps = if result.is_ok() {
        clients[0].step_floor().await
    } else {
        Ok(None)
    };
    for job in &jobs {
        clients[0].forget_job(job).await?;
    }
    clients[0].clear_raw_primitive(&run_id).await?;
    let (baton, lock, measured_by) = result?;
    let steps = steps?;
    let due = (jobs.len() * settings.slots.max(1)) as u64;
    let per_slot = |us: f64| ratio(us, due as f64);
    let store_us_per_slot = per_slot(baton.us);
    let lock_us_per_slot = per_slot(lock.us);
    Ok(Capacity {
        store: store::redact(&settings.store_url),
        backend: clients[0].backend().to_owned(),
        hosts,
        jobs: jobs.len(),
        slots_per_job: settings.slots.max(1),
        due_slots: due,
        measured_by,
        store_us_per_slot,
        lock_us_per_slot,
        ratio: ratio(store_us_per_slot, lock_us_per_slot),
        baton_slots_per_s_per_core: ratio(1e6, store_us_per_slot),
        lock_slots_per_s_per_core: ratio(1e6, lock_us_per_slot),
        baton_requests_per_slot: per_slot(baton.requests as f64),
        lock_requests_per_slot: per_slot(lock.requests as f64),
        floor: steps.map(|steps| {
            let us_per_slot = steps.per_slot_us(hosts);
            Floor {
                steps,
                us_per_slot,
                ratio: ratio(us_per_slot, lock_us_per_slot),
            }
        }),
    })
}

/// One side's total: the store's time, µs, and the requests sent.
#[derive(Default)]
struct Side {
    us: f64,
    requests: u64,
}

/// The lease options of the capacity run: the defaults but for a history of
/// [`HISTORY_SIZE`] runs kept [`LATE_TOLERANCE`] (no catch-up, `max_late` 0), so that every
/// claim trims runs as in a job's steady state within a short run.
fn options() -> LeaseOptions {
    LeaseOptions {
        max_late: Duration::ZERO,
        catch_up: Duration::ZERO,
        history_size: HISTORY_SIZE,
        ..LeaseOptions::default()
    }
}

/// Finished runs each job keeps in the capacity run: 10.
pub const HISTORY_SIZE: u32 = 10;

/// Measures both sides, Baton first; returns them and where the times come from.
async fn measure(
    clients: &[Arc<dyn Store>],
    jobs: &[String],
    slots: usize,
    run_id: &str,
) -> Result<(Side, Side, String), BenchError> {
    let timed = clients[0].server_time().await?.is_none();
    // History to trim, not counted: as many runs of every job as the history keeps and as the
    // run adds, old enough to be trimmed once the retention has passed. It loads scripts,
    // prepares statements and registers the jobs' names too.
    // Each host wins each job once first, alone: its client registers a job's name on its
    // first win, a request no measured slot should carry.
    let mut slot = clients[0].now().await?;
    for round in 0..(HISTORY_SIZE as usize + slots).max(clients.len()) {
        slot = clients[0].now().await?.max(slot + 1);
        let lead = (round < clients.len()).then_some(round);
        baton_slot(clients, jobs, slot, false, lead).await?;
    }
    lock_slot(clients, jobs, &format!("{run_id}-warm"), false).await?;
    let old = slot;
    loop {
        let left = old + millis(options().retention()) + 100 - clients[0].now().await?;
        if left <= 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(left.unsigned_abs())).await;
    }

    // The server-time readings happen outside the windows; the clock reads of each round
    // (a new slot, never late) are not counted.
    let requests = || clients.iter().map(|c| c.round_trips()).sum::<u64>();
    let mut baton = Side::default();
    let before_time = clients[0].server_time().await?;
    let before = requests();
    let mut clock_reads = 0;
    for _ in 0..slots {
        let sent = requests();
        slot = clients[0].now().await?.max(slot + 1);
        clock_reads += requests() - sent;
        baton.us += baton_slot(clients, jobs, slot, timed, None).await?;
    }
    baton.requests = requests() - before - clock_reads;
    let after_time = clients[0].server_time().await?;
    if let (Some(a), Some(b)) = (after_time, before_time) {
        baton.us = a.steps_us - b.steps_us;
    }

    let mut lock = Side::default();
    let before_time = clients[0].server_time().await?;
    let before = requests();
    for round in 0..slots {
        lock.us += lock_slot(clients, jobs, &format!("{run_id}-r{round}"), timed).await?;
    }
    lock.requests = requests() - before;
    let after_time = clients[0].server_time().await?;
    let source = match (after_time, before_time) {
        (Some(a), Some(b)) => {
            lock.us = a.primitive_us - b.primitive_us;
            a.source.to_owned()
        }
        _ => "calls timed one at a time".to_owned(),
    };
    Ok((baton, lock, source))
}

/// One slot of every job under Baton: every host claims, the winner finishes; with a `lead`,
/// that host claims first and wins. Returns the calls' own time, µs, when `timed` (then one
/// call at a time), else 0.
async fn baton_slot(
    clients: &[Arc<dyn Store>],
    jobs: &[String],
    slot: i64,
    timed: bool,
    lead: Option<usize>,
) -> Result<f64, BenchError> {
    let first = lead.unwrap_or(0);
    let order: Vec<usize> = (0..clients.len())
        .map(|h| (h + first) % clients.len())
        .collect();
    let options = options();
    let one_job = |job: &str| {
        let (options, order) = (&options, &order);
        let job = job.to_owned();
        async move {
            let mut spent = Duration::ZERO;
            let mut winner = None;
            let claims = order.iter().map(|&h| {
                let job = &job;
                let client = &clients[h];
                async move {
                    let token = Token::random();
                    let runner = format!("host-{h}");
                    let request = claim_request(job, slot, &runner, token, options);
                    let began = Instant::now();
                    let outcome = client.claim(&request).await;
                    (h, token, outcome, began.elapsed())
                }
            });
            let answers = all(claims, timed || lead.is_some()).await;
            for (h, token, outcome, took) in answers {
                spent += took;
                match outcome? {
                    ClaimOutcome::Won(_) if winner.is_none() => winner = Some((h, token)),
                    ClaimOutcome::Running { .. } => {}
                    other => {
                        return Err(BenchError::Unexpected {
                            what: format!("claim of slot {slot} of {job} by host {h}"),
                            expected: "one win and the others running".into(),
                            got: format!("{other:?}"),
                        })
                    }
                }
            }
            let Some((h, token)) = winner else {
                return Err(BenchError::Unexpected {
                    what: format!("claims of slot {slot} of {job}"),
                    expected: "one win".into(),
                    got: "none".into(),
                });
            };
            let began = Instant::now();
            let finished = clients[h]
                .finish(&job, slot, token, Finish::Success)
                .await?;
            spent += began.elapsed();
            if finished != TokenOutcome::Accepted {
                return Err(BenchError::Unexpected {
                    what: format!("finish of slot {slot} of {job}"),
                    expected: "accepted".into(),
                    got: format!("{finished:?}"),
                });
            }
            Ok::<Duration, BenchError>(spent)
        }
    };
    each_job(jobs, timed, one_job).await
}

/// One slot of every job under the lock: every host writes the slot's key, the one that wrote
/// it deletes it. Returns the calls' own time, µs, when `timed`, else 0.
async fn lock_slot(
    clients: &[Arc<dyn Store>],
    jobs: &[String],
    round: &str,
    timed: bool,
) -> Result<f64, BenchError> {
    let one_job = |job: &str| {
        let key = format!("{round}-{job}");
        async move {
            let mut spent = Duration::ZERO;
            let locks = clients.iter().enumerate().map(|(h, client)| {
                let key = &key;
                async move {
                    let began = Instant::now();
                    let wrote = client.raw_primitive(key).await;
                    (h, wrote, began.elapsed())
                }
            });
            let answers = all(locks, timed).await;
            let mut holders = Vec::new();
            for (h, wrote, took) in answers {
                spent += took;
                if wrote? {
                    holders.push(h);
                }
            }
            let [holder] = holders[..] else {
                return Err(BenchError::Unexpected {
                    what: format!("lock {key}"),
                    expected: "one host holding it".into(),
                    got: format!("{} holders", holders.len()),
                });
            };
            let began = Instant::now();
            let released = clients[holder].raw_release(&key).await?;
            spent += began.elapsed();
            if !released {
                return Err(BenchError::Unexpected {
                    what: format!("release of lock {key}"),
                    expected: "deleted".into(),
                    got: "it was gone".into(),
                });
            }
            Ok::<Duration, BenchError>(spent)
        }
    };
    each_job(jobs, timed, one_job).await
}

/// Awaits every call: one after the other when `one_at_a_time`, else all at once.
async fn all<F: std::future::Future>(
    calls: impl Iterator<Item = F>,
    one_at_a_time: bool,
) -> Vec<F::Output> {
    if !one_at_a_time {
        return join_all(calls).await;
    }
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await);
    }
    answers
}

/// Runs `one_job` for every job: one at a time when `timed`, else [`CONCURRENT_JOBS`] at once.
/// Returns the sum of their own times, µs, when `timed`, else 0.
async fn each_job<'a, F, Fut>(
    jobs: &'a [String],
    timed: bool,
    one_job: F,
) -> Result<f64, BenchError>
where
    F: Fn(&'a str) -> Fut,
    Fut: std::future::Future<Output = Result<Duration, BenchError>>,
{
    let mut spent = Duration::ZERO;
    if timed {
        for job in jobs {
            spent += one_job(job).await?;
        }
        return Ok(spent.as_secs_f64() * 1e6);
    }
    let mut running =
        futures::stream::iter(jobs.iter().map(|j| one_job(j))).buffer_unordered(CONCURRENT_JOBS);
    while let Some(done) = running.next().await {
        done?;
    }
    Ok(0.0)
}

/// The figures as Markdown.
pub fn markdown(c: &Capacity) -> String {
    let mut text = format!(
        "Store capacity on {store} ({backend}): {hosts} hosts claim every slot of {jobs} jobs, \
         {slots} slots each ({due} due slots a side); store time from {by}.\n\n\
         | per due slot | store time | requests | due slots/s a core |\n\
         | --- | ---: | ---: | ---: |\n\
         | Baton: {hosts} claims + 1 finish | {b:.1} µs | {br:.2} | {bs:.0} |\n\
         | lock: {hosts} × raw primitive + 1 release | {l:.1} µs | {lr:.2} | {ls:.0} |\n\n\
         Baton over the lock: **{ratio:.2}×**.\n",
        store = c.store,
        backend = c.backend,
        hosts = c.hosts,
        jobs = c.jobs,
        slots = c.slots_per_job,
        due = c.due_slots,
        by = c.measured_by,
        b = c.store_us_per_slot,
        br = c.baton_requests_per_slot,
        bs = c.baton_slots_per_s_per_core,
        l = c.lock_us_per_slot,
        lr = c.lock_requests_per_slot,
        ls = c.lock_slots_per_s_per_core,
        ratio = c.ratio,
    );
    if let Some(f) = &c.floor {
        text.push_str(&format!(
            "\nThe floor of a script on this server ({calls} calls each, no logic in them): \
             an empty script {e:.2} µs; a losing claim's one `GET` {lc:.2} µs; a won claim's \
             `TIME`, `HMGET`, `HSET` and `SET … PX` {wc:.2} µs; a finish's `HMGET`, `TIME`, \
             `HSET` and `DEL` {fi:.2} µs. A due slot at that floor: {per:.1} µs, \
             **{ratio:.2}×** the lock.\n",
            calls = f.steps.calls,
            e = f.steps.empty_script_us,
            lc = f.steps.losing_claim_us,
            wc = f.steps.won_claim_us,
            fi = f.steps.finish_us,
            per = f.us_per_slot,
            ratio = f.ratio,
        ));
    }
    text
}
