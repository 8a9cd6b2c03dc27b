//! The scenarios: one fault each, on a cluster of real `baton run` processes, with the
//! well-behaved jobs (and, where the fault allows, the misbehaving guests) running throughout.

use std::time::Duration;

use crate::checker::{Event, Input, Violation};
use crate::harness::{
    command_effects_job, effects_job, misbehaving, now_ms, probe_job, well_behaved, Backend,
    Cluster, Fault, Job, RunnerOptions, Woken,
};
use baton_tests::http_server::Server;

/// A fault scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// `kill -9` of the runner mid-attempt, twice; a fresh runner joins after each.
    Kill,
    /// `SIGSTOP` of the runner mid-attempt for 1.8 s (longer than the lease), then `SIGCONT`.
    Freeze,
    /// The same with a job that sends an HTTP request and writes a file every 20 ms: once woken
    /// after the takeover, the frozen runner makes no request and no write.
    FreezeEffects,
    /// The same with a plain WASI program (a command component, no Baton SDK) that writes a
    /// file every 20 ms and never asks whether to stop: once woken after the takeover, the
    /// frozen runner's program writes nothing.
    FreezeCommand,
    /// `SIGTERM` of the runner mid-attempt: hand-over.
    Terminate,
    /// The store stopped for 2.5 s mid-attempt and started again.
    StoreRestart,
    /// The runner mid-attempt cut off the store for 2.5 s.
    Partition,
    /// 100 ms added each way between one runner and the store.
    Latency,
    /// One runner alone, its claims held up past `max_late` + 10 s (stalled in its proxy, or
    /// on SQLite behind the file's write lock), and it waits for the store's answer.
    LateClaim,
    /// Two of three runners with clocks 3 hours off (behind and ahead), and a `kill -9`.
    ClockSkew,
    /// Every runner killed (`kill -9`) for several slots, then one started again: the slots
    /// due meanwhile are missed but for the latest, which it catches up.
    AllDown,
    /// Redis Cluster: the hash slot of `tick` (due every second) moved to another primary, a key
    /// every 500 ms, while its claims run (`MOVED`, `ASK`, `TRYAGAIN`).
    SlotMigration,
    /// Redis Cluster: the primary that serves `effects` killed mid-attempt (`kill -9`), and its
    /// replica promoted by the cluster while the runners go on claiming.
    PrimaryFailover,
}

/// What a scenario leaves for the checker and the report.
pub struct Outcome {
    /// Which scenario.
    pub scenario: Scenario,
    /// On which store.
    pub backend: Backend,
    /// What the checker reads.
    pub input: Input,
    /// Faults a backup recovers from within lease + 2 × heartbeat.
    pub deaths: Vec<Fault>,
    /// Faults a backup recovers from within the stop timeout + 2 × heartbeat.
    pub hand_overs: Vec<Fault>,
    /// Violations of what only this scenario must prove.
    pub extra: Vec<Violation>,
    /// A line of what only this scenario shows.
    pub note: String,
}

const FOR_LONGER_THAN_THE_LEASE_MS: u64 = 2_500;
/// How long the SIGSTOP row freezes a runner: 1.8 s, longer than the 1 s lease, and over well
/// before `effects`' next slot (5 s after the last): a runner frozen inside a SQLite write
/// transaction holds the file's lock until it wakes, and only then can a backup take its run
/// over; frozen for 2.5 s with `effects` every 3 s, the next slot came first on a loaded
/// machine, and the run was (rightly) interrupted rather than taken over.
const FREEZE_MS: u64 = 1_800;
/// How far into an attempt of `effects` (1.2 s long) a fault hits it.
const MID_ATTEMPT: Duration = Duration::from_millis(300);
/// `max_late = "0s"` plus the store's 10 s tolerance.
const LATE_LIMIT_MS: i64 = 10_000;
/// How long the late-claim scenario stalls a runner's requests: the first slot due after the
/// stall began (within 1 s) is still claimed past [`LATE_LIMIT_MS`].
const STALL: Duration = Duration::from_millis(12_000);
const WAIT: Duration = Duration::from_secs(20);
/// How many lines a runner may log that a store outage began, for the one outage of the
/// store-restart scenario: 3 (the restarted server may cut a connection again as it comes
/// back; a line per failed call would be dozens).
const MAX_OUTAGE_LINES: usize = 3;
/// How long every runner stays down: several slots of a job due every second.
const ALL_DOWN_FOR: Duration = Duration::from_millis(3_500);

