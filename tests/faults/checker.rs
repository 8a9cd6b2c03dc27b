//! The checker: reads what the store recorded (`baton history --json`), what the side-effect
//! guest wrote, and what the runners logged, and holds every run to the rules of
//! `spec/leases.md`.
//!
//! Times. Every time here is milliseconds since the Unix epoch on the store's clock. The stores
//! of these tests (a SQLite file, Redis and Valkey servers, PostgreSQL) all run on this machine,
//! so the store's clock is the machine's clock, and the harness stamps the runners' log lines and
//! its own faults with it. The one exception is a runner started under `faketime`: its guests
//! read a shifted wall clock, so their side-effect times are moved back by the runner's known
//! skew before they are compared with the store's times.
//!
//! Excuses. Where an outcome that breaks a rule is let pass, a comment beside it names the
//! excuse (`Excuse NAME`) and its class: A, an outcome the protocol allows after a fault the
//! deterministic simulation models, with the seed whose exact history shows it (the simulation's
//! `every_excuse_of_the_fault_matrix_is_shown_by_a_seed` keeps each seed showing it, through
//! the detectors of `tests/simulation/mechanisms.rs`); B, a load window of real processes on a
//! real machine (process starts, scheduling, log lines read after the fact), which exact
//! simulated time does not need and this matrix cannot do without; C, one that can no longer
//! be needed.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

/// One attempt of a run, as `baton history --json` prints it.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// 1 for the first try.
    pub attempt: u32,
    /// Who ran it.
    pub runner: String,
    /// Why it was claimed: `scheduled`, `catch-up` or `takeover`.
    pub reason: String,
    /// The fence value won with it.
    pub fence: u64,
    /// When its claim was won.
    pub started_at: i64,
    /// When it ended (for a runner that died: the lease end it never renewed).
    pub ended_at: Option<i64>,
    /// `success`, `failed`, `died` or `handed-over`; `None` while it runs.
    pub outcome: Option<String>,
}

/// One run, as `baton history --json` prints it.
#[derive(Clone, Debug)]
pub struct Run {
    /// The job.
    pub job: String,
    /// The slot.
    pub slot: i64,
    /// `running`, `success`, `failed` or `interrupted`.
    pub status: String,
    /// The current attempt's lease end.
    pub lease_end: i64,
    /// Every attempt, oldest first.
    pub attempts: Vec<Attempt>,
}

/// One line the side-effect guest appended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    /// The job whose data directory held it.
    pub job: String,
    /// The slot the guest was told.
    pub slot: i64,
    /// The attempt the guest was told.
    pub attempt: u32,
    /// The fence the guest was told.
    pub fence: u64,
    /// The runner the guest was told.
    pub runner: String,
    /// The guest's wall clock when it wrote the line (the runner's clock, skew included).
    pub at: i64,
}

/// One line a runner logged (instance events, and the store errors that matter here).
#[derive(Clone, Debug)]
pub struct Event {
    /// When the harness read it (machine clock = store clock).
    pub at: i64,
    /// The runner that logged it.
    pub runner: String,
    /// The event (`won`, `skip`, `late`, `success`, …) or, for other lines, the message.
    pub kind: String,
    /// The job, where the line names one.
    pub job: Option<String>,
    /// The slot, where the line names one.
    pub slot: Option<i64>,
    /// The attempt, where the line names one.
    pub attempt: Option<u32>,
    /// The event's reason.
    pub reason: String,
}

/// A job of the scenario, as the checker needs to know it.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// Its name.
    pub name: String,
    /// Its schedule is "every `period` ms", aligned on the epoch (`*/N * * * * *`).
    pub period: i64,
    /// Its `max_attempts`.
    pub max_attempts: u32,
    /// A well-behaved job must keep its schedule outside the faults' disturbance.
    pub well_behaved: bool,
    /// Its `catch_up` window, ms: a runner that starts claims the latest missed slot if it was
    /// due less than this long ago.
    pub catch_up: i64,
    /// Its `max_late`, ms: the store answers a claim `late` past it plus 10 s.
    pub max_late: i64,
}

impl JobSpec {
    /// A job due every `period` ms, with `max_attempts` 3 and the default `catch_up` and
    /// `max_late`.
    pub fn every(name: &str, period: i64, well_behaved: bool) -> JobSpec {
        JobSpec {
            name: name.into(),
            period,
            max_attempts: 3,
            well_behaved,
            catch_up: DEFAULT_CATCH_UP_MS,
            max_late: DEFAULT_MAX_LATE_MS,
        }
    }
}

/// The spec's default `catch_up`: 5 minutes.
pub const DEFAULT_CATCH_UP_MS: i64 = 300_000;
/// Baton's default `max_late`: 30 s.
pub const DEFAULT_MAX_LATE_MS: i64 = 30_000;

/// A span of time, for one runner or for all of them.
#[derive(Clone, Debug)]
pub struct Span {
    /// The runner it concerns; `None` for all.
    pub runner: Option<String>,
    /// Start (ms).
    pub from: i64,
    /// End (ms).
    pub to: i64,
}

/// Everything the checker reads about one scenario.
#[derive(Clone, Debug, Default)]
pub struct Input {
    /// The scenario's jobs.
    pub jobs: Vec<JobSpec>,
    /// The store's history of every job.
    pub runs: Vec<Run>,
    /// The side-effect guest's lines.
    pub effects: Vec<Effect>,
    /// The runners' log lines.
    pub events: Vec<Event>,
    /// The slots in `[from, to]` must all be accounted for.
    pub window: (i64, i64),
    /// Each runner's wall clock minus the store's (a `faketime` runner), ms.
    pub skew: HashMap<String, i64>,
    /// When a runner was frozen (`SIGSTOP` to `SIGCONT`): it cannot stop its guests meanwhile.
    pub freezes: Vec<Span>,
    /// When no runner could run a slot because the store was out of reach for all of them, or
    /// answered their claims only once they were late.
    pub outages: Vec<Span>,
    /// When every runner was down: from the last one's `kill -9` to the first one's start.
    /// The slots due meanwhile are missed, but for the latest, which a runner that starts
    /// catches up (spec, "Catch-up on start").
    pub all_down: Vec<Span>,
    /// When a fault (and its recovery) was going on: well-behaved jobs may be off schedule then.
    pub disturbed: Vec<Span>,
    /// How long a host may take to stop a guest once it can run: the allowance for side effects
    /// after the lease end (the machine is loaded, so generous).
    pub stop_latency: i64,
    /// How late after its slot a well-behaved job's first attempt may start.
    pub on_time: i64,
    /// Every job's lease, ms.
    pub lease: i64,
    /// Every job's heartbeat, ms.
    pub heartbeat: i64,
    /// When each runner was up: from its start to its `kill -9` or exit (`i64::MAX` while it
    /// still ran at the end).
    pub lives: Vec<Span>,
    /// When one runner alone could not reach the store (a partition of its link).
    pub cut_off: Vec<Span>,
    /// Every key of the jobs' state, with its writer, as the store recorded it.
    pub state: Vec<crate::state_writes::StateRecord>,
    /// The jobs that write state: each that succeeded must have written some.
    pub state_jobs: Vec<String>,
    /// The attempts that faults whose point is a takeover hit (see [`rules::FORCED_TAKEOVER`]).
    pub hits: Vec<Hit>,
}

/// A broken rule, with what shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule, in the words of the issue.
    pub rule: &'static str,
    /// The run and what is wrong with it.
    pub detail: String,
}

/// The rule names, one per invariant.
pub mod rules {
    /// At most one attempt of a job holds a live lease at any store time.
    pub const ONE_LIVE_LEASE: &str = "one live lease";
    /// Attempts counted toward max attempts never exceed it; hand-overs are not counted.
    pub const MAX_ATTEMPTS: &str = "max attempts";
    /// No finish or heartbeat with a stale token was accepted.
    pub const STALE_TOKEN: &str = "stale token";
    /// No run of a job started after a newer slot had started.
    pub const ORDER: &str = "no older run after a newer one";
    /// Every due slot is accounted for.
    pub const ACCOUNTED: &str = "every slot accounted for";
    /// After all runners were down, only the latest missed slot is caught up, within the
    /// catch-up window, and never more than one.
    pub const CATCH_UP: &str = "catch-up on start";
    /// No side effect of a fenced attempt later than its lease end plus the stop latency.
    pub const ZOMBIE: &str = "zombie side effect";
    /// Well-behaved jobs keep their schedule beside misbehaving ones.
    pub const SCHEDULE: &str = "well-behaved jobs keep their schedule";
    /// A run whose attempt died, while a runner that knew of it lived and attempts remained,
    /// is taken over within lease + 2 × heartbeat of the moment the store could be reached
    /// again.
    pub const TAKEN_OVER: &str = "a died attempt is taken over";
    /// A fault whose point is a takeover (a `kill -9`, a freeze) hit a running attempt with
    /// attempts left; another runner took the run over, and the run ended `success` there.
    pub const FORCED_TAKEOVER: &str = "a fault on a running attempt forces a takeover";
}

