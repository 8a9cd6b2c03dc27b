//! Operating a cluster, as an operator does it: two real `baton run` nodes on one store (SQLite
//! and Redis), driven by `baton pause`, `baton resume`, `baton trigger` and the HTTP API, checked
//! against what the store recorded.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton_core::lease::{ClaimKind, Run};
use baton_core::operate::Action;
use baton_core::store::{self, Store};
use baton_tests::process::{baton, BatonProcess, Output};
use baton_tests::unique;

mod dashboard;
use serde_json::Value;

/// A job running the `hello` guest, every second or on a yearly schedule.
fn add_job(jobs: &Path, name: &str, schedule: &str) {
    add_component(jobs, name, schedule, env!("GUEST_HELLO"));
}

/// A job running the component at `wasm`.
fn add_component(jobs: &Path, name: &str, schedule: &str, wasm: &str) {
    std::fs::write(
        jobs.join(format!("{name}.toml")),
        format!("schedule = \"{schedule}\"\nlease = \"5s\"\n"),
    )
    .expect("write the job file");
    std::fs::copy(wasm, jobs.join(format!("{name}.wasm"))).expect("copy the component");
}

/// A node: `baton run` with JSON logs, its own runner id, and an HTTP address if asked.
fn node(jobs: &Path, url: &str, ns: &str, runner: &str, http: Option<&str>) -> BatonProcess {
    let jobs = jobs.display().to_string();
    let mut args = vec![
        "run",
        "--log-format",
        "json",
        "--jobs",
        &jobs,
        "--store",
        url,
        "--namespace",
        ns,
        "--runner",
        runner,
        "--cache-dir",
        "off",
    ];
    let token_args;
    if let Some(token) = http {
        args.extend_from_slice(&["--http", "127.0.0.1:0"]);
        if !token.is_empty() {
            token_args = ["--http-token", token];
            args.extend_from_slice(&token_args);
        }
    }
    let mut b = BatonProcess::start(&args, &[]);
    b.wait_line(Duration::from_secs(60), "the start-up line", |l| {
        l.contains("baton is running")
    });
    b
}

/// The bound HTTP address of a node started with `--http`.
fn http_address(b: &mut BatonProcess) -> String {
    let line = b
        .seen
        .iter()
        .find(|l| l.contains("serving /metrics"))
        .cloned()
        .unwrap_or_else(|| {
            b.wait_line(Duration::from_secs(30), "the http line", |l| {
                l.contains("serving /metrics")
            })
        });
    let v: Value = serde_json::from_str(&line).expect("a JSON line");
    v["http"].as_str().expect("the bound address").to_owned()
}

/// One HTTP request; returns the status code and the body.
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the http endpoint");
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: baton\r\n{auth}content-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (code, body.to_owned())
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

struct Cluster {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn Store>,
    url: String,
    ns: String,
}

impl Cluster {
    fn new(url: String) -> Cluster {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let ns = unique("operate");
        let store = rt
            .block_on(store::open(&url, &ns))
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
        Cluster { rt, store, url, ns }
    }

    fn cli(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--store", &self.url, "--namespace", &self.ns]);
        baton(&all, &[("USER", "alice")])
    }

    fn history(&self, job: &str) -> Vec<Run> {
        self.rt
            .block_on(self.store.history(job, 1000))
            .expect("history")
    }

