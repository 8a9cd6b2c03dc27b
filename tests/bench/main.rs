//! `baton bench` on the real binary, with tiny counts: every section is in the JSON report and
//! its numbers are sane. No timing thresholds: the speed targets are the printed figures of
//! `docs/BENCHMARKS.md`, not assertions. What is asserted is correctness: a run sends exactly
//! one claim and one finish plus one request per heartbeat, and the scale run never runs a slot
//! twice.

use std::path::Path;

use baton_tests::backends::redis_url;
use baton_tests::process::baton;
use serde_json::Value;

/// A directory with the two components `baton bench` measures, as the build script names them.
fn components(dir: &Path) {
    std::fs::copy(env!("GUEST_EMPTY"), dir.join("empty.wasm")).expect("copy empty");
    std::fs::copy(env!("GUEST_BUSY_LOOP"), dir.join("busy-loop.wasm")).expect("copy busy-loop");
}

fn json(args: &[&str]) -> Value {
    let out = baton(args, &[]);
    assert_eq!(out.code, Some(0), "baton {args:?} failed: {}", out.stderr);
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", out.stdout, out.stderr))
}

fn positive(v: &Value, path: &str) -> f64 {
    let x = v
        .pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {path} in {v:#}"));
    assert!(x.is_finite() && x > 0.0, "{path} is {x}");
    x
}

const SMALL: &[&str] = &[
    "--json",
    "--clients",
    "1,3",
    "--samples",
    "24",
    "--rounds",
    "2",
    "--runs",
    "2",
    "--wasm-runs",
    "5",
    "--zombie-stops",
    "3",
    "--failover-jobs",
    "2",
];

#[test]
fn bench_on_sqlite_reports_every_section() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let comps = dir.path().join("components");
    std::fs::create_dir(&comps).expect("components directory");
    components(&comps);
    let store = format!("sqlite://{}", dir.path().join("bench.db").display());
    let mut args = vec!["bench", "--store", &store, "--components"];
    let comps_arg = comps.display().to_string();
    args.push(&comps_arg);
    args.extend_from_slice(SMALL);
    let r = json(&args);

    assert_eq!(r["backend"], "sqlite");
    assert!(r["machine_before"]["cpus"].as_u64().is_some_and(|n| n >= 1));
    let rows = r["store_ops"].as_array().expect("store_ops rows");
    assert_eq!(
        rows.iter()
            .map(|row| row["clients"].as_u64())
            .collect::<Vec<_>>(),
        [Some(1), Some(3)]
    );
    for i in 0..rows.len() {
        for op in [
            "raw_primitive",
            "claim_won",
            "claim_running",
            "heartbeat",
            "state_write",
            "finish",
        ] {
            let base = format!("/store_ops/{i}/{op}");
            assert!(
                r.pointer(&format!("{base}/latency/count"))
                    .and_then(Value::as_u64)
                    >= Some(24)
            );
            positive(&r, &format!("{base}/latency/median_us"));
            positive(&r, &format!("{base}/latency/p99_us"));
            positive(&r, &format!("{base}/throughput_per_s"));
            assert_eq!(
                r.pointer(&format!("{base}/round_trips_per_op"))
                    .and_then(Value::as_f64),
                Some(1.0),
                "{op}: one request an operation"
            );
        }
        for ratio in [
            "claim_won",
            "claim_running",
            "heartbeat",
            "state_write",
            "finish",
        ] {
            positive(&r, &format!("/store_ops/{i}/ratios/{ratio}"));
        }
    }

    let rt = &r["round_trips"];
    assert_eq!(rt["exact"], true, "{rt:#}");
    assert_eq!(rt["counted"]["claims"], 2);
    assert_eq!(rt["counted"]["finishes"], 2);
    let heartbeats = rt["counted"]["heartbeats"].as_u64().expect("heartbeats");
    assert_eq!(rt["counted"]["round_trips"].as_u64(), Some(4 + heartbeats));

    positive(&r, "/wasm/overhead/wasm/median_us");
    positive(&r, "/wasm/overhead/native/median_us");
    positive(&r, "/wasm/overhead/native_over_wasm");
    assert_eq!(r["wasm"]["overhead"]["wasm"]["count"], 5);
    assert_eq!(r["wasm"]["zombie_stop"]["latency"]["count"], 3);
    positive(&r, "/wasm/zombie_stop/latency/median_us");

    for kind in ["takeover", "hand_over"] {
        assert_eq!(r["failover"][kind]["latency"]["count"], 2, "{kind}");
        positive(&r, &format!("/failover/{kind}/latency/median_us"));
    }
    assert_eq!(r["failover"]["takeover"]["bound_ms"], 800);
    assert_eq!(r["failover"]["hand_over"]["bound_ms"], 200);
    // A takeover waits for the lease to run out.
    assert!(positive(&r, "/failover/takeover/latency/min_us") >= 600_000.0);
    assert_eq!(r["notes"], serde_json::json!([]));
}

