//! The excuses of the real-process fault matrix's checker (`tests/faults/checker.rs`,
//! `accounts.rs`), each shown by a schedule of the simulation: an excuse that names a fault the
//! simulation models (class A there) is backed by a seed whose exact history needs it. Each
//! mechanism here is a test over one schedule's history; `SHOWN_BY` keeps the first seed found
//! for each, and `BATON_SIM_FIND_MECHANISMS=N` searches the first `N` seeds again.

use baton_core::lease::{AttemptOutcome, Run, Status};

use crate::world::{self, Outcome, START_MS};

/// One line of the history, cut at its time: `(ms since the start, the rest)`.
fn timed(line: &str) -> Option<(i64, &str)> {
    let line = line.trim_start();
    let (at, rest) = line.split_once(' ')?;
    Some((at.parse().ok()?, rest))
}

/// An event line: `(ms, runner, kind, job, slot, reason)`.
fn events(o: &Outcome) -> impl Iterator<Item = (i64, &str, &str, &str, i64, &str)> {
    o.lines.iter().filter_map(|line| {
        let (at, rest) = timed(line)?;
        let mut words = rest.splitn(7, ' ');
        let (runner, kind, job, slot) =
            (words.next()?, words.next()?, words.next()?, words.next()?);
        if words.next()? != "attempt" {
            return None;
        }
        let _attempt = words.next()?;
        Some((
            at,
            runner,
            kind,
            job,
            slot.parse().ok()?,
            words.next().unwrap_or(""),
        ))
    })
}

/// When a node's fault line says `what` of `node` (`crashes`, `freezes`, `stops`, …).
fn node_lines<'a>(o: &'a Outcome, node: &'a str, what: &'a str) -> impl Iterator<Item = i64> + 'a {
    o.lines.iter().filter_map(move |line| {
        let (at, rest) = timed(line)?;
        rest.strip_prefix(node)?
            .trim_start()
            .starts_with(what)
            .then_some(at)
    })
}

/// Whether `runner` logged that it won attempt `attempt` of `job`'s slot.
fn logged_win(o: &Outcome, runner: &str, job: &str, slot: i64, attempt: u32) -> bool {
    let attempt = format!("attempt Some({attempt}) ");
    o.lines.iter().any(|line| {
        timed(line).is_some_and(|(_, rest)| {
            rest.starts_with(&format!("{runner} won {job} {slot} {attempt}"))
        })
    })
}

/// Store ms of a history time.
fn store_ms(at: i64) -> i64 {
    START_MS + at
}

/// The heartbeat of every job, ms.
fn heartbeat_ms() -> i64 {
    baton_core::lease::millis(world::options().heartbeat)
}

/// Whether the store's run shows an attempt that its runner never logged won, after one of the
/// runner's claims of that slot had `fate` (`Delayed`, `AnswerLost`).
fn unlogged_win_after(o: &Outcome, fate: &str) -> bool {
    o.runs.iter().any(|run| {
        run.attempts.iter().any(|a| {
            !logged_win(o, &a.runner, &run.job, run.slot, a.attempt)
                && o.lines.iter().any(|line| {
                    timed(line).is_some_and(|(_, rest)| {
                        rest.starts_with(&format!("{} claim {} {} ", a.runner, run.job, run.slot))
                            && rest.contains(fate)
                    })
                })
        })
    })
}

/// ANSWER_AWAITED: a claim applied after its caller gave up (held past the timeout) won an
/// attempt its runner never logged.
fn answer_awaited(o: &Outcome) -> bool {
    unlogged_win_after(o, ": Delayed(")
}

/// ANSWER_LOST: a claim applied with its answer lost won an attempt its runner never logged.
fn answer_lost(o: &Outcome) -> bool {
    unlogged_win_after(o, ": AnswerLost(")
}

/// LOGGED_KILLED: a runner crashed after the store granted it an attempt and before it logged
/// the win.
fn logged_killed(o: &Outcome) -> bool {
    o.runs.iter().any(|run| {
        run.attempts.iter().any(|a| {
            !logged_win(o, &a.runner, &run.job, run.slot, a.attempt)
                && node_lines(o, &a.runner, "crashes")
                    .any(|at| (a.started_at..=a.started_at + 2_000).contains(&store_ms(at)))
        })
    })
}

/// WON_UNACKNOWLEDGED: a claim won on a primary whose replica did not acknowledge it: the
/// runner skips it as `not-acknowledged`.
fn won_unacknowledged(o: &Outcome) -> bool {
    events(o).any(|(_, _, kind, _, _, reason)| kind == "skip" && reason == "not-acknowledged")
}

/// RENEWAL_LOST: an overlap skip answered from a history a failover took back: the older run's
/// renewal by its runner was answered, then lost.
fn renewal_lost(o: &Outcome) -> bool {
    events(o).any(|(_, _, kind, job, slot, reason)| {
        kind == "skip"
            && reason == "overlap"
            && o.lost_writes.iter().any(|(j, s, _)| j == job && *s < slot)
    })
}

