//! Runs as people and programs read them: one JSON object per run (for `baton history --json`,
//! `baton runs --json` and the HTTP `/runs`), or a table; and the keys of a job's state (for
//! `baton state`).

use serde_json::{json, Value};

use crate::lease::{Attempt, Run};
use crate::schedule::format_utc;
use crate::state::{StateEntry, StateKey, Writer};

/// A run as one JSON object: `job`, `slot` (RFC 3339 UTC), `status`, `handed_over`, `fence`,
/// `lease_end`, and `attempts`, each with `attempt`, `runner`, `token`, `reason`, `fence`,
/// `started_at`, `ended_at`, `outcome` and `digest` (times RFC 3339 UTC; `null` where unset).
pub fn run_json(run: &Run) -> Value {
    json!({
        "job": run.job,
        "slot": format_utc(run.slot),
        "status": run.status.as_str(),
        "handed_over": run.handed_over(),
        "fence": run.fence,
        "lease_end": format_utc(run.lease_end),
        "attempts": run.attempts.iter().map(attempt_json).collect::<Vec<_>>(),
    })
}

fn attempt_json(a: &Attempt) -> Value {
    json!({
        "attempt": a.attempt,
        "runner": a.runner,
        "token": a.token.to_string(),
        "reason": a.reason.as_str(),
        "fence": a.fence,
        "started_at": format_utc(a.started_at),
        "ended_at": a.ended_at.map(format_utc),
        "outcome": a.outcome.map(|o| o.as_str()),
        "digest": a.digest,
    })
}

/// Runs as a table with a header: job, slot, status, attempts, the last runner, how the
/// attempts ended, and whether the run was handed over.
pub fn runs_table(runs: &[Run]) -> String {
    let header = [
        "JOB",
        "SLOT",
        "STATUS",
        "ATTEMPTS",
        "RUNNER",
        "OUTCOMES",
        "HANDED-OVER",
    ];
    let rows: Vec<[String; 7]> = runs
        .iter()
        .map(|r| {
            let outcomes: Vec<&str> = r
                .attempts
                .iter()
                .map(|a| a.outcome.map_or("running", |o| o.as_str()))
                .collect();
            [
                r.job.clone(),
                format_utc(r.slot),
                r.status.to_string(),
                r.attempt.to_string(),
                r.runner.clone(),
                outcomes.join(","),
                if r.handed_over() { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    table(header, &rows)
}

/// Rows of cells as a table under its header, each column as wide as its widest cell, two
/// spaces apart; the last column is not padded.
fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(&header);
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&cells));
    }
    out
}

// ---- Job state (`baton state`) ----

/// The writer of a state key as JSON fields: `slot` and `written_at` (RFC 3339 UTC), `attempt`
/// and `fence`.
fn writer_json(job: &str, key: &str, w: &Writer) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("job".into(), json!(job));
    m.insert("key".into(), json!(key));
    m.insert("slot".into(), json!(format_utc(w.slot)));
    m.insert("attempt".into(), json!(w.attempt));
    m.insert("fence".into(), json!(w.fence));
    m.insert("written_at".into(), json!(format_utc(w.written_at)));
    m
}

/// A key of a job's state as one JSON object: `job`, `key`, `size` (bytes), and its writer's
/// `slot`, `attempt`, `fence` and `written_at`.
pub fn state_key_json(job: &str, key: &StateKey) -> Value {
    let mut m = writer_json(job, &key.key, &key.writer);
    m.insert("size".into(), json!(key.size));
    Value::Object(m)
}

/// A key of a job's state with its value as one JSON object: as [`state_key_json`], with the
/// value as `value` (text) when it is UTF-8, else as `value_hex`.
pub fn state_entry_json(job: &str, entry: &StateEntry) -> Value {
    let mut m = writer_json(job, &entry.key, &entry.writer);
    m.insert("size".into(), json!(entry.value.len()));
    match std::str::from_utf8(&entry.value) {
        Ok(text) => m.insert("value".into(), json!(text)),
        Err(_) => m.insert("value_hex".into(), json!(hex::encode(&entry.value))),
    };
    Value::Object(m)
}

