//! The instance scenarios of `spec/leases.md`, generic over the store.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_core::instance::{handler_fn, AbortReason, EventKind};
use baton_core::lease::{AttemptOutcome, ClaimKind, Status};
use baton_core::schedule::Schedule;
use baton_tests::{unique, Fixture};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::*;

const LEASE: u64 = 600;
const HEARTBEAT: u64 = 100;
/// What the bounds allow beyond the spec's formulas: the claim's own round trip and the
/// scheduling delays of a loaded 2-core machine. The figures printed are the measurement.
const SLACK_MS: i64 = 150;

/// A killed runner (its instance crashes) is taken over by a backup within lease + 2 ×
/// heartbeat of its last heartbeat; measured over 20 takeovers.
pub async fn takeover_after_killed_runner_is_within_lease_plus_two_heartbeats(f: &Fixture) {
    let slot = slot_ahead(f, 500).await;
    let names: Vec<String> = (0..20).map(|i| unique(&format!("kill{i}"))).collect();
    let jobs = |work| {
        names
            .iter()
            .map(|n| job(n, once_at(slot), options(LEASE, HEARTBEAT), worker(work)))
            .collect::<Vec<_>>()
    };
    let mut a = node(f, "doomed", jobs(Duration::from_secs(30))).await;
    for _ in 0..20 {
        wait_event(
            &mut a.events,
            Duration::from_secs(5),
            "started on the runner",
            |e| e.kind == EventKind::Started,
        )
        .await;
    }
    let b = node(f, "backup-b", jobs(Duration::from_millis(200))).await;
    let c = node(f, "backup-c", jobs(Duration::from_millis(200))).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(a); // the runner dies: no more heartbeats, no release
    let mut delays = Vec::new();
    for name in &names {
        let run = wait_run(f, name, slot, Duration::from_secs(5), "taken over", |r| {
            r.attempts.len() >= 2
        })
        .await;
        let died = &run.attempts[0];
        assert_eq!(died.outcome, Some(AttemptOutcome::Died));
        let last_heartbeat = died.ended_at.expect("a died attempt has an end") - LEASE as i64;
        let delay = run.attempts[1].started_at - last_heartbeat;
        assert!(
            delay <= (LEASE + 2 * HEARTBEAT) as i64 + SLACK_MS,
            "{name}: takeover {delay} ms after the last heartbeat, bound {} ms",
            LEASE + 2 * HEARTBEAT
        );
        assert!(
            delay >= LEASE as i64,
            "{name}: taken over before the lease ran out ({delay} ms)"
        );
        assert!(["backup-b", "backup-c"].contains(&run.attempts[1].runner.as_str()));
        delays.push(delay);
    }
    let (min, median, max) = summary(delays);
    println!(
        "takeover after the last heartbeat over 20 takeovers: min {min} ms, median {median} ms, max {max} ms (bound lease + 2 x heartbeat = {} ms)",
        LEASE + 2 * HEARTBEAT
    );
    drop((b, c));
}

/// On stop, a handler that throws once its signal aborts is released, and a backup takes the run
/// over within two heartbeats; hand-overs do not count toward max attempts.
pub async fn stop_hands_over_to_a_backup_within_two_heartbeats(f: &Fixture) {
    let slot = slot_ahead(f, 500).await;
    let names: Vec<String> = (0..20).map(|i| unique(&format!("hand{i}"))).collect();
    let jobs = |work| {
        names
            .iter()
            .map(|n| job(n, once_at(slot), options(LEASE, HEARTBEAT), worker(work)))
            .collect::<Vec<_>>()
    };
    let mut a = node(f, "deploying", jobs(Duration::from_secs(30))).await;
    for _ in 0..20 {
        wait_event(&mut a.events, Duration::from_secs(5), "started", |e| {
            e.kind == EventKind::Started
        })
        .await;
    }
    let _b = node(f, "backup-b", jobs(Duration::from_millis(100))).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = a.instance.stop(Duration::from_secs(2)).await;
    assert_eq!(report.ended, 20);
    assert_eq!(report.abandoned, 0);
    let mut delays = Vec::new();
    for name in &names {
        let run = wait_run(
            f,
            name,
            slot,
            Duration::from_secs(3),
            "handed over and finished",
            |r| r.status == Status::Success,
        )
        .await;
        let released = &run.attempts[0];
        assert_eq!(released.outcome, Some(AttemptOutcome::HandedOver));
        assert_eq!(run.deaths(), 0, "a hand-over is not a death");
        let delay = run.attempts[1].started_at - released.ended_at.expect("released attempt ended");
        assert!(
            delay <= (2 * HEARTBEAT) as i64 + SLACK_MS,
            "{name}: taken over {delay} ms after the release, bound 2 x heartbeat = {} ms",
            2 * HEARTBEAT
        );
        delays.push(delay);
    }
    let (min, median, max) = summary(delays);
    println!(
        "hand-over after release over 20 hand-overs: min {min} ms, median {median} ms, max {max} ms (bound 2 x heartbeat = {} ms)",
        2 * HEARTBEAT
    );
}

