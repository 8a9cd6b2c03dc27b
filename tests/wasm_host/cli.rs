//! The real `baton` binary on a jobs directory with SQLite.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::copy_guest;

/// The `baton` binary of this build, built if needed (the tests crate cannot name another
/// package's binary, so it is built into the same target directory).
fn baton_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test runs from <target>/<profile>/deps");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "baton", "--bin", "baton"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env(
            "CARGO_TARGET_DIR",
            profile_dir.parent().expect("the target directory"),
        )
        .status()
        .expect("run cargo build for the baton binary");
    assert!(status.success(), "cargo build -p baton failed");
    profile_dir.join("baton")
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

    let mut child = Command::new(baton_binary())
        .arg("run")
        .arg("--jobs")
        .arg(&jobs)
        .arg("--store")
        .arg(format!("sqlite://{}", db.display()))
        .args(["--runner", "e2e", "--stop-timeout", "2s"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start baton");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let until = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let (mut guest_line, mut success) = (false, false);
    while !(guest_line && success) {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                guest_line |= line.contains("hello on stdout") && line.contains("job=hello");
                success |= line.contains("event=\"success\"") && line.contains("job=\"hello\"");
                seen.push(line);
            }
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "no successful run of hello within 60 s; baton said:\n{}",
                    seen.join("\n")
                );
            }
        }
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "baton did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let history = rt.block_on(async {
        let store = baton::store::open(&format!("sqlite://{}", db.display()), "baton")
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
        .find(|run| run.status == baton::lease::Status::Success)
        .expect("a successful run in the store");
    assert_eq!(done.attempts[0].runner, "e2e");
    assert_eq!(done.attempts[0].digest.as_deref(), Some(expected.as_str()));
}