#[test]
fn bench_without_components_skips_the_wasm_figures_with_a_note() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = format!("sqlite://{}", dir.path().join("bench.db").display());
    let missing = dir.path().join("nothing-here").display().to_string();
    let mut args = vec!["bench", "--store", &store, "--components", &missing];
    args.extend_from_slice(SMALL);
    let r = json(&args);
    assert!(r["wasm"].is_null());
    let notes = r["notes"].as_array().expect("notes");
    assert!(
        notes.iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("build-components.sh"))),
        "{notes:?}"
    );
}

#[test]
fn bench_on_redis_counts_two_round_trips_per_run_plus_heartbeats() {
    let url = redis_url();
    let mut args = vec!["bench", "--store", &url];
    args.extend_from_slice(SMALL);
    let r = json(&args);
    assert_eq!(r["backend"], "redis");
    assert_eq!(r["round_trips"]["exact"], true, "{:#}", r["round_trips"]);
}

#[test]
fn scale_smoke_runs_every_slot_at_most_once() {
    let url = redis_url();
    let r = json(&[
        "bench",
        "scale",
        "--store",
        &url,
        "--hosts",
        "2",
        "--jobs",
        "100",
        "--seconds",
        "5",
        "--warm-up",
        "2s",
        "--json",
    ]);
    assert_eq!(r["due"], 500);
    assert_eq!(r["duplicates"], 0, "{r:#}");
    assert!(
        r["run"].as_u64().is_some_and(|n| n > 0 && n <= 500),
        "{r:#}"
    );
    let hosts = r["per_host"].as_array().expect("per_host");
    assert_eq!(hosts.len(), 2);
    for h in hosts {
        assert!(h["peak_rss_mib"].as_f64().is_some_and(|m| m > 0.0), "{h:#}");
        assert!(h["cpu_s"].as_f64().is_some_and(|c| c > 0.0), "{h:#}");
    }
}

/// A claim and a finish with and without the replica's acknowledgement (`WAIT 1` pipelined
/// after the script), side by side in one run against a Redis primary with one replica that
/// the bench starts: blocks of 50 runs alternate between a store opened with `?replicas=0` and
/// one with `?replicas=auto`. Prints the figures that `docs/BENCHMARKS.md` records; asserts
/// only that both sides won every claim and that each operation stayed one round trip (the
/// `WAIT` rides in the script's pipeline).
#[test]
fn claim_and_finish_with_and_without_the_replicas_acknowledgement() {
    use std::time::{Duration, Instant};

    use baton_bench::Stats;
    use baton_core::lease::{ClaimKind, ClaimOutcome, ClaimRequest, Finish, LeaseOptions, Token};
    use baton_core::store::{self, Store};

    const BLOCKS: usize = 10;
    const BLOCK: usize = 50;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let pair = baton_tests::servers::start_redis_with_replica();
    rt.block_on(async move {
        let url = format!("redis://127.0.0.1:{}", pair.primary.port);
        let namespace = baton_tests::unique("bench");
        let off = store::open(&format!("{url}?replicas=0"), &namespace)
            .await
            .expect("open with replicas=0");
        let on = store::open(&url, &namespace).await.expect("open with replicas=auto");
        let options = LeaseOptions {
            overlap: baton_core::lease::Overlap::Allow,
            ..LeaseOptions::with_lease(Duration::from_secs(30))
        };
        let mut slot = baton_tests::store_now(&*on).await;
        let mut times: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
        let mut trips = [0u64; 2];
        for block in 0..BLOCKS * 2 {
            let side = block % 2;
            let store: &dyn Store = if side == 0 { &*off } else { &*on };
            let job = format!("job-{block}");
            for _ in 0..BLOCK {
                slot += 1;
                let token = Token::random();
                let request = ClaimRequest {
                    job: &job,
                    slot,
                    kind: ClaimKind::Scheduled,
                    runner: "bench",
                    token,
                    digest: None,
                    options: &options,
                };
                let before = store.round_trips();
                let started = Instant::now();
                let outcome = store.claim(&request).await.expect("claim");
                times[side].0.push(started.elapsed());
                assert!(matches!(outcome, ClaimOutcome::Won(_)), "{outcome:?}");
                let started = Instant::now();
                store
                    .finish(&job, slot, token, Finish::Success)
                    .await
                    .expect("finish");
                times[side].1.push(started.elapsed());
                // The first claim of a job also registers its name: one request more.
                trips[side] += store.round_trips() - before;
            }
        }
        let runs = (BLOCKS * BLOCK) as u64;
        for (side, name) in ["replicas=0", "replicas=auto (1)"].iter().enumerate() {
            let claim = Stats::of(times[side].0.clone());
            let finish = Stats::of(times[side].1.clone());
            println!(
                "replica acknowledgement, {name}: claim median {:.0} µs p99 {:.0} µs; finish median {:.0} µs p99 {:.0} µs; {} runs, {:.2} requests a run",
                claim.median_us,
                claim.p99_us,
                finish.median_us,
                finish.p99_us,
                runs,
                trips[side] as f64 / runs as f64
            );
            // A claim and a finish, plus one registration per job (block), plus at most two
            // requests per script the first time it is not loaded yet (SCRIPT LOAD, then EVALSHA
            // again; a pipeline with WAIT sends the script itself instead).
            let least = 2 * runs + BLOCKS as u64;
            assert!(
                (least..=least + 4).contains(&trips[side]),
                "{name}: {} requests",
                trips[side]
            );
        }
        for store in [&off, &on] {
            for block in 0..BLOCKS * 2 {
                let _ = store.forget_job(&format!("job-{block}")).await;
            }
        }
    });
}