/// A handler that returns normally once stop aborts its signal is finished as success.
pub async fn stop_finishes_a_handler_that_returns_normally(f: &Fixture) {
    let slot = slot_ahead(f, 300).await;
    let name = unique("calm");
    let calm = handler_fn(|ctx| async move {
        ctx.signal.aborted().await;
        Ok(())
    });
    let mut a = node(
        f,
        "a",
        vec![job(&name, once_at(slot), options(LEASE, HEARTBEAT), calm)],
    )
    .await;
    wait_event(&mut a.events, Duration::from_secs(5), "started", |e| {
        e.kind == EventKind::Started
    })
    .await;
    a.instance.stop(Duration::from_secs(2)).await;
    let run = f.store.get(&name, slot).await.expect("get").expect("run");
    assert_eq!(run.status, Status::Success);
}

/// The stop table's third row: a handler that ignores its signal and still runs when the stop
/// timeout passes is not released. The instance stops renewing, the attempt keeps its lease to
/// the lease end, and a backup takes the run over only after it: a death, not a hand-over.
pub async fn stop_timeout_with_a_handler_that_ignores_its_signal_leaves_the_run_to_a_backup_after_the_lease_end(
    f: &Fixture,
) {
    let slot = slot_ahead(f, 500).await;
    let name = unique("stubborn");
    let stubborn = handler_fn(|_ctx| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    });
    let opts = options(LEASE, HEARTBEAT);
    let mut a = node(
        f,
        "stubborn",
        vec![job(&name, once_at(slot), opts, stubborn)],
    )
    .await;
    wait_event(&mut a.events, Duration::from_secs(5), "started", |e| {
        e.kind == EventKind::Started
    })
    .await;
    let _b = node(
        f,
        "backup-b",
        vec![job(
            &name,
            once_at(slot),
            opts,
            worker(Duration::from_millis(100)),
        )],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = baton_tests::store_now(&*f.store).await;
    let report = a.instance.stop(Duration::from_millis(200)).await;
    assert_eq!((report.ended, report.abandoned), (0, 1));
    let run = wait_run(
        f,
        &name,
        slot,
        Duration::from_secs(5),
        "taken over and finished",
        |r| r.status == Status::Success,
    )
    .await;
    let first = &run.attempts[0];
    assert_eq!(first.runner, "stubborn");
    assert_eq!(first.outcome, Some(AttemptOutcome::Died), "not released");
    assert_eq!(run.deaths(), 1);
    let lease_end = first
        .ended_at
        .expect("a died attempt ends at its lease end");
    assert!(
        lease_end >= stopped + (LEASE - HEARTBEAT) as i64,
        "the lease ended at {lease_end}, before lease - heartbeat after the stop at {stopped}: it was released"
    );
    let second = &run.attempts[1];
    assert_eq!(second.runner, "backup-b");
    assert!(
        second.started_at >= lease_end,
        "the backup started at {}, before the abandoned attempt's lease end {lease_end}",
        second.started_at
    );
}

