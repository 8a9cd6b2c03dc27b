//! The native example (`examples/native`): Baton's lease engine from `baton-core` alone, a Rust
//! closure as the job, on a real SQLite file. Built and run as a user would run it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_core::lease::Status;
use baton_tests::native_example_binary;

/// Runs the example on `store` until it has seen `runs` successes; returns its stdout.
fn run_example(store: &str, runs: usize) -> String {
    let mut child = Command::new(native_example_binary())
        .args([store, &runs.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the native example");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the native example") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the native example did not stop within 60 s after {runs} runs");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().expect("the example's output");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        status.success(),
        "the native example failed: {status}\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_example_runs_a_closure_job_under_leases_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("native.db").display());

    let stdout = tokio::task::spawn_blocking({
        let store = store.clone();
        move || run_example(&store, 2)
    })
    .await
    .expect("the example's runner thread");

    // The closure ran, told its attempt and fence, and the instance said won and success.
    assert!(
        stdout.contains("tick: slot "),
        "no run of the closure:\n{stdout}"
    );
    assert!(stdout.contains("won tick slot "), "no won event:\n{stdout}");
    assert_eq!(
        stdout.matches("success tick slot ").count(),
        2,
        "two successes, then a stop:\n{stdout}"
    );
    assert!(stdout.contains("stopped:"), "no stop report:\n{stdout}");

    // The store recorded the runs: at least two `success`, each with the fence it was won with.
    let opened = baton_core::store::open(&store, baton_core::store::DEFAULT_NAMESPACE)
        .await
        .expect("open the example's store");
    let history = opened
        .history("tick", 100)
        .await
        .expect("read tick's history");
    let successes: Vec<_> = history
        .iter()
        .filter(|run| run.status == Status::Success)
        .collect();
    assert!(
        successes.len() >= 2,
        "the store holds {} successful runs of tick: {history:?}",
        successes.len()
    );
    for run in &successes {
        assert!(
            stdout.contains(&format!("slot {} attempt 1 fence {}", run.slot, run.fence)),
            "run {} (fence {}) is not the one the closure was told:\n{stdout}",
            run.slot,
            run.fence
        );
    }
}

#[test]
fn store_left_out_of_the_build_is_refused_with_the_feature_that_adds_it() {
    // The example builds baton-core with the `sqlite` feature alone: a Redis URL names a
    // backend that is not in it.
    let output = Command::new(native_example_binary())
        .args(["redis://127.0.0.1:6379", "1"])
        .output()
        .expect("run the native example");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "a Redis URL was accepted: {stderr}"
    );
    assert!(
        stderr.contains("this build has no redis store")
            && stderr.contains("cargo feature \"redis\""),
        "the error does not say which feature adds the store: {stderr}"
    );
}
