//! The report printed at the end: per scenario and backend, the runs, takeovers, hand-overs,
//! fenced attempts and violations, the takeover times against their bound, and the window in
//! which a fenced attempt still wrote side effects.

use std::fmt::Write;

use crate::checker::{self, Figures, Violation};
use crate::harness::{Backend, HEARTBEAT_MS, LEASE_MS, STOP_TIMEOUT_MS};
use crate::scenarios::{Outcome, Scenario};

/// One row of the report: a scenario on a backend, checked.
pub struct Row {
    /// Which scenario.
    pub scenario: Scenario,
    /// On which store.
    pub backend: Backend,
    /// What the checker counted.
    pub figures: Figures,
    /// Every rule it broke (must be empty), or why the scenario could not run.
    pub violations: Vec<Violation>,
    /// Fault to takeover, ms, sorted.
    pub takeovers: Vec<i64>,
    /// The bound the takeover times are held to, ms; `None` where the fault itself lasts longer
    /// (a store outage).
    pub bound: Option<i64>,
    /// What only this scenario shows.
    pub note: String,
    /// Why the scenario does not apply to the backend; the row is printed as n/a.
    pub not_applicable: Option<&'static str>,
}

/// Checks an outcome and makes its row.
pub fn row(outcome: Outcome) -> Row {
    let (mut violations, figures) = checker::check(&outcome.input);
    if std::env::var_os("BATON_FAULTS_DEBUG").is_some() {
        for r in &outcome.input.runs {
            if r.attempts
                .iter()
                .any(|a| a.outcome.as_deref() == Some("died"))
            {
                eprintln!(
                    "died: {} {}",
                    outcome.scenario.name(),
                    checker::story(&outcome.input, &r.job, r.slot)
                );
            }
        }
    }
    violations.extend(outcome.extra);
    let faults = |f: &[crate::harness::Fault]| -> Vec<(String, i64)> {
        f.iter().map(|f| (f.runner.clone(), f.at)).collect()
    };
    let mut takeovers = checker::takeover_times(&outcome.input.runs, &faults(&outcome.deaths));
    let handed = checker::takeover_times(&outcome.input.runs, &faults(&outcome.hand_overs));
    let bound = match outcome.scenario {
        Scenario::StoreRestart => None,
        _ if !outcome.hand_overs.is_empty() => Some(STOP_TIMEOUT_MS + 2 * HEARTBEAT_MS),
        _ => Some(LEASE_MS + 2 * HEARTBEAT_MS),
    };
    takeovers.extend(handed);
    takeovers.sort_unstable();
    Row {
        scenario: outcome.scenario,
        backend: outcome.backend,
        figures,
        violations,
        takeovers,
        bound,
        note: outcome.note,
        not_applicable: None,
    }
}

/// A row for a scenario that could not finish (a wait that timed out, a process that failed).
pub fn failed(scenario: Scenario, backend: Backend, why: String) -> Row {
    Row {
        scenario,
        backend,
        figures: Figures::default(),
        violations: vec![Violation {
            rule: "scenario ran to its end",
            detail: why,
        }],
        takeovers: Vec::new(),
        bound: None,
        note: String::new(),
        not_applicable: None,
    }
}

/// A row for a scenario that does not apply to the backend, with the reason.
pub fn not_applicable(scenario: Scenario, backend: Backend, why: &'static str) -> Row {
    Row {
        scenario,
        backend,
        figures: Figures::default(),
        violations: Vec::new(),
        takeovers: Vec::new(),
        bound: None,
        note: format!("n/a: {why}"),
        not_applicable: Some(why),
    }
}

fn takeover_cell(row: &Row) -> String {
    let t = &row.takeovers;
    if t.is_empty() {
        return "-".into();
    }
    let median = t[t.len() / 2];
    let bound = row
        .bound
        .map_or("outage+lease".to_owned(), |b| b.to_string());
    format!("{}/{}/{} (≤{bound})", t[0], median, t[t.len() - 1])
}

/// Died attempts taken over in time, of those owed a takeover, and the latest one against its
/// due time (e.g. `3/3 (-120)`).
fn owed_cell(f: &Figures) -> String {
    let (owed, kept) = f.owed_takeovers;
    if owed == 0 {
        return "-".into();
    }
    format!("{kept}/{owed} ({})", ms_cell(f.takeover_after_due))
}

fn ms_cell(v: Option<i64>) -> String {
    v.map_or("-".into(), |v| format!("{v:+}"))
}

/// The whole report, as printed.
pub fn render(rows: &[Row], took: std::time::Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nFault matrix: lease {LEASE_MS} ms, heartbeat {HEARTBEAT_MS} ms, stop timeout {STOP_TIMEOUT_MS} ms; times in ms (store clock)"
    );
    let _ = writeln!(
        out,
        "{:<18} {:<9} {:>5} {:>9} {:>10} {:>6} {:>10}  {:<26} {:>17} {:>12} {:>10} {:>10}  note",
        "scenario",
        "backend",
        "runs",
        "takeovers",
        "hand-overs",
        "fenced",
        "violations",
        "takeover min/median/max",
        "taken over/owed",
        "zombie>lease",
        "zombie>wake",
        "state keys"
    );
    for r in rows {
        if r.not_applicable.is_some() {
            let na = "n/a";
            let _ = writeln!(
                out,
                "{:<18} {:<9} {na:>5} {na:>9} {na:>10} {na:>6} {na:>10}  {na:<26} {na:>17} {na:>12} {na:>10} {na:>10}  {}",
                r.scenario.name(),
                r.backend.name(),
                r.note
            );
            continue;
        }
        let _ = writeln!(
            out,
            "{:<18} {:<9} {:>5} {:>9} {:>10} {:>6} {:>10}  {:<26} {:>17} {:>12} {:>10} {:>10}  {}",
            r.scenario.name(),
            r.backend.name(),
            r.figures.runs,
            r.figures.takeovers,
            r.figures.hand_overs,
            r.figures.fenced,
            r.violations.len(),
            takeover_cell(r),
            owed_cell(&r.figures),
            ms_cell(r.figures.zombie_after_lease_end),
            ms_cell(r.figures.zombie_after_wake),
            r.figures.state_records,
            r.note
        );
    }
    for r in rows {
        for v in &r.violations {
            let _ = writeln!(
                out,
                "VIOLATION {} on {}: {}: {}",
                r.scenario.name(),
                r.backend.name(),
                v.rule,
                v.detail
            );
        }
    }
    let _ = writeln!(
        out,
        "taken over/owed: died attempts taken over within lease + 2 x heartbeat of the store being reachable again (2 x heartbeat of the lease end without an outage), of those owed one (a runner that knew of the run up, attempts left, no newer run first); in brackets the latest against its due time (allowance {} ms)",
        checker::TAKEOVER_SLACK_MS
    );
    let _ = writeln!(
        out,
        "zombie>lease: the last side effect of a fenced attempt after its lease end (negative: it stopped before); zombie>wake: the same after its frozen host could run again"
    );
    let _ = writeln!(
        out,
        "state keys: keys of the jobs' state whose last writer (slot, attempt, fence, store time) was held to that attempt's lease: no write of an attempt no longer current accepted"
    );
    let _ = writeln!(out, "matrix took {:.0?}", took);
    out
}