/// All instances down across several slots: on restart exactly one catch-up run, of the
/// latest slot.
pub async fn all_instances_down_catch_up_runs_only_the_latest_slot(f: &Fixture) {
    let name = unique("report");
    let every_second = || Schedule::parse("* * * * * *", "UTC").expect("valid");
    let mk = || {
        vec![job(
            &name,
            every_second(),
            options(LEASE, HEARTBEAT),
            worker(Duration::from_millis(50)),
        )]
    };
    let mut first = node(f, "a", mk()).await;
    wait_event(
        &mut first.events,
        Duration::from_secs(3),
        "a first run",
        |e| e.kind == EventKind::Success,
    )
    .await;
    first.instance.stop(Duration::from_secs(1)).await;
    drop(first);
    let down_since = baton_tests::store_now(&*f.store).await;
    // Everyone is down for three slots; the nodes start again early in a second, so that the
    // latest slot due is the same from the first node's start to the second's.
    baton_tests::wait_past(&*f.store, down_since + 3_000).await;
    let now = baton_tests::store_now(&*f.store).await;
    baton_tests::wait_past(&*f.store, now - now.rem_euclid(1_000) + 1_050).await;
    let restart = baton_tests::store_now(&*f.store).await;
    let mut a = node(f, "a2", mk()).await;
    let mut b = node(f, "b2", mk()).await;
    let started = baton_tests::store_now(&*f.store).await;
    let caught_up = tokio::select! {
        e = wait_event(&mut a.events, Duration::from_secs(3), "catch-up", |e| e.kind == EventKind::Won && e.reason == "catch-up") => e,
        e = wait_event(&mut b.events, Duration::from_secs(3), "catch-up", |e| e.kind == EventKind::Won && e.reason == "catch-up") => e,
    };
    // The catch-up claims the latest slot due when its node started, never an older one missed
    // while every node was down: one slot when both started within the same second.
    let due_at_start: Vec<i64> = (restart.div_euclid(1_000)..=started.div_euclid(1_000))
        .map(|s| s * 1_000)
        .collect();
    assert!(
        due_at_start.contains(&caught_up.slot),
        "caught up slot {}, but the latest slots due while the nodes started were {due_at_start:?}",
        caught_up.slot
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    a.instance.stop(Duration::from_secs(1)).await;
    b.instance.stop(Duration::from_secs(1)).await;
    let history = f.store.history(&name, 100).await.expect("history");
    let catch_ups: Vec<i64> = history
        .iter()
        .filter(|r| r.slot > down_since && r.attempts[0].reason == ClaimKind::CatchUp)
        .map(|r| r.slot)
        .collect();
    assert_eq!(catch_ups, vec![caught_up.slot], "exactly one catch-up run");
    let missed: Vec<i64> = history
        .iter()
        .map(|r| r.slot)
        .filter(|s| *s < caught_up.slot && *s > down_since)
        .collect();
    assert!(
        missed.is_empty(),
        "earlier missed slots are not run: {missed:?}"
    );
}

/// A backup stops watching a slot once a newer slot of the job has started: its takeover claim
/// could only be answered interrupted or finished, so it is not sent. Two instances on a job
/// due every second send one claim each and one finish a slot, nothing more (before, the loser
/// checked every finished run once more, a third of the store's load on a busy cluster).
pub async fn backup_sends_no_takeover_claim_once_a_newer_slot_has_started(f: &Fixture) {
    // Backups check 1.5 to 3 s after losing: always after the next slot's claims.
    const SLOTS: u64 = 6;
    let sent = requests_of_two_instances(f, 1_500, Duration::from_millis(50), SLOTS).await;
    // Each slot: the winner's claim and finish, the loser's claim. A takeover claim per slot
    // (the backup's check of a finished run) would make it 4 × SLOTS, well past the
    // bound. The slack (3): a request in flight as the count was read, and on a loaded machine
    // a backup's check that falls before a late next claim.
    assert_about(sent, 3 * SLOTS, 3, &format!("{SLOTS} slots, two instances"));
}

/// A slot skipped as an overlap is not watched once a newer slot has started: a claim of it
/// could only be superseded. A job due every second whose runs take 1.3 s runs every other
/// slot; the slot between is skipped by both instances, and nothing more is sent for it.
pub async fn skipped_slot_is_not_watched_once_a_newer_slot_has_started(f: &Fixture) {
    // Backups check 3 to 6 s after losing or skipping: after the next run has started.
    const RUNS: u64 = 3;
    let sent = requests_of_two_instances(f, 3_000, Duration::from_millis(1_300), RUNS).await;
    // Each run: the winner's claim and finish, the loser's claim; the skipped slot: a claim
    // from each. Watching the skipped slot meant reading it and its blocking run again (six
    // more a skipped slot), and a takeover claim of each finished run.
    assert_about(
        sent,
        5 * RUNS,
        3,
        &format!("{RUNS} runs and {RUNS} skipped slots, two instances"),
    );
}

/// Store requests `sent` are `expected`, give or take `slack` (a request in flight as the count
/// was read).
fn assert_about(sent: u64, expected: u64, slack: u64, what: &str) {
    println!("{what}: {sent} store requests");
    assert!(
        sent <= expected + slack,
        "{what}: {sent} store requests, more than the {expected} their claims and finishes are"
    );
    assert!(
        sent + slack >= expected,
        "{what}: {sent} store requests, too few to be the {expected} claims and finishes"
    );
}

/// Two instances run one job due every second (lease 5 s or 3 × `heartbeat`, each run taking
/// `work`); returns the store requests both sent while `runs` runs succeeded, after a warm-up
/// of four runs (the start's clock read and unfinished runs, script loads, the first backups'
/// waits).
async fn requests_of_two_instances(f: &Fixture, heartbeat: u64, work: Duration, runs: u64) -> u64 {
    let name = unique("watch");
    let mut opts = options((3 * heartbeat).max(5_000), heartbeat);
    opts.catch_up = Duration::ZERO;
    let jobs = || {
        let every_second = Schedule::parse("* * * * * *", "UTC").expect("valid");
        vec![job(&name, every_second, opts, worker(work))]
    };
    // Each instance reaches the store through a proxy that counts round trips at the wire;
    // they are the clients' own counts only where there is no wire to count on: SQLite has
    // none, and a cluster client follows the nodes' addresses past any proxy.
    let (a_wire, b_wire) = (f.counted_at_the_wire().await, f.counted_at_the_wire().await);
    // `?replicas=0` on Redis and Valkey: no server here has replicas, and `auto` would read
    // the replica count again every 5 s, requests no claim or finish makes.
    let redis_like = f.url.starts_with("redis://") || f.url.starts_with("valkey://");
    let through = |w: &Option<baton_tests::Wire>| match w {
        Some(w) if redis_like => f.reached_through(format!("{}?replicas=0", w.url)),
        Some(w) => f.reached_through(w.url.clone()),
        None => f.reached_through(f.url.clone()),
    };
    let a = node(&through(&a_wire), "a", jobs()).await;
    let b = node(&through(&b_wire), "b", jobs()).await;
    let (a_store, b_store) = (a.instance.store(), b.instance.store());
    let requests = || match (&a_wire, &b_wire) {
        (Some(a), Some(b)) => a.proxy.round_trips() + b.proxy.round_trips(),
        _ => a_store.round_trips() + b_store.round_trips(),
    };
    let mut events = [a.events, b.events];
    successes(&mut events, &name, 4).await;
    let before = requests();
    successes(&mut events, &name, runs as usize).await;
    let sent = requests() - before;
    a.instance.stop(Duration::from_secs(1)).await;
    b.instance.stop(Duration::from_secs(1)).await;
    sent
}

/// Waits for `n` successes of `job` on either of two instances.
async fn successes(
    events: &mut [tokio::sync::broadcast::Receiver<baton_core::instance::Event>; 2],
    job: &str,
    n: usize,
) {
    let [a, b] = events;
    let mut seen = 0;
    let counted = tokio::time::timeout(Duration::from_secs(20), async {
        while seen < n {
            // `recv` is cancel-safe: the branch not taken loses no event.
            let e = tokio::select! {
                e = a.recv() => e,
                e = b.recv() => e,
            };
            match e {
                Ok(e) if e.kind == EventKind::Success && e.job == job => seen += 1,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    panic!("events closed waiting for successes of {job}")
                }
            }
        }
    })
    .await;
    assert!(
        counted.is_ok(),
        "only {seen} of {n} successes of {job} within 20 s"
    );
}

