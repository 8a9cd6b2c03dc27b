//! The `baton` command line, as an operator uses it: the real binary, real stores, real
//! components. Every subcommand's happy path and its errors for bad input, the precedence of
//! flags, environment and config file, JSON logs, and metrics scraped from a running host.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use baton_tests::process::{baton, BatonProcess, Output};
use serde_json::Value;

mod errors;
mod state;

/// A jobs directory with the `hello` guest as job `name`, run every second.
fn jobs_dir(dir: &Path, name: &str) -> String {
    let jobs = dir.join("jobs");
    std::fs::create_dir_all(&jobs).expect("mkdir jobs");
    std::fs::write(
        jobs.join(format!("{name}.toml")),
        "schedule = \"* * * * * *\"\nlease = \"5s\"\n",
    )
    .expect("write the job file");
    std::fs::copy(env!("GUEST_HELLO"), jobs.join(format!("{name}.wasm"))).expect("copy hello");
    jobs.display().to_string()
}

fn sqlite(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("baton.db").display())
}

/// The JSON log line of `baton run` that says it is running.
fn running_line(line: &str) -> bool {
    line.contains("baton is running")
}

fn json(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

fn ok(out: &Output) {
    assert_eq!(
        out.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
}

/// Starts `baton run` with JSON logs, waits until it runs, and returns its start-up line.
fn start(args: &[&str], envs: &[(&str, &str)]) -> (BatonProcess, Value) {
    let mut all = vec!["run", "--log-format", "json"];
    all.extend_from_slice(args);
    let mut b = BatonProcess::start(&all, envs);
    let line = b.wait_line(Duration::from_secs(60), "the start-up line", running_line);
    (b, json(&line))
}

fn stop(mut b: BatonProcess) {
    b.signal(libc::SIGTERM);
    let status = b.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status}; said:\n{}", b.seen.join("\n"));
}

#[test]
fn flag_beats_environment_beats_config_file_beats_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = jobs_dir(dir.path(), "hello");
    let config = dir.path().join("baton.toml");
    std::fs::write(
        &config,
        format!(
            "store = \"{}\"\nrunner = \"file-runner\"\nnamespace = \"file-ns\"\n\
             stop_timeout = \"3s\"\njobs = \"jobs\"\n",
            sqlite(dir.path())
        ),
    )
    .expect("write the config file");
    let config = config.display().to_string();

    // The file alone: its values, and `jobs` taken from the file's directory.
    let (b, line) = start(&["--config", &config], &[]);
    assert_eq!(line["runner"], "file-runner");
    assert_eq!(line["namespace"], "file-ns");
    assert_eq!(line["jobs"], jobs);
    stop(b);

    // The environment beats the file.
    let (b, line) = start(
        &["--config", &config],
        &[
            ("BATON_RUNNER", "env-runner"),
            ("BATON_NAMESPACE", "env-ns"),
        ],
    );
    assert_eq!(line["runner"], "env-runner");
    assert_eq!(line["namespace"], "env-ns");
    stop(b);

    // A flag beats the environment; what nobody sets keeps its default.
    let (b, line) = start(
        &[
            "--runner",
            "flag-runner",
            "--jobs",
            &jobs,
            "--store",
            &sqlite(dir.path()),
        ],
        &[("BATON_RUNNER", "env-runner")],
    );
    assert_eq!(line["runner"], "flag-runner");
    assert_eq!(line["namespace"], "baton", "the default namespace");
    stop(b);

    // The config file can come from the environment too.
    let (b, line) = start(&[], &[("BATON_CONFIG", &config)]);
    assert_eq!(line["runner"], "file-runner");
    stop(b);
}