/// An attempt a fault hit: the scenario saw it start on `runner` and then killed or froze it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    /// The job.
    pub job: String,
    /// The slot.
    pub slot: i64,
    /// The runner that held it.
    pub runner: String,
    /// Whether another runner must take the run over: not when the hit runner kept every
    /// other one out of the store until it woke (frozen holding a SQLite file's write lock), so
    /// the takeover was a race that the woken runner, a backup of its own lost run, may win.
    pub by_another: bool,
}

/// The figures of one scenario, for the report.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// Runs in the store.
    pub runs: usize,
    /// Attempts won by a takeover.
    pub takeovers: usize,
    /// Attempts handed over on stop.
    pub hand_overs: usize,
    /// Attempts the store fenced out: their lease ran out and their token was no longer good.
    pub fenced: usize,
    /// The latest side effect of a fenced attempt after its lease end, ms (negative: it stopped
    /// before); `None` when no fenced attempt wrote anything.
    pub zombie_after_lease_end: Option<i64>,
    /// The same, counted from when the runner could run again (after a freeze), ms.
    pub zombie_after_wake: Option<i64>,
    /// Slots due while every runner was down that nobody ran: missed, as the spec allows.
    pub missed_all_down: usize,
    /// Slots due while every runner was down that a starting runner caught up.
    pub caught_up: usize,
    /// Died attempts whose run was owed a takeover (a runner that knew of it lived, attempts
    /// remained, no newer run started first), and how many of them got it in time.
    pub owed_takeovers: (usize, usize),
    /// State keys whose writer was held to the lease (see [`crate::state_writes`]).
    pub state_records: usize,
    /// The latest owed takeover, counted from when it was due (lease + 2 × heartbeat after the
    /// store was back, or 2 × heartbeat after the lease end), ms; negative: before.
    pub takeover_after_due: Option<i64>,
}

fn ms(v: &Value) -> Option<i64> {
    let s = v.as_str()?;
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// Parses `baton history --json` output: one run per line.
pub fn parse_history(text: &str) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
        let bad = |what: &str| format!("history line without {what}: {line}");
        let mut attempts = Vec::new();
        for a in v["attempts"].as_array().ok_or_else(|| bad("attempts"))? {
            attempts.push(Attempt {
                attempt: a["attempt"]
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad("attempt"))?,
                runner: a["runner"]
                    .as_str()
                    .ok_or_else(|| bad("runner"))?
                    .to_owned(),
                reason: a["reason"].as_str().unwrap_or_default().to_owned(),
                fence: a["fence"].as_u64().ok_or_else(|| bad("fence"))?,
                started_at: ms(&a["started_at"]).ok_or_else(|| bad("started_at"))?,
                ended_at: ms(&a["ended_at"]),
                outcome: a["outcome"].as_str().map(str::to_owned),
            });
        }
        runs.push(Run {
            job: v["job"].as_str().ok_or_else(|| bad("job"))?.to_owned(),
            slot: ms(&v["slot"]).ok_or_else(|| bad("slot"))?,
            status: v["status"]
                .as_str()
                .ok_or_else(|| bad("status"))?
                .to_owned(),
            lease_end: ms(&v["lease_end"]).ok_or_else(|| bad("lease_end"))?,
            attempts,
        });
    }
    Ok(runs)
}

/// Parses one side-effect line: `<slot> <attempt> <fence> <runner> <ms> <step>`.
pub fn parse_effect(job: &str, line: &str) -> Option<Effect> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 6 {
        return None;
    }
    Some(Effect {
        job: job.to_owned(),
        slot: f[0].parse().ok()?,
        attempt: f[1].parse().ok()?,
        fence: f[2].parse().ok()?,
        runner: f[3].to_owned(),
        at: f[4].parse().ok()?,
    })
}

/// Parses one JSON log line of `baton run --log-format json`, read at `at`.
pub fn parse_event(runner: &str, at: i64, line: &str) -> Option<Event> {
    let v: Value = serde_json::from_str(line).ok()?;
    let kind = v["event"]
        .as_str()
        .or_else(|| v["message"].as_str())?
        .to_owned();
    let slot = match &v["slot"] {
        Value::String(_) => ms(&v["slot"]),
        Value::Number(n) => n.as_i64(),
        _ => None,
    };
    Some(Event {
        at,
        runner: runner.to_owned(),
        kind,
        job: v["job"].as_str().map(str::to_owned),
        slot,
        attempt: v["attempt"].as_u64().and_then(|n| u32::try_from(n).ok()),
        reason: v["reason"].as_str().unwrap_or_default().to_owned(),
    })
}

fn within(spans: &[Span], t: i64, before: i64, after: i64) -> bool {
    spans
        .iter()
        .any(|s| s.from - before <= t && t <= s.to + after)
}

/// The end of an attempt's live lease: its end, or the run's lease end while it is current.
fn lease_until(run: &Run, a: &Attempt) -> i64 {
    a.ended_at.unwrap_or(run.lease_end)
}

/// Checks every rule; returns the violations (none, when Baton keeps the spec) and the figures.
pub fn check(input: &Input) -> (Vec<Violation>, Figures) {
    let mut v = Vec::new();
    let mut catch_up_counts = (0, 0);
    let mut by_job: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in &input.runs {
        by_job.entry(run.job.as_str()).or_default().push(run);
    }
    for runs in by_job.values_mut() {
        runs.sort_by_key(|r| r.slot);
    }
    for job in &input.jobs {
        let runs = by_job.get(job.name.as_str()).cloned().unwrap_or_default();
        one_live_lease(input, &runs, &mut v);
        max_attempts(job, &runs, &mut v);
        stale_tokens(&runs, &mut v);
        order(&runs, &mut v);
        let missed = catch_up(input, job, &runs, &mut v, &mut catch_up_counts);
        accounted(input, job, &runs, &missed, &mut v);
        if job.well_behaved {
            schedule(input, job, &runs, &mut v);
        }
    }
    stale_finishes_reported(input, &mut v);
    let mut figures = Figures {
        runs: input.runs.len(),
        missed_all_down: catch_up_counts.0,
        caught_up: catch_up_counts.1,
        ..Figures::default()
    };
    for job in &input.jobs {
        let runs = by_job.get(job.name.as_str()).cloned().unwrap_or_default();
        taken_over(input, job, &runs, &mut v, &mut figures);
    }
    for a in input.runs.iter().flat_map(|r| &r.attempts) {
        figures.takeovers += usize::from(a.reason == "takeover");
        figures.hand_overs += usize::from(a.outcome.as_deref() == Some("handed-over"));
        figures.fenced += usize::from(a.outcome.as_deref() == Some("died"));
    }
    zombies(input, &mut v, &mut figures);
    forced_takeovers(input, &mut v);
    crate::accounts::check(input, &mut v);
    figures.state_records = crate::state_writes::check(input, &mut v);
    (v, figures)
}

/// What the store and the runners said of one slot, to explain a violation.
pub fn story(input: &Input, job: &str, slot: i64) -> String {
    let mut out = String::new();
    for r in input.runs.iter().filter(|r| r.job == job && r.slot == slot) {
        out.push_str(&format!(" [store: {} lease_end {}", r.status, r.lease_end));
        for a in &r.attempts {
            out.push_str(&format!(
                "; #{} {} {} {}..{:?} {:?}",
                a.attempt, a.runner, a.reason, a.started_at, a.ended_at, a.outcome
            ));
        }
        out.push(']');
    }
    let said: Vec<String> = input
        .events
        .iter()
        .filter(|e| e.job.as_deref() == Some(job) && e.slot == Some(slot))
        .map(|e| format!("{}@{} {} {}", e.kind, e.at, e.runner, e.reason))
        .collect();
    if !said.is_empty() {
        out.push_str(&format!(" [runners: {}]", said.join("; ")));
    }
    out
}