/// Order 1: the next slot is due while the dead run's lease is still alive: it is skipped as an
/// overlap, and a backup takes the old run over when the lease runs out.
pub async fn next_slot_during_a_dead_runs_lease_is_skipped_then_the_run_is_taken_over(f: &Fixture) {
    let name = unique("order1");
    let every_two = || Schedule::parse("*/2 * * * * *", "UTC").expect("valid");
    let first_slot = even_slot_ahead(f).await;
    let mut opts = options(2_500, 400);
    opts.catch_up = Duration::ZERO; // only the slots this test names
    let mut a = node(
        f,
        "a",
        vec![job(
            &name,
            every_two(),
            opts,
            worker(Duration::from_secs(6)),
        )],
    )
    .await;
    wait_event(&mut a.events, Duration::from_secs(5), "a's start", |e| {
        is(e, EventKind::Started, &name, first_slot)
    })
    .await;
    let mut b = node(
        f,
        "b",
        vec![job(
            &name,
            every_two(),
            opts,
            worker(Duration::from_secs(6)),
        )],
    )
    .await;
    drop(a);
    let skip = wait_event(
        &mut b.events,
        Duration::from_secs(4),
        "skip of the next slot",
        |e| is(e, EventKind::Skip, &name, first_slot + 2000),
    )
    .await;
    assert_eq!(skip.reason, "overlap");
    wait_event(&mut b.events, Duration::from_secs(4), "takeover", |e| {
        is(e, EventKind::Takeover, &name, first_slot)
    })
    .await;
    let run = f
        .store
        .get(&name, first_slot)
        .await
        .expect("get")
        .expect("run");
    assert_eq!(run.attempt, 2);
    assert!(f
        .store
        .get(&name, first_slot + 2000)
        .await
        .expect("get")
        .is_none());
}

