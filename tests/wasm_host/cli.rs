//! The real `baton` binary on a jobs directory with SQLite.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
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

/// A running `baton run` whose stderr lines arrive on a channel.
struct Baton {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Baton {
    fn start(jobs: &Path, db: &Path, runner: &str) -> Baton {
        let mut child = Command::new(baton_binary())
            .arg("run")
            .arg("--jobs")
            .arg(jobs)
            .arg("--store")
            .arg(format!("sqlite://{}", db.display()))
            .args(["--runner", runner, "--stop-timeout", "2s"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start baton");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Baton {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line that `pred` accepts; returns it.
    fn wait_line(&mut self, within: Duration, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "no {what} within {within:?}; baton said:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("a pid fits in i32");
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// Waits for the process to exit, or panics after `within`.
    fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let until = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < until,
                "baton did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