fn one_live_lease(input: &Input, runs: &[&Run], v: &mut Vec<Violation>) {
    let mut spans: Vec<(i64, i64, i64, u32)> = runs
        .iter()
        .flat_map(|r| {
            r.attempts
                .iter()
                .map(move |a| (a.started_at, lease_until(r, a), r.slot, a.attempt))
        })
        .collect();
    spans.sort();
    let mut held: Option<(i64, i64, u32)> = None;
    for (from, to, slot, attempt) in spans {
        if let Some((until, hslot, hattempt)) = held {
            if from < until {
                v.push(Violation {
                    rule: rules::ONE_LIVE_LEASE,
                    detail: format!(
                        "slot {slot} attempt {attempt} won at {from} while slot {hslot} attempt {hattempt} held a lease until {until};{}{}",
                        story(input, &runs[0].job, slot),
                        story(input, &runs[0].job, hslot)
                    ),
                });
            }
        }
        if held.is_none_or(|(until, _, _)| to > until) {
            held = Some((to, slot, attempt));
        }
    }
}

fn max_attempts(job: &JobSpec, runs: &[&Run], v: &mut Vec<Violation>) {
    for (i, run) in runs.iter().enumerate() {
        let mut deaths = 0u32;
        for (k, a) in run.attempts.iter().enumerate() {
            if a.attempt as usize != k + 1 {
                v.push(Violation {
                    rule: rules::MAX_ATTEMPTS,
                    detail: format!(
                        "{} slot {}: attempt number {} in position {}",
                        run.job,
                        run.slot,
                        a.attempt,
                        k + 1
                    ),
                });
            }
            if deaths >= job.max_attempts {
                v.push(Violation {
                    rule: rules::MAX_ATTEMPTS,
                    detail: format!(
                        "{} slot {}: attempt {} started after {deaths} runners died (max_attempts {})",
                        run.job, run.slot, a.attempt, job.max_attempts
                    ),
                });
            }
            deaths += u32::from(a.outcome.as_deref() == Some("died"));
        }
        // Excuse MAX_ATTEMPTS_NEWER: an interrupted run with attempts left is fine once a newer
        // run exists (spec rule 3). Class A, as TAKEN_OVER_NEWER_FIRST.
        let newer = i + 1 < runs.len();
        if run.status == "interrupted" && deaths < job.max_attempts && !newer {
            v.push(Violation {
                rule: rules::MAX_ATTEMPTS,
                detail: format!(
                    "{} slot {}: interrupted after {deaths} deaths (max_attempts {}) with no newer run: a hand-over was counted",
                    run.job, run.slot, job.max_attempts
                ),
            });
        }
    }
}

fn stale_tokens(runs: &[&Run], v: &mut Vec<Violation>) {
    for run in runs {
        let mut bad = |detail: String| {
            v.push(Violation {
                rule: rules::STALE_TOKEN,
                detail: format!("{} slot {}: {detail}", run.job, run.slot),
            })
        };
        let Some(last) = run.attempts.last() else {
            bad("a run without attempts".into());
            continue;
        };
        for a in &run.attempts[..run.attempts.len() - 1] {
            if !matches!(a.outcome.as_deref(), Some("died" | "handed-over")) {
                bad(format!(
                    "attempt {} was followed by another, yet ended {:?}: a finish with a superseded token was accepted",
                    a.attempt, a.outcome
                ));
            }
        }
        match run.status.as_str() {
            "success" | "failed" => {
                if last.outcome.as_deref() != Some(run.status.as_str()) {
                    bad(format!(
                        "status {} but the last attempt ended {:?}",
                        run.status, last.outcome
                    ));
                }
                if last.ended_at != Some(run.lease_end) {
                    bad(format!(
                        "finished at {:?} but its lease end moved to {}: a heartbeat after the finish was accepted",
                        last.ended_at, run.lease_end
                    ));
                }
            }
            "interrupted" => {
                // A released run whose newer slot was claimed before a backup's check is
                // interrupted too (spec, "A dead run and the next slot"): its lease ran out.
                // Excuse INTERRUPTED_HANDED_OVER, class A; shown in the simulation by: Stop with
                // hand-over — a run interrupted, last attempt handed-over; seed 89.
                if !matches!(last.outcome.as_deref(), Some("died" | "handed-over")) {
                    bad(format!(
                        "interrupted, but its last attempt ended {:?}",
                        last.outcome
                    ));
                }
            }
            _ => {
                if last.outcome.as_deref() == Some("handed-over")
                    && last.ended_at != Some(run.lease_end)
                {
                    bad(format!(
                        "released at {:?} but its lease end moved to {}: a heartbeat renewed a released lease",
                        last.ended_at, run.lease_end
                    ));
                }
            }
        }
    }
}

/// A runner told that its finish or release was accepted, for an attempt the store recorded
/// otherwise: the store accepted a stale token, or told the runner it had.
fn stale_finishes_reported(input: &Input, v: &mut Vec<Violation>) {
    let runs: HashMap<(&str, i64), &Run> = input
        .runs
        .iter()
        .map(|r| ((r.job.as_str(), r.slot), r))
        .collect();
    for e in &input.events {
        let expected = match e.kind.as_str() {
            "success" => "success",
            "failed" => "failed",
            "released" => "handed-over",
            _ => continue,
        };
        let (Some(job), Some(slot), Some(attempt)) = (&e.job, e.slot, e.attempt) else {
            continue;
        };
        let Some(run) = runs.get(&(job.as_str(), slot)) else {
            continue;
        };
        let recorded = run.attempts.iter().find(|a| a.attempt == attempt);
        let ok = recorded
            .is_some_and(|a| a.runner == e.runner && a.outcome.as_deref() == Some(expected));
        if !ok {
            v.push(Violation {
                rule: rules::STALE_TOKEN,
                detail: format!(
                    "{job} slot {slot}: {} was told its {} of attempt {attempt} was accepted; the store recorded {:?}",
                    e.runner,
                    e.kind,
                    recorded.map(|a| (&a.runner, &a.outcome))
                ),
            });
        }
    }
}

fn order(runs: &[&Run], v: &mut Vec<Violation>) {
    // The earliest first attempt of any newer run, from the newest down.
    let mut newer_started: Option<(i64, i64)> = None;
    for run in runs.iter().rev() {
        if let Some((started, newer_slot)) = newer_started {
            for a in run.attempts.iter().filter(|a| a.started_at > started) {
                v.push(Violation {
                    rule: rules::ORDER,
                    detail: format!(
                        "{} slot {} attempt {} started at {} after slot {newer_slot} had started at {started}",
                        run.job, run.slot, a.attempt, a.started_at
                    ),
                });
            }
        }
        if let Some(first) = run.attempts.first() {
            if newer_started.is_none_or(|(s, _)| first.started_at < s) {
                newer_started = Some((first.started_at, run.slot));
            }
        }
    }
}

fn slots(job: &JobSpec, (from, to): (i64, i64)) -> impl Iterator<Item = i64> {
    let period = job.period;
    let first = from.div_euclid(period) * period + period;
    (0..)
        .map(move |k| first + k * period)
        .take_while(move |s| *s <= to)
}

/// How late after its slot a caught-up run may start beyond the catch-up window (excuse
/// CATCH_UP_SLACK): the starting runner checks the window at its loop's start, then reads the
/// store and waits its jitter, min(2 × heartbeat, 2 s) (`schedule_loop.rs`), before the claim;
/// the jitter is the protocol's, and [`CATCH_UP_LOAD_MS`] is the rest.
fn catch_up_slack(heartbeat: i64) -> i64 {
    (2 * heartbeat).min(2_000) + CATCH_UP_LOAD_MS
}

/// Class B, a load window of real processes: the starting runner's process start and its reads'
/// round trips on a loaded machine, 1 s. (It was 3 s with a jitter of 2 s assumed; the jitter
/// is 300 ms at the matrix's 150 ms heartbeat.)
const CATCH_UP_LOAD_MS: i64 = 1_000;

