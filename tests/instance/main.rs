//! The instance: several instances in one process and as separate processes, with short leases
//! (600 ms, heartbeat 100 ms), against real stores; and the daylight-saving policy.

mod scenarios;
mod support;

/// One module per backend, the same scenarios in each.
macro_rules! instance_suite {
    ($($backend:ident => $fixture:path),* $(,)?) => {
        $(instance_suite!(@backend $backend, $fixture,
            takeover_after_killed_runner_is_within_lease_plus_two_heartbeats,
            stop_hands_over_to_a_backup_within_two_heartbeats,
            stop_finishes_a_handler_that_returns_normally,
            stop_timeout_with_a_handler_that_ignores_its_signal_leaves_the_run_to_a_backup_after_the_lease_end,
            all_instances_down_catch_up_runs_only_the_latest_slot,
            backup_sends_no_takeover_claim_once_a_newer_slot_has_started,
            skipped_slot_is_not_watched_once_a_newer_slot_has_started,
            next_slot_during_a_dead_runs_lease_is_skipped_then_the_run_is_taken_over,
            backup_check_first_takes_over_and_the_next_slot_is_skipped,
            next_slot_first_interrupts_the_dead_run,
            killed_runner_process_is_taken_over_by_the_backup_process,
            frozen_runner_process_is_fenced_when_it_wakes,
            terminated_runner_process_hands_over,
        );)*
    };
    (@backend $backend:ident, $fixture:path, $($case:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture().await;
                    crate::scenarios::$case(&fixture).await;
                }
            )*
        }
    };
}

instance_suite! {
    sqlite => baton_tests::backends::sqlite,
    redis => baton_tests::backends::redis,
    valkey => baton_tests::backends::valkey,
    postgres => baton_tests::backends::postgres,
    redis_cluster => baton_tests::backends::redis_cluster_with_replicas,
}

/// Backend-specific ways to cut a runner off its store.
mod cut_off {
    /// Another connection holds the SQLite file's exclusive lock: every write waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_store_locked_longer_than_the_lease_fences_the_runner() {
        let f = baton_tests::backends::sqlite().await;
        let path = f.url.trim_start_matches("sqlite://").to_owned();
        crate::scenarios::unreachable_store_longer_than_the_lease_fences_the_runner(
            &f,
            move || {
                let release_tx = baton_tests::lock_sqlite_file(std::path::Path::new(&path));
                Box::new(move || {
                    let _ = release_tx.send(());
                })
            },
        )
        .await;
    }

    /// The runner's own Redis server is frozen (`SIGSTOP`): every command waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_server_frozen_longer_than_the_lease_fences_the_runner() {
        let server =
            baton_tests::servers::start_redis_like(std::path::Path::new("redis-server"), &[]);
        let pid = server.pid as libc::pid_t;
        let url = format!("redis://127.0.0.1:{}", server.port);
        let f = baton_tests::Fixture::open(url, Some(Box::new(server))).await;
        crate::scenarios::unreachable_store_longer_than_the_lease_fences_the_runner(
            &f,
            move || {
                // SAFETY: signals to the server process this test started.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                Box::new(move || {
                    unsafe { libc::kill(pid, libc::SIGCONT) };
                })
            },
        )
        .await;
    }
}

/// A store outage longer than the lease, one second into a run, on every store: the run is
/// taken over within lease + 2 × heartbeat of the store's return and ends in success. Each store
/// in two ways: the instances' calls wait longer than the outage (`?timeout=10s`: a backup's
/// check sent during the outage is answered when it ends, after its local deadline), or give up
/// during it (`?timeout=250ms`: the checks fail, and the one that takes over is sent after it).
mod outage {
    use std::path::Path;
    use std::sync::Arc;

    use baton_tests::proxy::Proxy;
    use baton_tests::{servers, Fixture};

    /// Makes the store unreachable for every instance; returns what ends the outage.
    type Cut = Arc<dyn Fn() -> Box<dyn FnOnce() + Send> + Send + Sync>;

    /// A client's wait that outlasts the outage.
    const PATIENT: &str = "10s";
    /// A client's wait that ends well within the outage.
    const IMPATIENT: &str = "250ms";