    /// Waits until `job` has a run whose first attempt started after `after` and ended.
    fn wait_run_after(&self, job: &str, after: i64, within: Duration) -> Run {
        let until = std::time::Instant::now() + within;
        loop {
            let found = self
                .history(job)
                .into_iter()
                .find(|r| r.attempts[0].started_at > after && r.status.is_finished());
            if let Some(run) = found {
                return run;
            }
            assert!(
                std::time::Instant::now() < until,
                "no run of {job} after {after}: {:?}",
                self.history(job)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pause_at(&self, job: &str, action: Action) -> i64 {
        let ops = self
            .rt
            .block_on(self.store.operations(Some(job), 0, 10))
            .expect("operations");
        ops.iter()
            .find(|o| o.action == action)
            .unwrap_or_else(|| panic!("no {action} of {job} recorded: {ops:?}"))
            .at
    }
}

/// The whole story on one store: pause holds on every node while another job goes on, resume
/// runs the schedule again, a trigger runs exactly once cluster-wide with reason manual, a
/// trigger of a paused or unknown job is refused, and the API's token answers 401/403/200.
fn operate_a_cluster(url: String) {
    let c = Cluster::new(url);
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("mkdir jobs");
    add_job(&jobs, "often", "* * * * * *");
    add_job(&jobs, "other", "* * * * * *");
    add_job(&jobs, "rare", "0 0 1 1 *");
    let mut a = node(&jobs, &c.url, &c.ns, "node-a", Some("s3cret"));
    let mut b = node(&jobs, &c.url, &c.ns, "node-b", Some(""));
    let (api_a, api_b) = (http_address(&mut a), http_address(&mut b));
    c.wait_run_after("often", 0, Duration::from_secs(30));

    // Pause: no slot of `often` starts after the store acknowledged it, on either node.
    let paused = c.cli(&["pause", "often", "--reason", "maintenance"]);
    ok(&paused);
    assert!(
        paused.stdout.starts_with("paused often at ") && paused.stdout.contains("by alice@"),
        "{}",
        paused.stdout
    );
    let pause_at = c.pause_at("often", Action::Paused);
    for n in [&mut a, &mut b] {
        n.wait_line(Duration::from_secs(10), "the paused event", |l| {
            l.contains("\"event\":\"paused\"") && l.contains("maintenance")
        });
    }
    std::thread::sleep(Duration::from_secs(3));
    let late: Vec<_> = c
        .history("often")
        .into_iter()
        .filter(|r| r.attempts[0].started_at > pause_at)
        .collect();
    assert!(late.is_empty(), "runs started after the pause: {late:?}");
    c.wait_run_after("other", pause_at + 1_000, Duration::from_secs(10));
    let runs = c.cli(&["runs"]);
    ok(&runs);
    assert!(runs.stdout.contains("paused often at"), "{}", runs.stdout);

    // Resume: the schedule runs again; the history shows who did what.
    ok(&c.cli(&["resume", "often"]));
    let resume_at = c.pause_at("often", Action::Resumed);
    c.wait_run_after("often", resume_at, Duration::from_secs(10));
    let history = c.cli(&["history", "often", "--limit", "3"]);
    ok(&history);
    assert!(
        history.stdout.contains("resumed often at"),
        "{}",
        history.stdout
    );
    assert!(
        history.stdout.contains("paused often at"),
        "{}",
        history.stdout
    );

    // The API's token: 403 on a node without one, 401 without the right one, 200 with it.
    let trigger = "/api/jobs/rare/trigger";
    assert_eq!(http(&api_b, "POST", trigger, Some("s3cret"), "").0, 403);
    assert_eq!(http(&api_a, "POST", trigger, None, "").0, 401);
    assert_eq!(http(&api_a, "POST", trigger, Some("wrong"), "").0, 401);
    let (code, body) = http(
        &api_a,
        "POST",
        trigger,
        Some("s3cret"),
        r#"{"reason":"now"}"#,
    );
    assert_eq!(code, 200, "{body}");

    // Run now: exactly one run, one attempt, reason manual, on one of the two nodes.
    let first = c.wait_run_after("rare", 0, Duration::from_secs(15));
    ok(&c.cli(&["trigger", "rare", "--reason", "again"]));
    let second = c.wait_run_after(
        "rare",
        first.attempts[0].started_at,
        Duration::from_secs(15),
    );
    std::thread::sleep(Duration::from_secs(2));
    let rare = c.history("rare");
    assert_eq!(rare.len(), 2, "two triggers, two runs: {rare:?}");
    for run in [&first, &second] {
        assert_eq!(run.attempts.len(), 1, "{run:?}");
        assert_eq!(run.attempts[0].reason, ClaimKind::Manual);
    }
    let (code, body) = http(&api_a, "GET", "/api/jobs/rare/runs?limit=5", None, "");
    assert_eq!(code, 200);
    let listed: Value = serde_json::from_str(&body).expect("JSON runs");
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{body}");

    // A paused or unknown job cannot be triggered.
    ok(&c.cli(&["pause", "rare"]));
    let refused = c.cli(&["trigger", "rare"]);
    assert_eq!(refused.code, Some(1));
    assert!(refused.stderr.contains("is paused"), "{}", refused.stderr);
    let (code, _) = http(&api_a, "POST", trigger, Some("s3cret"), "");
    assert_eq!(code, 409);
    let unknown = c.cli(&["trigger", "no-such-job"]);
    assert_eq!(unknown.code, Some(1));
    assert!(unknown.stderr.contains("unknown"), "{}", unknown.stderr);
    let (code, body) = http(&api_a, "GET", "/api/jobs", None, "");
    assert_eq!(code, 200);
    let jobs: Value = serde_json::from_str(&body).expect("JSON jobs");
    let rare = jobs
        .as_array()
        .and_then(|j| j.iter().find(|j| j["name"] == "rare"))
        .expect("rare is listed");
    assert_eq!(rare["paused"]["action"], "paused");
}

#[test]
fn pause_with_stop_ends_the_running_attempt_as_failed_and_not_handed_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Cluster::new(format!(
        "sqlite://{}",
        dir.path().join("baton.db").display()
    ));
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("mkdir jobs");
    add_component(&jobs, "long", "0 0 1 1 *", env!("GUEST_LONG"));
    let mut a = node(&jobs, &c.url, &c.ns, "node-a", None);
    let _b = node(&jobs, &c.url, &c.ns, "node-b", None);
    let by = baton_core::operate::Operator {
        host: "test".into(),
        user: "test".into(),
        reason: None,
    };
    c.rt.block_on(
        c.store
            .operate("long", baton_core::operate::Request::Trigger, &by),
    )
    .expect("trigger");
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while c.history("long").is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "the trigger never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ok(&c.cli(&["pause", "long", "--stop", "--reason", "stop it"]));
    let run = c.wait_run_after("long", 0, Duration::from_secs(20));
    assert_eq!(run.status, baton_core::lease::Status::Failed, "{run:?}");
    assert_eq!(run.attempts.len(), 1, "not handed over: {run:?}");
    assert!(!run.handed_over(), "{run:?}");
    a.wait_line(Duration::from_secs(10), "the paused event", |l| {
        l.contains("\"event\":\"paused\"") && l.contains("(stop)")
    });
}

#[test]
fn sqlite_pause_resume_and_trigger_hold_on_every_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    operate_a_cluster(format!(
        "sqlite://{}",
        dir.path().join("baton.db").display()
    ));
}

#[test]
fn redis_pause_resume_and_trigger_hold_on_every_node() {
    operate_a_cluster(baton_tests::backends::redis_url());
}