/// Holds the slots due while every runner was down to the catch-up rule; returns the slots it
/// accounts for as missed while all runners were down. Per span, the slots due in it are
/// missed, except the latest, which a starting runner catches up (reason `catch-up`) if it was
/// due within the catch-up window; a slot due after the runners' loops started may run as
/// scheduled. So: at most one caught-up slot; no slot after it missed; none caught up outside
/// the window; and, when the window covers the whole outage, the latest one caught up.
fn catch_up(
    input: &Input,
    job: &JobSpec,
    runs: &[&Run],
    v: &mut Vec<Violation>,
    counts: &mut (usize, usize),
) -> HashSet<i64> {
    let by_slot: HashMap<i64, &&Run> = runs.iter().map(|r| (r.slot, r)).collect();
    let mut missed = HashSet::new();
    for span in &input.all_down {
        let due: Vec<i64> = slots(job, (span.from, span.to)).collect();
        let reason = |s: &i64| {
            by_slot
                .get(s)
                .and_then(|r| r.attempts.first())
                .map(|a| a.reason.as_str())
        };
        let caught: Vec<i64> = due
            .iter()
            .copied()
            .filter(|s| reason(s) == Some("catch-up"))
            .collect();
        let mut bad = |detail: String| {
            v.push(Violation {
                rule: rules::CATCH_UP,
                detail: format!(
                    "{} (all runners down {}..{}): {detail}",
                    job.name, span.from, span.to
                ),
            })
        };
        if caught.len() > 1 {
            bad(format!("{} slots caught up: {caught:?}", caught.len()));
        }
        let latest = caught.last().copied();
        let mut missed_here = 0;
        for &slot in &due {
            match (by_slot.get(&slot), latest) {
                (None, Some(c)) if slot > c => {
                    // Due while all were down, so accounted; but the wrong slot was caught up.
                    missed.insert(slot);
                    bad(format!(
                        "slot {slot} missed, but the older slot {c} was caught up"
                    ));
                }
                (None, _) => {
                    missed_here += 1;
                    missed.insert(slot);
                }
                // Excuse CATCH_UP_SCHEDULED: a slot of the span that ran anyway. The span ends
                // at the first runner's spawn, its loop starts later. Class B, a load window of
                // real processes: process start and component compilation.
                (Some(_), _) => {}
            }
        }
        for &c in &caught {
            let started = by_slot
                .get(&c)
                .and_then(|r| r.attempts.first())
                .map_or(c, |a| a.started_at);
            if started - c > job.catch_up + catch_up_slack(input.heartbeat) {
                bad(format!(
                    "slot {c} caught up {} ms after it was due, outside the catch-up window of {} ms",
                    started - c,
                    job.catch_up
                ));
            }
        }
        // Excuse CATCH_UP_WINDOW: the latest slot must be caught up only when the window covers
        // the whole span plus a period (the spec's window, counted generously). Not a fault
        // window; with the 5 min default and spans of seconds it never excuses anything.
        let whole_outage = span.to - span.from + job.period;
        if latest.is_none() && missed_here > 0 && job.catch_up >= whole_outage {
            bad(format!(
                "no slot caught up, though the catch-up window ({} ms) covers the outage",
                job.catch_up
            ));
        }
        counts.1 += caught.len();
    }
    counts.0 += missed.len();
    missed
}

fn accounted(
    input: &Input,
    job: &JobSpec,
    runs: &[&Run],
    missed_all_down: &HashSet<i64>,
    v: &mut Vec<Violation>,
) {
    let ran: HashSet<i64> = runs.iter().map(|r| r.slot).collect();
    let told: HashSet<i64> = input
        .events
        .iter()
        .filter(|e| e.job.as_deref() == Some(job.name.as_str()))
        .filter(|e| matches!(e.kind.as_str(), "skip" | "late"))
        .filter_map(|e| e.slot)
        .collect();
    for slot in slots(job, input.window) {
        // Excuse ACCOUNTED_OUTAGE. In the span (class A): a claim unanswered in the outage is
        // watched and sent again, but yields to a newer slot's claim (`claim.rs`, `watch`), so
        // the slot has no run and no line. Shown in the simulation by: a store outage
        // (`world.rs` outages) — a slot due in it with no run, no skip, no late; seed 1.
        // The 2.5 s tail (class B), a load window of real processes: a restarted server and the
        // clients' reconnection outlast the recorded end, plus the claim's 2 s retry.
        let unreachable = within(&input.outages, slot, 0, 2_500);
        let down = missed_all_down.contains(&slot);
        if !ran.contains(&slot) && !told.contains(&slot) && !unreachable && !down {
            v.push(Violation {
                rule: rules::ACCOUNTED,
                detail: format!(
                    "{} slot {slot}: no run, no skip, no late answer, no outage, and not missed while all runners were down",
                    job.name
                ),
            });
        }
    }
}

fn schedule(input: &Input, job: &JobSpec, runs: &[&Run], v: &mut Vec<Violation>) {
    let by_slot: HashMap<i64, &&Run> = runs.iter().map(|r| (r.slot, r)).collect();
    for slot in slots(job, input.window) {
        // Excuse SCHEDULE_DISTURBED: a slot in a fault's span is not held to the schedule. The
        // fault itself is class A (a takeover, a late claim, an outage); shown in the
        // simulation by: any node or store fault — the simulation judges only slots from
        // `quiet_from` + lease + 2 × heartbeat on; seed 1. The margins around each fault
        // (−1 s, +1..3 s, a host's start +1 s) are class B, a load window of real processes.
        // Excuse SCHEDULE_OUTAGE (the 2.5 s tail as in ACCOUNTED_OUTAGE): mostly inside the
        // disturbed spans already, which reach 3 s past a stopped store, 2 s past the others.
        if within(&input.disturbed, slot, 0, 0) || within(&input.outages, slot, 0, 2_500) {
            continue;
        }
        // Excuse SCHEDULE_HIT: a run whose runner a fault hit while it ran (a long one began
        // before the fault's span) is not outside every fault: the liveness rules judge it. Class
        // A: a crash or freeze ends the attempt, a takeover follows. Shown in the simulation by:
        // Crash / Freeze (`world.rs`) — "nX crashes"/"freezes" inside a died attempt; seed 2.
        if by_slot
            .get(&slot)
            .is_some_and(|r| hit_while_running(input, r))
        {
            continue;
        }
        // Excuse SCHEDULE_OVERLAP: the job's own earlier run still held its lease when this slot
        // came: the spec skips the slot as an overlap (rule 5). Class A (the spec's rule); shown
        // in the simulation by: its `long` job, 26 s runs every 20 s — a skip overlap while the
        // older run lives; seed 1. Its trigger here is a well-behaved job slowed by load (B).
        let overlapped = runs.iter().any(|r| {
            r.slot < slot
                && r.attempts
                    .last()
                    .is_some_and(|a| a.ended_at.is_none_or(|end| end > slot))
        });
        if overlapped && !by_slot.contains_key(&slot) {
            continue;
        }
        // Excuse SCHEDULE_STILL_RUNNING: a run still going when the scenario ended (its lease
        // renewed past the window's end, on a loaded machine) has kept its schedule so far.
        // Class B: the history is read while real processes run. `on_time` (excuse ON_TIME,
        // 1 s): class B, a load window of real processes: the claim's send on the runner's
        // estimate of the store's clock, scheduling and the round trip; exact time needs none.
        let kept = by_slot.get(&slot).is_some_and(|r| {
            (r.status == "success" || (r.status == "running" && r.lease_end > input.window.1))
                && r.attempts.len() == 1
                && r.attempts
                    .first()
                    .is_some_and(|a| a.started_at - slot <= input.on_time)
        });
        if !kept {
            v.push(Violation {
                rule: rules::SCHEDULE,
                detail: format!(
                    "{} slot {slot}: not a success on time outside every fault;{}",
                    job.name,
                    story(input, &job.name, slot)
                ),
            });
        }
    }
}

/// Whether a fault hit the runner of one of the run's attempts while it held its lease: the
/// runner was frozen then, cut off from the store then (a partition of its link, which ends
/// every attempt it runs, not only the one the scenario aimed at), or its life (a `kill -9`,
/// an exit) ended then.
fn hit_while_running(input: &Input, run: &Run) -> bool {
    run.attempts.iter().any(|a| {
        let (from, to) = (a.started_at, lease_until(run, a));
        let ours = |s: &&Span| s.runner.as_deref() == Some(a.runner.as_str());
        input
            .freezes
            .iter()
            .chain(&input.cut_off)
            .filter(ours)
            .any(|f| f.from <= to && f.to >= from)
            || input
                .lives
                .iter()
                .filter(ours)
                .any(|l| from <= l.to && l.to <= to)
    })
}

/// How much later than it was due an owed takeover may come: 1 s, for a loaded 2-core machine
/// running a dozen hosts (as [`Input::stop_latency`]). Excuse TAKEOVER_SLACK, class B, a load
/// window of real processes: a backup's timer firing late and its claim's round trip; the
/// spec's bound (lease + 2 × heartbeat) is already in [`takeover_due`]. Tighten it from the
/// report's `takeover_after_due` figure, not below it.
pub const TAKEOVER_SLACK_MS: i64 = 1_000;

