//! Jobs in Python and JavaScript, built by their own scripts (`guests/python/build.sh`,
//! `guests/js/build.sh`) and run like any other component: under `baton run`, and stopped by the
//! host when their attempt is lost although they never ask. Also the host's part in running
//! large components: the compile cache on disk, and pool limits that fit a 40 MB component.

mod cache;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use baton_core::instance::{AbortReason, Handler};
use baton_tests::process::BatonProcess;
use serde_json::Value;

use support::{built, context, host, lines_of, sandbox, summary, Lang};

/// Runs the language's job under `baton run` (every second, granted a data directory) until
/// two attempts succeeded; checks the guest's own log line and what it wrote.
fn runs_under_baton_run(lang: Lang, name: &str, greeting: &str) {
    let component = built(lang);
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).expect("mkdir jobs");
    std::fs::copy(&component, jobs.join(format!("{name}.wasm"))).expect("copy the component");
    std::fs::write(
        jobs.join(format!("{name}.toml")),
        "schedule = \"* * * * * *\"\nlease = \"10s\"\n\n[limits]\nmemory = \"256MiB\"\n\n\
         [grants]\ndata_dir = \"data\"\n",
    )
    .expect("write the job file");
    let jobs_arg = jobs.display().to_string();
    let store = format!("sqlite://{}", dir.path().join("baton.db").display());
    let cache = support::target_dir().join("polyglot").join("cache");
    let cache = cache.display().to_string();
    let mut baton = BatonProcess::start(
        &[
            "run",
            "--jobs",
            &jobs_arg,
            "--store",
            &store,
            "--runner",
            "poly",
            "--log-format",
            "json",
            "--cache-dir",
            &cache,
        ],
        &[],
    );
    let line = baton.wait_line(Duration::from_secs(120), "the guest's log line", |l| {
        l.contains(greeting)
    });
    let line: Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(line["job"], name, "the host tags the guest's line: {line}");
    for _ in 0..2 {
        baton.wait_line(Duration::from_secs(60), "a success", |l| {
            l.contains("\"event\":\"success\"") && l.contains(&format!("\"job\":\"{name}\""))
        });
    }
    baton.signal(libc::SIGTERM);
    assert!(baton.wait_exit(Duration::from_secs(30)).success());

    let written = std::fs::read_to_string(jobs.join("data").join(format!("{name}.log")))
        .expect("the job wrote into its data directory");
    let lines: Vec<&str> = written.lines().collect();
    assert!(lines.len() >= 2, "{written}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("attempt=1") && l.contains("runner=poly") && l.contains("fence=")),
        "each line carries the run info: {written}"
    );
}

#[test]
fn python_job_runs_under_baton_run_and_writes_its_data_directory() {
    runs_under_baton_run(
        Lang::Python,
        "py-report",
        "hello from python: job py-report",
    );
}

#[test]
fn javascript_job_runs_under_baton_run_and_writes_its_data_directory() {
    runs_under_baton_run(
        Lang::JavaScript,
        "js-report",
        "hello from javascript: job js-report",
    );
}

