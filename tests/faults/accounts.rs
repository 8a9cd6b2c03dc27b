//! The runners' own accounts held to the store's: what every runner logged (won, took over,
//! succeeded, skipped, was called late) must agree with the history the store recorded, and a
//! dead run that a newer slot replaced must end in the store, not linger `running`.
//!
//! Three invariants, each with bad histories in the tests below:
//! - [`LOGS_MATCH_STORE`]: every `won`, `takeover` and `success` line of every runner matches an
//!   attempt of the store's history (same job, slot, attempt and runner; `success` only for an
//!   attempt the store recorded `success`), and the reverse: every attempt the store granted to
//!   a runner whose log is read was logged `won` by it, and every attempt it recorded `success`
//!   was logged `success` — unless the runner was killed before it could log the line, or the
//!   store's answer could have been lost in an outage or a cut link.
//! - [`SKIPS_JUSTIFIED`]: every `skip` for `overlap` names a slot while an older run of the job
//!   held a live lease when the claim could have been made (within [`LOGGED_WITHIN_MS`] before
//!   the runner logged the answer: a runner may send a claim a little before its slot by the
//!   machine's clock, so the slot bounds nothing); every `skip` for `superseded`
//!   one that a newer run had already started; every `late` answer came more than `max_late`
//!   plus the store's 10 s tolerance after its slot.
//! - [`SUPERSEDED_RUNS_END`]: a run left `running` whose lease had run out when a newer run of
//!   its job started is a violation: the newer claim marks it `interrupted` (spec, "Overlap").

use std::collections::HashMap;

use crate::checker::{story, Attempt, Event, Input, Run, Violation};

/// The rule: the runners' logs and the store's history tell the same story.
pub const LOGS_MATCH_STORE: &str = "logs match the store";
/// The rule: every overlap, superseded or late answer a runner heard is borne out by the store.
pub const SKIPS_JUSTIFIED: &str = "skips are justified";
/// The rule: a dead run that a newer slot replaced is recorded `interrupted`.
pub const SUPERSEDED_RUNS_END: &str = "superseded runs end";

/// The three invariants of this module.
pub const RULES: [&str; 3] = [LOGS_MATCH_STORE, SKIPS_JUSTIFIED, SUPERSEDED_RUNS_END];

/// The store's tolerance on `max_late` (spec, "Late claims"): 10 s. The spec's figure, not an
/// excuse; but excuse LATE_AT_LOG: a `late` is judged at the harness's read of the log line,
/// after the store decided. Class B, a load window of real processes: log flush and reading.
const LATE_TOLERANCE_MS: i64 = 10_000;
/// How long after the store granted (or recorded the end of) an attempt its runner surely
/// logged it, unless it was killed meanwhile: 1 s. Excuse LOGGED_WITHIN, class B, a load window
/// of real processes: the answer's way back, the log line's flush and the harness's read, all
/// stamped when read; the simulation emits events in the same instant.
const LOGGED_WITHIN_MS: i64 = 1_000;

/// How long a runner waits for the store's answer before it gives the request up: the stores'
/// default response timeout, 5 s. A request it gave up may still take effect until then.
/// Excuse ANSWER_AWAITED, class A: a request applied after its caller gave up. Shown in the
/// simulation by: `Fate::Delayed` (`faults.rs`, applied up to TIMEOUT + 12 s after its send) — a
/// "claim …: Delayed" line, then an attempt its node never logged won; seed 38.
const ANSWER_AWAITED_MS: i64 = 5_000;

/// Checks the three invariants; pushes what breaks them.
pub fn check(input: &Input, v: &mut Vec<Violation>) {
    logs_match_store(input, v);
    skips_justified(input, v);
    superseded_runs_end(input, v);
}

fn attempts(input: &Input) -> HashMap<(&str, i64, u32), (&Run, &Attempt)> {
    input
        .runs
        .iter()
        .flat_map(|r| {
            r.attempts
                .iter()
                .map(move |a| ((r.job.as_str(), r.slot, a.attempt), (r, a)))
        })
        .collect()
}

