//! The deterministic simulation: the real `Instance` of three nodes, with a native handler, on
//! tokio's paused time and a simulated store behind a seeded fault layer, in one thread per
//! schedule. Every choice of a schedule comes from its seed, so a failure replays exactly:
//!
//! - `cargo test --test simulation` runs `BATON_SIM_SCHEDULES` seeded schedules (default 2000),
//!   of 5 simulated minutes each, and prints `N schedules` with how long they took;
//! - `BATON_SIM_SEED=N cargo test --test simulation` runs the schedule of seed `N` alone and
//!   prints its whole history.

use std::time::Instant;

mod checker;
mod faults;
mod mechanisms;
mod outage;
mod world;

/// How many schedules a run simulates unless `BATON_SIM_SCHEDULES` says: 2000.
const DEFAULT_SCHEDULES: u64 = 2_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// The lines of the history that concern the slots a violation names.
fn story(outcome: &world::Outcome, violations: &[checker::Violation]) -> String {
    let slots: Vec<String> = violations
        .iter()
        .map(|v| format!(" {} {} ", v.job, v.slot))
        .collect();
    outcome
        .lines
        .iter()
        .filter(|l| {
            slots.iter().any(|s| format!("{l} ").contains(s.as_str()))
                || l.contains("crashes")
                || l.contains("starts")
                || l.contains("stops")
        })
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs one schedule and returns its violations, described with the seed and the story of the
/// slots involved.
fn judge(seed: u64) -> Option<String> {
    let outcome = world::run(seed);
    if let Ok(dir) = std::env::var("BATON_SIM_DUMP") {
        let _ = std::fs::write(format!("{dir}/{seed}.txt"), outcome.lines.join("\n"));
    }
    let violations = checker::check(&outcome);
    if violations.is_empty() {
        return None;
    }
    Some(format!(
        "seed {seed} breaks {} rule(s) (replay: BATON_SIM_SEED={seed} cargo test --test simulation):\n{}\n--- the story of those slots:\n{}",
        violations.len(),
        violations
            .iter()
            .map(|v| format!("  {}: {} slot {}: {}", v.rule, v.job, v.slot, v.detail))
            .collect::<Vec<_>>()
            .join("\n"),
        story(&outcome, &violations)
    ))
}

#[test]
fn seeded_schedules_keep_every_rule() {
    if let Some(seed) = env_u64("BATON_SIM_SEED") {
        let outcome = world::run(seed);
        println!("{}", outcome.lines.join("\n"));
        let violations = checker::check(&outcome);
        assert!(violations.is_empty(), "{}", judge(seed).unwrap_or_default());
        println!("1 schedules, seed {seed}: every rule kept");
        return;
    }
    let schedules = env_u64("BATON_SIM_SCHEDULES").unwrap_or(DEFAULT_SCHEDULES);
    let first = env_u64("BATON_SIM_FIRST_SEED").unwrap_or(1);
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (first + t..first + schedules)
                        .step_by(threads as usize)
                        .filter_map(judge)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a simulation thread"))
            .collect()
    });
    let took = started.elapsed().as_secs_f64();
    baton_tests::publish_report(
        env!("CARGO_TARGET_TMPDIR"),
        "simulation",
        &format!(
            "simulation: {schedules} schedules of {} s simulated, {} nodes, in {took:.1} s ({:.0} schedules a second), {} breaking a rule",
            world::LENGTH.as_secs(),
            world::NODES.len(),
            schedules as f64 / took,
            failures.len()
        ),
    );
    let summary: Vec<String> = failures
        .iter()
        .map(|f| f.lines().take(2).collect::<Vec<_>>().join(" / "))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {schedules} schedules break a rule:\n{}\n\nthe first in full:\n{}",
        failures.len(),
        summary.join("\n"),
        failures[0]
    );
}

#[test]
fn a_seed_replays_the_same_history_byte_for_byte() {
    // Seed 13340 freezes a node and wakes it, which once woke its tasks in an order of tokio's
    // own random choice. The second run is on another thread, after another schedule.
    let seed = env_u64("BATON_SIM_SEED").unwrap_or(13_340);
    let first = world::run(seed).lines;
    let second = std::thread::spawn(move || {
        world::run(seed + 1);
        world::run(seed).lines
    })
    .join()
    .expect("the replay's thread");
    assert!(first.len() > 100, "a schedule of {} lines", first.len());
    assert_eq!(first, second, "seed {seed} replayed differently");
}

