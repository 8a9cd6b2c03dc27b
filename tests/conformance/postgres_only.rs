//! Rules of the PostgreSQL store beyond the shared suite: claims of one job serialize, clear
//! failures for an unreachable server, the `schema` URL parameter, the schema version, and
//! connections cut in the middle of an operation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::lease::{
    ClaimKind, ClaimOutcome, ClaimRequest, Finish, LeaseOptions, Overlap, Token,
};
use baton_core::store::postgres::{CONNECT_TIMEOUT, SCHEMA_VERSION};
use baton_core::store::{self, Store, StoreError};
use baton_tests::backends::{self, postgres_url};
use baton_tests::proxy::{Mode, Proxy};
use baton_tests::servers::free_port;
use baton_tests::store_now;
use sqlx::{Connection, PgConnection};
use tokio::net::TcpListener;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// A schema name of this test's own (a plain identifier, as the `schema` parameter needs).
fn unique_schema() -> String {
    format!(
        "baton_test_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// The test database's URL with `?schema=NAME` added.
fn url_with_schema(schema: &str) -> String {
    let url = postgres_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}schema={schema}")
}

/// The test stores' URL with its host and port replaced by `authority`.
fn url_at(authority: &str) -> String {
    let url = backends::postgres_store_url();
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let (userinfo, after) = match rest.split_once('@') {
        Some((userinfo, after)) => (format!("{userinfo}@"), after),
        None => (String::new(), rest),
    };
    let tail = after.find(['/', '?']).map_or("", |i| &after[i..]);
    format!("{scheme}://{userinfo}{authority}{tail}")
}

/// The host and port of the test database.
fn server_address() -> String {
    let url = postgres_url();
    let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
    let after = rest.rsplit_once('@').map_or(rest, |(_, a)| a);
    let authority = after.split(['/', '?']).next().unwrap_or("127.0.0.1");
    if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:5432")
    }
}

/// A direct connection to the test database, for looking behind the store.
async fn psql() -> PgConnection {
    PgConnection::connect(&postgres_url())
        .await
        .expect("connect to the test database")
}

async fn drop_schema(schema: &str) {
    let mut conn = psql().await;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(&mut conn)
        .await
        .expect("drop the test schema");
}

async fn claim(
    store: &dyn Store,
    job: &str,
    slot: i64,
    runner: &str,
    options: &LeaseOptions,
) -> ClaimOutcome {
    let request = ClaimRequest {
        job,
        slot,
        kind: ClaimKind::Scheduled,
        runner,
        token: Token::random(),
        digest: None,
        options,
    };
    store
        .claim(&request)
        .await
        .expect("claim reaches the store")
}

/// Claims, from two clients at once, slot `slot_of(0, job)` of every job from one and
/// `slot_of(1, job)` from the other; returns both answers per job.
async fn race_adjacent_slots(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
    jobs: &[String],
    slots: [i64; 2],
) -> Vec<[ClaimOutcome; 2]> {
    let barrier = Arc::new(Barrier::new(2));
    let mut tasks = JoinSet::new();
    for (side, store) in [a, b].into_iter().enumerate() {
        let jobs = jobs.to_vec();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            let options = LeaseOptions::with_lease(Duration::from_secs(30));
            barrier.wait().await;
            let claims = jobs.iter().map(|job| {
                let store = store.clone();
                let runner = format!("side-{side}");
                async move { claim(&*store, job, slots[side], &runner, &options).await }
            });
            (side, futures::future::join_all(claims).await)
        });
    }
    let mut answers: [Vec<ClaimOutcome>; 2] = [Vec::new(), Vec::new()];
    while let Some(done) = tasks.join_next().await {
        let (side, outcomes) = done.expect("claim task");
        answers[side] = outcomes;
    }
    let [first, second] = answers;
    first.into_iter().zip(second).map(|(x, y)| [x, y]).collect()
}