#[test]
fn run_logs_json_events_and_history_reads_them_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = jobs_dir(dir.path(), "hello");
    let store = sqlite(dir.path());
    let (mut b, _) = start(&["--jobs", &jobs, "--store", &store, "--runner", "r1"], &[]);
    let success = b.wait_line(Duration::from_secs(60), "a success event", |l| {
        l.contains("\"event\":\"success\"")
    });
    let success = json(&success);
    for key in ["event", "job", "slot", "attempt", "runner"] {
        assert!(!success[key].is_null(), "{key} missing in {success}");
    }
    assert_eq!(success["job"], "hello");
    assert_eq!(success["runner"], "r1");
    let guest = b.wait_line(Duration::from_secs(30), "a guest line", |l| {
        l.contains("hello on stdout")
    });
    let guest = json(&guest);
    assert_eq!(guest["job"], "hello");
    assert!(
        !guest["slot"].is_null() && !guest["attempt"].is_null(),
        "{guest}"
    );
    stop(b);

    // baton history --json: one object per run, with the promised fields.
    let out = baton(
        &[
            "history", "hello", "--store", &store, "--json", "--limit", "3",
        ],
        &[],
    );
    ok(&out);
    let runs: Vec<Value> = out.stdout.lines().map(json).collect();
    assert!(!runs.is_empty(), "{}", out.stdout);
    let done = runs
        .iter()
        .find(|r| r["status"] == "success")
        .unwrap_or_else(|| panic!("no successful run in {}", out.stdout));
    for key in ["job", "slot", "status", "handed_over", "fence", "attempts"] {
        assert!(!done[key].is_null(), "{key} missing in {done}");
    }
    let attempt = &done["attempts"][0];
    for key in [
        "attempt",
        "runner",
        "token",
        "reason",
        "started_at",
        "ended_at",
        "outcome",
        "digest",
    ] {
        assert!(!attempt[key].is_null(), "{key} missing in {attempt}");
    }
    assert_eq!(attempt["runner"], "r1");
    assert!(
        done["slot"].as_str().is_some_and(|s| s.ends_with('Z')),
        "slot is RFC 3339 UTC: {done}"
    );
    assert!(
        attempt["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "{attempt}"
    );

    // The table, and `baton runs`.
    let table = baton(&["history", "hello", "--store", &store], &[]);
    ok(&table);
    assert!(table.stdout.starts_with("JOB"), "{}", table.stdout);
    assert!(table.stdout.contains("success"), "{}", table.stdout);
    let runs = baton(&["runs", "--store", &store, "--json"], &[]);
    ok(&runs);
    let latest: Vec<Value> = runs.stdout.lines().map(json).collect();
    assert_eq!(latest.len(), 1, "one latest run per job: {}", runs.stdout);
    assert_eq!(latest[0]["job"], "hello");
    let running = baton(&["runs", "--store", &store, "--running"], &[]);
    ok(&running);
    assert_eq!(
        running.stdout.lines().count(),
        1,
        "only the header once everything stopped: {}",
        running.stdout
    );
}

/// One HTTP GET against a running host; returns the status line and the body.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the http endpoint");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: baton\r\nconnection: close\r\n\r\n"
    )
    .expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// The value of a metric line `name value`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn metrics_health_and_runs_are_served_by_a_running_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = jobs_dir(dir.path(), "hello");
    let store = sqlite(dir.path());
    let (mut b, _) = start(
        &["--jobs", &jobs, "--store", &store, "--http", "127.0.0.1:0"],
        &[],
    );
    let serving = b.wait_line(Duration::from_secs(30), "the http line", |l| {
        l.contains("serving /metrics")
    });
    let addr = json(&serving)["http"]
        .as_str()
        .expect("the bound address")
        .to_owned();
    for _ in 0..3 {
        b.wait_line(Duration::from_secs(30), "a success", |l| {
            l.contains("\"event\":\"success\"")
        });
    }
    let (status, text) = get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(metric(&text, "baton_runs_total{status=\"success\"}") >= 3.0);
    assert!(metric(&text, "baton_claims_total{outcome=\"won\"}") >= 3.0);
    assert!(metric(&text, "baton_run_duration_seconds_count") >= 3.0);
    assert!(text.contains("# TYPE baton_heartbeat_latency_seconds histogram"));
    assert!(text.contains("# TYPE baton_run_duration_seconds histogram"));
    assert_eq!(get(&addr, "/healthz").0, "HTTP/1.1 200 OK");
    assert_eq!(get(&addr, "/readyz").0, "HTTP/1.1 200 OK");
    let (status, runs) = get(&addr, "/runs");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(json(runs.trim()).is_array(), "{runs}");
    stop(b);
}

#[test]
fn jobs_lists_valid_and_invalid_jobs_with_their_next_slots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = jobs_dir(dir.path(), "hello");
    std::fs::write(
        Path::new(&jobs).join("nightly.toml"),
        "schedule = \"30 2 * * *\"\ntime_zone = \"Europe/Berlin\"\n",
    )
    .expect("write nightly.toml");
    std::fs::copy(env!("GUEST_HELLO"), Path::new(&jobs).join("nightly.wasm")).expect("copy");
    std::fs::write(
        Path::new(&jobs).join("broken.toml"),
        "schedule = \"61 * * * *\"\n",
    )
    .expect("write broken.toml");
    let out = baton(&["jobs", "--jobs", &jobs], &[]);
    ok(&out);
    let text = &out.stdout;
    assert!(
        text.contains("hello: valid; schedule \"* * * * * *\" in UTC"),
        "{text}"
    );
    assert!(
        text.contains("nightly: valid; schedule \"30 2 * * *\" in Europe/Berlin"),
        "{text}"
    );
    let nightly: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("nightly:"))
        .skip(1)
        .take_while(|l| l.starts_with("  next "))
        .collect();
    assert_eq!(nightly.len(), 5, "{text}");
    assert!(
        nightly
            .iter()
            .all(|l| l.contains("T02:30:00+0") || l.contains("T03:00:00+02:00")),
        "{text}"
    );
    assert!(text.contains("broken: invalid:"), "{text}");
    assert!(
        text.contains("broken.toml"),
        "the reason names the file: {text}"
    );
}

