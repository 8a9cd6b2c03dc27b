//! One test per guest of `guests/`: what the run records and the message a user would read.

use std::time::{Duration, Instant};

use baton_core::instance::{AbortReason, Handler};
use baton_wasm::LineSource;

use crate::support::{
    context, host, job, lines_of, run, run_until_lost, sandbox, unique, wait_running,
};

const WITHIN: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_logs_its_run_info_tagged_with_job_slot_and_attempt() {
    let name = unique("hello");
    let hello = job(env!("GUEST_HELLO"), sandbox());
    let ctx = context(&name);
    let slot = ctx.slot;
    assert_eq!(run(&hello, ctx, WITHIN).await, Ok(()));
    let lines = lines_of(&name);
    let expected = format!(
        "hello from {name} slot {slot} attempt 1 on test-runner (fence 7, ClaimReason::Scheduled)"
    );
    assert!(
        lines.iter().any(
            |l| l.source == LineSource::Log(baton_wasm::log::Level::Info)
                && l.message == expected
                && l.slot == slot
                && l.attempt == 1
        ),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.source == LineSource::Stdout && l.message == "hello on stdout"),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_built_against_world_0_1_0_keeps_loading_and_running() {
    let name = unique("hello-v1");
    let old = job(env!("GUEST_HELLO_V1"), sandbox());
    assert_eq!(old.component().world_version(), Some("0.1.0"));
    let current = job(env!("GUEST_HELLO"), sandbox());
    assert_eq!(current.component().world_version(), Some("0.2.0"));
    let ctx = context(&name);
    let slot = ctx.slot;
    assert_eq!(run(&old, ctx, WITHIN).await, Ok(()));
    let expected =
        format!("hello from a 0.1.0 job: {name} slot {slot} attempt 1 (ClaimReason::Scheduled)");
    let lines = lines_of(&name);
    assert!(lines.iter().any(|l| l.message == expected), "{lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_loop_that_ignores_the_signal_is_interrupted_when_its_lease_is_lost() {
    let name = unique("busy");
    let busy = job(env!("GUEST_BUSY_LOOP"), sandbox());
    let message = run_until_lost(&busy, &name)
        .await
        .expect_err("an interrupted attempt is not a success");
    assert_eq!(
        message,
        "interrupted by the host: the attempt lost its lease (the store refused a heartbeat or a state write)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_loop_is_interrupted_at_its_run_timeout_naming_the_limit() {
    let name = unique("busy-timeout");
    let mut sb = sandbox();
    sb.run_timeout = Duration::from_millis(300);
    let busy = job(env!("GUEST_BUSY_LOOP"), sb);
    let started = Instant::now();
    let message = run(&busy, context(&name), WITHIN).await.unwrap_err();
    assert_eq!(
        message,
        "interrupted by the host: ran past its run timeout of 300ms (limits.run_timeout)"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_bound_guests_do_not_starve_other_guests() {
    let hogs: Vec<_> = (0..4)
        .map(|_| {
            let busy = job(env!("GUEST_BUSY_LOOP"), sandbox());
            let ctx = context(&unique("spinner"));
            let signal = ctx.signal.clone();
            let task = tokio::spawn(async move { busy.run(ctx).await });
            (signal, task)
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let name = unique("hello-among-spinners");
    let hello = job(env!("GUEST_HELLO"), sandbox());
    let started = Instant::now();
    let result = run(&hello, context(&name), Duration::from_secs(10)).await;
    let took = started.elapsed();
    for (signal, task) in hogs {
        signal.abort(AbortReason::Lost);
        let _ = task.await;
    }
    assert_eq!(result, Ok(()));
    assert!(
        took < Duration::from_secs(2),
        "hello took {took:?} beside four spinning guests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeper_in_a_host_call_is_stopped_when_its_lease_deadline_passes() {
    let name = unique("sleeper");
    let sleeper = job(env!("GUEST_SLEEPER"), sandbox());
    let mut ctx = context(&name);
    ctx.deadline =
        baton_core::instance::LeaseDeadline::new(Instant::now() + Duration::from_millis(400));
    let signal = ctx.signal.clone();
    let started = Instant::now();
    let message = run(&sleeper, ctx, WITHIN).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(
        message,
        "interrupted by the host: the attempt's lease deadline passed without a renewal (self-fenced)"
    );
    assert_eq!(signal.reason(), Some(AbortReason::Fenced));
    assert!(took < Duration::from_millis(1400), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeper_is_left_alone_while_stopping_and_stopped_at_the_stop_timeout() {
    let name = unique("sleeper-stop");
    let sleeper = job(env!("GUEST_SLEEPER"), sandbox());
    let ctx = context(&name);
    let signal = ctx.signal.clone();
    let task = tokio::spawn({
        let sleeper = sleeper.clone();
        async move { sleeper.run(ctx).await }
    });
    wait_running(&sleeper, 1, WITHIN).await;
    signal.abort(AbortReason::Stopping);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !task.is_finished(),
        "a stopping host must give the guest its chance to return"
    );
    let at = Instant::now();
    signal.abort(AbortReason::StopTimeout);
    let result = tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("stopped within a second")
        .expect("the task ends");
    assert!(
        at.elapsed() < Duration::from_millis(500),
        "{:?}",
        at.elapsed()
    );
    assert_eq!(
        result,
        Err(
            "interrupted by the host: still running at the stop timeout; the lease is handed over"
                .to_owned()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_sees_signal_aborted_and_stops_cleanly_when_the_host_is_stopping() {
    let name = unique("long");
    let long = job(env!("GUEST_LONG"), sandbox());
    let ctx = context(&name);
    let signal = ctx.signal.clone();
    let task = tokio::spawn({
        let long = long.clone();
        async move { long.run(ctx).await }
    });
    wait_running(&long, 1, WITHIN).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    signal.abort(AbortReason::Stopping);
    let result = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("stopped within two seconds")
        .expect("the task ends");
    let message = result.unwrap_err();
    assert!(message.starts_with("aborted before step "), "{message}");
    let lines = lines_of(&name);
    assert!(
        lines.iter().any(|l| l.message.contains("stopping cleanly")),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hog_fails_with_a_memory_cap_error_naming_the_limit() {
    let name = unique("hog");
    let mut sb = sandbox();
    sb.memory = 16 << 20;
    sb.job_file = "jobs/hog.toml".into();
    let hog = job(env!("GUEST_HOG"), sb);
    let message = run(&hog, context(&name), WITHIN).await.unwrap_err();
    assert!(
        message.starts_with("memory cap exceeded: the guest asked for ")
            && message.contains("but its limit is 16 MiB (limits.memory in jobs/hog.toml)"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trap_fails_the_run_with_the_trap_message() {
    let name = unique("trap");
    let trap = job(env!("GUEST_TRAP"), sandbox());
    let message = run(&trap, context(&name), WITHIN).await.unwrap_err();
    assert_eq!(
        message,
        "the guest trapped: wasm `unreachable` instruction executed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_fails_the_run_with_the_trap_and_the_panic_message() {
    let name = unique("panic");
    let panic = job(env!("GUEST_PANIC"), sandbox());
    let message = run(&panic, context(&name), WITHIN).await.unwrap_err();
    assert!(
        message.starts_with("the guest trapped: wasm `unreachable` instruction executed; stderr: ")
            && message.contains(&format!("the job {name} gave up on purpose")),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escape_cannot_open_files_outside_its_grant_nor_see_the_host_environment() {
    let name = unique("escape");
    let data = tempfile::tempdir().expect("tempdir");
    let mut sb = sandbox();
    sb.data_dir = Some((
        baton_wasm::GrantedDir::open(data.path()).expect("the data directory opens"),
        false,
    ));
    let escape = job(env!("GUEST_ESCAPE"), sb);
    let message = run(&escape, context(&name), WITHIN).await.unwrap_err();
    assert!(!message.starts_with("escaped"), "{message}");
    for refused in [
        "read /etc/passwd: ",
        "write /tmp/baton-escape: ",
        "read /data/../../../../etc/passwd: ",
    ] {
        assert!(message.contains(refused), "{refused} missing in {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_is_truncated_with_a_count_of_dropped_bytes_and_the_attempt_succeeds() {
    let name = unique("flood");
    let flood = job(env!("GUEST_FLOOD"), sandbox());
    assert_eq!(run(&flood, context(&name), WITHIN).await, Ok(()));
    let lines = lines_of(&name);
    let kept: usize = lines
        .iter()
        .filter(|l| l.source != LineSource::Host)
        .map(|l| l.message.len() + 1)
        .sum();
    assert!(kept <= baton_wasm::LOG_BUDGET, "{kept} bytes kept");
    let written = 5 * 1024 * 1024;
    let notice = lines
        .iter()
        .find(|l| l.source == LineSource::Host)
        .expect("a line that says what was dropped");
    assert!(
        notice.message.starts_with(&format!(
            "output truncated: dropped {} bytes (",
            written - kept
        )) && notice
            .message
            .ends_with("past the attempt's log budget of 64 KiB"),
        "{}",
        notice.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_world_is_refused_at_load_naming_the_file_the_missing_exports_and_the_fix() {
    let message = host()
        .load(env!("GUEST_OTHER_WORLD"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        format!(
            "{}: neither a command nor a baton:job component: it exports `start`, but neither `wasi:cli/run` (a program with `fn main` built for wasm32-wasip2) nor `run` (the world baton:job/job@0.2.0 of wit/baton-job.wit; in Rust: `baton_guest::job!`)",
            env!("GUEST_OTHER_WORLD")
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_data_writes_into_its_granted_directory() {
    let name = unique("write-data");
    let data = tempfile::tempdir().expect("tempdir");
    std::fs::write(data.path().join("in.txt"), "from the host\n").expect("write in.txt");
    let mut sb = sandbox();
    sb.data_dir = Some((
        baton_wasm::GrantedDir::open(data.path()).expect("the data directory opens"),
        false,
    ));
    let writer = job(env!("GUEST_WRITE_DATA"), sb);
    let ctx = context(&name);
    let slot = ctx.slot;
    assert_eq!(run(&writer, ctx, WITHIN).await, Ok(()));
    let out = std::fs::read_to_string(data.path().join("out.txt")).expect("out.txt written");
    assert_eq!(out, format!("{name} {slot} 1\n"));
    let lines = lines_of(&name);
    assert!(
        lines
            .iter()
            .any(|l| l.message == "in.txt says \"from the host\""),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_data_cannot_write_into_a_read_only_grant() {
    let name = unique("write-ro");
    let data = tempfile::tempdir().expect("tempdir");
    let mut sb = sandbox();
    sb.data_dir = Some((
        baton_wasm::GrantedDir::open(data.path()).expect("the data directory opens"),
        true,
    ));
    let writer = job(env!("GUEST_WRITE_DATA"), sb);
    let message = run(&writer, context(&name), WITHIN).await.unwrap_err();
    assert!(
        message.starts_with("cannot write /data/out.txt: "),
        "{message}"
    );
    assert!(!data.path().join("out.txt").exists());
}