impl Scenario {
    /// Every scenario, in report order.
    pub const ALL: [Scenario; 13] = [
        Scenario::Kill,
        Scenario::Freeze,
        Scenario::FreezeEffects,
        Scenario::FreezeCommand,
        Scenario::Terminate,
        Scenario::StoreRestart,
        Scenario::Partition,
        Scenario::Latency,
        Scenario::LateClaim,
        Scenario::ClockSkew,
        Scenario::AllDown,
        Scenario::SlotMigration,
        Scenario::PrimaryFailover,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "kill -9",
            Scenario::Freeze => "SIGSTOP 1.8s",
            Scenario::FreezeEffects => "SIGSTOP http+files",
            Scenario::FreezeCommand => "SIGSTOP command",
            Scenario::Terminate => "SIGTERM",
            Scenario::StoreRestart => "store restart",
            Scenario::Partition => "partition",
            Scenario::Latency => "latency 100ms",
            Scenario::LateClaim => "late claim",
            Scenario::ClockSkew => "clock ±3h",
            Scenario::AllDown => "all down",
            Scenario::SlotMigration => "slot migration",
            Scenario::PrimaryFailover => "primary failover",
        }
    }

    /// Whether it applies to `backend`: `None` when it does, else why not.
    ///
    /// A SQLite store has no network between a runner and the file: its claim is a transaction
    /// in the runner's own process, so there is no link to cut or delay. A claim held up on
    /// SQLite waits for the file's write lock instead (see [`Cluster::stall_requests`]), and
    /// its clock is the kernel's, which `faketime` does not reach, so a runner with a wrong
    /// clock is only that, as on the network stores.
    pub fn not_applicable(self, backend: Backend) -> Option<&'static str> {
        let cluster = backend == Backend::RedisCluster;
        match self {
            Scenario::Partition | Scenario::Latency if backend == Backend::Sqlite => {
                Some("no network between a runner and a SQLite file")
            }
            Scenario::Partition | Scenario::Latency | Scenario::LateClaim if cluster => {
                Some("a cluster client follows the nodes' own addresses past any proxy")
            }
            Scenario::StoreRestart if cluster => Some(
                "a cluster is not stopped as one server (a primary's failover: the failover scenarios)",
            ),
            Scenario::SlotMigration | Scenario::PrimaryFailover if !cluster => {
                Some("needs a Redis Cluster")
            }
            _ => None,
        }
    }

    /// Runs it on `backend`.
    pub async fn run(self, backend: Backend) -> Outcome {
        let mut note = String::new();
        let mut extra = Vec::new();
        let with_neighbours = || {
            let mut jobs = well_behaved();
            jobs.extend(misbehaving());
            jobs
        };
        let server = match self {
            Scenario::FreezeEffects => Some(Server::start().await),
            _ => None,
        };
        let mut c = match self {
            Scenario::FreezeEffects => {
                let mut jobs = well_behaved();
                let origin = server
                    .as_ref()
                    .map(|s| s.origin.as_str())
                    .unwrap_or_default();
                jobs.push(probe_job("probe", origin));
                Cluster::new(backend, jobs)
            }
            Scenario::FreezeCommand => {
                let mut jobs = well_behaved();
                jobs.push(command_effects_job("command", 3, 60, 20));
                Cluster::new(backend, jobs)
            }
            Scenario::LateClaim => {
                let mut late = effects_job("late", 1, 1, 1, "max_late = \"0s\"", false);
                late.spec.max_late = 0;
                Cluster::new(backend, vec![late])
            }
            Scenario::Latency | Scenario::ClockSkew => Cluster::new(backend, well_behaved()),
            Scenario::AllDown => Cluster::new(backend, catch_up_jobs()),
            _ => Cluster::new(backend, with_neighbours()),
        };
        match self {
            Scenario::Kill => {
                c.start(3).await;
                for n in 4..=5 {
                    let (i, started) = c.next_attempt("effects").await;
                    tokio::time::sleep(MID_ATTEMPT).await;
                    c.hit(&started);
                    c.kill(i);
                    taken_over(&c, &started).await;
                    c.start_runner(&format!("r{n}"), RunnerOptions::default())
                        .await;
                }
                next_success(&c).await;
            }
            Scenario::Freeze => {
                c.start(3).await;
                let (i, started) = c.next_attempt("effects").await;
                tokio::time::sleep(MID_ATTEMPT).await;
                let at = now_ms();
                c.hit(&started);
                c.freeze(i, FREEZE_MS).await;
                let id = c.id(i);
                let lost = c
                    .wait_event(WAIT, "lost on the woken runner", |e| {
                        e.runner == id && e.kind == "lost" && e.at >= at
                    })
                    .await;
                note = format!("woken runner: lost ({})", lost.reason);
                if c.frozen_holding_the_file {
                    note.push_str("; it was frozen holding the file's write lock");
                }
                taken_over(&c, &started).await;
                next_success(&c).await;
            }
            Scenario::FreezeEffects => {
                let server = server.as_ref().expect("the scenario's HTTP server");
                let (n, violation) = zombie_effects(&mut c, server).await;
                note = n;
                extra.extend(violation);
            }
            Scenario::FreezeCommand => {
                let (n, violation) = zombie_command(&mut c).await;
                note = n;
                extra.extend(violation);
            }
            Scenario::Terminate => {
                c.start(3).await;
                let (i, _) = c.next_attempt("effects").await;
                tokio::time::sleep(MID_ATTEMPT).await;
                let at = now_ms();
                c.terminate(i).await;
                let id = c.id(i);
                let released = c
                    .wait_event(WAIT, "released on SIGTERM", |e| {
                        e.runner == id && e.kind == "released"
                    })
                    .await;
                note = format!("terminated runner: released ({})", released.reason);
                recovered(&c, at).await;
                c.start_runner("r4", RunnerOptions::default()).await;
                next_success(&c).await;
            }
            Scenario::StoreRestart => {
                c.start(3).await;
                let _ = c.next_attempt("effects").await;
                tokio::time::sleep(MID_ATTEMPT).await;
                c.stop_store();
                tokio::time::sleep(Duration::from_millis(FOR_LONGER_THAN_THE_LEASE_MS)).await;
                c.start_store();
                next_success(&c).await;
                next_success(&c).await;
                let how = match backend {
                    Backend::Sqlite => "file locked by another connection",
                    Backend::Postgres => {
                        "server stopped (immediate), restarted on its port with its WAL"
                    }
                    _ => "server killed, restarted on its port with its AOF",
                };
                // A runner logs one line when an outage begins and one when it ends, not one
                // per failed call (a call is retried every 100 ms: a line per retry would be
                // dozens). A restarted server may cut a connection once more as it comes back.
                let events = c.events();
                let lines = |runner: &str, what: &str| {
                    events
                        .iter()
                        .filter(|e| e.runner == runner && e.kind.starts_with(what))
                        .count()
                };
                let mut began = Vec::new();
                for runner in ["r1", "r2", "r3"] {
                    let n = lines(runner, "store out of reach");
                    began.push(n);
                    if n > MAX_OUTAGE_LINES {
                        extra.push(Violation {
                            rule: "one log line per store outage",
                            detail: format!(
                                "{runner} logged {n} lines that an outage began, for one outage"
                            ),
                        });
                    }
                }
                let ended: usize = ["r1", "r2", "r3"]
                    .iter()
                    .map(|r| lines(r, "store reachable again"))
                    .sum();
                note = format!(
                    "{how}; outages logged per runner: {began:?} began, {ended} ended in all"
                );
            }
            Scenario::Partition => {
                c.start(3).await;
                let (i, _) = c.next_attempt("effects").await;
                tokio::time::sleep(MID_ATTEMPT).await;
                let at = now_ms();
                c.partition(i, FOR_LONGER_THAN_THE_LEASE_MS).await;
                let id = c.id(i);
                let lost = c
                    .wait_event(WAIT, "lost on the partitioned runner", |e| {
                        e.runner == id && e.kind == "lost" && e.at >= at
                    })
                    .await;
                note = format!("partitioned runner: lost ({})", lost.reason);
                next_success(&c).await;
            }
            Scenario::Latency => {
                c.start(3).await;
                let from = now_ms();
                c.delay(0, Duration::from_millis(100));
                for _ in 0..2 {
                    next_success(&c).await;
                }
                c.delay(0, Duration::ZERO);
                // A run the delayed runner holds may be fenced: each of its requests takes
                // 200 ms longer, against a 1 s lease.
                c.disturb(from, now_ms() + 2_000);
                let wins = c
                    .events()
                    .iter()
                    .filter(|e| e.runner == "r1" && e.kind == "won" && e.at >= from)
                    .count();
                note = format!("delayed runner won {wins} claims meanwhile");
                next_success(&c).await;
            }
            Scenario::LateClaim => late_claim(&mut c, &mut note).await,
            Scenario::SlotMigration => {
                c.start(3).await;
                next_success(&c).await;
                let from = now_ms();
                let (moved, took) = c.migrate_slot_of("tick", Duration::from_millis(500)).await;
                for _ in 0..2 {
                    next_success_of(&c, "tick").await;
                }
                next_success(&c).await;
                // The slots of tick (every second) due while its keys moved: their claims were
                // sent meanwhile, and answered once the slot had settled.
                let due = (from + took).div_euclid(1_000) - (from - 1).div_euclid(1_000);
                let waited = c
                    .events()
                    .iter()
                    .filter(|e| e.job.as_deref() == Some("tick") && e.kind == "won")
                    .filter_map(|e| e.slot.map(|slot| e.at - slot))
                    .max()
                    .unwrap_or(0);
                note = format!(
                    "tick's slot moved to another primary: {moved} keys in {took} ms, {due} of its slots due meanwhile; its claims answered up to {waited} ms after their slot"
                );
                if due == 0 {
                    extra.push(Violation {
                        rule: "claims were due while the slot moved",
                        detail: note.clone(),
                    });
                }
            }
            Scenario::PrimaryFailover => {
                c.start(3).await;
                let _ = c.next_attempt("effects").await;
                tokio::time::sleep(MID_ATTEMPT).await;
                let (took, heard) = c.fail_over_primary_of("effects").await;
                let promoted = now_ms();
                for _ in 0..2 {
                    next_success_of(&c, "effects").await;
                }
                next_success(&c).await;
                let events = c.events();
                let after = |kind: &str| {
                    events
                        .iter()
                        .filter(|e| e.job.as_deref() == Some("effects"))
                        .filter(|e| e.kind == kind && e.at >= promoted)
                        .count()
                };
                note = format!(
                    "effects' primary killed, its replica promoted in {took} ms, heard by every runner {heard} ms later; then {} wins, {} successes of effects",
                    after("won"),
                    after("success")
                );
            }
            Scenario::AllDown => {
                c.start(2).await;
                // Right after a slot was won, so no slot is half claimed when the last dies.
                let after = now_ms();
                c.wait_event(WAIT, "a win of catchup", |e| {
                    e.kind == "won" && e.job.as_deref() == Some("catchup") && e.at >= after
                })
                .await;
                let from = c.kill_all();
                tokio::time::sleep(ALL_DOWN_FOR).await;
                c.start_runner("r3", RunnerOptions::default()).await;
                let to = now_ms();
                c.all_down(from, to);
                c.wait_event(WAIT, "a catch-up claim won", |e| {
                    e.kind == "won" && e.reason == "catch-up" && e.at >= to - 5_000
                })
                .await;
                // The schedule goes on after the catch-up.
                for _ in 0..2 {
                    next_success_of(&c, "catchup").await;
                }
            }
            Scenario::ClockSkew => {
                c.start_runner("r1", RunnerOptions::default()).await;
                c.start_runner(
                    "behind",
                    RunnerOptions {
                        faketime: Some(("-3h", -3 * 3_600_000)),
                        ..RunnerOptions::default()
                    },
                )
                .await;
                c.start_runner(
                    "ahead",
                    RunnerOptions {
                        faketime: Some(("+3h", 3 * 3_600_000)),
                        ..RunnerOptions::default()
                    },
                )
                .await;
                c.open_window();
                for _ in 0..2 {
                    let (i, started) = c.next_attempt("effects").await;
                    tokio::time::sleep(MID_ATTEMPT).await;
                    let id = c.id(i);
                    c.hit(&started);
                    c.kill(i);
                    taken_over(&c, &started).await;
                    c.start_runner(&format!("{id}-again"), skewed_like(&id))
                        .await;
                }
                next_success(&c).await;
                let events = c.events();
                let wins = |who: &str| {
                    events
                        .iter()
                        .filter(|e| e.runner.starts_with(who) && e.kind == "won")
                        .count()
                };
                note = format!(
                    "wins: r1 {}, behind {}, ahead {}",
                    wins("r1"),
                    wins("behind"),
                    wins("ahead")
                );
            }
        }
        let deaths = c.deaths.clone();
        let hand_overs = c.hand_overs.clone();
        let input = c.finish();
        if self == Scenario::LateClaim {
            extra.extend(nothing_ran_late(&input, "late", LATE_LIMIT_MS));
        }
        if self == Scenario::AllDown {
            let (_, f) = crate::checker::check(&input);
            note = format!(
                "missed while all runners were down: {}, caught up: {}",
                f.missed_all_down, f.caught_up
            );
            if f.missed_all_down == 0 || f.caught_up == 0 {
                extra.push(Violation {
                    rule: crate::checker::rules::CATCH_UP,
                    detail: format!("the catch-up rule was not exercised: {note}"),
                });
            }
        }
        Outcome {
            scenario: self,
            backend,
            input,
            deaths,
            hand_overs,
            extra,
            note,
        }
    }
}

