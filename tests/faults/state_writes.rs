//! The job-state invariant of the fault matrix: from the store's own write records (`baton state
//! JOB --json`: each key with the slot, attempt and fence that wrote it last, and the store's
//! clock at the write), no write from an attempt that was no longer current was ever accepted.
//!
//! The store accepts a write only while the writer's token is the current attempt of a running
//! run with a live lease. So the writer of every key must be an attempt of the store's history,
//! with its fence, and the write must fall inside that attempt's lease: at or after its start,
//! before its lease end if its runner died (the lease end it never renewed), at or before its
//! finish or release otherwise. A write accepted later, from a zombie whose lease had run out or
//! whose run was taken over, finished or released, breaks it. Since every key keeps its last
//! writer, and the state-writing guest writes a key of its own every few milliseconds until the
//! host stops it, a stale write accepted after an attempt's end would be the last one of its key.

use serde_json::Value;

use crate::checker::{Input, Run, Violation};

/// The rule's name in the report.
pub const RULE: &str = "no stale state write";

/// One key of a job's state as `baton state JOB --json` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateRecord {
    /// The job.
    pub job: String,
    /// The key.
    pub key: String,
    /// The writer's slot.
    pub slot: i64,
    /// The writer's attempt.
    pub attempt: u32,
    /// The writer's fence.
    pub fence: u64,
    /// When the store accepted the write, on its clock.
    pub written_at: i64,
}

fn ms(v: &Value) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(v.as_str()?)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// Parses `baton state JOB --json`: one key per line.
pub fn parse(text: &str) -> Result<Vec<StateRecord>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
            let bad = |what: &str| format!("state line without {what}: {line}");
            Ok(StateRecord {
                job: v["job"].as_str().ok_or_else(|| bad("job"))?.to_owned(),
                key: v["key"].as_str().ok_or_else(|| bad("key"))?.to_owned(),
                slot: ms(&v["slot"]).ok_or_else(|| bad("slot"))?,
                attempt: v["attempt"]
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad("attempt"))?,
                fence: v["fence"].as_u64().ok_or_else(|| bad("fence"))?,
                written_at: ms(&v["written_at"]).ok_or_else(|| bad("written_at"))?,
            })
        })
        .collect()
}

/// Holds every state record to the rule; returns how many records were checked. A job named in
/// `input.state_jobs` that finished a run with success must have written something, so that the
/// rule is never checked on nothing.
pub fn check(input: &Input, v: &mut Vec<Violation>) -> usize {
    for record in &input.state {
        let run: Option<&Run> = input
            .runs
            .iter()
            .find(|r| r.job == record.job && r.slot == record.slot);
        let attempt = run.and_then(|r| r.attempts.iter().find(|a| a.attempt == record.attempt));
        let (Some(run), Some(attempt)) = (run, attempt) else {
            v.push(Violation {
                rule: RULE,
                detail: format!(
                    "{} key {:?} written by slot {} attempt {}, which the store's history does not hold",
                    record.job, record.key, record.slot, record.attempt
                ),
            });
            continue;
        };
        let end = attempt.ended_at.unwrap_or(run.lease_end);
        let died = attempt.outcome.as_deref() == Some("died");
        let after_end = if died {
            record.written_at >= end
        } else {
            record.written_at > end
        };
        let wrong = if attempt.fence != record.fence {
            Some(format!(
                "with fence {}, but the attempt's is {}",
                record.fence, attempt.fence
            ))
        } else if record.written_at < attempt.started_at {
            Some(format!("at {}, before it started", record.written_at))
        } else if after_end {
            Some(format!(
                "at {}, after its lease ended ({:?} at {end}): a stale write was accepted",
                record.written_at, attempt.outcome
            ))
        } else {
            None
        };
        if let Some(wrong) = wrong {
            v.push(Violation {
                rule: RULE,
                detail: format!(
                    "{} key {:?} written by slot {} attempt {} {wrong};{}",
                    record.job,
                    record.key,
                    record.slot,
                    record.attempt,
                    crate::checker::story(input, &record.job, record.slot)
                ),
            });
        }
    }
    for job in &input.state_jobs {
        let succeeded = input
            .runs
            .iter()
            .any(|r| &r.job == job && r.status == "success");
        if succeeded && !input.state.iter().any(|s| &s.job == job) {
            v.push(Violation {
                rule: RULE,
                detail: format!("{job} succeeded, yet the store holds no state of it"),
            });
        }
    }
    input.state.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::Attempt;

    fn input(outcome: &str, written_at: i64) -> Input {
        Input {
            runs: vec![Run {
                job: "j".into(),
                slot: 10_000,
                status: "running".into(),
                lease_end: 12_000,
                attempts: vec![
                    Attempt {
                        attempt: 1,
                        runner: "a".into(),
                        reason: "scheduled".into(),
                        fence: 5,
                        started_at: 10_010,
                        ended_at: Some(11_000),
                        outcome: Some(outcome.into()),
                    },
                    Attempt {
                        attempt: 2,
                        runner: "b".into(),
                        reason: "takeover".into(),
                        fence: 6,
                        started_at: 11_200,
                        ended_at: None,
                        outcome: None,
                    },
                ],
            }],
            state: vec![StateRecord {
                job: "j".into(),
                key: "w-10000-1".into(),
                slot: 10_000,
                attempt: 1,
                fence: 5,
                written_at,
            }],
            state_jobs: vec!["j".into()],
            ..Input::default()
        }
    }

    #[test]
    fn a_write_within_the_attempts_lease_passes_and_one_after_its_end_is_a_violation() {
        let mut v = Vec::new();
        assert_eq!(check(&input("died", 10_999), &mut v), 1);
        assert!(v.is_empty(), "{v:?}");
        check(&input("died", 11_000), &mut v);
        assert_eq!(v.len(), 1, "a died attempt's lease end is not live: {v:?}");
        assert!(v[0].detail.contains("stale write"), "{v:?}");
        let mut v = Vec::new();
        check(&input("handed-over", 11_000), &mut v);
        assert!(v.is_empty(), "a write in the ms of the release: {v:?}");
        check(&input("handed-over", 11_001), &mut v);
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn a_writer_with_another_fence_or_unknown_to_the_history_is_a_violation() {
        let mut i = input("died", 10_500);
        i.state[0].fence = 6;
        let mut v = Vec::new();
        check(&i, &mut v);
        assert!(v[0].detail.contains("fence 6"), "{v:?}");
        let mut i = input("died", 10_500);
        i.state[0].attempt = 3;
        let mut v = Vec::new();
        check(&i, &mut v);
        assert!(v[0].detail.contains("does not hold"), "{v:?}");
    }

    #[test]
    fn a_state_job_that_succeeded_without_any_state_is_a_violation() {
        let mut i = input("died", 10_500);
        i.state.clear();
        i.runs[0].status = "success".into();
        let mut v = Vec::new();
        check(&i, &mut v);
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn state_json_lines_parse() {
        let line = r#"{"job":"j","key":"k","size":1,"slot":"2026-12-04T10:00:00.000Z","attempt":2,"fence":1780000000000001,"written_at":"2026-12-04T10:00:00.250Z"}"#;
        let records = parse(line).expect("parses");
        assert_eq!(records[0].attempt, 2);
        assert_eq!(records[0].fence, 1_780_000_000_000_001);
        assert_eq!(records[0].written_at - records[0].slot, 250);
    }
}