    /// A SQLite file whose write lock another connection holds during the outage.
    async fn sqlite(timeout: &str) -> (Fixture, Cut) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("baton.db");
        let url = format!("sqlite://{}?timeout={timeout}", path.display());
        let f = Fixture::open(url, Some(Box::new(dir))).await;
        let cut: Cut = Arc::new(move || {
            let release = baton_tests::lock_sqlite_file(&path);
            Box::new(move || {
                let _ = release.send(());
            })
        });
        (f, cut)
    }

    /// A Redis or Valkey server of the test's own, frozen (`SIGSTOP`) during the outage.
    async fn frozen_server(binary: &Path, scheme: &str, timeout: &str) -> (Fixture, Cut) {
        let server = servers::start_redis_like(binary, &[]);
        let pid = server.pid as libc::pid_t;
        let url = format!("{scheme}://127.0.0.1:{}?timeout={timeout}", server.port);
        let f = Fixture::open(url, Some(Box::new(server))).await;
        let cut: Cut = Arc::new(move || {
            // SAFETY: signals to the server process this test started.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            Box::new(move || {
                unsafe { libc::kill(pid, libc::SIGCONT) };
            })
        });
        (f, cut)
    }

    async fn redis(timeout: &str) -> (Fixture, Cut) {
        frozen_server(Path::new("redis-server"), "redis", timeout).await
    }

    async fn valkey(timeout: &str) -> (Fixture, Cut) {
        let binary = tokio::task::spawn_blocking(servers::valkey_server_binary)
            .await
            .expect("find valkey-server");
        frozen_server(&binary, "valkey", timeout).await
    }

    /// The machine's PostgreSQL behind a proxy that holds every request during the outage
    /// and lets them through when it ends; the test's own client goes around the proxy.
    async fn postgres(timeout: &str) -> (Fixture, Cut) {
        let direct = baton_tests::backends::postgres().await;
        let (scheme, rest) = direct.url.split_once('@').expect("a user in the url");
        let (address, tail) = rest.split_once('/').expect("a database in the url");
        let proxy = Arc::new(Proxy::start(address.to_owned()).await);
        let url = format!("{scheme}@127.0.0.1:{}/{tail}&timeout={timeout}", proxy.port);
        let f = direct.reached_through(url);
        let cut: Cut = Arc::new(move || {
            proxy.stall_requests(crate::scenarios::OUTAGE);
            // The stall ends by itself, when the scenario's outage does.
            Box::new(|| {})
        });
        (f, cut)
    }

    macro_rules! outage_suite {
        ($($backend:ident),* $(,)?) => {
            $(mod $backend {
                /// The backups' calls outlast the outage: a check sent during it is answered
                /// after it, when the run's first attempt has fenced itself.
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn outage_longer_than_the_lease_with_checks_answered_after_it_is_taken_over_within_lease_plus_two_heartbeats() {
                    let (f, cut) = super::$backend(super::PATIENT).await;
                    crate::scenarios::store_outage_longer_than_the_lease_is_taken_over_within_lease_plus_two_heartbeats(&f, move || cut()).await;
                }

                /// The backups' calls give up during the outage: their checks fail and are
                /// sent again after it.
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn outage_longer_than_the_lease_with_checks_failing_during_it_is_taken_over_within_lease_plus_two_heartbeats() {
                    let (f, cut) = super::$backend(super::IMPATIENT).await;
                    crate::scenarios::store_outage_longer_than_the_lease_is_taken_over_within_lease_plus_two_heartbeats(&f, move || cut()).await;
                }
            })*
        };
    }

    outage_suite!(sqlite, redis, valkey, postgres);
}

/// A Redis Cluster whose primaries each have a replica: the primary that holds a job's keys is
/// killed one second into a run. The client finds the promoted replica, the run is taken over
/// and ends in success, and so does every later slot.
mod cluster_failover {
    use std::time::{Duration, Instant};

    use baton_core::lease::{Run, Status};
    use baton_core::schedule::Schedule;
    use baton_tests::{servers, unique, Fixture};

    use crate::support::*;

    /// The job runs every 10 s (a failover takes a few seconds: the run it hits is taken over
    /// before the next slot is due) and works 1.5 s; lease 1 s, heartbeat 150 ms.
    const PERIOD_MS: i64 = 10_000;