fn known_job(input: &Input, job: &str) -> bool {
    input.jobs.iter().any(|j| j.name == job)
}

/// Whether the harness read `runner`'s log and the runner was up until `until` (its log line
/// for what happened before then cannot have been cut off by a `kill -9`).
fn logged_until(input: &Input, runner: &str, until: i64) -> bool {
    let spans: Vec<_> = input
        .lives
        .iter()
        .filter(|l| l.runner.as_deref() == Some(runner))
        .collect();
    !spans.is_empty() && spans.iter().any(|l| l.from <= until && l.to >= until)
}

fn logs_match_store(input: &Input, v: &mut Vec<Violation>) {
    let store = attempts(input);
    let mut logged: HashMap<(&str, i64, u32, &str), Vec<&str>> = HashMap::new();
    for e in &input.events {
        let (Some(job), Some(slot), Some(attempt)) = (e.job.as_deref(), e.slot, e.attempt) else {
            continue;
        };
        if !matches!(e.kind.as_str(), "won" | "takeover" | "success") || !known_job(input, job) {
            continue;
        }
        logged
            .entry((job, slot, attempt, e.runner.as_str()))
            .or_default()
            .push(e.kind.as_str());
        let problem = match store.get(&(job, slot, attempt)) {
            None => Some("the store has no such attempt".to_owned()),
            Some((_, a)) if a.runner != e.runner => {
                Some(format!("the store granted it to {}", a.runner))
            }
            Some((_, a)) if e.kind == "success" && a.outcome.as_deref() != Some("success") => {
                Some(format!(
                    "the store recorded it {}",
                    a.outcome.as_deref().unwrap_or("running")
                ))
            }
            Some(_) => None,
        };
        if let Some(problem) = problem {
            v.push(Violation {
                rule: LOGS_MATCH_STORE,
                detail: format!(
                    "{} logged {} for {job} slot {slot} attempt {attempt}, but {problem}",
                    e.runner, e.kind
                ),
            });
        }
    }
    for run in input.runs.iter().filter(|r| known_job(input, &r.job)) {
        for a in &run.attempts {
            let lines = logged
                .get(&(run.job.as_str(), run.slot, a.attempt, a.runner.as_str()))
                .map(Vec::as_slice)
                .unwrap_or_default();
            // Excuse LOGGED_KILLED (`logged_until`): a runner killed before its answer came
            // never logs it. Class A; shown in the simulation by: Crash — an attempt won just
            // before "nX crashes", no "nX won"; seed 852. Excuse LOGGED_WINDOW_END (the
            // `window.1` bounds): the history is read while real processes run (class B).
            let granted_by = a.started_at + LOGGED_WITHIN_MS;
            if granted_by <= input.window.1
                && logged_until(input, &a.runner, granted_by)
                && !answer_may_be_lost(input, &a.runner, a.started_at)
                && !lines.contains(&"won")
                && !won_unacknowledged(input, run, a)
            {
                v.push(Violation {
                    rule: LOGS_MATCH_STORE,
                    detail: format!(
                        "the store granted {} slot {} attempt {} to {}, which never logged it won:{}",
                        run.job, run.slot, a.attempt, a.runner, story(input, &run.job, run.slot)
                    ),
                });
            }
            let ended_by = a.ended_at.map(|t| t + LOGGED_WITHIN_MS);
            if a.outcome.as_deref() == Some("success")
                && ended_by
                    .is_some_and(|t| t <= input.window.1 && logged_until(input, &a.runner, t))
                && !a
                    .ended_at
                    .is_some_and(|t| answer_may_be_lost(input, &a.runner, t))
                && !lines.contains(&"success")
            {
                v.push(Violation {
                    rule: LOGS_MATCH_STORE,
                    detail: format!(
                        "the store recorded {} slot {} attempt {} on {} a success its runner never logged:{}",
                        run.job, run.slot, a.attempt, a.runner, story(input, &run.job, run.slot)
                    ),
                });
            }
        }
    }
}

