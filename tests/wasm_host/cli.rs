//! The real `baton` binary on a jobs directory with SQLite.

use std::path::Path;
use std::time::{Duration, Instant};

use baton_tests::process::BatonProcess;

use crate::support::copy_guest;

/// `baton run` on a jobs directory and a SQLite file.
struct Baton;

impl Baton {
    fn start(jobs: &Path, db: &Path, runner: &str) -> BatonProcess {
        let jobs = jobs.display().to_string();
        let store = format!("sqlite://{}", db.display());
        BatonProcess::start(
            &[
                "run",
                "--jobs",
                &jobs,
                "--store",
                &store,
                "--runner",
                runner,
                "--stop-timeout",
                "2s",
            ],
            &[],
        )
    }
}

/// Whether a log line is the instance event `kind` of `job`.
fn is_event(line: &str, kind: &str, job: &str) -> bool {
    line.contains(&format!("event=\"{kind}\"")) && line.contains(&format!("job=\"{job}\""))
}

#[test]
fn baton_run_runs_a_jobs_directory_on_sqlite_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).expect("mkdir jobs");
    std::fs::write(
        jobs.join("hello.toml"),
        "schedule = \"* * * * * *\"\nlease = \"5s\"\n",
    )
    .expect("write hello.toml");
    let wasm = copy_guest(env!("GUEST_HELLO"), &jobs, "hello");
    let db = dir.path().join("baton.db");

    let mut baton = Baton::start(&jobs, &db, "e2e");
    baton.wait_line(Duration::from_secs(60), "a guest line of hello", |l| {
        l.contains("hello on stdout") && l.contains("job=hello")
    });
    baton.wait_line(Duration::from_secs(60), "a success of hello", |l| {
        is_event(l, "success", "hello")
    });
    baton.signal(libc::SIGTERM);
    let status = baton.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status}");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let history = rt.block_on(async {
        let store = baton_core::store::open(&format!("sqlite://{}", db.display()), "baton")
            .await
            .expect("open the store baton wrote");
        store.history("hello", 100).await.expect("history")
    });
    let expected = crate::support::host()
        .load(&wasm)
        .expect("load")
        .digest
        .clone();
    let done = history
        .iter()
        .find(|run| run.status == baton_core::lease::Status::Success)
        .expect("a successful run in the store");
    assert_eq!(done.attempts[0].runner, "e2e");
    assert_eq!(done.attempts[0].digest.as_deref(), Some(expected.as_str()));
}

/// A host frozen (SIGSTOP) for longer than its lease wakes (SIGCONT) and stops its zombie guest
/// by itself, at once: the watchdog sees the passed lease deadline on its first tick.
#[test]
fn a_host_that_wakes_from_a_freeze_stops_its_zombie_guest_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).expect("mkdir jobs");
    std::fs::write(
        jobs.join("spin.toml"),
        "schedule = \"* * * * * *\"\nlease = \"1s\"\nheartbeat = \"150ms\"\ncatch_up = \"0s\"\n",
    )
    .expect("write spin.toml");
    copy_guest(env!("GUEST_BUSY_LOOP"), &jobs, "spin");
    let mut baton = Baton::start(&jobs, &dir.path().join("baton.db"), "frozen");
    baton.wait_line(Duration::from_secs(60), "the spinning attempt", |l| {
        is_event(l, "started", "spin")
    });
    std::thread::sleep(Duration::from_millis(300));
    baton.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    baton.signal(libc::SIGCONT);
    let woke = Instant::now();
    // The watchdog (or the instance's own timer) fences the attempt; the host stops the guest.
    let (mut stopped, mut lost) = (None, false);
    while stopped.is_none() || !lost {
        let line = baton.wait_line(Duration::from_secs(5), "the zombie stopped and lost", |l| {
            l.contains("interrupted by the host: ") || is_event(l, "lost", "spin")
        });
        if line.contains(
            "interrupted by the host: the attempt's lease deadline passed without a renewal (self-fenced)",
        ) && line.contains("job=spin")
        {
            stopped = Some(woke.elapsed());
        }
        lost |= is_event(&line, "lost", "spin") && line.contains("reason=\"self-fenced\"");
    }
    let took = stopped.unwrap_or_default();
    println!("frozen host: the zombie guest's stop was logged {took:?} after SIGCONT (as read through the pipe)");
    assert!(took < Duration::from_secs(1), "{took:?}");
}