/// Order 2: the lease runs out and a backup's check comes first: it takes the old run over, and
/// the next slot, due while it runs, is skipped as an overlap.
pub async fn backup_check_first_takes_over_and_the_next_slot_is_skipped(f: &Fixture) {
    let name = unique("order2");
    let first_slot = even_slot_ahead(f).await;
    let every_two = || Schedule::parse("*/2 * * * * *", "UTC").expect("valid");
    let mut opts = options(800, 130);
    opts.catch_up = Duration::ZERO; // only the slots this test names
    let mut a = node(
        f,
        "a",
        vec![job(
            &name,
            every_two(),
            opts,
            worker(Duration::from_secs(10)),
        )],
    )
    .await;
    wait_event(&mut a.events, Duration::from_secs(5), "a's start", |e| {
        is(e, EventKind::Started, &name, first_slot)
    })
    .await;
    let mut b = node(
        f,
        "b",
        vec![job(
            &name,
            every_two(),
            opts,
            worker(Duration::from_millis(2_500)),
        )],
    )
    .await;
    drop(a);
    wait_event(&mut b.events, Duration::from_secs(2), "takeover", |e| {
        is(e, EventKind::Takeover, &name, first_slot)
    })
    .await;
    let skip = wait_event(&mut b.events, Duration::from_secs(3), "skip", |e| {
        is(e, EventKind::Skip, &name, first_slot + 2000)
    })
    .await;
    assert_eq!(skip.reason, "overlap");
}