/// Whether the attempt's runner logged its win as a `skip` for `not-acknowledged` (a claim
/// that won on a primary whose replicas did not acknowledge it: the job does not start, the
/// claim is released), and the store shows the attempt ended without running: released, or
/// died when that release failed too.
///
/// Excuse WON_UNACKNOWLEDGED, class A (`claim.rs`, `NotAcknowledged`). Shown in the simulation
/// by: Failover with acknowledgements — a "skip … not-acknowledged" line; seed 17. But its
/// failover loses every unacknowledged write, so its store never keeps such an attempt.
fn won_unacknowledged(input: &Input, run: &Run, a: &Attempt) -> bool {
    matches!(a.outcome.as_deref(), Some("handed-over" | "died"))
        && input.events.iter().any(|e| {
            e.runner == a.runner
                && e.kind == "skip"
                && e.reason == "not-acknowledged"
                && e.job.as_deref() == Some(run.job.as_str())
                && e.slot == Some(run.slot)
                && e.at >= a.started_at - LOGGED_WITHIN_MS
        })
}

/// Whether the store's answer to `runner` at `at` may never have reached it: the store was
/// stopped or cut off around then (a claim that took effect just before a server was killed,
/// or behind a cut link, whose reply was lost), or up to [`ANSWER_AWAITED_MS`] before (a
/// request sent in the outage that a cluster client delivered to the promoted primary after
/// its caller stopped waiting), so the runner cannot have logged it.
///
/// Excuse ANSWER_LOST, class A: the write applied, its answer lost. Shown in the simulation by:
/// `Fate::AnswerLost` / `Delayed` (`faults.rs`) or an outage — an attempt (or success) in the
/// store its node never logged, after such a line; seed 12. The −1 s edge is class B.
fn answer_may_be_lost(input: &Input, runner: &str, at: i64) -> bool {
    input
        .outages
        .iter()
        .chain(&input.cut_off)
        .filter(|s| s.runner.as_deref().is_none_or(|r| r == runner))
        .any(|s| s.from - LOGGED_WITHIN_MS <= at && at - ANSWER_AWAITED_MS <= s.to)
}

/// Whether an attempt whose lease the history ends at `end` may have held it longer when a
/// claim was answered at `at`: a store outage (a failover) began while the lease was alive and
/// the answer came during it or just after. A primary answers a claim from a renewal it holds
/// before its replica does (see the Redis store's module documentation), so a renewal the lost
/// primary applied may be missing from the history that the promoted replica keeps, while a
/// claim was answered from it.
///
/// Excuse RENEWAL_LOST, class A. Shown in the simulation by: Failover without acknowledgement
/// (`world.rs`, `lost_writes`) — an overlap skip after the older run's recorded lease end, the
/// older attempt's (job, slot, node) in `lost_writes`; seed 21. The ±1 s edges are class B.
fn renewal_may_be_lost(input: &Input, end: i64, at: i64) -> bool {
    input
        .outages
        .iter()
        .filter(|s| s.runner.is_none())
        .any(|s| {
            end >= s.from - LOGGED_WITHIN_MS
                && s.from - LOGGED_WITHIN_MS <= at
                && at <= s.to + LOGGED_WITHIN_MS
        })
}

/// The end of an attempt's live lease: its end, or the run's lease end while it is current.
fn live_until(run: &Run, a: &Attempt) -> i64 {
    a.ended_at.unwrap_or(run.lease_end)
}