/// Options for a runner that replaces `id`: the same clock.
fn skewed_like(id: &str) -> RunnerOptions {
    let faketime = if id.starts_with("behind") {
        Some(("-3h", -3 * 3_600_000))
    } else if id.starts_with("ahead") {
        Some(("+3h", 3 * 3_600_000))
    } else {
        None
    };
    RunnerOptions {
        faketime,
        ..RunnerOptions::default()
    }
}

/// Waits until the run hit at `at` was taken over or interrupted (or a newer one won): after a
/// hand-over, a backup may start a newer slot first.
async fn recovered(c: &Cluster, at: i64) {
    c.wait_event(WAIT, "a takeover, an interruption or a newer win", |e| {
        e.job.as_deref() == Some("effects")
            && e.at >= at
            && matches!(e.kind.as_str(), "takeover" | "interrupted" | "won")
    })
    .await;
}

/// Waits until another runner takes over the run whose attempt `started` (a `started` line)
/// a fault hit, and the run ends `success` there. Where the hit runner kept the others out of
/// the store until it woke ([`Cluster::by_another`]), the takeover may be its own.
async fn taken_over(c: &Cluster, started: &Event) {
    let (job, slot, hit) = (started.job.clone(), started.slot, started.runner.clone());
    let by_another = c.by_another(started);
    let by = c
        .wait_event(WAIT, "the takeover of the hit attempt", |e| {
            e.kind == "takeover"
                && e.job == job
                && e.slot == slot
                && (e.runner != hit || !by_another)
        })
        .await;
    c.wait_event(WAIT, "the taken-over run's success", |e| {
        e.kind == "success" && e.job == job && e.slot == slot && e.runner == by.runner
    })
    .await;
}