/// Order 3: the lease runs out and the next slot's claim comes first: the new run starts and the
/// dead one is marked interrupted, not retried. Here through catch-up on start, which leaves a
/// dead run to a newer due slot.
pub async fn next_slot_first_interrupts_the_dead_run(f: &Fixture) {
    let name = unique("order3");
    let first_slot = even_slot_ahead(f).await;
    let every_two = || Schedule::parse("*/2 * * * * *", "UTC").expect("valid");
    let mut opts = options(800, 130);
    opts.catch_up = Duration::ZERO; // only the slots this test names
    let mut a = node(
        f,
        "a",
        vec![job(
            &name,
            every_two(),
            opts,
            worker(Duration::from_secs(10)),
        )],
    )
    .await;
    wait_event(&mut a.events, Duration::from_secs(5), "a's start", |e| {
        is(e, EventKind::Started, &name, first_slot)
    })
    .await;
    drop(a);
    // Nobody is up when the next slot falls due.
    baton_tests::wait_past(&*f.store, first_slot + 2_200).await;
    // The instance that starts now catches up (the default window, 5 min).
    let b_opts = options(800, 130);
    let mut b = node(
        f,
        "b",
        vec![job(
            &name,
            every_two(),
            b_opts,
            worker(Duration::from_millis(100)),
        )],
    )
    .await;
    let won = wait_event(
        &mut b.events,
        Duration::from_secs(3),
        "the newer slot",
        |e| e.kind == EventKind::Won,
    )
    .await;
    assert_eq!(won.slot, first_slot + 2000);
    assert_eq!(won.reason, "catch-up");
    let old = f
        .store
        .get(&name, first_slot)
        .await
        .expect("get")
        .expect("run");
    assert_eq!(old.status, Status::Interrupted);
    assert_eq!(old.attempts.len(), 1, "the dead run is not retried");
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok(e) = b.events.try_recv() {
        assert!(
            !is(&e, EventKind::Takeover, &name, first_slot),
            "took over the old run: {e:?}"
        );
    }
}

/// A store that cannot be reached for longer than the lease makes the runner fence itself:
/// `lost` fires and its signal aborts, although the store never said so.
pub async fn unreachable_store_longer_than_the_lease_fences_the_runner(
    f: &Fixture,
    cut: impl FnOnce() -> Box<dyn FnOnce() + Send>,
) {
    let name = unique("cut");
    let slot = slot_ahead(f, 300).await;
    let seen: Arc<Mutex<Option<AbortReason>>> = Arc::default();
    let seen2 = seen.clone();
    let handler = handler_fn(move |ctx| {
        let seen = seen2.clone();
        async move {
            ctx.signal.aborted().await;
            *seen.lock().expect("lock") = ctx.signal.reason();
            Err("aborted".to_owned())
        }
    });
    let mut a = node(
        f,
        "a",
        vec![job(
            &name,
            once_at(slot),
            options(LEASE, HEARTBEAT),
            handler,
        )],
    )
    .await;
    wait_event(&mut a.events, Duration::from_secs(5), "start", |e| {
        e.kind == EventKind::Started
    })
    .await;
    let restore = cut();
    let began = Instant::now();
    let lost = wait_event(&mut a.events, Duration::from_secs(3), "lost", |e| {
        e.kind == EventKind::Lost
    })
    .await;
    let after = began.elapsed();
    restore();
    assert_eq!(lost.reason, "self-fenced");
    assert!(
        after <= Duration::from_millis(LEASE + SLACK_MS as u64),
        "fenced {after:?} after the cut"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*seen.lock().expect("lock"), Some(AbortReason::Fenced));
}