/// Starts the language's job in its `spin` mode (it never asks `signal-aborted()`), aborts the
/// signal as a lost lease, and returns how long the host took to stop it.
async fn lost_attempt_is_stopped(lang: Lang, name: &str) -> Duration {
    let loaded = host().load(built(lang)).expect("the component loads");
    let job = host().job_from(loaded, sandbox(&[("JOB_MODE", "spin")]));
    let ctx = context(name);
    let signal = ctx.signal.clone();
    let task = tokio::spawn({
        let job = job.clone();
        async move {
            let result = job.run(ctx).await;
            (result, Instant::now())
        }
    });
    // Wait until the guest logged its greeting: it is in its loop then.
    let until = Instant::now() + Duration::from_secs(60);
    while lines_of(name).is_empty() {
        assert!(Instant::now() < until, "the {lang:?} job did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "the spinning job ended by itself");
    let aborted = Instant::now();
    signal.abort(AbortReason::Lost);
    let (result, stopped) = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the host stops the guest")
        .expect("the attempt's task ends");
    assert_eq!(
        result,
        Err("interrupted by the host: the attempt lost its lease (the store refused a heartbeat or a state write)".into())
    );
    stopped.saturating_duration_since(aborted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_stops_a_python_job_that_ignores_its_lost_lease() {
    let took = lost_attempt_is_stopped(Lang::Python, &baton_tests::unique("py-spin")).await;
    println!(
        "python: abort to guest stopped in {:.3} ms",
        took.as_secs_f64() * 1e3
    );
    assert!(took < Duration::from_millis(500), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_stops_a_javascript_job_that_ignores_its_lost_lease() {
    let took = lost_attempt_is_stopped(Lang::JavaScript, &baton_tests::unique("js-spin")).await;
    println!(
        "javascript: abort to guest stopped in {:.3} ms",
        took.as_secs_f64() * 1e3
    );
    assert!(took < Duration::from_millis(500), "{took:?}");
}

/// Fresh store, instantiate and call of the language's job, `n` times.
async fn per_run_overhead(lang: Lang, n: usize) -> (f64, f64, f64) {
    let loaded = host().load(built(lang)).expect("the component loads");
    let job = host().job_from(loaded, sandbox(&[]));
    let name = baton_tests::unique("overhead");
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let result = job.run(context(&name)).await;
        took.push(started.elapsed());
        assert_eq!(result, Ok(()));
    }
    summary(took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_run_overhead_of_python_and_javascript_jobs() {
    const N: usize = 20;
    for (lang, label) in [(Lang::Python, "python"), (Lang::JavaScript, "javascript")] {
        let size = std::fs::metadata(built(lang)).map(|m| m.len()).unwrap_or(0);
        let (min, median, max) = per_run_overhead(lang, N).await;
        println!(
            "per-run overhead of the {label} job ({:.1} MB; fresh store + instantiate + call, {N} runs): min {min:.3} ms, median {median:.3} ms, max {max:.3} ms",
            size as f64 / 1e6
        );
        assert!(median < 2_000.0, "{label}: median {median:.3} ms");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_megabyte_component_runs_within_the_pool_limits() {
    let path = Path::new(env!("GUEST_LARGE"));
    let size = std::fs::metadata(path).expect("the large guest").len();
    assert!(size >= 40_000_000, "the large guest is {size} bytes");
    let loaded = host().load(path).expect("a 40 MB component loads");
    let job = host().job_from(loaded, sandbox(&[]));
    let name = baton_tests::unique("large");
    for _ in 0..3 {
        assert_eq!(job.run(context(&name)).await, Ok(()));
    }
    let lines = lines_of(&name);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].message.starts_with("payload of 41943040 bytes"),
        "{lines:?}"
    );
}

/// The job of `lang` fetches the URL it is granted (JOB_URL); the request goes through the host's
/// `wasi:http`, to an allowed host, with the host's fence headers, and the job logs the answer.
async fn fetches_an_allowed_url_through_the_host(lang: Lang) {
    let server = baton_tests::http_server::Server::start().await;
    let loaded = host().load(built(lang)).expect("the component loads");
    let path = format!("/from-{lang:?}").to_lowercase();
    let url = format!("{}{path}", server.origin);
    let mut sandbox = sandbox(&[("JOB_URL", &url)]);
    sandbox.outbound.allowed = vec![server.origin.parse().expect("an allowed host")];
    let job = host().job_from(loaded, sandbox);
    let name = baton_tests::unique("fetch");
    let ctx = context(&name);
    let fence = ctx.fence;
    tokio::time::timeout(Duration::from_secs(60), job.run(ctx))
        .await
        .expect("the run ends")
        .expect("the run succeeds");
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, path);
    assert_eq!(seen[0].all("baton-fence"), [fence.to_string().as_str()]);
    let lines: Vec<String> = lines_of(&name).into_iter().map(|l| l.message).collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("fetched") && l.contains(" 200 ")),
        "{lines:?}"
    );
}

/// The JavaScript job calls `fetch()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_job_fetches_an_allowed_url_through_the_host() {
    fetches_an_allowed_url_through_the_host(Lang::JavaScript).await;
}

/// The Python job sends its request through componentize-py's `poll_loop`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_job_fetches_an_allowed_url_through_the_host() {
    fetches_an_allowed_url_through_the_host(Lang::Python).await;
}
