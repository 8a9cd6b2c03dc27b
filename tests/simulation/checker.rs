//! The rules a schedule's exact history must keep. No time windows: in simulated time every
//! instant is exact, so each rule is a plain comparison of what happened.

use std::collections::{BTreeMap, BTreeSet};

use baton_core::lease::{AttemptOutcome, Status};

use crate::world::{options, Outcome, START_MS};

/// One rule broken, with what shows it.
#[derive(Debug)]
pub struct Violation {
    /// The rule.
    pub rule: &'static str,
    /// The job and slot involved.
    pub job: String,
    /// The slot.
    pub slot: i64,
    /// What happened.
    pub detail: String,
}

/// Every rule the outcome breaks.
pub fn check(outcome: &Outcome) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut violation = |rule, job: &str, slot, detail: String| {
        found.push(Violation {
            rule,
            job: job.to_owned(),
            slot,
            detail,
        })
    };
    let runs: BTreeMap<(String, i64), _> = outcome
        .runs
        .iter()
        .map(|run| ((run.job.clone(), run.slot), run))
        .collect();

    // Fences: a fresh fence for every attempt won, never handed out twice, and larger than
    // every fence won before it.
    let mut by_job: BTreeMap<&str, Vec<(i64, u64, i64, u32)>> = BTreeMap::new();
    for run in &outcome.runs {
        for attempt in &run.attempts {
            by_job.entry(&run.job).or_default().push((
                attempt.started_at,
                attempt.fence,
                run.slot,
                attempt.attempt,
            ));
        }
    }
    for (job, mut won) in by_job {
        won.sort();
        let mut seen = BTreeSet::new();
        for pair in won.windows(2) {
            let ((t1, f1, s1, a1), (t2, f2, s2, a2)) = (pair[0], pair[1]);
            if t1 < t2 && f1 >= f2 {
                violation(
                    "fences increase",
                    job,
                    s2,
                    format!("attempt {a2} of slot {s2} won at {t2} with fence {f2}, not above fence {f1} of attempt {a1} of slot {s1} won at {t1}"),
                );
            }
        }
        for (_, fence, slot, attempt) in &won {
            if !seen.insert(*fence) {
                violation(
                    "a fence is never handed out twice",
                    job,
                    *slot,
                    format!("fence {fence} of attempt {attempt} was handed out before"),
                );
            }
        }
    }

    // A fence is never handed out twice, even past a failover that lost the win that had it:
    // two attempts that acted never acted with one fence.
    let mut acted: BTreeMap<(&str, u64), (i64, u32, &str)> = BTreeMap::new();
    for effect in &outcome.effects {
        let who = (effect.slot, effect.attempt, effect.node.as_str());
        if let Some(other) = acted.insert((&effect.job, effect.fence), who) {
            if other != who {
                violation(
                    "a fence is never handed out twice",
                    &effect.job,
                    effect.slot,
                    format!(
                        "{} acted for attempt {} with fence {}, as {} did for attempt {} of slot {}",
                        effect.node, effect.attempt, effect.fence, other.2, other.1, other.0
                    ),
                );
            }
        }
    }

    // One live attempt per slot: every effect comes from the slot's current attempt, so no
    // later attempt of the slot was won at or before it (the runner's own deadline ends before
    // the store's lease does, and a takeover waits for the store's).
    for effect in &outcome.effects {
        // Allowed by a failover without acknowledgements that lost a write of this runner for
        // this slot after the store had answered it (its win, or a renewal): the runner acts
        // on a lease the store no longer has. Its fences are still held to the rule above.
        if outcome
            .lost_writes
            .contains(&(effect.job.clone(), effect.slot, effect.node.clone()))
        {
            continue;
        }
        let Some(run) = runs.get(&(effect.job.clone(), effect.slot)) else {
            violation(
                "an effect belongs to a run the store knows",
                &effect.job,
                effect.slot,
                format!(
                    "{} acted for attempt {} of a run the store does not have",
                    effect.node, effect.attempt
                ),
            );
            continue;
        };
        let at = START_MS + effect.at_ms;
        for later in run.attempts.iter().filter(|a| a.attempt > effect.attempt) {
            if later.started_at <= at {
                violation(
                    "every effect comes from the current attempt",
                    &effect.job,
                    effect.slot,
                    format!(
                        "{} acted at {at} for attempt {} (fence {}), but attempt {} of {} was won at {}",
                        effect.node, effect.attempt, effect.fence, later.attempt, later.runner, later.started_at
                    ),
                );
            }
        }
        match run.attempts.iter().find(|a| a.attempt == effect.attempt) {
            Some(a) if a.fence == effect.fence && a.runner == effect.node => {}
            other => violation(
                "an effect's attempt is the store's",
                &effect.job,
                effect.slot,
                format!(
                    "{} acted as attempt {} fence {}; the store has {other:?}",
                    effect.node, effect.attempt, effect.fence
                ),
            ),
        }
    }

    // max_attempts: runners that died count; hand-overs do not.
    let max = options().max_attempts as usize;
    for run in &outcome.runs {
        let died = run
            .attempts
            .iter()
            .filter(|a| a.outcome == Some(AttemptOutcome::Died))
            .count();
        if died > max || (died == max && run.status == Status::Running) {
            violation(
                "max_attempts is honoured",
                &run.job,
                run.slot,
                format!("{died} attempts died, status {}", run.status.as_str()),
            );
        }
    }

    // Liveness: once every fault is over, a run still running is taken over within a lease and
    // two heartbeats, and every slot due a lease after the quiet began runs to success.
    let end = START_MS + crate::world::LENGTH.as_millis() as i64;
    let opts = options();
    let settle = (opts.lease + 2 * opts.heartbeat).as_millis() as i64;
    let quiet = START_MS + outcome.quiet_from;
    for run in &outcome.runs {
        if run.status == Status::Running && run.lease_end + settle < end - 30_000 {
            violation(
                "a dead run is taken over once the store is reachable",
                &run.job,
                run.slot,
                format!(
                    "still running at the end, its lease ended at {}",
                    run.lease_end
                ),
            );
        }
    }
    for (job, cron, max_steps) in crate::world::jobs() {
        let schedule = baton_core::schedule::Schedule::parse(cron, "UTC").expect("valid");
        // A slot is judged if its run, taken over once, ends before every node stops.
        let last = end - (max_steps as i64 * 1_000 + 2 * settle + 10_000);
        let mut slot = schedule.next_after(quiet + settle);
        while let Some(s) = slot {
            if s > last {
                break;
            }
            let status = runs.get(&(job.to_owned(), s)).map(|r| r.status);
            // A slot skipped because the slot before it still ran is the overlap rule's.
            let skipped = status.is_none()
                && runs.values().any(|r| {
                    r.job == job
                        && r.slot < s
                        && r.attempts
                            .iter()
                            .any(|a| a.started_at <= s && a.ended_at.is_none_or(|e| e > s))
                });
            if status != Some(Status::Success) && !skipped {
                violation(
                    "every slot due after the faults runs to success",
                    job,
                    s,
                    format!("status {status:?}"),
                );
            }
            slot = schedule.next_after(s);
        }
    }
    found
}