/// Checks one round: exactly one of the two adjacent claims of each job won, and the other was
/// refused for it (an overlap with the earlier slot, or superseded by the later one).
fn exactly_one_winner_per_job(
    round: usize,
    jobs: &[String],
    answers: &[[ClaimOutcome; 2]],
    slots: [i64; 2],
) {
    for (job, [early, late]) in jobs.iter().zip(answers) {
        match (early, late) {
            (ClaimOutcome::Won(_), ClaimOutcome::Overlap { blocking_slot }) => {
                assert_eq!(*blocking_slot, slots[0], "round {round}, {job}")
            }
            (ClaimOutcome::Superseded { newer_slot }, ClaimOutcome::Won(_)) => {
                assert_eq!(*newer_slot, slots[1], "round {round}, {job}")
            }
            other => panic!("round {round}, {job}: two live leases or none: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_of_adjacent_slots_of_one_job_never_both_win_under_overlap_skip() {
    let fixture = backends::postgres().await;
    let a = fixture.store.clone();
    let b = fixture.another().await;
    let jobs: Vec<String> = (0..500).map(|i| format!("adjacent-{i}")).collect();
    let base = store_now(&*a).await;
    // Round 0 races on jobs that have no row yet; round 1 on jobs whose row exists.
    for round in 0..2 {
        let slots = [base + 2 * round as i64, base + 2 * round as i64 + 1];
        let answers = race_adjacent_slots(a.clone(), b.clone(), &jobs, slots).await;
        exactly_one_winner_per_job(round, &jobs, &answers, slots);
        for (job, pair) in jobs.iter().zip(&answers) {
            let live = a.unfinished(job).await.expect("unfinished");
            assert_eq!(live.len(), 1, "round {round}, {job}: {live:?}");
            let (slot, lease) = match pair {
                [ClaimOutcome::Won(lease), _] => (slots[0], lease),
                [_, ClaimOutcome::Won(lease)] => (slots[1], lease),
                _ => unreachable!("checked above"),
            };
            assert_eq!(live[0].slot, slot, "the store agrees who won");
            a.finish(job, slot, lease.token, Finish::Success)
                .await
                .expect("finish");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_server_fails_fast_naming_host_and_port_without_the_password() {
    let port = free_port(false);
    let url = format!("postgres://postgres:secret@127.0.0.1:{port}/test");
    let started = Instant::now();
    let err = match store::open(&url, "ns").await {
        Ok(_) => panic!("nothing listens on port {port}, yet the store opened"),
        Err(e) => e,
    };
    assert!(
        started.elapsed() < CONNECT_TIMEOUT,
        "took {:?}",
        started.elapsed()
    );
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{msg}");
    assert!(err.is_retryable(), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(!msg.contains("secret"), "{msg}");
    assert!(!format!("{err:?}").contains("secret"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_server_fails_within_the_connect_timeout() {
    // A server that accepts connections and never says a word.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let url = format!("postgres://postgres:secret@127.0.0.1:{port}/test");
    let started = Instant::now();
    let err = match store::open(&url, "ns").await {
        Ok(_) => panic!("a silent server cannot be a store"),
        Err(e) => e,
    };
    let took = started.elapsed();
    silent.abort();
    assert!(
        took >= CONNECT_TIMEOUT - Duration::from_millis(100),
        "took {took:?}"
    );
    assert!(
        took < CONNECT_TIMEOUT + Duration::from_secs(2),
        "took {took:?}"
    );
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(msg.contains("5 s"), "{msg}");
    assert!(!msg.contains("secret"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_that_does_not_speak_postgresql_is_refused_as_unsupported() {
    // An HTTP server where PostgreSQL was expected.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let http = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = tokio::io::AsyncWriteExt::write_all(
                &mut socket,
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            )
            .await;
        }
    });
    let err = match store::open(&format!("postgres://postgres@127.0.0.1:{port}/test"), "ns").await {
        Ok(_) => panic!("an HTTP server cannot be a store"),
        Err(e) => e,
    };
    http.abort();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Unsupported { .. }), "{msg}");
    assert!(!err.is_retryable(), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(msg.contains("PostgreSQL 13 or newer is needed"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_parameter_puts_the_tables_and_functions_in_that_schema() {
    let schema = unique_schema();
    let store = store::open(&url_with_schema(&schema), "ns")
        .await
        .expect("open the store in its own schema");
    let now = store_now(&*store).await;
    let options = LeaseOptions::default();
    assert!(matches!(
        claim(&*store, "job", now, "a", &options).await,
        ClaimOutcome::Won(_)
    ));
    let mut conn = psql().await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = $1 ORDER BY table_name",
    )
    .bind(&schema)
    .fetch_all(&mut conn)
    .await
    .expect("list tables");
    assert_eq!(
        tables,
        [
            "baton_bench_scratch",
            "baton_jobs",
            "baton_migrations",
            "baton_operations",
            "baton_paused",
            "baton_runs",
            "baton_state"
        ]
    );
    let functions: Vec<String> = sqlx::query_scalar(
        "SELECT routine_name::text FROM information_schema.routines
         WHERE routine_schema = $1 AND routine_name IN
           ('baton_claim', 'baton_heartbeat', 'baton_finish', 'baton_release')
         ORDER BY routine_name",
    )
    .bind(&schema)
    .fetch_all(&mut conn)
    .await
    .expect("list functions");
    assert_eq!(
        functions,
        [
            "baton_claim",
            "baton_finish",
            "baton_heartbeat",
            "baton_release"
        ]
    );
    let runs: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\".baton_runs WHERE namespace = 'ns'"
    ))
    .fetch_one(&mut conn)
    .await
    .expect("count runs");
    assert_eq!(runs, 1, "the run is in the configured schema");
    drop(store);
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_opens_of_a_fresh_schema_migrate_it_once() {
    let schema = unique_schema();
    let url = url_with_schema(&schema);
    let opens = (0..12).map(|i| {
        let url = url.clone();
        async move { store::open(&url, &format!("ns-{i}")).await }
    });
    for opened in futures::future::join_all(opens).await {
        opened.expect("every concurrent open succeeds");
    }
    let mut conn = psql().await;
    let versions: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT version FROM \"{schema}\".baton_migrations ORDER BY version"
    ))
    .fetch_all(&mut conn)
    .await
    .expect("read the versions");
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_newer_than_this_build_is_refused_naming_the_database_and_the_fix() {
    let schema = unique_schema();
    let url = url_with_schema(&schema);
    drop(store::open(&url, "ns").await.expect("first open migrates"));
    let mut conn = psql().await;
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".baton_migrations (version, description)
         VALUES ($1, 'from a newer baton')"
    ))
    .bind(SCHEMA_VERSION + 1)
    .execute(&mut conn)
    .await
    .expect("pretend a newer baton migrated");
    let err = match store::open(&url, "ns").await {
        Ok(_) => panic!("a schema from a newer baton was opened"),
        Err(e) => e,
    };
    let msg = err.to_string();
    match &err {
        StoreError::NewerSchema {
            found, supported, ..
        } => {
            assert_eq!(*found, SCHEMA_VERSION + 1);
            assert_eq!(*supported, SCHEMA_VERSION);
        }
        other => panic!("expected a newer schema, got {other}"),
    }
    assert!(!err.is_retryable(), "{msg}");
    assert!(msg.contains("upgrade Baton"), "{msg}");
    assert!(msg.contains(&schema), "{msg}");
    let database = postgres_url()
        .rsplit('/')
        .next()
        .and_then(|d| d.split('?').next())
        .unwrap_or("test")
        .to_owned();
    assert!(msg.contains(&format!("database {database:?}")), "{msg}");
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_mid_operation_is_a_retryable_error_and_the_store_recovers() {
    let proxy = Proxy::start(server_address()).await;
    let namespace = baton_tests::unique("t");
    let store = store::open(&url_at(&format!("127.0.0.1:{}", proxy.port)), &namespace)
        .await
        .expect("open through the proxy");
    let options = LeaseOptions {
        overlap: Overlap::Allow,
        ..LeaseOptions::default()
    };
    let now = store_now(&*store).await;
    assert!(matches!(
        claim(&*store, "job", now, "a", &options).await,
        ClaimOutcome::Won(_)
    ));
    proxy.set(Mode::Partition);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let request = ClaimRequest {
        job: "job",
        slot: now + 1,
        kind: ClaimKind::Scheduled,
        runner: "a",
        token: Token::random(),
        digest: None,
        options: &options,
    };
    let err = store
        .claim(&request)
        .await
        .expect_err("the connection is cut");
    assert!(err.is_retryable(), "{err}");
    assert!(
        matches!(err, StoreError::Unreachable { .. }),
        "a cut connection is unreachable, not a refusal: {err}"
    );
    // The server comes back on the same address: the same claim, sent again, wins once.
    proxy.set(Mode::Pass);
    let mut answer = None;
    for _ in 0..50 {
        match store.claim(&request).await {
            Ok(outcome) => {
                answer = Some(outcome);
                break;
            }
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(
        matches!(answer, Some(ClaimOutcome::Won(_))),
        "the retried claim wins: {answer:?}"
    );
}

/// The store's `?timeout=` bounds each operation's wait for its answer: an answer slower than
/// it is a retryable error, a longer timeout waits for the same slow answer, and the store
/// keeps working once answers are quick again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_parameter_sets_how_long_an_operation_waits_for_its_answer() {
    let proxy = Proxy::start(server_address()).await;
    let namespace = baton_tests::unique("t");
    let at = url_at(&format!("127.0.0.1:{}", proxy.port));
    // Opening connects the pool within the same timeout: on a loaded machine a connection (TLS
    // included) can take longer than 200 ms, so opening is tried a few times; what is tested
    // is each operation's wait.
    let open = |timeout: &str| {
        let url = format!("{at}&timeout={timeout}");
        let namespace = namespace.clone();
        async move {
            let mut tries = 0;
            loop {
                tries += 1;
                match store::open(&url, &namespace).await {
                    Ok(store) => break store,
                    Err(e) if e.is_retryable() && tries < 10 => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!("open through the proxy ({tries} tries): {e}"),
                }
            }
        }
    };
    let impatient = open("200ms").await;
    let patient = open("5s").await;
    proxy.set_delay(Duration::from_millis(300));
    let err = impatient.now().await.expect_err("an answer after 600 ms");
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("?timeout="), "{err}");
    patient.now().await.expect("the same answer within 5 s");
    proxy.set_delay(Duration::ZERO);
    impatient.now().await.expect("quick answers again");
    let err = match store::open(&format!("{at}&timeout=0s"), &namespace).await {
        Ok(_) => panic!("a zero timeout opened"),
        Err(e) => e,
    };
    assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err}");
    assert!(err.to_string().contains("timeout parameter"), "{err}");
}