/// The run of `job`'s slot that came next after `run`, if any.
fn next_run<'a>(o: &'a Outcome, run: &Run) -> Option<&'a Run> {
    o.runs
        .iter()
        .filter(|r| r.job == run.job && r.slot > run.slot)
        .min_by_key(|r| r.slot)
}

/// INTERRUPTED_HANDED_OVER: a run handed over on stop, interrupted by the next slot's claim
/// before a backup took it over.
fn interrupted_handed_over(o: &Outcome) -> bool {
    o.runs.iter().any(|run| {
        run.status == Status::Interrupted
            && run.attempts.last().and_then(|a| a.outcome) == Some(AttemptOutcome::HandedOver)
    })
}

/// TAKEN_OVER_NEWER_FIRST (and MAX_ATTEMPTS_NEWER): a dead run with attempts left, interrupted
/// by the next slot's claim, which came before any takeover.
fn newer_first(o: &Outcome) -> bool {
    let max = world::options().max_attempts;
    o.runs.iter().any(|run| {
        run.status == Status::Interrupted
            && run.attempts.last().and_then(|a| a.outcome) == Some(AttemptOutcome::Died)
            && (run.attempts.len() as u32) < max
            && next_run(o, run).is_some()
    })
}

/// TAKEN_OVER_MAX_ATTEMPTS: the last attempt `max_attempts` allows died; the run is
/// interrupted, not taken over.
fn max_attempts_used(o: &Outcome) -> bool {
    let max = world::options().max_attempts;
    o.runs.iter().any(|run| {
        run.status == Status::Interrupted
            && run
                .attempts
                .iter()
                .filter(|a| a.outcome == Some(AttemptOutcome::Died))
                .count() as u32
                >= max
    })
}

/// A died attempt and the attempt that took it over, if one did.
fn takeovers(o: &Outcome) -> impl Iterator<Item = (&Run, i64, i64)> {
    o.runs.iter().flat_map(|run| {
        run.attempts.windows(2).filter_map(move |pair| {
            let (dead, next) = (&pair[0], &pair[1]);
            (dead.outcome == Some(AttemptOutcome::Died)).then_some((
                run,
                dead.ended_at?,
                next.started_at,
            ))
        })
    })
}

/// Whether an outage overlaps the store times `from..to`.
fn outage_between(o: &Outcome, from: i64, to: i64) -> bool {
    o.outages
        .iter()
        .any(|(a, b)| store_ms(*a) < to && store_ms(*b) > from)
}

/// OWED_KNEW / OWED_LIFE / OWED_FROZEN: a died attempt taken over later than two heartbeats
/// after its lease end, with the store reachable all along, because every node that knew the
/// run (it logged an event of it) crashed, stopped or froze before the takeover fell due.
fn owed_late(o: &Outcome) -> bool {
    takeovers(o).any(|(run, end, next)| {
        let due = end + 2 * heartbeat_ms();
        let first = run.attempts.first().map_or(end, |a| a.started_at);
        let mut knowers: Vec<&str> = events(o)
            .filter(|(_, _, _, job, slot, _)| *job == run.job && *slot == run.slot)
            .map(|(_, runner, ..)| runner)
            .collect();
        knowers.sort_unstable();
        knowers.dedup();
        let down = |node: &str| {
            ["crashes", "stops", "freezes"].iter().any(|what| {
                node_lines(o, node, what).any(|at| (first..=due).contains(&store_ms(at)))
            })
        };
        next > due + 100
            && !outage_between(o, end - 1, next)
            && !knowers.is_empty()
            && knowers.iter().all(|node| down(node))
    })
}

/// TAKEOVER_DUE_OUTAGE: a died attempt whose lease ended in a store outage, taken over more
/// than two heartbeats after the store could be reached again.
fn takeover_after_outage(o: &Outcome) -> bool {
    takeovers(o).any(|(_, end, next)| {
        o.outages.iter().any(|(from, to)| {
            (store_ms(*from)..store_ms(*to)).contains(&end)
                && next > store_ms(*to) + 2 * heartbeat_ms()
        })
    })
}

/// ACCOUNTED_OUTAGE: a slot due in a store outage that has no run, no skip and no `late`:
/// its claims went unanswered and yielded to a newer slot's.
fn slot_lost_to_an_outage(o: &Outcome) -> bool {
    world::jobs().iter().any(|(job, _, _)| {
        let period = if *job == "short" { 15_000 } else { 20_000 };
        o.outages.iter().any(|(from, to)| {
            let first = (store_ms(*from) + period - 1) / period * period;
            (first..store_ms(*to)).step_by(period as usize).any(|slot| {
                !o.runs.iter().any(|r| r.job == *job && r.slot == slot)
                    && !events(o).any(|(_, _, kind, j, s, _)| {
                        j == *job && s == slot && matches!(kind, "skip" | "late")
                    })
            })
        })
    })
}