/// `baton bench capacity` with tiny counts, as JSON.
fn capacity(store: &str) -> Value {
    json(&[
        "bench", "capacity", "--store", store, "--hosts", "3", "--jobs", "5", "--slots", "3",
        "--json",
    ])
}

/// What every capacity run must show: both sides measured the same way, one request per
/// claim and per finish or release (3 hosts: 3 claims and 1 finish a slot, 3 writes and 1
/// release for the lock), and a ratio that is the quotient of the two.
fn check_capacity(r: &Value, measured_by: &str) {
    assert_eq!(r["measured_by"], measured_by, "{r:#}");
    assert_eq!(r["due_slots"], 15, "{r:#}");
    let baton = positive(r, "/store_us_per_slot");
    let lock = positive(r, "/lock_us_per_slot");
    let ratio = positive(r, "/ratio");
    assert!((ratio - baton / lock).abs() < 1e-9, "{r:#}");
    assert_eq!(r["baton_requests_per_slot"], 4.0, "{r:#}");
    assert_eq!(r["lock_requests_per_slot"], 4.0, "{r:#}");
    if measured_by != "INFO commandstats" {
        assert!(
            r["floor"].is_null(),
            "a floor where no server times scripts: {r:#}"
        );
    }
}

/// Where the steps are scripts, the floor of a script on the server is measured beside them:
/// a script making a won claim's four calls costs more than one making none, and a due slot at
/// the floor is one won claim, two losing ones and a finish, against the same lock.
fn check_floor(r: &Value) {
    let empty = positive(r, "/floor/empty_script_us");
    let losing = positive(r, "/floor/losing_claim_us");
    let won = positive(r, "/floor/won_claim_us");
    let finish = positive(r, "/floor/finish_us");
    assert!(won > empty, "a won claim's calls cost nothing: {r:#}");
    let per_slot = positive(r, "/floor/us_per_slot");
    assert!(
        (per_slot - (won + finish + 2.0 * losing)).abs() < 1e-9,
        "{r:#}"
    );
    let lock = positive(r, "/lock_us_per_slot");
    assert!(
        (positive(r, "/floor/ratio") - per_slot / lock).abs() < 1e-9,
        "{r:#}"
    );
    assert_eq!(r["floor"]["calls"], 500, "{r:#}");
}

/// On a Redis of the test's own, the server's `INFO commandstats` gives both sides' time.
#[test]
fn capacity_on_redis_reads_the_servers_command_stats() {
    let server = baton_tests::servers::start_redis_like(std::path::Path::new("redis-server"), &[]);
    let r = capacity(&format!("redis://127.0.0.1:{}", server.port));
    check_capacity(&r, "INFO commandstats");
    check_floor(&r);
}

/// On a PostgreSQL that loads `pg_stat_statements`, the extension gives both sides' time.
#[test]
fn capacity_on_postgres_reads_pg_stat_statements_where_it_is_loaded() {
    let server = baton_tests::servers::Postgres::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
    ]);
    let psql = baton_tests::servers::postgres_bin_dir().join("psql");
    let out = std::process::Command::new(&psql)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
            "-U",
            "postgres",
        ])
        .args([
            "-d",
            "postgres",
            "-c",
            "CREATE EXTENSION pg_stat_statements",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", psql.display()));
    assert!(
        out.status.success(),
        "CREATE EXTENSION failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = capacity(&server.url(&format!("127.0.0.1:{}", server.port), "schema=capacity"));
    check_capacity(&r, "pg_stat_statements");
}

/// Where the server keeps no counts (SQLite, and a PostgreSQL without the extension), each
/// call is timed, one at a time.
#[test]
fn capacity_on_sqlite_and_plain_postgres_times_the_calls_one_at_a_time() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let r = capacity(&format!(
        "sqlite://{}",
        dir.path().join("capacity.db").display()
    ));
    check_capacity(&r, "calls timed one at a time");
    let server = baton_tests::servers::Postgres::start();
    let r = capacity(&server.url(&format!("127.0.0.1:{}", server.port), "schema=capacity"));
    check_capacity(&r, "calls timed one at a time");
}
