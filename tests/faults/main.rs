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
//! one backend, `BATON_FAULTS_SCENARIO=partition` the scenarios whose name contains that,
//! `BATON_FAULTS_PARALLEL=N` how many backends run side by side (default 2), and
//! `BATON_FAULTS_DEBUG=1` prints the story of every run with a died attempt.

mod accounts;
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

/// The backends `BATON_FAULTS_ONLY` names (one name), or all.
fn chosen_backends() -> Vec<Backend> {
    chosen(
        "BATON_FAULTS_ONLY",
        &Backend::ALL,
        Backend::name,
        |name, only| name == only,
    )
}

/// The scenarios whose name contains `BATON_FAULTS_SCENARIO`, or all.
fn chosen_scenarios() -> Vec<Scenario> {
    chosen(
        "BATON_FAULTS_SCENARIO",
        &Scenario::ALL,
        Scenario::name,
        |name, only| name.contains(only),
    )
}

/// The items of `all` whose name `picks` the value of environment variable `var`, or all when
/// it is unset; panics, listing the names, when it picks none, so a typo cannot run nothing
/// and pass.
fn chosen<T: Copy>(
    var: &str,
    all: &[T],
    name: fn(T) -> &'static str,
    picks: fn(&str, &str) -> bool,
) -> Vec<T> {
    let Ok(only) = std::env::var(var) else {
        return all.to_vec();
    };
    let chosen: Vec<T> = all
        .iter()
        .copied()
        .filter(|t| picks(name(*t), &only))
        .collect();
    let names: Vec<&str> = all.iter().map(|t| name(*t)).collect();
    assert!(
        !chosen.is_empty(),
        "{var}={only:?} picks nothing; the names are: {}",
        names.join(", ")
    );
    chosen
}

/// Runs every scenario of one backend, one after the other.
fn backend_rows(backend: Backend) -> Vec<report::Row> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut rows = Vec::new();
    for scenario in chosen_scenarios() {
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
        // Printed as they happen too, so a log cut short after the first lines still holds them.
        for v in &row.violations {
            eprintln!(
                "faults: VIOLATION {} on {}: {}: {}",
                scenario.name(),
                backend.name(),
                v.rule,
                v.detail
            );
        }
        rows.push(row);
    }
    rows
}

/// How many backends run their scenarios side by side: `BATON_FAULTS_PARALLEL`, default 2.
/// Each backend runs a store and three to five runners; all five at once on a 2-core machine
/// starve runners past their 1 s lease with no fault injected, which the checker rightly
/// flags, so the matrix loads the machine no more than a loaded production host would be.
fn backends_at_once() -> usize {
    match std::env::var("BATON_FAULTS_PARALLEL") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| {
                panic!("BATON_FAULTS_PARALLEL={v:?}: expected a count of 1 or more")
            }),
        Err(_) => 2,
    }
}

/// The next backend to run, the longest (Redis Cluster) first.
fn next_backend(queue: &std::sync::Mutex<Vec<Backend>>) -> Option<Backend> {
    let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
    if q.is_empty() {
        None
    } else {
        Some(q.remove(0))
    }
}

/// The whole matrix, two backends side by side: every rule holds under every fault on every
/// store, and the takeovers stay within their bound (with slack for a loaded machine).
#[test]
fn every_fault_on_every_store_keeps_every_rule_of_the_spec() {
    let _alone = machine_alone();
    let started = Instant::now();
    chosen_scenarios();
    let mut backends = chosen_backends();
    backends.sort_by_key(|b| *b != Backend::RedisCluster);
    // Build the binary once before the threads race for it.
    baton_tests::baton_binary();
    let queue = std::sync::Mutex::new(backends);
    let handles: Vec<_> = (0..backends_at_once())
        .map(|_| {
            let queue = &queue;
            move || {
                let mut rows = Vec::new();
                while let Some(b) = next_backend(queue) {
                    rows.extend(backend_rows(b));
                }
                rows
            }
        })
        .collect();
    let mut rows = Vec::new();
    std::thread::scope(|s| {
        let running: Vec<_> = handles.into_iter().map(|h| s.spawn(h)).collect();
        for h in running {
            rows.extend(h.join().expect("a backend's thread"));
        }
    });
    rows.sort_by_key(|r| {
        (
            Scenario::ALL.iter().position(|s| *s == r.scenario),
            Backend::ALL.iter().position(|b| *b == r.backend),
        )
    });
    baton_tests::publish_report(
        env!("CARGO_TARGET_TMPDIR"),
        "fault-matrix",
        &report::render(&rows, started.elapsed()),
    );
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