/// The keys of a job's state as a table with a header: key, size, and the slot, attempt and
/// fence that wrote it, and when.
pub fn state_table(keys: &[StateKey]) -> String {
    let header = ["KEY", "SIZE", "SLOT", "ATTEMPT", "FENCE", "WRITTEN-AT"];
    let rows: Vec<[String; 6]> = keys
        .iter()
        .map(|k| {
            [
                k.key.clone(),
                k.size.to_string(),
                format_utc(k.writer.slot),
                k.writer.attempt.to_string(),
                k.writer.fence.to_string(),
                format_utc(k.writer.written_at),
            ]
        })
        .collect();
    table(header, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{AttemptOutcome, ClaimKind, Status, Token};

    fn run() -> Run {
        let token = Token::random();
        Run {
            job: "report".into(),
            slot: 1_764_748_800_000,
            status: Status::Success,
            attempt: 2,
            token,
            runner: "api-2".into(),
            lease_end: 1_764_748_830_000,
            released: false,
            fence: 7,
            attempts: vec![
                Attempt {
                    attempt: 1,
                    runner: "api-1".into(),
                    token: Token::random(),
                    reason: ClaimKind::Scheduled,
                    fence: 6,
                    started_at: 1_764_748_800_010,
                    ended_at: Some(1_764_748_801_000),
                    outcome: Some(AttemptOutcome::HandedOver),
                    digest: Some("sha256:ab".into()),
                },
                Attempt {
                    attempt: 2,
                    runner: "api-2".into(),
                    token,
                    reason: ClaimKind::Takeover,
                    fence: 7,
                    started_at: 1_764_748_801_100,
                    ended_at: None,
                    outcome: None,
                    digest: None,
                },
            ],
        }
    }

    #[test]
    fn run_json_has_the_fields_history_promises() {
        let v = run_json(&run());
        assert_eq!(v["job"], "report");
        assert_eq!(v["slot"], "2025-12-03T08:00:00.000Z");
        assert_eq!(v["status"], "success");
        assert_eq!(v["handed_over"], true);
        assert_eq!(v["fence"], 7);
        let a = &v["attempts"][0];
        assert_eq!(a["outcome"], "handed-over");
        assert_eq!(a["reason"], "scheduled");
        assert_eq!(a["digest"], "sha256:ab");
        assert_eq!(a["started_at"], "2025-12-03T08:00:00.010Z");
        assert_eq!(v["attempts"][1]["ended_at"], Value::Null);
        assert_eq!(v["attempts"][1]["token"].as_str().map(str::len), Some(32));
    }

    #[test]
    fn state_json_names_the_writer_and_gives_text_or_hex() {
        let writer = Writer {
            slot: 1_764_748_800_000,
            attempt: 2,
            fence: 9,
            written_at: 1_764_748_800_250,
        };
        let entry = StateEntry {
            key: "count".into(),
            value: b"12".to_vec(),
            writer: writer.clone(),
        };
        let v = state_entry_json("counter", &entry);
        assert_eq!(v["value"], "12");
        assert_eq!(v["attempt"], 2);
        assert_eq!(v["fence"], 9);
        assert_eq!(v["written_at"], "2025-12-03T08:00:00.250Z");
        let binary = StateEntry {
            value: vec![0xff, 0x00],
            ..entry
        };
        let v = state_entry_json("counter", &binary);
        assert_eq!(v["value_hex"], "ff00");
        assert_eq!(v.get("value"), None);
        let key = StateKey {
            key: "count".into(),
            size: 2,
            writer,
        };
        let table = state_table(&[key]);
        assert!(table.starts_with("KEY    SIZE"), "{table}");
        assert!(table
            .lines()
            .nth(1)
            .is_some_and(|l| l.ends_with("2025-12-03T08:00:00.250Z")));
    }

    #[test]
    fn table_lines_up_under_its_header() {
        let table = runs_table(&[run()]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("JOB     SLOT"), "{table}");
        assert!(lines[1].contains("handed-over,running"), "{table}");
        assert!(lines[1].ends_with("yes"), "{table}");
        assert_eq!(lines[0].find("SLOT"), lines[1].find("2025-"));
    }
}
