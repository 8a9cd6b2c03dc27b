//! Outbound HTTP, configuration and secrets, through the real Wasm host, against a real HTTP
//! server on 127.0.0.1 started by each test: the allow list, the fence headers and the
//! idempotency key, secrets, the fence at the call, and the limits.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use baton_core::instance::{AbortReason, Handler, LeaseDeadline, RunContext};
use baton_core::schedule::format_utc;
use baton_tests::attempt::context;
use baton_tests::captured;
use baton_tests::http_server::{self as server, Server};
use baton_wasm::config::{ConfigSource, ConfigValue};
use baton_wasm::outbound::{idempotency_key, HttpLimits, Outbound};
use baton_wasm::{HostConfig, LineSource, Sandbox, WasmHost, WasmJob};

static OUTCOMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

fn host() -> &'static WasmHost {
    static HOST: OnceLock<WasmHost> = OnceLock::new();
    HOST.get_or_init(|| {
        WasmHost::new(HostConfig {
            log_sink: captured::sink(),
            outbound_sink: Some(Arc::new(|outcome| {
                OUTCOMES
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(outcome)
            })),
            ..HostConfig::default()
        })
        .expect("the wasm host starts")
    })
}

/// The lines of the attempts of `job`, as `source: message`.
fn lines_of(job: &str) -> Vec<String> {
    captured::lines_of(job)
        .iter()
        .map(|l| format!("{}: {}", l.source.as_str(), l.message))
        .collect()
}

/// The host's own lines about the attempts of `job`.
fn host_lines_of(job: &str) -> Vec<String> {
    captured::lines_of(job)
        .into_iter()
        .filter(|l| l.source == LineSource::Host)
        .map(|l| l.message)
        .collect()
}

/// A sandbox that allows `allowed` and grants `env`.
fn sandbox(allowed: &[&str], env: &[(&str, &str)]) -> Sandbox {
    Sandbox {
        job_file: PathBuf::from("jobs/probe.toml"),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        outbound: Outbound {
            allowed: allowed
                .iter()
                .map(|a| a.parse().expect("a valid allowed host"))
                .collect(),
            limits: HttpLimits::default(),
        },
        ..Sandbox::default()
    }
}

fn job(component: &str, sandbox: Sandbox) -> WasmJob {
    let loaded = host().load(component).expect("the guest loads");
    host().job_from(loaded, sandbox)
}

async fn run(job: &WasmJob, ctx: RunContext) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(60), job.run(ctx))
        .await
        .expect("the attempt ends within a minute")
}

fn unique(prefix: &str) -> String {
    baton_tests::unique(prefix)
}