/// When `runner` owes a takeover of an attempt whose lease ended at `end` at the latest: two
/// heartbeats after that (a backup's checks), or, where a store outage (or a partition of that
/// runner's own link) overlaps the wait, lease + 2 × heartbeat after the store could be reached
/// again (a heartbeat held up in the outage may renew the dead attempt's lease as it ends).
///
/// Excuse TAKEOVER_DUE_OUTAGE, class A: backups' checks fail in the outage; the store's return
/// is when they can work again; a call sent before it waits its timeout first. Shown in the
/// simulation by: a store outage (`world.rs` outages, `faults.rs` TIMEOUT) — a died attempt's
/// lease end inside an outage, its takeover more than 2 × heartbeat after the outage's end;
/// seed 108. Suspect: a held heartbeat's renewal shows in the recorded lease end already.
pub fn takeover_due(input: &Input, runner: &str, end: i64) -> i64 {
    let checks = 2 * input.heartbeat;
    let mut due = end + checks;
    let own = input
        .cut_off
        .iter()
        .filter(|c| c.runner.as_deref() == Some(runner));
    let spans: Vec<&Span> = input.outages.iter().chain(own).collect();
    loop {
        let later = spans
            .iter()
            .filter(|o| o.from <= due && o.to >= end)
            .map(|o| o.to + input.lease + checks)
            .max();
        match later {
            Some(later) if later > due => due = later,
            _ => return due,
        }
    }
}

/// When the first runner that knew of the run (it won, ran, lost or backed up an attempt of it)
/// and was up from `end` on, and not frozen in its last two heartbeats before then, owed its
/// takeover: `None` when no such runner was up (every one killed, frozen or never told).
///
/// Excuses OWED_KNEW, OWED_LIFE, OWED_FROZEN, class A: only a backup sets a check (spec,
/// "Backups"); a killed runner checks nothing; a frozen one's timers fire after it wakes.
/// Shown in the simulation by: Crash / Stop / Freeze (`world.rs`) — a died attempt whose knowers
/// were all down or frozen at its lease end, taken over late or interrupted. No seed of 12 000
/// needs it: the simulation's own liveness rule holds the same condition (takeovers are owed
/// once every node is up again, from its `quiet_from`), and its three nodes are rarely all down
/// at once. The one seed that showed it (7170) was a bug: a node starting while another
/// claimed the latest slot did not back that run up; fixed, with that seed as a test.
fn owed_by(input: &Input, job: &str, slot: i64, end: i64) -> Option<i64> {
    let knew = |runner: &str| {
        input.events.iter().any(|e| {
            e.runner == runner
                && e.job.as_deref() == Some(job)
                && e.slot == Some(slot)
                && matches!(
                    e.kind.as_str(),
                    "won" | "started" | "backup" | "takeover" | "lost"
                )
        })
    };
    input
        .lives
        .iter()
        .filter_map(|life| {
            let runner = life.runner.as_deref()?;
            let due = takeover_due(input, runner, end);
            let checking = due - 2 * input.heartbeat;
            let frozen = input
                .freezes
                .iter()
                .any(|f| f.runner.as_deref() == Some(runner) && f.from < due && f.to > checking);
            (life.from <= end && life.to >= due && !frozen && knew(runner)).then_some(due)
        })
        .min()
}

/// The liveness rule: a run whose attempt died (killed, frozen, self-fenced, or answered too
/// late) while a runner that knew of the run lived and attempts remained is taken over by the
/// time [`takeover_due`] says for that runner (plus [`TAKEOVER_SLACK_MS`]), unless a newer run
/// of the job started first (the spec then lets the dead run be interrupted). A runner that only
/// skipped the slot as an overlap before the run existed is not its backup (spec, "Overlap").
/// Attempts whose takeover would fall due after the history was read are not judged.
fn taken_over(
    input: &Input,
    job: &JobSpec,
    runs: &[&Run],
    v: &mut Vec<Violation>,
    figures: &mut Figures,
) {
    for (i, run) in runs.iter().enumerate() {
        let mut deaths = 0u32;
        for (k, a) in run.attempts.iter().enumerate() {
            if a.outcome.as_deref() != Some("died") {
                continue;
            }
            deaths += 1;
            // Class C guard: a died attempt always has its end (the lease end it never renewed).
            let Some(end) = a.ended_at else { continue };
            // Excuse TAKEN_OVER_MAX_ATTEMPTS, class A (spec rule 3): the last allowed attempt
            // died. Shown in the simulation by: Crash / Freeze on every attempt — a run with
            // max_attempts attempts died, `interrupted`; seed 665.
            if deaths >= job.max_attempts {
                continue;
            }
            let Some(due) = owed_by(input, &run.job, run.slot, end) else {
                continue;
            };
            let limit = due + TAKEOVER_SLACK_MS;
            let newer_first = runs[i + 1..]
                .iter()
                .filter_map(|r| r.attempts.first())
                .any(|first| first.started_at <= limit);
            // Excuse TAKEN_OVER_NEWER_FIRST, class A (spec, "A dead run and the next slot"):
            // the next slot's claim came first and interrupts the dead run. Shown in the
            // simulation by: Crash shortly before a slot — a run `interrupted`, its last attempt
            // died, the next slot won before lease end + 2 × heartbeat; seed 1.
            // Excuse TAKEN_OVER_WINDOW_END: due after the history was read. Class B: the
            // history of real processes is read at a wall-clock moment.
            if limit > input.window.1 || newer_first {
                continue;
            }
            figures.owed_takeovers.0 += 1;
            match run.attempts.get(k + 1).map(|next| next.started_at) {
                Some(started) if started <= limit => {
                    figures.owed_takeovers.1 += 1;
                    figures.takeover_after_due =
                        figures.takeover_after_due.max(Some(started - due));
                }
                next => v.push(Violation {
                    rule: rules::TAKEN_OVER,
                    detail: format!(
                        "{} slot {} attempt {} died (lease end {end}) with {} of {} attempts used and a runner up; the takeover was due by {due} (+{TAKEOVER_SLACK_MS} ms), but {};{}",
                        run.job,
                        run.slot,
                        a.attempt,
                        deaths,
                        job.max_attempts,
                        next.map_or("none followed".to_owned(), |t| format!("the next attempt started at {t}")),
                        story(input, &run.job, run.slot)
                    ),
                }),
            }
        }
    }
}

fn zombies(input: &Input, v: &mut Vec<Violation>, figures: &mut Figures) {
    let runs: HashMap<(&str, i64), &Run> = input
        .runs
        .iter()
        .map(|r| ((r.job.as_str(), r.slot), r))
        .collect();
    for e in &input.effects {
        let attempt = runs
            .get(&(e.job.as_str(), e.slot))
            .and_then(|r| r.attempts.iter().find(|a| a.attempt == e.attempt));
        let Some(a) = attempt.filter(|a| a.runner == e.runner && a.fence == e.fence) else {
            v.push(Violation {
                rule: rules::ZOMBIE,
                detail: format!(
                    "{} slot {} attempt {} on {} (fence {}): a side effect of an attempt the store never granted",
                    e.job, e.slot, e.attempt, e.runner, e.fence
                ),
            });
            continue;
        };
        // Excuse ZOMBIE_STOP_LATENCY (`stop_latency`, 1 s). The guest stamps its line before
        // the host call whose gate (`runtime/wasm/src/fence.rs`) checks the local deadline, and
        // that deadline is taken from the send, so a line is never later than the store's lease
        // end but for: a renewal answered, then lost in a failover (class A; shown in the
        // simulation by: Failover without acknowledgement — `lost_writes` holds the run; seed:
        // 937); and ms between a release's record and the gate closing, faketime (class B).
        let Some(end) = a.ended_at else { continue };
        let at = e.at - input.skew.get(&e.runner).copied().unwrap_or(0);
        // A frozen runner can stop nothing until it runs again. Excuse ZOMBIE_FROZEN, class C
        // (dead): the gate's clock runs through SIGSTOP and the line is stamped before the gate,
        // so a woken guest's late write is refused, or stamped before its freeze. Remove once
        // the report's zombie_after_wake equals zombie_after_lease_end on every freezing row.
        let woke = input
            .freezes
            .iter()
            .filter(|f| f.runner.as_deref() == Some(e.runner.as_str()))
            .filter(|f| f.from <= end + input.stop_latency && f.to > end)
            .map(|f| f.to)
            .max()
            .unwrap_or(end);
        if a.outcome.as_deref() == Some("died") {
            let raw = at - end;
            let awake = at - woke;
            figures.zombie_after_lease_end = figures.zombie_after_lease_end.max(Some(raw));
            figures.zombie_after_wake = figures.zombie_after_wake.max(Some(awake));
        }
        if at > woke + input.stop_latency {
            v.push(Violation {
                rule: rules::ZOMBIE,
                detail: format!(
                    "{} slot {} attempt {} on {}: a side effect at {at}, {} ms after its lease end {end} (runner could run again at {woke}; allowance {} ms)",
                    e.job, e.slot, e.attempt, e.runner, at - end, input.stop_latency
                ),
            });
        }
    }
}