/// The frozen-runner case with HTTP and files: the runner of an attempt of `probe` (a request
/// and a line in `writes.log` every 20 ms) is frozen past its lease, a backup takes the run
/// over, and the runner is woken. Counts the requests the server received and the lines written
/// by the frozen attempt after the wake: both must be 0 (the host refuses them at the call).
async fn zombie_effects(c: &mut Cluster, server: &Server) -> (String, Option<Violation>) {
    let Frozen {
        slot,
        attempt,
        woken,
        ..
    } = freeze_past_the_lease(c, "probe").await;
    let attempt_header = attempt.to_string();
    let of_slot = |header: &str| {
        chrono::DateTime::parse_from_rfc3339(header).is_ok_and(|t| t.timestamp_millis() == slot)
    };
    let ours: Vec<_> = server
        .seen()
        .into_iter()
        .filter(|s| {
            matches!(s.all("baton-slot")[..], [h] if of_slot(h))
                && s.all("baton-attempt") == [attempt_header.as_str()]
        })
        .collect();
    let before = ours.iter().filter(|s| s.at < woken.instant).count();
    let requests_after = ours.len() - before;
    let log = c.data_dir("probe").join("writes.log");
    let writes = std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("the probe wrote no {}: {e}", log.display()));
    let writes_after = writes
        .lines()
        .filter_map(|l| match l.split(' ').collect::<Vec<_>>()[..] {
            [s, a, ms, _] if s == slot.to_string() && a == attempt_header => ms.parse::<i64>().ok(),
            _ => None,
        })
        .filter(|ms| *ms >= woken.at)
        .count();
    let note = format!(
        "woken runner: {requests_after} requests, {writes_after} writes after waking \
         ({before} requests before the freeze)"
    );
    let violation = (before == 0 || requests_after + writes_after > 0).then(|| Violation {
        rule: "no side effect after the lease is lost",
        detail: format!("probe slot {slot} attempt {attempt}: {note}"),
    });
    (note, violation)
}