fn one_header<'a>(seen: &'a server::Seen, name: &str) -> &'a str {
    let all = seen.all(name);
    assert_eq!(all.len(), 1, "{name}: {:?}", seen.headers);
    all[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_reaches_an_allowed_host_and_a_denied_one_never_reaches_its_server() {
    let allowed = Server::start().await;
    let other = Server::start().await;
    let name = unique("allow");
    let urls = format!("{}/a,{}/b", allowed.origin, other.origin);
    let probe = job(
        env!("GUEST_HTTP_PROBE"),
        sandbox(&[&allowed.origin], &[("URLS", &urls), ("KEEP_GOING", "1")]),
    );
    run(&probe, context(&name)).await.expect("the run succeeds");
    assert_eq!(allowed.seen().len(), 1);
    assert_eq!(allowed.seen()[0].path, "/a");
    assert!(other.seen().is_empty(), "{:?}", other.seen());
    let other_host = other.origin.trim_start_matches("http://");
    let refusal = host_lines_of(&name);
    assert!(
        refusal.iter().any(|l| l.contains(other_host)
            && l.contains("[grants] allowed_outbound_hosts")
            && l.contains("probe.toml")),
        "{refusal:?}"
    );
    let lines = lines_of(&name);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("error") && l.contains("http-request-denied")),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_headers_are_the_attempts_and_a_guest_cannot_forge_them() {
    let server = Server::start().await;
    let name = unique("headers");
    let probe = job(
        env!("GUEST_HTTP_PROBE"),
        sandbox(
            &[&server.origin],
            &[("URLS", &format!("{}/x", server.origin)), ("FORGE", "1")],
        ),
    );
    let ctx = context(&name);
    let (slot, fence) = (ctx.slot, ctx.fence);
    run(&probe, ctx).await.expect("the run succeeds");
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(one_header(&seen[0], "baton-job"), name);
    assert_eq!(one_header(&seen[0], "baton-slot"), format_utc(slot));
    assert_eq!(one_header(&seen[0], "baton-attempt"), "1");
    assert_eq!(one_header(&seen[0], "baton-fence"), fence.to_string());
    assert_eq!(
        one_header(&seen[0], "idempotency-key"),
        idempotency_key(&name, slot)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotency_key_is_the_same_across_a_takeover_and_differs_between_slots() {
    let server = Server::start().await;
    let name = unique("idem");
    let probe = job(
        env!("GUEST_HTTP_PROBE"),
        sandbox(
            &[&server.origin],
            &[("URLS", &format!("{}/x", server.origin))],
        ),
    );
    let first = context(&name);
    let mut takeover = context(&name);
    takeover.attempt = 2;
    takeover.fence = first.fence + 1;
    let mut next_slot = context(&name);
    next_slot.slot += 60_000;
    next_slot.fence = first.fence + 2;
    for ctx in [first, takeover, next_slot] {
        run(&probe, ctx).await.expect("the run succeeds");
    }
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    let key = |i: usize| one_header(&seen[i], "idempotency-key").to_owned();
    let fence = |i: usize| one_header(&seen[i], "baton-fence").to_owned();
    assert_eq!(key(0), key(1), "attempts 1 and 2 of one run");
    assert_ne!(key(1), key(2), "two slots");
    assert_ne!(fence(0), fence(1));
    assert_eq!(one_header(&seen[1], "baton-attempt"), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_and_secrets_reach_the_guest_and_the_secret_is_in_no_log_line() {
    let server = Server::start().await;
    let secret = "s3cret-token-4711";
    let config: BTreeMap<String, ConfigValue> = [
        (
            "url".to_owned(),
            ConfigValue::new(format!("{}/hook", server.origin), ConfigSource::Literal),
        ),
        (
            "token".to_owned(),
            ConfigValue::new(secret, ConfigSource::Env("WEBHOOK_TOKEN".into())),
        ),
    ]
    .into();
    let name = unique("webhook");
    let webhook = job(
        env!("GUEST_WEBHOOK"),
        Sandbox {
            config: config.clone(),
            ..sandbox(&[&server.origin], &[])
        },
    );
    run(&webhook, context(&name))
        .await
        .expect("the webhook succeeds");
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/hook");
    assert_eq!(
        one_header(&seen[0], "authorization"),
        format!("Bearer {secret}")
    );
    assert!(String::from_utf8_lossy(&seen[0].body).contains(&name));

    // A guest that logs the secret itself has it redacted.
    let leaky = unique("leaky");
    let probe = job(
        env!("GUEST_HTTP_PROBE"),
        Sandbox {
            config,
            ..sandbox(
                &[&server.origin],
                &[
                    ("URLS", &format!("{}/x", server.origin)),
                    ("LOG_SECRET", "1"),
                ],
            )
        },
    );
    run(&probe, context(&leaky))
        .await
        .expect("the run succeeds");
    let lines = lines_of(&leaky);
    assert!(
        lines.iter().any(|l| l.contains("the token is [redacted]")),
        "{lines:?}"
    );
    for l in lines_of(&name).iter().chain(&lines) {
        assert!(!l.contains(secret), "{l}");
    }
}

/// Runs the probe sending a request and writing a line every 10 ms until its attempt is lost
/// by `lose`; returns how many requests and writes reached the server and the file after the
/// host knew (with 20 ms for a request already on the wire).
async fn requests_after_the_lease_is_lost(
    lose: impl FnOnce(&RunContext) -> Option<LeaseDeadline>,
) -> (usize, usize, usize) {
    let server = Server::start().await;
    let data = tempfile::tempdir().expect("tempdir");
    let name = unique("zombie");
    let probe = job(
        env!("GUEST_HTTP_PROBE"),
        Sandbox {
            data_dir: Some((
                baton_wasm::GrantedDir::open(data.path()).expect("the data directory opens"),
                false,
            )),
            ..sandbox(
                &[&server.origin],
                &[
                    ("URLS", &format!("{}/x", server.origin)),
                    ("REPEAT", "100000"),
                    ("INTERVAL_MS", "10"),
                    ("KEEP_GOING", "1"),
                    ("WRITE", "1"),
                ],
            )
        },
    );
    let mut ctx = context(&name);
    let signal = ctx.signal.clone();
    if let Some(deadline) = lose(&ctx) {
        ctx.deadline = deadline;
    }
    let deadline = ctx.deadline.clone();
    let attempt = tokio::spawn({
        let probe = probe.clone();
        async move { probe.run(ctx).await }
    });
    let until = Instant::now() + Duration::from_secs(20);
    while server.seen().len() < 5 {
        assert!(Instant::now() < until, "the probe sent nothing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if !deadline.has_passed() && deadline.get() > Instant::now() + Duration::from_secs(60) {
        signal.abort(AbortReason::Lost);
    }
    while !signal.is_aborted() && !deadline.has_passed() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let knew = Instant::now();
    let writes = || {
        std::fs::read_to_string(data.path().join("writes.log"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (sent, written) = (server.seen().len(), writes());
    let result = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .expect("the guest is stopped")
        .expect("the attempt's task");
    assert!(result.is_err(), "a lost attempt cannot succeed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = server
        .seen()
        .iter()
        .filter(|s| s.at > knew + Duration::from_millis(20))
        .count();
    println!(
        "{name}: {sent} requests and {written} writes before the loss; {late} requests and {} writes after it",
        writes() - written
    );
    (late, server.seen().len() - sent, writes() - written)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_whose_heartbeat_was_refused_sends_and_writes_nothing_more() {
    let (late, more, writes) = requests_after_the_lease_is_lost(|_| None).await;
    assert_eq!((late, more, writes), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_lease_deadline_sends_and_writes_nothing_more() {
    let (late, more, writes) = requests_after_the_lease_is_lost(|_| {
        Some(LeaseDeadline::new(
            Instant::now() + Duration::from_millis(500),
        ))
    })
    .await;
    assert_eq!((late, more, writes), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_request_does_not_fence_requests() {
    let server = Server::start().await;
    let name = unique("stopping");
    let probe = job(
        env!("GUEST_HTTP_PROBE"),
        sandbox(
            &[&server.origin],
            &[("URLS", &format!("{}/x", server.origin))],
        ),
    );
    let ctx = context(&name);
    ctx.signal.abort(AbortReason::Stopping);
    run(&probe, ctx)
        .await
        .expect("a handing-over attempt may finish its work");
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_fail_the_request_with_a_clear_error_and_never_the_host() {
    let server = Server::start().await;
    let name = unique("limits");
    let mut limited = sandbox(
        &[&server.origin],
        &[
            ("URLS", &format!("{0}/one,{0}/two,{0}/three", server.origin)),
            ("KEEP_GOING", "1"),
        ],
    );
    limited.outbound.limits.requests = 2;
    run(&job(env!("GUEST_HTTP_PROBE"), limited), context(&name))
        .await
        .expect("the run goes on");
    assert_eq!(
        server.seen().len(),
        2,
        "the third request is over the limit"
    );
    assert!(
        host_lines_of(&name)
            .iter()
            .any(|l| l.contains("limits.http_requests")),
        "{:?}",
        host_lines_of(&name)
    );

    let big = unique("big");
    let mut small = sandbox(
        &[&server.origin],
        &[("URLS", &format!("{}/big", server.origin))],
    );
    small.outbound.limits.response_size = 1024;
    let e = run(&job(env!("GUEST_HTTP_PROBE"), small), context(&big))
        .await
        .expect_err("a body over the limit fails the request");
    assert!(e.contains("limits.http_response_size"), "{e}");

    let slow = unique("slow");
    let mut impatient = sandbox(
        &[&server.origin],
        &[("URLS", &format!("{}/slow", server.origin))],
    );
    impatient.outbound.limits.first_byte_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let e = run(&job(env!("GUEST_HTTP_PROBE"), impatient), context(&slow))
        .await
        .expect_err("a slow server fails the request");
    assert!(e.contains("timed out"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // The host is unharmed: the next attempt sends as before.
    let after = unique("after");
    run(
        &job(
            env!("GUEST_HTTP_PROBE"),
            sandbox(
                &[&server.origin],
                &[("URLS", &format!("{}/x", server.origin))],
            ),
        ),
        context(&after),
    )
    .await
    .expect("a request after the limits");
    let outcomes = OUTCOMES.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for outcome in ["sent", "denied", "failed"] {
        assert!(outcomes.contains(&outcome), "{outcomes:?}");
    }
}

/// One `GET` from a native client: a fresh connection, as the host makes for every request.
async fn native_get(origin: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = origin.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!("GET /x HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
}

/// Prints what a request through the host costs next to the same request from a native
/// client, in the same run, against the same server. No threshold: the figures go to
/// docs/BENCHMARKS.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_overhead_of_the_host_against_a_native_client() {
    const N: u64 = 200;
    let server = Server::start().await;
    let url = format!("{}/x", server.origin);
    let timed = |repeat: u64| {
        let mut sandbox = sandbox(
            &[&server.origin],
            &[("URLS", &url), ("REPEAT", &repeat.to_string())],
        );
        sandbox.outbound.limits.requests = u32::MAX;
        let probe = job(env!("GUEST_HTTP_PROBE"), sandbox);
        async move {
            let started = Instant::now();
            run(&probe, context(&unique("overhead")))
                .await
                .expect("the run succeeds");
            started.elapsed()
        }
    };
    timed(1).await; // compiled and warm
    let one = timed(1).await;
    let many = timed(N + 1).await;
    let guest = (many.saturating_sub(one)).as_secs_f64() / N as f64;
    let started = Instant::now();
    for _ in 0..N {
        native_get(&server.origin).await;
    }
    let native = started.elapsed().as_secs_f64() / N as f64;
    println!(
        "per request ({N} GETs, a fresh connection each, 127.0.0.1): through the host {:.3} ms, native client {:.3} ms, host overhead {:.3} ms ({:.1}x)",
        guest * 1000.0,
        native * 1000.0,
        (guest - native) * 1000.0,
        guest / native
    );
    assert_eq!(server.seen().len() as u64, 2 + (N + 1) + N);
}

/// Prints what one call from the guest into the host costs, the fence's check included (the
/// call hook runs on every such call): `signal-aborted` called a million times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_of_a_host_call_with_the_fence_check() {
    const CALLS: u64 = 1_000_000;
    let server = Server::start().await;
    let url = format!("{}/x", server.origin);
    let timed = |calls: u64| {
        let probe = job(
            env!("GUEST_HTTP_PROBE"),
            sandbox(
                &[&server.origin],
                &[("URLS", &url), ("CALLS", &calls.to_string())],
            ),
        );
        async move {
            let started = Instant::now();
            run(&probe, context(&unique("calls")))
                .await
                .expect("the run succeeds");
            started.elapsed()
        }
    };
    timed(0).await;
    let none = timed(0).await;
    let many = timed(CALLS).await;
    println!(
        "one host call (signal-aborted) with the fence check on every call: {:.0} ns",
        many.saturating_sub(none).as_secs_f64() * 1e9 / CALLS as f64
    );
}

/// Whether a log line of `baton run` is the instance event `kind` of `job`.
fn is_event(line: &str, kind: &str, job: &str) -> bool {
    line.contains(&format!("event=\"{kind}\"")) && line.contains(&format!("job=\"{job}\""))
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Two real `baton run` processes on one SQLite file; the runner is frozen (SIGSTOP) past its
/// lease while its job sends a request and writes a line every 20 ms, the other takes the run
/// over, and the frozen one is woken (SIGCONT): it makes no request and no write after waking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_woken_after_a_takeover_makes_no_request_and_no_write() {
    use baton_tests::process::BatonProcess;
    let server = Server::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).expect("mkdir jobs");
    std::fs::write(
        jobs.join("probe.toml"),
        format!(
            "schedule = \"* * * * * *\"\nlease = \"1s\"\nheartbeat = \"150ms\"\ncatch_up = \"0s\"\n\
             [limits]\nhttp_requests = 1000000\n\
             [grants]\ndata_dir = \"data\"\nallowed_outbound_hosts = [\"{0}\"]\n\
             env = {{ URLS = \"{0}/x\", REPEAT = \"1000000\", INTERVAL_MS = \"20\", KEEP_GOING = \"1\", WRITE = \"1\" }}\n",
            server.origin
        ),
    )
    .expect("write probe.toml");
    std::fs::copy(env!("GUEST_HTTP_PROBE"), jobs.join("probe.wasm")).expect("copy the guest");
    let start = |runner: &str| {
        let (jobs, store) = (
            jobs.display().to_string(),
            format!("sqlite://{}", dir.path().join("baton.db").display()),
        );
        BatonProcess::start(
            &[
                "run", "--jobs", &jobs, "--store", &store, "--runner", runner,
            ],
            &[],
        )
    };
    tokio::task::block_in_place(|| {
        let mut frozen = start("frozen");
        frozen.wait_line(Duration::from_secs(60), "the first attempt", |l| {
            is_event(l, "started", "probe")
        });
        let mut backup = start("backup");
        backup.wait_line(Duration::from_secs(60), "the backup", |l| {
            is_event(l, "backup", "probe") || is_event(l, "skip", "probe")
        });
        std::thread::sleep(Duration::from_millis(300));
        let slot = {
            let seen = server.seen();
            assert!(!seen.is_empty(), "the job sent nothing");
            one_header(&seen[0], "baton-slot").to_owned()
        };
        frozen.signal(libc::SIGSTOP);
        let until = Instant::now() + Duration::from_secs(20);
        while !server
            .seen()
            .iter()
            .any(|s| s.all("baton-slot") == [slot.as_str()] && s.all("baton-attempt") == ["2"])
        {
            assert!(Instant::now() < until, "no takeover within 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        frozen.signal(libc::SIGCONT);
        let (woke, woke_ms) = (Instant::now(), wall_ms());
        std::thread::sleep(Duration::from_millis(1500));
        let ours = |s: &&server::Seen| {
            s.all("baton-slot") == [slot.as_str()] && s.all("baton-attempt") == ["1"]
        };
        let seen = server.seen();
        let before = seen.iter().filter(ours).filter(|s| s.at < woke).count();
        let after = seen.iter().filter(ours).filter(|s| s.at >= woke).count();
        let writes =
            std::fs::read_to_string(jobs.join("data").join("writes.log")).expect("the job wrote");
        let slot_ms = chrono::DateTime::parse_from_rfc3339(&slot)
            .expect("an RFC 3339 slot")
            .timestamp_millis();
        let written_after = writes
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.len() == 4 && f[0] == slot_ms.to_string() && f[1] == "1")
                    .then(|| f[2].parse::<u128>().ok())
                    .flatten()
            })
            .filter(|at| *at >= woke_ms)
            .count();
        println!(
            "frozen runner woken after the takeover: {before} requests before the freeze, {after} requests and {written_after} writes after waking"
        );
        assert_eq!((after, written_after), (0, 0));
        drop(backup);
        drop(frozen);
    });
}