/// Every hit attempt was taken over by another runner, and its run ended `success` on a runner
/// other than the one hit: a fault that produced no takeover fails the scenario rather than
/// passing unseen.
fn forced_takeovers(input: &Input, v: &mut Vec<Violation>) {
    for hit in &input.hits {
        let run = input
            .runs
            .iter()
            .find(|r| r.job == hit.job && r.slot == hit.slot);
        let problem = match run {
            None => Some("the store has no such run".to_owned()),
            Some(run) => {
                let k = run.attempts.iter().position(|a| a.runner == hit.runner);
                let later = k.and_then(|k| run.attempts.get(k + 1));
                let last = run.attempts.last().map(|a| a.runner.as_str());
                match (k, later) {
                    (None, _) => Some(format!("no attempt of the run was on {}", hit.runner)),
                    (Some(_), None) => {
                        Some(format!("no attempt followed; the run ended {}", run.status))
                    }
                    // Excuse FORCED_BY_SELF (`by_another` false): a runner frozen holding the
                    // SQLite file's write lock is an outage for all; woken, it races the others
                    // for its own run's takeover. Class A; shown in the simulation by: Freeze —
                    // a died attempt on nX taken over by nX; seed 2104.
                    (Some(_), Some(next)) if hit.by_another && next.runner == hit.runner => {
                        Some(format!("the next attempt was on {} again", hit.runner))
                    }
                    _ if run.status != "success"
                        || (hit.by_another && last == Some(hit.runner.as_str())) =>
                    {
                        Some(format!(
                            "the run ended {} on {}",
                            run.status,
                            last.unwrap_or("no runner")
                        ))
                    }
                    _ => None,
                }
            }
        };
        if let Some(problem) = problem {
            v.push(Violation {
                rule: rules::FORCED_TAKEOVER,
                detail: format!(
                    "{} slot {}, hit on {}: {problem};{}",
                    hit.job,
                    hit.slot,
                    hit.runner,
                    story(input, &hit.job, hit.slot)
                ),
            });
        }
    }
}

/// How long after each fault `(runner, at)` the run that runner held was taken over: the next
/// attempt's start minus the fault's time, for faults whose run was taken over (not
/// interrupted by a newer slot).
pub fn takeover_times(runs: &[Run], faults: &[(String, i64)]) -> Vec<i64> {
    let mut times = Vec::new();
    for (runner, at) in faults {
        let found = runs
            .iter()
            .flat_map(|r| r.attempts.windows(2))
            .filter(|w| &w[0].runner == runner && w[0].started_at <= *at)
            .filter(|w| w[0].ended_at.is_some_and(|end| end >= *at))
            .map(|w| w[1].started_at - at)
            .min();
        times.extend(found);
    }
    times
}

#[cfg(test)]
pub(crate) mod tests {
    //! The checker must be able to fail: each test feeds it a hand-made history that breaks one
    //! rule, and a clean one that breaks none.

    use super::*;

    /// The checker without the invariants that hold the runners' logs to the store
    /// (`accounts.rs`, with bad histories of their own): these histories log only what their
    /// rule needs.
    fn check(input: &Input) -> (Vec<Violation>, Figures) {
        let (v, f) = super::check(input);
        let others = v
            .into_iter()
            .filter(|v| !crate::accounts::RULES.contains(&v.rule))
            .collect();
        (others, f)
    }

    /// Attempt `n` of job `j` on `runner`, from `from` to `to`.
    pub(crate) fn attempt(
        n: u32,
        runner: &str,
        from: i64,
        to: Option<i64>,
        outcome: Option<&str>,
    ) -> Attempt {
        Attempt {
            attempt: n,
            runner: runner.into(),
            reason: if n == 1 { "scheduled" } else { "takeover" }.into(),
            fence: u64::from(n),
            started_at: from,
            ended_at: to,
            outcome: outcome.map(str::to_owned),
        }
    }

    /// A run of job `j`.
    pub(crate) fn run(slot: i64, status: &str, lease_end: i64, attempts: Vec<Attempt>) -> Run {
        Run {
            job: "j".into(),
            slot,
            status: status.into(),
            lease_end,
            attempts,
        }
    }

    fn input(runs: Vec<Run>) -> Input {
        Input {
            jobs: vec![JobSpec {
                name: "j".into(),
                period: 1000,
                max_attempts: 2,
                well_behaved: false,
                catch_up: DEFAULT_CATCH_UP_MS,
                max_late: DEFAULT_MAX_LATE_MS,
            }],
            runs,
            window: (10_000, 12_000),
            stop_latency: 100,
            on_time: 500,
            lease: 1_000,
            heartbeat: 150,
            ..Input::default()
        }
    }

    fn clean() -> Vec<Run> {
        vec![
            run(
                11_000,
                "success",
                11_300,
                vec![attempt(1, "a", 11_005, Some(11_300), Some("success"))],
            ),
            run(
                12_000,
                "success",
                13_800,
                vec![
                    attempt(1, "a", 12_005, Some(13_005), Some("died")),
                    attempt(2, "b", 13_200, Some(13_800), Some("success")),
                ],
            ),
        ]
    }