#[test]
fn check_accepts_a_good_directory_and_names_what_is_wrong_in_a_bad_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = jobs_dir(dir.path(), "hello");
    let out = baton(&["check", &jobs], &[]);
    ok(&out);
    assert!(
        out.stdout.contains("1 job files, all valid"),
        "{}",
        out.stdout
    );
    let wasm = format!("{jobs}/hello.wasm");
    let out = baton(&["check", &wasm], &[]);
    ok(&out);
    assert!(out.stdout.contains("ok (sha256:"), "{}", out.stdout);
    assert!(
        out.stdout.contains(", world baton:job@0.2.0)"),
        "{}",
        out.stdout
    );

    std::fs::write(
        Path::new(&jobs).join("typo.toml"),
        "schedul = \"@hourly\"\n",
    )
    .expect("write typo.toml");
    std::fs::copy(env!("GUEST_HELLO"), Path::new(&jobs).join("typo.wasm")).expect("copy");
    let out = baton(&["check", &jobs], &[]);
    assert_eq!(out.code, Some(1), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("typo.toml"), "{}", out.stdout);
    assert!(
        out.stdout.contains("schedul"),
        "names the unknown key: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains("error: 1 of 2 job files are invalid"),
        "{}",
        out.stderr
    );

    let other = format!("{}/other.wasm", dir.path().display());
    std::fs::copy(env!("GUEST_OTHER_WORLD"), &other).expect("copy other-world");
    let out = baton(&["check", &other], &[]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("other.wasm"), "{}", out.stderr);
    assert!(
        out.stderr.contains("run"),
        "names the missing export: {}",
        out.stderr
    );
}

#[test]
fn next_prints_slots_in_the_zone_across_daylight_saving() {
    let out = baton(
        &[
            "next",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--after",
            "2026-03-28T12:00:00Z",
            "--count",
            "2",
        ],
        &[],
    );
    ok(&out);
    assert_eq!(
        out.stdout,
        "2026-03-29T03:00:00+02:00\n2026-03-30T02:30:00+02:00\n"
    );
    let out = baton(
        &[
            "next",
            "0 * * * *",
            "--tz",
            "America/New_York",
            "--after",
            "2026-11-01T04:30:00Z",
            "--count",
            "3",
        ],
        &[],
    );
    ok(&out);
    assert_eq!(
        out.stdout,
        "2026-11-01T01:00:00-04:00\n2026-11-01T02:00:00-05:00\n2026-11-01T03:00:00-05:00\n"
    );
}

#[test]
fn second_signal_stops_at_once_with_exit_code_130() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("mkdir jobs");
    // A job that ignores its signal, so the first stop waits for the stop timeout.
    std::fs::write(jobs.join("busy.toml"), "schedule = \"* * * * * *\"\n").expect("write");
    std::fs::copy(env!("GUEST_BUSY_LOOP"), jobs.join("busy.wasm")).expect("copy busy-loop");
    let jobs = jobs.display().to_string();
    let store = sqlite(dir.path());
    let (mut b, _) = start(
        &["--jobs", &jobs, "--store", &store, "--stop-timeout", "60s"],
        &[],
    );
    b.wait_line(Duration::from_secs(60), "the busy job started", |l| {
        l.contains("\"event\":\"started\"")
    });
    b.signal(libc::SIGTERM);
    b.wait_line(Duration::from_secs(10), "the stopping line", |l| {
        l.contains("stopping: running jobs are told to stop")
    });
    b.signal(libc::SIGINT);
    let status = b.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(130), "said:\n{}", b.seen.join("\n"));
}

#[test]
fn store_password_never_appears_in_the_logs() {
    // PostgreSQL here trusts local connections, so a password in the URL is accepted and unused.
    let url = baton_tests::backends::postgres_store_url().replacen(
        "postgres://postgres@",
        "postgres://postgres:hunter2@",
        1,
    );
    assert!(
        url.contains("hunter2"),
        "the test URL carries a password: {url}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = jobs_dir(dir.path(), "hello");
    let namespace = baton_tests::unique("cli");
    let (mut b, line) = start(
        &["--jobs", &jobs, "--store", &url, "--namespace", &namespace],
        &[],
    );
    assert!(
        line["store"]
            .as_str()
            .is_some_and(|s| s.contains("postgres:***@")),
        "{line}"
    );
    b.wait_line(Duration::from_secs(60), "a success", |l| {
        l.contains("\"event\":\"success\"")
    });
    stop_and_check(b, |all| {
        assert!(!all.contains("hunter2"), "the password leaked:\n{all}");
    });
    let out = baton(&["runs", "--store", &url, "--namespace", &namespace], &[]);
    ok(&out);
    assert!(out.stdout.contains("hello"), "{}", out.stdout);
    assert!(!out.stdout.contains("hunter2") && !out.stderr.contains("hunter2"));
}

/// Stops `baton run` and hands everything it said to `check`.
fn stop_and_check(mut b: BatonProcess, check: impl FnOnce(&str)) {
    b.signal(libc::SIGTERM);
    let status = b.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    check(&b.seen.join("\n"));
}