/// SCHEDULE_HIT: a runner crashed or froze while its attempt ran; the attempt died.
fn hit_while_running(o: &Outcome) -> bool {
    o.runs.iter().any(|run| {
        run.attempts.iter().any(|a| {
            a.outcome == Some(AttemptOutcome::Died)
                && a.ended_at.is_some_and(|end| {
                    node_lines(o, &a.runner, "crashes")
                        .chain(node_lines(o, &a.runner, "freezes"))
                        .any(|at| (a.started_at..end).contains(&store_ms(at)))
                })
        })
    })
}

/// SCHEDULE_OVERLAP: a slot skipped while the job's earlier run still held its lease.
fn overlap_skip(o: &Outcome) -> bool {
    events(o).any(|(_, _, kind, _, _, reason)| kind == "skip" && reason == "overlap")
}

/// SCHEDULE_DISTURBED: a slot due during the faults that needed more than one attempt.
fn disturbed(o: &Outcome) -> bool {
    o.runs
        .iter()
        .any(|r| r.attempts.len() > 1 && r.slot < store_ms(o.quiet_from))
}

/// FORCED_BY_SELF: a runner frozen while its attempt ran takes its own run over once it wakes.
fn taken_over_by_itself(o: &Outcome) -> bool {
    o.runs.iter().any(|run| {
        run.attempts.windows(2).any(|pair| {
            pair[0].outcome == Some(AttemptOutcome::Died)
                && pair[1].runner == pair[0].runner
                && pair[0].ended_at.is_some_and(|end| {
                    node_lines(o, &pair[0].runner, "freezes")
                        .any(|at| (pair[0].started_at..end).contains(&store_ms(at)))
                })
        })
    })
}

/// ZOMBIE_STOP_LATENCY (its class A part): a side effect after the store's recorded lease end,
/// by a runner whose renewal was answered and then lost in a failover.
fn effect_after_a_lost_renewal(o: &Outcome) -> bool {
    o.effects.iter().any(|e| {
        o.lost_writes
            .contains(&(e.job.clone(), e.slot, e.node.clone()))
            && o.runs.iter().any(|run| {
                run.job == e.job
                    && run.slot == e.slot
                    && run.attempts.iter().any(|a| {
                        a.attempt == e.attempt
                            && a.ended_at.is_some_and(|end| store_ms(e.at_ms) > end)
                    })
            })
    })
}

/// Whether a schedule's history shows a mechanism.
pub type Shows = fn(&Outcome) -> bool;

/// Every mechanism, by the name of the excuse it backs.
pub const MECHANISMS: [(&str, Shows); 17] = [
    ("ANSWER_AWAITED", answer_awaited),
    ("ANSWER_LOST", answer_lost),
    ("LOGGED_KILLED", logged_killed),
    ("WON_UNACKNOWLEDGED", won_unacknowledged),
    ("RENEWAL_LOST", renewal_lost),
    ("INTERRUPTED_HANDED_OVER", interrupted_handed_over),
    ("TAKEN_OVER_NEWER_FIRST", newer_first),
    ("TAKEN_OVER_MAX_ATTEMPTS", max_attempts_used),
    ("OWED_KNEW/LIFE/FROZEN", owed_late),
    ("TAKEOVER_DUE_OUTAGE", takeover_after_outage),
    ("ACCOUNTED_OUTAGE", slot_lost_to_an_outage),
    ("SCHEDULE_HIT", hit_while_running),
    ("SCHEDULE_OVERLAP", overlap_skip),
    ("SCHEDULE_DISTURBED", disturbed),
    ("FORCED_BY_SELF", taken_over_by_itself),
    ("ZOMBIE_STOP_LATENCY", effect_after_a_lost_renewal),
    ("MAX_ATTEMPTS_NEWER", newer_first),
];

/// The first seed (from 1) whose history shows each mechanism, as a search of 12 000 seeds
/// found them. OWED_KNEW/LIFE/FROZEN has none: see its excuse in `tests/faults/checker.rs`.
pub const SHOWN_BY: [(&str, u64); 16] = [
    ("ANSWER_AWAITED", 38),
    ("ANSWER_LOST", 12),
    ("LOGGED_KILLED", 852),
    ("WON_UNACKNOWLEDGED", 17),
    ("RENEWAL_LOST", 21),
    ("INTERRUPTED_HANDED_OVER", 89),
    ("TAKEN_OVER_NEWER_FIRST", 1),
    ("TAKEN_OVER_MAX_ATTEMPTS", 665),
    ("TAKEOVER_DUE_OUTAGE", 108),
    ("ACCOUNTED_OUTAGE", 1),
    ("SCHEDULE_HIT", 2),
    ("SCHEDULE_OVERLAP", 1),
    ("SCHEDULE_DISTURBED", 1),
    ("FORCED_BY_SELF", 2104),
    ("ZOMBIE_STOP_LATENCY", 937),
    ("MAX_ATTEMPTS_NEWER", 1),
];