    /// Polls the run until `pred` holds, through the store errors of a failover.
    async fn wait_through_failover(
        f: &Fixture,
        job: &str,
        slot: i64,
        within: Duration,
        what: &str,
        pred: impl Fn(&Run) -> bool,
    ) -> Run {
        let until = Instant::now() + within;
        loop {
            let last = match f.store.get(job, slot).await {
                Ok(Some(run)) if pred(&run) => return run,
                Ok(run) => format!("{run:#?}"),
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < until,
                "{what}: not within {within:?}; last seen {last}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_primary_of_a_jobs_slot_is_survived_by_the_run_and_every_later_slot() {
        let cluster =
            tokio::task::spawn_blocking(|| servers::start_redis_cluster_with_replicas(1_000))
                .await
                .expect("start the cluster");
        let f = Fixture::open(cluster.url(), None).await;
        let name = unique("failover");
        let mut opts = options(1_000, 150);
        opts.catch_up = Duration::ZERO;
        let jobs = || {
            let every_ten = Schedule::parse("*/10 * * * * *", "UTC").expect("valid");
            vec![job(
                &name,
                every_ten,
                opts,
                worker(Duration::from_millis(1_500)),
            )]
        };
        let a = node(&f, "runner-a", jobs()).await;
        let b = node(&f, "runner-b", jobs()).await;
        let now = baton_tests::store_now(&*f.store).await;
        let hit = (now + 500) / PERIOD_MS * PERIOD_MS + PERIOD_MS;
        let run = wait_run(&f, &name, hit, Duration::from_secs(12), "won", |r| {
            r.attempts.len() == 1
        })
        .await;
        // Every key of the job carries its hash tag: they all live on this primary.
        let key = format!("{{{}:{}}}:runs", f.namespace, name);
        let primary = cluster
            .primary_serving(&key)
            .expect("a primary serves the job's keys");
        baton_tests::wait_past(&*f.store, run.attempts[0].started_at + 1_000).await;
        let killed = baton_tests::store_now(&*f.store).await;
        // SAFETY: kill(2) on a server process this test started.
        unsafe { libc::kill(cluster.nodes[primary].pid as libc::pid_t, libc::SIGKILL) };
        let run = wait_through_failover(
            &f,
            &name,
            hit,
            Duration::from_secs(20),
            "the run hit by the failover ends in success",
            |r| r.status == Status::Success,
        )
        .await;
        let succeeded = run.attempts.last().expect("attempts");
        println!(
            "primary killed at {killed}; the run was won again {} ms later, attempt {}, on {}",
            succeeded.started_at - killed,
            succeeded.attempt,
            succeeded.runner
        );
        // Every slot due after the run ended: success (one due while it still ran may be
        // skipped as an overlap, rule 5).
        let ended = succeeded.ended_at.expect("a finished attempt has an end");
        let first_later = ended / PERIOD_MS * PERIOD_MS + PERIOD_MS;
        for k in 0..2 {
            let slot = first_later + k * PERIOD_MS;
            wait_through_failover(
                &f,
                &name,
                slot,
                Duration::from_secs(15),
                &format!("slot {slot} after the failover ends in success"),
                |r| r.status == Status::Success,
            )
            .await;
        }
        a.instance.stop(Duration::from_secs(1)).await;
        b.instance.stop(Duration::from_secs(1)).await;
    }
}

/// A finish whose answer is lost is sent again; the store refuses the second one (the run has
/// ended), and the instance knows its own finish by the attempt and status it is shown.
mod lost_answer {
    use std::sync::Arc;
    use std::time::Duration;

    use baton_core::instance::{handler_fn, EventKind};
    use baton_core::lease::Status;
    use baton_tests::proxy::{Mode, Proxy};

    use crate::support::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finish_whose_answer_was_lost_is_recorded_once_as_success_not_lost() {
        let proxy = Proxy::start(baton_tests::backends::redis_address()).await;
        let url = format!("redis://127.0.0.1:{}", proxy.port);
        let direct = baton_tests::backends::redis().await;
        let f = direct.reached_through(url);
        let release = Arc::new(tokio::sync::Notify::new());
        let handler = {
            let release = release.clone();
            handler_fn(move |_ctx| {
                let release = release.clone();
                async move {
                    release.notified().await;
                    Ok(())
                }
            })
        };
        let slot = slot_ahead(&f, 500).await;
        let name = baton_tests::unique("lost-answer");
        // A 10 s lease: the retried finish is answered long before it runs out, so on a loaded
        // machine too only the lost answer, never the local deadline, decides how the attempt ends.
        let mut a = node(
            &f,
            "a",
            vec![job(&name, once_at(slot), options(10_000, 200), handler)],
        )
        .await;
        wait_event(&mut a.events, Duration::from_secs(5), "started", |e| {
            is(e, EventKind::Started, &name, slot)
        })
        .await;
        // The finish reaches the store, its answer does not.
        proxy.set(Mode::CutReplies);
        release.notify_one();
        wait_run(
            &f,
            &name,
            slot,
            Duration::from_secs(5),
            "the finish took effect",
            |r| r.status == Status::Success,
        )
        .await;
        proxy.set(Mode::Pass);
        let ended = wait_event(
            &mut a.events,
            Duration::from_secs(10),
            "the end of the attempt",
            |e| e.job == name && matches!(e.kind, EventKind::Success | EventKind::Lost),
        )
        .await;
        assert_eq!(ended.kind, EventKind::Success, "{ended:?}");
        a.instance.stop(Duration::from_secs(1)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claim_whose_answer_was_lost_is_sent_again_with_its_token_and_runs_as_its_attempt() {
        let proxy = Proxy::start(baton_tests::backends::redis_address()).await;
        let url = format!("redis://127.0.0.1:{}", proxy.port);
        let direct = baton_tests::backends::redis().await;
        let f = direct.reached_through(url);
        let slot = slot_ahead(&f, 1_000).await;
        let name = baton_tests::unique("lost-claim");
        // A 10 s lease: without its token, the claim sent again would find this runner's own
        // attempt held and wait for the lease to run out, then take it over as attempt 2.
        let mut a = node(
            &f,
            "a",
            vec![job(
                &name,
                once_at(slot),
                options(10_000, 200),
                handler_fn(|_ctx| async { Ok(()) }),
            )],
        )
        .await;
        // The claim reaches the store, its answers do not.
        proxy.cut_replies_to(name.as_bytes());
        let granted = wait_run(
            &f,
            &name,
            slot,
            Duration::from_secs(5),
            "the claim took effect",
            |r| r.status == Status::Running,
        )
        .await;
        // Past the instance's own retries of the claim (2 s): the answer comes only to the
        // claim its backup check sends again.
        tokio::time::sleep(Duration::from_secs(3)).await;
        proxy.set(Mode::Pass);
        let won = wait_event(&mut a.events, Duration::from_secs(5), "won", |e| {
            is(e, EventKind::Won, &name, slot)
        })
        .await;
        assert_eq!(won.attempt, Some(1), "{won:?}");
        let run = wait_run(
            &f,
            &name,
            slot,
            Duration::from_secs(5),
            "the run's success",
            |r| r.status == Status::Success,
        )
        .await;
        assert_eq!(run.attempts.len(), 1, "{run:?}");
        assert_eq!(run.token, granted.token, "the attempt the first claim won");
        a.instance.stop(Duration::from_secs(1)).await;
    }
}

/// The daylight-saving policy, as the README documents it.
mod dst {
    use baton_core::schedule::{format_in, Schedule};

    fn slots(expr: &str, zone: &str, after: &str, n: usize) -> Vec<String> {
        let s = Schedule::parse(expr, zone).expect("valid schedule");
        let after = chrono::DateTime::parse_from_rfc3339(after)
            .expect("time")
            .timestamp_millis();
        s.upcoming(after, n)
            .into_iter()
            .map(|t| format_in(t, s.time_zone()))
            .collect()
    }

    #[test]
    fn berlin_spring_forward_runs_the_missing_time_once_at_the_end_of_the_gap() {
        assert_eq!(
            slots("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 3),
            [
                "2026-03-29T03:00:00+02:00",
                "2026-03-30T02:30:00+02:00",
                "2026-03-31T02:30:00+02:00",
            ]
        );
    }

    #[test]
    fn berlin_fall_back_runs_the_repeated_time_once_at_its_first_occurrence() {
        assert_eq!(
            slots("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00",]
        );
        assert_eq!(
            slots("*/30 * * * *", "Europe/Berlin", "2026-10-24T23:59:00Z", 4),
            [
                "2026-10-25T02:00:00+02:00",
                "2026-10-25T02:30:00+02:00",
                "2026-10-25T03:00:00+01:00",
                "2026-10-25T03:30:00+01:00",
            ]
        );
    }

    #[test]
    fn new_york_spring_forward_runs_the_missing_time_once_at_the_end_of_the_gap() {
        assert_eq!(
            slots("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 2),
            ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00",]
        );
    }

    #[test]
    fn new_york_fall_back_runs_the_repeated_time_once_at_its_first_occurrence() {
        assert_eq!(
            slots("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2),
            ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00",]
        );
        assert_eq!(
            slots("0 * * * *", "America/New_York", "2026-11-01T04:30:00Z", 3),
            [
                "2026-11-01T01:00:00-04:00",
                "2026-11-01T02:00:00-05:00",
                "2026-11-01T03:00:00-05:00",
            ]
        );
    }
}