    fn broken(input: &Input) -> Vec<&'static str> {
        check(input).0.iter().map(|v| v.rule).collect()
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let (v, f) = check(&input(clean()));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!((f.runs, f.takeovers, f.fenced), (2, 1, 1));
    }

    #[test]
    fn two_live_leases_at_once_break_the_one_live_lease_rule() {
        let mut runs = clean();
        runs[1].attempts[1].started_at = 12_900; // before attempt 1's lease end 13_005
        assert!(broken(&input(runs)).contains(&rules::ONE_LIVE_LEASE));
    }

    #[test]
    fn an_attempt_after_max_deaths_breaks_the_max_attempts_rule() {
        let mut runs = clean();
        runs[1].attempts[1].outcome = Some("died".into());
        runs[1].attempts.push(attempt(3, "c", 14_000, None, None));
        runs[1].status = "running".into();
        runs[1].lease_end = 15_000;
        assert!(broken(&input(runs)).contains(&rules::MAX_ATTEMPTS));
    }

    #[test]
    fn an_interrupted_run_with_attempts_left_and_no_newer_run_counts_a_hand_over() {
        let runs = vec![run(
            11_000,
            "interrupted",
            11_500,
            vec![
                attempt(1, "a", 11_005, Some(11_100), Some("handed-over")),
                attempt(2, "b", 11_200, Some(11_500), Some("died")),
            ],
        )];
        let mut i = input(runs);
        i.window = (10_000, 11_000);
        assert_eq!(broken(&i), [rules::MAX_ATTEMPTS]);
    }

    #[test]
    fn a_finished_attempt_followed_by_another_breaks_the_stale_token_rule() {
        let mut runs = clean();
        runs[1].attempts[0].outcome = Some("success".into());
        assert!(broken(&input(runs)).contains(&rules::STALE_TOKEN));
    }

    #[test]
    fn a_lease_end_moved_after_the_finish_breaks_the_stale_token_rule() {
        let mut runs = clean();
        runs[0].lease_end = 12_300;
        assert!(broken(&input(runs)).contains(&rules::STALE_TOKEN));
    }

    #[test]
    fn a_runner_told_its_stale_finish_was_accepted_breaks_the_stale_token_rule() {
        let mut i = input(clean());
        i.events.push(Event {
            at: 13_900,
            runner: "a".into(),
            kind: "success".into(),
            job: Some("j".into()),
            slot: Some(12_000),
            attempt: Some(1),
            reason: String::new(),
        });
        assert_eq!(broken(&i), [rules::STALE_TOKEN]);
    }

    #[test]
    fn an_older_run_taken_over_after_a_newer_slot_started_breaks_the_order_rule() {
        let mut runs = clean();
        runs[0].status = "success".into();
        runs[0].attempts = vec![
            attempt(1, "a", 11_005, Some(12_000), Some("died")),
            attempt(2, "b", 12_100, Some(12_200), Some("success")),
        ];
        runs[0].lease_end = 12_200;
        let b = broken(&input(runs));
        assert!(b.contains(&rules::ORDER), "{b:?}");
    }

    #[test]
    fn a_slot_with_no_run_skip_or_outage_is_unaccounted() {
        let mut runs = clean();
        runs.remove(0);
        assert_eq!(broken(&input(runs.clone())), [rules::ACCOUNTED]);
        let mut skipped = input(runs.clone());
        skipped.events.push(Event {
            at: 11_001,
            runner: "b".into(),
            kind: "skip".into(),
            job: Some("j".into()),
            slot: Some(11_000),
            attempt: None,
            reason: "overlap".into(),
        });
        assert!(broken(&skipped).is_empty());
        let mut down = input(runs);
        down.outages.push(Span {
            runner: None,
            from: 10_500,
            to: 11_200,
        });
        assert!(broken(&down).is_empty());
    }

    /// All runners down from 10_500 to 14_200: slots 11_000..=14_000 were due meanwhile, and
    /// the runner that started caught up 14_000; slot 15_000 ran as scheduled.
    fn all_down() -> Input {
        let ok = |slot: i64, reason: &str| {
            let mut a = attempt(1, "c", slot + 20, Some(slot + 40), Some("success"));
            a.reason = reason.into();
            run(slot, "success", slot + 40, vec![a])
        };
        let mut i = input(vec![
            ok(10_000, "scheduled"),
            ok(14_000, "catch-up"),
            ok(15_000, "scheduled"),
        ]);
        i.window = (9_000, 15_000);
        i.all_down.push(Span {
            runner: None,
            from: 10_500,
            to: 14_200,
        });
        i
    }

    fn all_down_without(slot: i64) -> Input {
        let mut i = all_down();
        i.runs.retain(|r| r.slot != slot);
        i
    }

    fn run_of(input: &mut Input, slot: i64) -> &mut Run {
        let found = input.runs.iter_mut().find(|r| r.slot == slot);
        found.expect("a run of that slot")
    }

    #[test]
    fn slots_missed_while_all_runners_were_down_are_accounted_and_the_latest_caught_up() {
        let (v, f) = check(&all_down());
        assert!(v.is_empty(), "{v:?}");
        assert_eq!((f.missed_all_down, f.caught_up), (3, 1));
    }

    #[test]
    fn a_second_caught_up_slot_breaks_the_catch_up_rule() {
        let mut i = all_down();
        let mut a = attempt(1, "d", 13_020, Some(13_040), Some("success"));
        a.reason = "catch-up".into();
        i.runs.push(run(13_000, "success", 13_040, vec![a]));
        assert_eq!(broken(&i), [rules::CATCH_UP]);
    }

    #[test]
    fn an_older_slot_caught_up_instead_of_the_latest_breaks_the_catch_up_rule() {
        let mut i = all_down();
        run_of(&mut i, 14_000).slot = 13_000;
        assert_eq!(broken(&i), [rules::CATCH_UP]);
    }

    #[test]
    fn no_catch_up_within_the_window_breaks_the_catch_up_rule_and_outside_it_is_missed() {
        let mut i = all_down_without(14_000);
        assert_eq!(broken(&i), [rules::CATCH_UP]);
        // A window shorter than the outage: every slot of it is missed, none is owed.
        i.jobs[0].catch_up = 0;
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
        // ... and a catch-up that starts past that window breaks the rule.
        let mut late = all_down_without(15_000);
        late.jobs[0].catch_up = 0;
        late.window = (9_000, 14_500);
        let slack = catch_up_slack(late.heartbeat);
        let run = run_of(&mut late, 14_000);
        let started = 14_000 + slack + 1;
        run.attempts[0].started_at = started;
        run.attempts[0].ended_at = Some(started + 20);
        run.lease_end = started + 20;
        assert_eq!(broken(&late), [rules::CATCH_UP]);
    }

    #[test]
    fn an_unaccounted_slot_outside_the_all_down_span_is_a_violation() {
        // Slot 15_000 is due after the first runner started: not missed while all were down.
        assert_eq!(broken(&all_down_without(15_000)), [rules::ACCOUNTED]);
        // Nor is a slot due before the last runner died.
        assert_eq!(broken(&all_down_without(10_000)), [rules::ACCOUNTED]);
    }

    #[test]
    fn a_side_effect_past_the_lease_end_and_stop_latency_is_a_zombie() {
        let mut i = input(clean());
        let effect = |at| Effect {
            job: "j".into(),
            slot: 12_000,
            attempt: 1,
            fence: 1,
            runner: "a".into(),
            at,
        };
        i.effects.push(effect(13_050));
        let (v, f) = check(&i);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(f.zombie_after_lease_end, Some(45));
        i.effects.push(effect(13_200));
        assert_eq!(broken(&i), [rules::ZOMBIE]);
        // Frozen until 13_150: the allowance counts from the wake.
        i.freezes.push(Span {
            runner: Some("a".into()),
            from: 12_500,
            to: 13_150,
        });
        assert!(broken(&i).is_empty());
        // A skewed runner's clock is corrected before the comparison.
        i.skew.insert("a".into(), 3_600_000);
        i.effects.push(effect(3_600_000 + 13_400));
        assert_eq!(broken(&i), [rules::ZOMBIE]);
    }

    #[test]
    fn a_side_effect_of_an_attempt_the_store_never_granted_is_a_violation() {
        let mut i = input(clean());
        i.effects.push(Effect {
            job: "j".into(),
            slot: 12_000,
            attempt: 2,
            fence: 2,
            runner: "a".into(),
            at: 13_300,
        });
        assert_eq!(broken(&i), [rules::ZOMBIE]);
    }

    #[test]
    fn a_late_or_failed_well_behaved_run_breaks_the_schedule_rule() {
        let mut i = input(clean());
        i.jobs[0].well_behaved = true;
        // Slot 12_000 was taken over (not success on time) and is not in a disturbance.
        assert_eq!(broken(&i), [rules::SCHEDULE]);
        i.disturbed.push(Span {
            runner: None,
            from: 11_900,
            to: 14_000,
        });
        assert!(broken(&i).is_empty());
    }

    #[test]
    fn a_run_whose_runner_was_frozen_while_it_ran_is_not_held_to_the_schedule() {
        let mut i = input(clean());
        i.jobs[0].well_behaved = true;
        // Slot 12_000's attempt on `a` ran from 12_005 and died at 13_005: `a` was frozen
        // from 12_800, after the slot, so the slot is outside the fault's span but its run is
        // not. A freeze of a runner that ran none of its attempts, or of `a` after its
        // attempt, excuses nothing.
        for (runner, from, excused) in [
            ("c", 12_800, false),
            ("a", 13_100, false),
            ("a", 12_800, true),
        ] {
            i.freezes = vec![Span {
                runner: Some(runner.into()),
                from,
                to: from + 1_800,
            }];
            assert_eq!(
                broken(&i).is_empty(),
                excused,
                "freeze of {runner} from {from}: {:?}",
                broken(&i)
            );
        }
        // The same for a kill of `a` while the attempt ran.
        i.freezes.clear();
        i.lives = vec![Span {
            runner: Some("a".into()),
            from: 0,
            to: 12_800,
        }];
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    #[test]
    fn a_run_still_going_at_the_end_keeps_the_schedule_rule_and_an_abandoned_one_breaks_it() {
        // Slot 12_000, the window's last, started on time and still renewed when the scenario
        // ended (lease past the window's end 12_000).
        let going = run(
            12_000,
            "running",
            12_900,
            vec![attempt(1, "a", 12_005, None, None)],
        );
        let mut i = input(vec![clean()[0].clone(), going.clone()]);
        i.jobs[0].well_behaved = true;
        assert!(!broken(&i).contains(&rules::SCHEDULE), "{:?}", broken(&i));
        // The same run with its lease run out before the end: nobody was running it.
        let mut abandoned = going;
        abandoned.lease_end = 11_990;
        let mut i = input(vec![clean()[0].clone(), abandoned]);
        i.jobs[0].well_behaved = true;
        assert!(broken(&i).contains(&rules::SCHEDULE), "{:?}", broken(&i));
    }

    #[test]
    fn a_slot_skipped_while_the_jobs_own_earlier_run_still_ran_keeps_the_schedule_rule() {
        let slow = run(
            11_000,
            "success",
            12_400,
            vec![attempt(1, "a", 11_005, Some(12_400), Some("success"))],
        );
        let mut i = input(vec![slow.clone()]);
        i.jobs[0].well_behaved = true;
        assert!(
            !broken(&i).contains(&rules::SCHEDULE),
            "slot 12_000 overlapped run 11_000: {:?}",
            broken(&i)
        );
        // The same missing slot with the earlier run ended in time is a broken schedule.
        let mut quick = slow;
        quick.lease_end = 11_400;
        quick.attempts[0].ended_at = Some(11_400);
        let mut i = input(vec![quick]);
        i.jobs[0].well_behaved = true;
        assert!(broken(&i).contains(&rules::SCHEDULE), "{:?}", broken(&i));
    }

    /// Slot 12_000's first attempt died with its lease ending at 13_005, during a store outage
    /// from 12_500 to 14_000; runners a and b were up throughout, and the history was read at
    /// 20_000. The takeover is due lease + 2 × heartbeat after the store was back: 15_300.
    fn died_in_an_outage(takeover_at: Option<i64>) -> Input {
        let mut attempts = vec![attempt(1, "a", 12_005, Some(13_005), Some("died"))];
        let (status, lease_end) = match takeover_at {
            Some(t) => {
                attempts.push(attempt(2, "b", t, Some(t + 100), Some("success")));
                ("success", t + 100)
            }
            None => ("running", 13_005),
        };
        let mut i = input(vec![run(12_000, status, lease_end, attempts)]);
        i.window = (11_500, 20_000);
        // No other slot falls due in the window: only this run is held to the rules.
        i.jobs[0].period = 100_000;
        i.outages.push(Span {
            runner: None,
            from: 12_500,
            to: 14_000,
        });
        for runner in ["a", "b"] {
            i.lives.push(Span {
                runner: Some(runner.into()),
                from: 0,
                to: i64::MAX,
            });
            let kind = if runner == "a" { "won" } else { "backup" };
            i.events.push(Event {
                at: 12_005,
                runner: runner.into(),
                kind: kind.into(),
                job: Some("j".into()),
                slot: Some(12_000),
                attempt: Some(1),
                reason: "scheduled".into(),
            });
        }
        i
    }

    #[test]
    fn a_takeover_is_due_lease_plus_two_heartbeats_after_the_store_is_back() {
        let mut i = died_in_an_outage(None);
        assert_eq!(takeover_due(&i, "b", 13_005), 15_300);
        // No outage in the wait: two heartbeats after the lease end.
        assert_eq!(takeover_due(&i, "b", 16_000), 16_300);
        // A runner cut off alone until 17_000 owes it lease + 2 × heartbeat after that.
        i.cut_off.push(Span {
            runner: Some("b".into()),
            from: 15_500,
            to: 17_000,
        });
        assert_eq!(takeover_due(&i, "b", 16_000), 18_300);
        assert_eq!(takeover_due(&i, "a", 16_000), 16_300);
    }

    #[test]
    fn a_died_attempt_taken_over_within_lease_plus_two_heartbeats_of_the_stores_return_keeps_the_liveness_rule(
    ) {
        let (v, f) = check(&died_in_an_outage(Some(15_200)));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(f.owed_takeovers, (1, 1));
        assert_eq!(f.takeover_after_due, Some(-100));
    }

    #[test]
    fn a_died_attempt_never_taken_over_while_a_runner_lived_breaks_the_liveness_rule() {
        assert_eq!(broken(&died_in_an_outage(None)), [rules::TAKEN_OVER]);
    }

    #[test]
    fn a_takeover_later_than_lease_plus_two_heartbeats_after_the_stores_return_breaks_the_liveness_rule(
    ) {
        let late = 15_300 + TAKEOVER_SLACK_MS + 1;
        assert_eq!(broken(&died_in_an_outage(Some(late))), [rules::TAKEN_OVER]);
    }

    #[test]
    fn no_takeover_is_owed_without_a_runner_up_attempts_left_or_before_a_newer_run() {
        // The only runner up never knew of the run: it skipped the slot before the run existed.
        let mut i = died_in_an_outage(None);
        i.lives.retain(|l| l.runner.as_deref() == Some("b"));
        i.events.retain(|e| e.runner != "b");
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
        // Every runner down (or frozen) meanwhile.
        let mut i = died_in_an_outage(None);
        i.lives.iter_mut().for_each(|l| l.to = 13_500);
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
        let mut i = died_in_an_outage(None);
        for runner in ["a", "b"] {
            i.freezes.push(Span {
                runner: Some(runner.into()),
                from: 12_000,
                to: 16_000,
            });
        }
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
        // The attempt that died was the last one allowed.
        let mut i = died_in_an_outage(None);
        i.jobs[0].max_attempts = 1;
        i.runs[0].status = "interrupted".into();
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
        // A newer run started first: the dead one may be interrupted instead.
        let mut i = died_in_an_outage(None);
        i.runs[0].status = "interrupted".into();
        i.runs.push(run(
            13_000,
            "success",
            15_100,
            vec![attempt(1, "b", 15_000, Some(15_100), Some("success"))],
        ));
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    fn hit(slot: i64, runner: &str) -> Hit {
        Hit {
            job: "j".into(),
            slot,
            runner: runner.into(),
            by_another: true,
        }
    }

    #[test]
    fn a_hit_attempt_taken_over_and_ended_success_elsewhere_keeps_the_forced_takeover_rule() {
        let mut i = input(clean());
        i.hits.push(hit(12_000, "a"));
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    #[test]
    fn a_kill_that_produced_no_takeover_breaks_the_forced_takeover_rule() {
        // The killed run was interrupted by a newer slot instead of taken over.
        let mut i = input(clean());
        i.runs[1].status = "interrupted".into();
        i.runs[1].attempts.truncate(1);
        i.hits.push(hit(12_000, "a"));
        assert!(
            broken(&i).contains(&rules::FORCED_TAKEOVER),
            "{:?}",
            broken(&i)
        );
        // The fault hit an attempt that finished by itself: nothing was taken over.
        let mut i = input(clean());
        i.hits.push(hit(11_000, "a"));
        assert_eq!(broken(&i), [rules::FORCED_TAKEOVER]);
        // The run was taken over but ended on the hit runner again.
        let mut i = input(clean());
        i.runs[1].attempts[1].runner = "a".into();
        i.hits.push(hit(12_000, "a"));
        assert!(
            broken(&i).contains(&rules::FORCED_TAKEOVER),
            "{:?}",
            broken(&i)
        );
        // Unless the hit runner had kept every other one out of the store until it woke: then
        // it may win the takeover of its own run, but the run must still be taken over.
        i.hits[0].by_another = false;
        assert!(
            !broken(&i).contains(&rules::FORCED_TAKEOVER),
            "{:?}",
            broken(&i)
        );
        i.runs[1].attempts.truncate(1);
        i.runs[1].status = "interrupted".into();
        assert!(
            broken(&i).contains(&rules::FORCED_TAKEOVER),
            "{:?}",
            broken(&i)
        );
    }

    #[test]
    fn takeover_time_is_counted_from_the_fault() {
        assert_eq!(takeover_times(&clean(), &[("a".into(), 12_100)]), [1_100]);
        assert!(takeover_times(&clean(), &[("b".into(), 12_100)]).is_empty());
    }

    #[test]
    fn history_and_effect_lines_parse() {
        let line = r#"{"attempts":[{"attempt":1,"digest":null,"ended_at":"2026-12-03T08:12:16.211Z","fence":4,"outcome":"success","reason":"scheduled","runner":"r1","started_at":"2026-12-03T08:12:16.001Z","token":"e1"}],"fence":4,"handed_over":false,"job":"effects","lease_end":"2026-12-03T08:12:16.211Z","slot":"2026-12-03T08:12:16.000Z","status":"success"}"#;
        let runs = parse_history(line).expect("parses");
        assert_eq!(runs[0].slot, 1_796_285_536_000);
        assert_eq!(runs[0].attempts[0].ended_at, Some(1_796_285_536_211));
        let e = parse_effect("effects", "1796285533000 1 1 r1 1796285533331 0").expect("parses");
        assert_eq!((e.attempt, e.at), (1, 1_796_285_533_331));
        let ev = parse_event(
            "r1",
            5,
            r#"{"event":"skip","job":"effects","slot":"2026-12-03T08:12:16.000Z","reason":"overlap"}"#,
        )
        .expect("parses");
        assert_eq!(
            (ev.kind.as_str(), ev.slot),
            ("skip", Some(1_796_285_536_000))
        );
    }
}