/// Runs `baton-test-instance` as a process of its own; returns it with its event lines.
async fn spawn_process(
    f: &Fixture,
    runner: &str,
    name: &str,
    cron: &str,
    work_ms: u64,
) -> (
    tokio::process::Child,
    tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_baton-test-instance"))
        .args([
            &f.url,
            &f.namespace,
            runner,
            name,
            cron,
            &LEASE.to_string(),
            &HEARTBEAT.to_string(),
            &work_ms.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start baton-test-instance");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    (child, rx)
}

async fn wait_line(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    event: &str,
    within: Duration,
) -> serde_json::Value {
    tokio::time::timeout(within, async {
        while let Some(v) = rx.recv().await {
            if v["event"] == event {
                return v;
            }
        }
        panic!("the process ended before {event}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {event} within {within:?}"))
}

fn signal(child: &tokio::process::Child, sig: i32) {
    let pid = child.id().expect("running child") as i32;
    // SAFETY: kill(2) on a child we started and still own.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// Separate processes: `kill -9` of the runner mid-attempt; the backup process takes over.
pub async fn killed_runner_process_is_taken_over_by_the_backup_process(f: &Fixture) {
    let name = unique("proc-kill");
    let slot = slot_ahead(f, 800).await;
    let cron = once_cron(slot);
    let (mut a, mut a_events) = spawn_process(f, "proc-a", &name, &cron, 30_000).await;
    wait_line(&mut a_events, "started", Duration::from_secs(5)).await;
    let (_b, mut b_events) = spawn_process(f, "proc-b", &name, &cron, 200).await;
    wait_line(&mut b_events, "backup", Duration::from_secs(5)).await;
    signal(&a, libc::SIGKILL);
    let _ = a.wait().await;
    wait_line(&mut b_events, "takeover", Duration::from_secs(3)).await;
    let run = wait_run(
        f,
        &name,
        slot,
        Duration::from_secs(3),
        "finished by the backup",
        |r| r.status == Status::Success,
    )
    .await;
    assert_eq!(run.attempts[0].runner, "proc-a");
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::Died));
    assert_eq!(run.attempts[1].runner, "proc-b");
    let delay =
        run.attempts[1].started_at - (run.attempts[0].ended_at.expect("ended") - LEASE as i64);
    assert!(
        delay <= (LEASE + 2 * HEARTBEAT) as i64 + SLACK_MS,
        "takeover {delay} ms after the last heartbeat"
    );
}

/// Separate processes: a runner frozen (`SIGSTOP`) longer than its lease is taken over; when it
/// wakes (`SIGCONT`) its attempt is lost at once and nothing it does changes the run.
pub async fn frozen_runner_process_is_fenced_when_it_wakes(f: &Fixture) {
    let name = unique("proc-freeze");
    let slot = slot_ahead(f, 800).await;
    let cron = once_cron(slot);
    let (a, mut a_events) = spawn_process(f, "frozen-a", &name, &cron, 2_000).await;
    wait_line(&mut a_events, "started", Duration::from_secs(5)).await;
    let (_b, mut b_events) = spawn_process(f, "backup-b", &name, &cron, 1_500).await;
    wait_line(&mut b_events, "backup", Duration::from_secs(5)).await;
    signal(&a, libc::SIGSTOP);
    wait_line(&mut b_events, "takeover", Duration::from_secs(3)).await;
    signal(&a, libc::SIGCONT);
    let woke = Instant::now();
    let lost = wait_line(&mut a_events, "lost", Duration::from_secs(2)).await;
    assert!(
        woke.elapsed() < Duration::from_millis(200),
        "lost {:?} after waking",
        woke.elapsed()
    );
    // Woken past its local lease deadline, the runner fences itself before any heartbeat is
    // answered: a heartbeat sent after the deadline is not waited for, and one sent before the
    // freeze was renewed (the lease was still live).
    assert_eq!(lost["reason"], "self-fenced", "{lost}");
    let run = wait_run(
        f,
        &name,
        slot,
        Duration::from_secs(5),
        "finished by the backup",
        |r| r.status == Status::Success,
    )
    .await;
    assert_eq!(run.runner, "backup-b");
    assert_eq!(
        run.attempts.len(),
        2,
        "the frozen runner changed nothing: {run:#?}"
    );
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::Died));
}

/// Separate processes: `SIGTERM` hands the run over to the backup process at once.
pub async fn terminated_runner_process_hands_over(f: &Fixture) {
    let name = unique("proc-term");
    let slot = slot_ahead(f, 800).await;
    let cron = once_cron(slot);
    let (mut a, mut a_events) = spawn_process(f, "term-a", &name, &cron, 30_000).await;
    wait_line(&mut a_events, "started", Duration::from_secs(5)).await;
    let (_b, mut b_events) = spawn_process(f, "term-b", &name, &cron, 100).await;
    wait_line(&mut b_events, "backup", Duration::from_secs(5)).await;
    signal(&a, libc::SIGTERM);
    wait_line(&mut a_events, "released", Duration::from_secs(2)).await;
    let _ = a.wait().await;
    let run = wait_run(
        f,
        &name,
        slot,
        Duration::from_secs(3),
        "finished by the backup",
        |r| r.status == Status::Success,
    )
    .await;
    assert_eq!(run.attempts[0].outcome, Some(AttemptOutcome::HandedOver));
    let delay = run.attempts[1].started_at - run.attempts[0].ended_at.expect("ended");
    assert!(
        delay <= (2 * HEARTBEAT) as i64 + SLACK_MS,
        "handed over in {delay} ms"
    );
}