/// An attempt whose runner was frozen past its lease, taken over, and woken.
struct Frozen {
    slot: i64,
    attempt: u32,
    runner: String,
    woken: Woken,
}

/// Starts three runners, freezes the runner of the next attempt of `job` mid-attempt for longer
/// than the lease, waits for the takeover and for the woken runner's `lost`, then for one more
/// success of `job`, so the window the checker judges covers the takeover.
async fn freeze_past_the_lease(c: &mut Cluster, job: &str) -> Frozen {
    c.start(3).await;
    let (i, started) = c.next_attempt(job).await;
    let (slot, attempt) = (
        started.slot.expect("a started line names its slot"),
        started.attempt.expect("a started line names its attempt"),
    );
    tokio::time::sleep(MID_ATTEMPT).await;
    let at = now_ms();
    c.hit(&started);
    let woken = c.freeze(i, FOR_LONGER_THAN_THE_LEASE_MS).await;
    taken_over(c, &started).await;
    let runner = c.id(i);
    c.wait_event(WAIT, "lost on the woken runner", |e| {
        e.runner == runner && e.kind == "lost" && e.at >= at
    })
    .await;
    next_success_of(c, job).await;
    Frozen {
        slot,
        attempt,
        runner,
        woken,
    }
}

/// Freezes the runner of an attempt of `command` (a plain WASI program writing a line every
/// 20 ms) past its lease, waits for the takeover and the woken runner's `lost`, and counts the
/// lines that attempt wrote after the runner woke: there must be none, and some before.
async fn zombie_command(c: &mut Cluster) -> (String, Option<Violation>) {
    let Frozen {
        slot,
        attempt,
        runner: id,
        woken,
    } = freeze_past_the_lease(c, "command").await;
    let log = c
        .data_dir("command")
        .join(format!("{slot}-{attempt}-{id}.log"));
    let lines = std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("the command wrote no {}: {e}", log.display()));
    let times: Vec<i64> = lines
        .lines()
        .filter_map(|l| l.split(' ').nth(4)?.parse().ok())
        .collect();
    let after = times.iter().filter(|ms| **ms >= woken.at).count();
    let before = times.len() - after;
    let note = format!("woken runner's program: {after} writes after waking ({before} before)");
    let violation = (before == 0 || after > 0).then(|| Violation {
        rule: "no side effect after the lease is lost",
        detail: format!("command slot {slot} attempt {attempt}: {note}"),
    });
    (note, violation)
}

