//! Fault injection across real processes and stores: several `baton run` processes on one jobs
//! directory and one store (SQLite, Redis, Valkey, PostgreSQL), hit by `kill -9`, `SIGSTOP`,
//! `SIGTERM`, a store stopped and restarted, a partition, latency, claims held up past
//! `max_late`, clocks hours off, and every runner down for several slots (catch-up on start); a
//! checker holds the store's history and the side effects to the rules of `spec/leases.md`, and
//! a report is printed at the end.
//!
//! A scenario that cannot apply to a backend (a partition or added latency on SQLite, which has
//! no network between a runner and the file) is a row of the report too, "n/a" with the reason.
//!
//! `cargo test --test faults -- --nocapture` shows the report. `BATON_FAULTS_ONLY=redis` runs
//! one backend, `BATON_FAULTS_SCENARIO=partition` the scenarios whose name contains that, and
//! `BATON_FAULTS_DEBUG=1` prints the story of every run with a died attempt.

mod checker;
mod failover;
mod harness;
mod report;
mod scenarios;
mod state_writes;

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use harness::Backend;
use scenarios::Scenario;

/// Keeps the fault matrix, whose takeover times are measured, from sharing the machine with
/// the failover scenarios; those may run side by side.
static MACHINE: RwLock<()> = RwLock::new(());

/// The machine to the fault matrix alone.
fn machine_alone() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|p| p.into_inner())
}

/// The machine shared with the other failover scenario, not with the fault matrix.
pub(crate) fn machine_shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|p| p.into_inner())
}

/// Runs every scenario of one backend, one after the other.
fn backend_rows(backend: Backend) -> Vec<report::Row> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut rows = Vec::new();
    let only = std::env::var("BATON_FAULTS_SCENARIO").ok();
    let chosen = |s: &Scenario| only.as_deref().is_none_or(|o| s.name().contains(o));
    for scenario in Scenario::ALL.into_iter().filter(chosen) {
        if let Some(why) = scenario.not_applicable(backend) {
            rows.push(report::not_applicable(scenario, backend, why));
            continue;
        }
        let started = Instant::now();
        let joined = rt.block_on(async { tokio::spawn(scenario.run(backend)).await });
        let row = match joined {
            Ok(outcome) => report::row(outcome),
            Err(e) => {
                let why = match e.try_into_panic() {
                    Ok(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "panicked".into()),
                    Err(e) => e.to_string(),
                };
                report::failed(scenario, backend, why)
            }
        };
        eprintln!(
            "faults: {} on {} done in {:.1?} ({} violations)",
            scenario.name(),
            backend.name(),
            started.elapsed(),
            row.violations.len()
        );
        rows.push(row);
    }
    rows
}

/// The whole matrix, the backends side by side: every rule holds under every fault on every
/// store, and the takeovers stay within their bound (with slack for a loaded machine).
#[test]
fn every_fault_on_every_store_keeps_every_rule_of_the_spec() {
    let _alone = machine_alone();
    let started = Instant::now();
    // Build the binary once before the threads race for it.
    baton_tests::baton_binary();
    let only = std::env::var("BATON_FAULTS_ONLY").ok();
    let handles: Vec<_> = Backend::ALL
        .into_iter()
        .filter(|b| only.as_deref().is_none_or(|o| o == b.name()))
        .map(|b| std::thread::spawn(move || backend_rows(b)))
        .collect();
    let mut rows = Vec::new();
    for h in handles {
        rows.extend(h.join().expect("a backend's thread"));
    }
    rows.sort_by_key(|r| {
        (
            Scenario::ALL.iter().position(|s| *s == r.scenario),
            Backend::ALL.iter().position(|b| *b == r.backend),
        )
    });
    println!("{}", report::render(&rows, started.elapsed()));
    let violations: usize = rows.iter().map(|r| r.violations.len()).sum();
    assert_eq!(violations, 0, "violations: see the report above");
    for r in &rows {
        if let (Some(bound), Some(max)) = (r.bound, r.takeovers.last()) {
            // Measured from the fault, not from the last heartbeat, on a loaded machine.
            assert!(
                *max <= 2 * bound + 1_000,
                "{} on {}: takeover after {max} ms, bound {bound} ms",
                r.scenario.name(),
                r.backend.name()
            );
        }
    }
}