/// An even second about two seconds ahead, returned once the odd second before it has begun,
/// so that the next slot of `*/2 * * * * *` for an instance started now is this one.
async fn even_slot_ahead(f: &Fixture) -> i64 {
    let now = baton_tests::store_now(&*f.store).await;
    let mut slot = ((now + 2_500) / 1000 + 1) * 1000;
    if (slot / 1000) % 2 != 0 {
        slot += 1000;
    }
    baton_tests::wait_past(&*f.store, slot - 1_900).await;
    slot
}

fn once_cron(slot_ms: i64) -> String {
    once_at(slot_ms).expr().to_owned()
}

/// How long the store is out of reach in the outage scenarios: twice the lease.
pub const OUTAGE: Duration = Duration::from_millis(2 * LEASE);

/// How many runs each outage scenario hits, one after the other: a pass that depends on when
/// the backups' checks happen to fall is then unlikely.
const OUTAGES: usize = 3;

/// A store outage longer than the lease, starting one second into a run: the runner's attempt
/// fences itself, and once the store can be reached again the run is taken over within lease +
/// 2 × heartbeat and ends in success, however the backups' checks met the outage (held and
/// answered when it ended, or failed and sent again). `cut` makes the store unreachable for
/// every instance and returns what ends the outage; `f.url` is how the instances reach the
/// store, with the `?timeout=` that decides whether their calls wait out the outage.
pub async fn store_outage_longer_than_the_lease_is_taken_over_within_lease_plus_two_heartbeats(
    f: &Fixture,
    cut: impl Fn() -> Box<dyn FnOnce() + Send>,
) {
    let bound = (LEASE + 2 * HEARTBEAT) as i64;
    let mut delays = Vec::new();
    for _ in 0..OUTAGES {
        let name = unique("outage");
        let slot = slot_ahead(f, 300).await;
        // The first attempt works until it is fenced; a takeover finishes at once.
        let handler = handler_fn(|ctx| async move {
            if ctx.attempt == 1 {
                ctx.signal.aborted().await;
                return Err("aborted".to_owned());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(())
        });
        let jobs = || {
            vec![job(
                &name,
                once_at(slot),
                options(LEASE, HEARTBEAT),
                handler.clone(),
            )]
        };
        let a = node(f, "runner-a", jobs()).await;
        let b = node(f, "runner-b", jobs()).await;
        let run = wait_run(f, &name, slot, Duration::from_secs(5), "won", |r| {
            r.attempts.len() == 1
        })
        .await;
        baton_tests::wait_past(&*f.store, run.attempts[0].started_at + 1_000).await;
        let restore = cut();
        tokio::time::sleep(OUTAGE).await;
        restore();
        let back = baton_tests::store_now(&*f.store).await;
        let run = wait_run(
            f,
            &name,
            slot,
            Duration::from_millis(OUTAGE.as_millis() as u64 + 3_000),
            "success after the outage",
            |r| r.status == Status::Success,
        )
        .await;
        let first = &run.attempts[0];
        assert_ne!(
            first.outcome,
            Some(AttemptOutcome::Success),
            "the attempt hit by the outage cannot have finished: {run:#?}"
        );
        let succeeded = run.attempts.last().expect("attempts");
        let delay = succeeded.started_at - back;
        assert!(
            delay <= bound + SLACK_MS,
            "{name}: taken over {delay} ms after the store was back, bound lease + 2 x heartbeat = {bound} ms: {run:#?}"
        );
        delays.push(delay);
        a.instance.stop(Duration::from_secs(1)).await;
        b.instance.stop(Duration::from_secs(1)).await;
    }
    let (min, median, max) = summary(delays);
    println!(
        "takeover after the store was back over {OUTAGES} outages of {OUTAGE:?}: min {min} ms, median {median} ms, max {max} ms (bound lease + 2 x heartbeat = {bound} ms)"
    );
}