fn skips_justified(input: &Input, v: &mut Vec<Violation>) {
    for e in &input.events {
        let (Some(job), Some(slot)) = (e.job.as_deref(), e.slot) else {
            continue;
        };
        let Some(spec) = input.jobs.iter().find(|j| j.name == job) else {
            continue;
        };
        let runs = || input.runs.iter().filter(move |r| r.job == job);
        // The claim reached the store shortly before the runner logged the answer (`e.at`, on
        // the store's clock).
        let problem = match (e.kind.as_str(), e.reason.as_str()) {
            ("skip", "overlap") => {
                let held = runs().filter(|r| r.slot < slot).any(|r| {
                    r.attempts.iter().any(|a| {
                        // Excuse OVERLAP_LOGGED_WITHIN: the claim reached the store up to 1 s
                        // before the line was read. Class B, as LOGGED_WITHIN.
                        a.started_at <= e.at
                            && (live_until(r, a) >= e.at - LOGGED_WITHIN_MS
                                || renewal_may_be_lost(input, live_until(r, a), e.at))
                    })
                });
                (!held).then_some("no older run held a live lease then")
            }
            ("skip", "superseded") => {
                let newer = runs()
                    .filter(|r| r.slot > slot)
                    .any(|r| r.attempts.first().is_some_and(|a| a.started_at <= e.at));
                (!newer).then_some("no newer run had started")
            }
            ("late", _) => (e.at - slot <= spec.max_late + LATE_TOLERANCE_MS)
                .then_some("it was answered within max_late plus the store's tolerance"),
            _ => None,
        };
        if let Some(problem) = problem {
            // The story of the slot, and of the newest older run (the one an overlap waits on).
            let older = runs().map(|r| r.slot).filter(|s| *s < slot).max();
            v.push(Violation {
                rule: SKIPS_JUSTIFIED,
                detail: format!(
                    "{} heard {} {} for {job} slot {slot} at {}, but {problem};{}{}",
                    e.runner,
                    e.kind,
                    e.reason,
                    e.at,
                    story(input, job, slot),
                    older.map_or(String::new(), |o| format!(
                        " older slot {o}:{}",
                        story(input, job, o)
                    ))
                ),
            });
        }
    }
}