/// Seeds whose schedules found a bug, each kept as it was fixed:
/// - 158 and 794: a claim sent again with its token after its answer was lost got its win back
///   with the lease the lost claim had started, but the runner took its deadline from the new
///   send, so it acted after its lease had ended and another node had taken over (the win is
///   now renewed before the handler starts);
/// - 77 and 699: a slot skipped as an overlap whose own earlier claim was still on its way was
///   no longer watched once the blocking run ended; the claim then arrived, won the slot for a
///   token nobody ran, and the next slot interrupted it (the watch now lasts while such a claim
///   can arrive, and gets the win back with the claim's token).
///
/// And seeds that find a fix taken back: 193 (a fence that is only the previous one plus one,
/// without the store's clock as its floor, is handed out twice after a failover loses the win
/// that had it) and 773 (a claim whose answer was lost, not sent again with its token).
#[test]
fn seeds_that_found_a_bug_keep_every_rule() {
    for seed in [77, 158, 193, 699, 773, 794] {
        assert_eq!(judge(seed), None);
    }
}

/// Seed 7170 starts `n2` and `n3` while `n1` claims the first slot of `long`: their catch-up
/// read the unfinished runs before the claim and the slot after it, and once left such a live
/// run unwatched, so when `n1` crashed nobody took it over until `n1` came back. A starting
/// node that finds the latest slot claimed is now its backup (the spec's catch-up: a claim
/// answered running makes a backup), and the run is taken over within two heartbeats of its
/// lease end by another node.
#[test]
fn a_node_that_finds_the_latest_slot_claimed_as_it_starts_is_its_backup() {
    let outcome = world::run(7_170);
    let run = outcome
        .runs
        .iter()
        .find(|r| r.job == "long" && r.slot == world::START_MS)
        .expect("the first slot of long ran");
    let [first, second, ..] = run.attempts.as_slice() else {
        panic!("the first slot's run was not taken over: {run:?}");
    };
    assert_eq!(first.runner, "n1");
    let end = first.ended_at.expect("the first attempt ended");
    let heartbeat = baton_core::lease::millis(world::options().heartbeat);
    assert!(
        second.runner != "n1" && second.started_at <= end + 2 * heartbeat,
        "taken over by {} at {} (lease end {end})",
        second.runner,
        second.started_at
    );
}

/// Every excuse of the real-process fault matrix's checker that names a fault the simulation
/// models is needed by a seed's exact history (see `mechanisms`): the seed kept for it still
/// shows it. `BATON_SIM_FIND_MECHANISMS=N` searches `N` seeds (from `BATON_SIM_FIRST_SEED`,
/// default 1) and prints the first seed of each mechanism instead.
#[test]
fn every_excuse_of_the_fault_matrix_is_shown_by_a_seed() {
    if let Some(n) = env_u64("BATON_SIM_FIND_MECHANISMS") {
        let first = env_u64("BATON_SIM_FIRST_SEED").unwrap_or(1);
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
        let found: Vec<(usize, u64)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    scope.spawn(move || {
                        let mut found = Vec::new();
                        for seed in (first + t..first + n).step_by(threads as usize) {
                            let outcome = world::run(seed);
                            for (i, (_, shows)) in mechanisms::MECHANISMS.iter().enumerate() {
                                if shows(&outcome) {
                                    found.push((i, seed));
                                }
                            }
                        }
                        found
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("a search thread"))
                .collect()
        });
        for (i, (name, _)) in mechanisms::MECHANISMS.iter().enumerate() {
            let seeds: Vec<u64> = found
                .iter()
                .filter(|(m, _)| *m == i)
                .map(|(_, s)| *s)
                .collect();
            println!(
                "{name}: {} of {n} seeds, the first {:?}",
                seeds.len(),
                seeds.iter().min()
            );
        }
        return;
    }
    for (name, seed) in mechanisms::SHOWN_BY {
        let (_, shows) = mechanisms::MECHANISMS
            .iter()
            .find(|(m, _)| *m == name)
            .unwrap_or_else(|| panic!("no mechanism {name}"));
        assert!(
            shows(&world::run(seed)),
            "seed {seed} no longer shows {name} (replay: BATON_SIM_SEED={seed})"
        );
    }
}