/// Waits for the next success of `effects` on any runner.
async fn next_success(c: &Cluster) {
    next_success_of(c, "effects").await;
}

/// Waits for the next success of `job` on any runner.
async fn next_success_of(c: &Cluster, job: &str) {
    let after = now_ms();
    c.wait_event(WAIT, &format!("a success of {job}"), |e| {
        e.kind == "success" && e.job.as_deref() == Some(job) && e.at >= after
    })
    .await;
}

/// The jobs of the all-down scenario: `catchup` every second with the default catch-up window
/// (5 minutes), and `nocatch` every 2 s with none (`catch_up = "0s"`): it catches nothing up.
fn catch_up_jobs() -> Vec<Job> {
    let mut nocatch = effects_job("nocatch", 2, 1, 1, "catch_up = \"0s\"", false);
    nocatch.spec.catch_up = 0;
    vec![effects_job("catchup", 1, 1, 1, "", true), nocatch]
}

/// One runner, whose store operations wait up to 30 s for an answer (`?timeout=30s`); once it
/// has run the job, what it sends to the store stalls for 12 s, so the claim of the next slot
/// reaches the store more than `max_late` (0 s) + 10 s after its slot. The store must answer
/// late, the runner must hear it, and no slot may run that late.
async fn late_claim(c: &mut Cluster, note: &mut String) {
    let patient = RunnerOptions {
        store_timeout: Some("30s"),
        ..RunnerOptions::default()
    };
    c.start_runner("r1", patient).await;
    c.open_window();
    let after = now_ms();
    c.wait_event(WAIT, "a success of late", |e| {
        e.kind == "success" && e.at >= after
    })
    .await;
    let from = now_ms();
    c.stall_requests(0, STALL);
    c.wait_event(WAIT, "the store's late answer", |e| {
        e.kind == "late" && e.at >= from
    })
    .await;
    // The job's loop waits for each claim's answer and then claims only the latest due slot:
    // the slots due meanwhile were never claimed, as when the store is out of reach. The spell
    // ends when a claim sent after the stall is answered in time.
    let stall_end = from + i64::try_from(STALL.as_millis()).unwrap_or(i64::MAX);
    let back = c
        .wait_event(WAIT, "a claim answered in time", |e| {
            matches!(e.kind.as_str(), "won" | "backup" | "skip")
                && e.slot.is_some_and(|s| s >= stall_end)
        })
        .await;
    c.outage(from, back.at);
    let events = c.events();
    let count = |kind: &str| events.iter().filter(|e| e.kind.starts_with(kind)).count();
    // At least one: the wait for the store's late answer above fails otherwise. A runner logs
    // one line per store outage (its calls timing out), not one per failed call.
    *note = format!(
        "late answers heard: {}, store outages logged: {}",
        count("late"),
        count("store out of reach")
    );
}

/// No run of `job` started later than `limit` ms after its slot.
pub fn nothing_ran_late(input: &Input, job: &str, limit: i64) -> Vec<Violation> {
    input
        .runs
        .iter()
        .filter(|r| r.job == job)
        .filter_map(|r| r.attempts.first().map(|a| (r.slot, a.started_at - r.slot)))
        .filter(|(_, late)| *late > limit)
        .map(|(slot, late)| Violation {
            rule: "no late claim wins",
            detail: format!("{job} slot {slot} started {late} ms after its slot"),
        })
        .collect()
}