fn superseded_runs_end(input: &Input, v: &mut Vec<Violation>) {
    for run in input.runs.iter().filter(|r| r.status == "running") {
        let replaced_by = input
            .runs
            .iter()
            .filter(|r| r.job == run.job && r.slot > run.slot)
            .filter_map(|r| r.attempts.first().map(|a| (r.slot, a.started_at)))
            .find(|(_, started)| *started > run.lease_end);
        if let Some((newer, started)) = replaced_by {
            v.push(Violation {
                rule: SUPERSEDED_RUNS_END,
                detail: format!(
                    "{} slot {} is still running with its lease ended at {}, though slot {newer} started at {started}",
                    run.job, run.slot, run.lease_end
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each test feeds a hand-made history that breaks one invariant, beside one that keeps it.

    use super::*;
    use crate::checker::tests::{attempt, run};
    use crate::checker::{JobSpec, Span, DEFAULT_CATCH_UP_MS};

    fn event(
        runner: &str,
        at: i64,
        kind: &str,
        slot: i64,
        attempt: Option<u32>,
        reason: &str,
    ) -> Event {
        Event {
            at,
            runner: runner.into(),
            kind: kind.into(),
            job: Some("j".into()),
            slot: Some(slot),
            attempt,
            reason: reason.into(),
        }
    }

    /// Slot 10 000 won by a, which died; b took it over and succeeded. Slot 12 000 skipped by
    /// a as an overlap while b held slot 10 000, then won by a.
    fn input() -> Input {
        Input {
            jobs: vec![JobSpec {
                name: "j".into(),
                period: 1_000,
                max_attempts: 3,
                well_behaved: false,
                catch_up: DEFAULT_CATCH_UP_MS,
                max_late: 0,
            }],
            runs: vec![
                run(
                    10_000,
                    "success",
                    12_600,
                    vec![
                        attempt(1, "a", 10_005, Some(11_005), Some("died")),
                        attempt(2, "b", 11_200, Some(12_600), Some("success")),
                    ],
                ),
                run(
                    13_000,
                    "success",
                    13_500,
                    vec![attempt(1, "a", 13_010, Some(13_500), Some("success"))],
                ),
            ],
            events: vec![
                event("a", 10_006, "won", 10_000, Some(1), "scheduled"),
                event("b", 11_201, "won", 10_000, Some(2), "takeover"),
                event("b", 11_201, "takeover", 10_000, Some(2), "takeover"),
                event("a", 12_002, "skip", 12_000, None, "overlap"),
                event("b", 12_601, "success", 10_000, Some(2), ""),
                event("a", 13_011, "won", 13_000, Some(1), "scheduled"),
                event("a", 13_501, "success", 13_000, Some(1), ""),
            ],
            window: (10_000, 20_000),
            lives: ["a", "b"]
                .map(|r| Span {
                    runner: Some(r.into()),
                    from: 9_000,
                    to: i64::MAX,
                })
                .to_vec(),
            ..Input::default()
        }
    }

    fn broken(input: &Input) -> Vec<&'static str> {
        let mut v = Vec::new();
        check(input, &mut v);
        v.iter().map(|v| v.rule).collect()
    }

    #[test]
    fn a_history_whose_logs_match_the_store_breaks_none_of_these_invariants() {
        assert!(broken(&input()).is_empty(), "{:?}", broken(&input()));
    }

    #[test]
    fn a_won_line_with_no_attempt_in_the_store_breaks_the_logs_match_the_store_rule() {
        let mut i = input();
        i.events
            .push(event("b", 14_001, "won", 14_000, Some(1), "scheduled"));
        assert_eq!(broken(&i), [LOGS_MATCH_STORE]);
        // Or the store granted the attempt to another runner.
        let mut i = input();
        i.events[0].runner = "b".into();
        assert!(broken(&i).contains(&LOGS_MATCH_STORE), "{:?}", broken(&i));
    }

    #[test]
    fn a_success_line_for_an_attempt_the_store_recorded_died_breaks_the_logs_match_the_store_rule()
    {
        let mut i = input();
        i.events
            .push(event("a", 11_006, "success", 10_000, Some(1), ""));
        assert_eq!(broken(&i), [LOGS_MATCH_STORE]);
    }

    #[test]
    fn an_attempt_its_living_runner_never_logged_breaks_the_logs_match_the_store_rule() {
        let mut i = input();
        i.events
            .retain(|e| !(e.runner == "a" && e.slot == Some(13_000)));
        assert_eq!(broken(&i), [LOGS_MATCH_STORE, LOGS_MATCH_STORE]);
        // Unless the runner was killed before it could log it.
        i.lives[0].to = 13_200;
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    #[test]
    fn a_win_its_runner_logged_as_not_acknowledged_and_released_keeps_the_logs_match_the_store_rule(
    ) {
        let mut i = input();
        // Slot 14 000: a's claim won on a primary whose replicas did not acknowledge it, so a
        // released it unstarted; b took the run over and finished it.
        i.runs.push(run(
            14_000,
            "success",
            15_500,
            vec![
                attempt(1, "a", 14_005, Some(14_010), Some("handed-over")),
                attempt(2, "b", 14_020, Some(15_500), Some("success")),
            ],
        ));
        i.events.extend([
            event("b", 14_021, "won", 14_000, Some(2), "takeover"),
            event("b", 14_021, "takeover", 14_000, Some(2), "takeover"),
            event("b", 15_501, "success", 14_000, Some(2), ""),
        ]);
        // A skip of another slot does not account for it.
        i.events
            .push(event("a", 13_007, "skip", 13_000, None, "not-acknowledged"));
        assert_eq!(broken(&i), [LOGS_MATCH_STORE]);
        i.events
            .push(event("a", 14_007, "skip", 14_000, None, "not-acknowledged"));
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
        // Nor does it for an attempt the store shows did not end so (still running).
        i.runs[2].attempts[0].outcome = None;
        assert_eq!(broken(&i), [LOGS_MATCH_STORE]);
    }

    #[test]
    fn a_win_granted_more_than_the_answer_wait_after_an_outage_and_never_logged_breaks_the_logs_match_the_store_rule(
    ) {
        let mut i = input();
        i.events
            .retain(|e| !(e.runner == "a" && e.slot == Some(13_000)));
        // An outage that ended 7.1 s before the win: a request sent in it was given up 5 s on.
        i.outages.push(Span {
            runner: None,
            from: 5_000,
            to: 5_900,
        });
        assert_eq!(broken(&i), [LOGS_MATCH_STORE, LOGS_MATCH_STORE]);
        // One that ended 4.5 s before: the claim sent in it may have taken effect unheard.
        i.outages[0].to = 8_500;
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    #[test]
    fn a_success_its_runner_never_logged_breaks_the_logs_match_the_store_rule_unless_cut_off() {
        let mut i = input();
        i.events
            .retain(|e| !(e.runner == "a" && e.slot == Some(13_000) && e.kind == "success"));
        assert_eq!(broken(&i), [LOGS_MATCH_STORE]);
        // The finish reached the store while the runner's link was cut: its answer was lost.
        i.cut_off.push(Span {
            runner: Some("a".into()),
            from: 13_400,
            to: 15_000,
        });
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    #[test]
    fn an_overlap_skip_with_no_older_run_holding_a_lease_breaks_the_skips_are_justified_rule() {
        let mut i = input();
        // Every older run's lease had ended more than a second before (12 600, 13 500).
        i.events
            .push(event("b", 15_002, "skip", 15_000, None, "overlap"));
        assert_eq!(broken(&i), [SKIPS_JUSTIFIED]);
        // A store outage (a failover) that began after the last lease had ended does not
        // justify it either.
        i.outages.push(Span {
            runner: None,
            from: 14_600,
            to: 16_000,
        });
        assert_eq!(broken(&i), [SKIPS_JUSTIFIED]);
        // One that began while the lease of 13 500 was alive does: a renewal the lost primary
        // answered is not in the history the promoted replica keeps.
        i.outages[0].from = 13_400;
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    #[test]
    fn a_superseded_skip_before_any_newer_run_started_breaks_the_skips_are_justified_rule() {
        let mut i = input();
        i.events
            .push(event("b", 12_900, "skip", 10_000, None, "superseded"));
        assert_eq!(broken(&i), [SKIPS_JUSTIFIED]);
        let mut i = input();
        i.events
            .push(event("b", 13_100, "skip", 10_000, None, "superseded"));
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    #[test]
    fn a_late_answer_within_max_late_and_the_tolerance_breaks_the_skips_are_justified_rule() {
        let mut i = input();
        i.events
            .push(event("b", 19_000, "late", 14_000, None, "scheduled"));
        assert_eq!(broken(&i), [SKIPS_JUSTIFIED]);
        let mut i = input();
        i.events
            .push(event("b", 24_500, "late", 14_000, None, "scheduled"));
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }

    #[test]
    fn a_dead_run_a_newer_slot_replaced_left_running_breaks_the_superseded_runs_end_rule() {
        let mut i = input();
        i.runs[0].status = "running".into();
        i.runs[0].lease_end = 11_005;
        i.runs[0].attempts.truncate(1);
        i.runs[0].attempts[0].outcome = Some("died".into());
        i.events.retain(|e| e.runner != "b" && e.kind != "skip");
        assert_eq!(broken(&i), [SUPERSEDED_RUNS_END]);
        // Recorded interrupted, it keeps the rule.
        i.runs[0].status = "interrupted".into();
        assert!(broken(&i).is_empty(), "{:?}", broken(&i));
    }
}
