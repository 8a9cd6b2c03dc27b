//! What only the Redis and Valkey store has to prove: the errors a user sees when the server is
//! out of reach, of another kind or too old, that a claim or a finish whose answer was lost took
//! effect and can be sent again without making two winners, even as the first call a server
//! runs, and that a server that lost its script cache still runs every operation.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::lease::{
    ClaimKind, ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, LeaseOptions, Status, Token,
    TokenOutcome,
};
use baton_core::store::{self, redis::CONNECT_TIMEOUT, StoreError};
use baton_tests::backends::redis_address;
use baton_tests::proxy::{Mode, Proxy};
use baton_tests::servers::{redis_cli, start_redis_like, Server};
use baton_tests::{store_now, unique};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

async fn open_err(url: &str) -> StoreError {
    match store::open(url, "baton").await {
        Ok(_) => panic!("{url} opened, but should not"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn silent_server_fails_within_the_connect_timeout_naming_host_and_port_not_the_password() {
    // Accepts connections and never answers.
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let _keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let started = Instant::now();
    let err = open_err(&format!("redis://baton:hunter2@127.0.0.1:{port}")).await;
    let took = started.elapsed();
    let message = err.to_string();
    assert!(
        took < CONNECT_TIMEOUT + Duration::from_secs(2),
        "took {took:?}"
    );
    assert!(err.is_retryable(), "{message}");
    assert_eq!(
        message,
        format!("cannot reach store 127.0.0.1:{port}: no answer within 5s (the connect timeout)")
    );
    assert!(!message.contains("hunter2"), "{message}");
}

#[tokio::test]
async fn closed_port_is_unreachable_with_host_and_port() {
    let port = baton_tests::servers::free_port(false);
    let err = open_err(&format!("valkey://:secret@127.0.0.1:{port}")).await;
    let message = err.to_string();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{message}");
    assert!(
        message.starts_with(&format!("cannot reach store 127.0.0.1:{port}: ")),
        "{message}"
    );
    assert!(!message.contains("secret"), "{message}");
}

/// A server that speaks RESP and says it is Redis 5.0.14: enough to be asked its version.
async fn old_redis() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                loop {
                    // Each command is an array of bulk strings: *N, then $len and data N times.
                    let mut line = String::new();
                    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let n: usize = line.trim_start_matches('*').trim().parse().unwrap_or(0);
                    let mut args = Vec::new();
                    for _ in 0..n {
                        let mut len = String::new();
                        let _ = read.read_line(&mut len).await;
                        let len: usize = len.trim_start_matches('$').trim().parse().unwrap_or(0);
                        let mut data = vec![0; len + 2];
                        let _ = read.read_exact(&mut data).await;
                        args.push(String::from_utf8_lossy(&data[..len]).to_uppercase());
                    }
                    let reply = if args.first().is_some_and(|a| a == "INFO") {
                        let info = "# Server\r\nredis_version:5.0.14\r\n";
                        format!("${}\r\n{info}\r\n", info.len())
                    } else {
                        "+OK\r\n".to_owned()
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn redis_older_than_6_2_is_refused_saying_what_is_needed() {
    let port = old_redis().await;
    let err = open_err(&format!("redis://127.0.0.1:{port}")).await;
    assert_eq!(
        err.to_string(),
        format!(
            "store 127.0.0.1:{port} is not supported: Redis 5.0.14 is too old; Baton needs Redis \
             6.2 or later (or Valkey)"
        )
    );
}

#[tokio::test]
async fn server_of_another_kind_is_refused() {
    // PostgreSQL reads a Redis PING as a bad start-up packet and hangs up.
    let err = open_err("redis://127.0.0.1:5432").await;
    assert_eq!(
        err.to_string(),
        "store 127.0.0.1:5432 is not supported: it hung up without an answer to a Redis PING, \
         so it is not a Redis or Valkey server; point the URL at a Redis 6.2+ or Valkey server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_sent_again_after_its_answer_was_lost_wins_once() {
    // A server of its own, whose script cache holds only what this store loaded when it
    // opened: the cut claim below is the first this server runs, and still takes effect.
    let (_server, proxy, through_proxy, direct) = fresh_server_behind_a_proxy().await;
    let options = LeaseOptions::with_lease(Duration::from_secs(5));
    let slot = store_now(&*direct).await;

    let job = unique("job");
    let request = scheduled(&job, slot, &options);
    proxy.set(Mode::CutReplies);
    let err = through_proxy
        .claim(&request)
        .await
        .expect_err("the answer was cut");
    assert!(err.is_retryable(), "a dropped answer is retryable: {err}");
    let run = direct
        .get(&job, slot)
        .await
        .expect("get")
        .expect("the claim took effect on the server");
    assert_eq!(run.token, request.token);

    proxy.set(Mode::Pass);
    let retried = loop {
        match through_proxy.claim(&request).await {
            Ok(outcome) => break outcome,
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("retry failed for good: {e}"),
        }
    };
    let ClaimOutcome::Won(lease) = retried else {
        panic!("the retried claim gets its own win back, got {retried:?}");
    };
    assert_eq!((lease.attempt, lease.token), (1, request.token));
    assert_eq!(
        lease.lease_end, run.lease_end,
        "the same lease, not a new one"
    );
    let other = ClaimRequest {
        runner: "b",
        token: Token::random(),
        ..request.clone()
    };
    assert!(
        matches!(
            direct.claim(&other).await.expect("claim"),
            ClaimOutcome::Running { ref runner, .. } if runner == "a"
        ),
        "a second claimer sees the one winner"
    );
}

/// A `redis-server` of the test's own, whose script cache holds only what the store loads, a
/// proxy in front of it, and the store opened through the proxy and directly.
async fn fresh_server_behind_a_proxy(
) -> (Server, Proxy, Arc<dyn store::Store>, Arc<dyn store::Store>) {
    let server = start_redis_like(Path::new("redis-server"), &[]);
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port)).await;
    let namespace = unique("t");
    let through_proxy = store::open(&format!("redis://127.0.0.1:{}", proxy.port), &namespace)
        .await
        .expect("open via proxy");
    let direct = store::open(&format!("redis://127.0.0.1:{}", server.port), &namespace)
        .await
        .expect("open directly");
    (server, proxy, through_proxy, direct)
}

/// A scheduled claim of `job`'s `slot` by runner `a`, with a fresh token.
fn scheduled<'a>(job: &'a str, slot: i64, options: &'a LeaseOptions) -> ClaimRequest<'a> {
    ClaimRequest {
        job,
        slot,
        kind: ClaimKind::Scheduled,
        runner: "a",
        token: Token::random(),
        digest: None,
        options,
    }
}

/// A claim that wins on `store`.
async fn won(store: &dyn store::Store, job: &str, slot: i64, options: &LeaseOptions) -> Token {
    match store
        .claim(&scheduled(job, slot, options))
        .await
        .expect("claim")
    {
        ClaimOutcome::Won(lease) => lease.token,
        other => panic!("the first claim of a slot wins, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_finish_on_a_fresh_server_whose_answer_was_lost_took_effect_and_is_known_as_ours() {
    let (_server, proxy, through_proxy, direct) = fresh_server_behind_a_proxy().await;
    let options = LeaseOptions::with_lease(Duration::from_secs(5));
    let slot = store_now(&*direct).await;
    let job = unique("job");
    let token = won(&*through_proxy, &job, slot, &options).await;

    // The first finish this server ever runs: the store loaded the script when it opened, so
    // the call is one request, which takes effect though its answer is lost.
    proxy.set(Mode::CutReplies);
    let err = through_proxy
        .finish(&job, slot, token, Finish::Success)
        .await
        .expect_err("the answer was cut");
    assert!(err.is_retryable(), "a dropped answer is retryable: {err}");
    let run = direct.get(&job, slot).await.expect("get").expect("the run");
    assert_eq!(run.status, Status::Success, "the finish ran on the server");

    proxy.set(Mode::Pass);
    let retried = loop {
        match through_proxy
            .finish(&job, slot, token, Finish::Success)
            .await
        {
            Ok(outcome) => break outcome,
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("retry failed for good: {e}"),
        }
    };
    match retried {
        TokenOutcome::Refused(Some(state)) => {
            assert_eq!(
                (state.attempt, state.status),
                (1, Status::Success),
                "{state:?}"
            );
        }
        other => panic!("a finish sent again is refused with the run's end, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_run_after_the_server_lost_its_script_cache() {
    let (server, _proxy, _through_proxy, direct) = fresh_server_behind_a_proxy().await;
    let flush = || assert_eq!(redis_cli(server.port, &["SCRIPT", "FLUSH"]).trim(), "OK");
    let options = LeaseOptions::with_lease(Duration::from_secs(5));
    let slot = store_now(&*direct).await;
    let job = unique("job");
    flush();
    let token = won(&*direct, &job, slot, &options).await;
    flush();
    let renewed = direct
        .heartbeat(&job, slot, token, options.lease)
        .await
        .expect("heartbeat");
    assert!(
        matches!(renewed, HeartbeatOutcome::Renewed { .. }),
        "{renewed:?}"
    );
    flush();
    let finished = direct
        .finish(&job, slot, token, Finish::Success)
        .await
        .expect("finish");
    assert!(matches!(finished, TokenOutcome::Accepted), "{finished:?}");
    let run = direct.get(&job, slot).await.expect("get").expect("the run");
    assert_eq!(run.status, Status::Success);
}

/// The store's `?timeout=` is its response timeout: an answer slower than it is a retryable
/// error, and a longer timeout waits for the same slow answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_parameter_sets_how_long_an_operation_waits_for_its_answer() {
    let proxy = Proxy::start(redis_address()).await;
    let namespace = unique("t");
    let open = |timeout: &str| {
        let url = format!("redis://127.0.0.1:{}?timeout={timeout}", proxy.port);
        let namespace = namespace.clone();
        async move { store::open(&url, &namespace).await.expect("open via proxy") }
    };
    let impatient = open("200ms").await;
    let patient = open("5s").await;
    proxy.set_delay(Duration::from_millis(300));
    let err = impatient.now().await.expect_err("an answer after 600 ms");
    assert!(err.is_retryable(), "{err}");
    patient.now().await.expect("the same answer within 5 s");
    proxy.set_delay(Duration::ZERO);
    let err = open_err(&format!(
        "redis://u:hunter2@127.0.0.1:{}?timeout=soon",
        proxy.port
    ))
    .await;
    let msg = err.to_string();
    assert!(matches!(err, StoreError::InvalidUrl { .. }), "{msg}");
    assert!(msg.contains("timeout parameter"), "{msg}");
    assert!(!msg.contains("hunter2"), "{msg}");
}

/// A Redis without persistence that restarts has lost every fence counter: the job's fences
/// would start again at 1. With the store's clock as their floor they keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_of_a_job_strictly_increase_across_a_restart_of_a_redis_without_persistence() {
    let port = baton_tests::servers::free_port(false);
    let dir = tempfile::tempdir().expect("server directory");
    let start = || {
        baton_tests::servers::start_redis_like_in(
            std::path::Path::new("redis-server"),
            port,
            dir.path(),
            &[],
        )
    };
    let url = format!("redis://127.0.0.1:{port}");
    let namespace = unique("t");
    let options = LeaseOptions::with_lease(Duration::from_secs(5));
    let job = unique("job");
    let claim = |store: Arc<dyn store::Store>, slot: i64| {
        let job = job.clone();
        async move {
            let request = scheduled(&job, slot, &options);
            match store.claim(&request).await.expect("claim") {
                ClaimOutcome::Won(lease) => {
                    store
                        .finish(&job, slot, lease.token, Finish::Success)
                        .await
                        .expect("finish");
                    lease.fence
                }
                other => panic!("expected a win, got {other:?}"),
            }
        }
    };

    let server = start();
    let before = store::open(&url, &namespace).await.expect("open");
    let slot = store_now(&*before).await;
    let mut fences = vec![
        claim(before.clone(), slot).await,
        claim(before.clone(), slot + 1).await,
    ];
    drop(before);
    drop(server);

    let _server = start();
    let after = store::open(&url, &namespace).await.expect("open again");
    assert_eq!(
        after.get(&job, slot).await.expect("get"),
        None,
        "the restarted server has lost the job's state"
    );
    let slot = store_now(&*after).await;
    fences.push(claim(after.clone(), slot).await);
    fences.push(claim(after.clone(), slot + 1).await);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences {fences:?} strictly increase across the restart"
    );
}

/// A primary with its replica, and a store on it in a namespace of its own: waiting for the
/// replica (`?replicas=auto`, the default) and not (`?replicas=0`).
struct Replicated {
    pair: baton_tests::servers::ReplicatedRedis,
    url: String,
    namespace: String,
    store: Arc<dyn store::Store>,
    unguarded: Arc<dyn store::Store>,
}

async fn replicated() -> Replicated {
    let pair = tokio::task::spawn_blocking(baton_tests::servers::start_redis_with_replica)
        .await
        .expect("start a primary and its replica");
    let url = format!("redis://127.0.0.1:{}", pair.primary.port);
    let namespace = unique("t");
    let store = store::open(&url, &namespace).await.expect("open");
    let unguarded = store::open(&format!("{url}?replicas=0"), &namespace)
        .await
        .expect("open with replicas=0");
    Replicated {
        pair,
        url,
        namespace,
        store,
        unguarded,
    }
}

/// Asserts that `answer` is a write that the one replica required did not acknowledge.
fn assert_not_acknowledged<T: std::fmt::Debug>(answer: Result<T, StoreError>, what: &str) {
    match answer {
        Err(StoreError::NotAcknowledged {
            operation,
            acknowledged,
            required,
            ..
        }) => assert_eq!((operation, acknowledged, required), (what, 0, 1)),
        other => panic!("a {what} the frozen replica did not acknowledge, got {other:?}"),
    }
}

/// With a replica attached, a claim waits for it (`WAIT`, `?replicas=auto`): a frozen replica
/// never acknowledges, so the claim is not acknowledged and an instance does not start the job
/// (it says so with a `skip` event); with the replica live, claims win as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_that_a_frozen_replica_does_not_acknowledge_is_refused_and_no_job_starts() {
    use baton_core::instance::{handler_fn, EventKind, Instance, InstanceConfig, Job};
    use baton_tests::servers::signal;

    let Replicated {
        pair,
        url,
        namespace,
        store,
        unguarded,
    } = replicated().await;
    let options = LeaseOptions {
        overlap: baton_core::lease::Overlap::Allow,
        ..LeaseOptions::with_lease(Duration::from_secs(5))
    };
    let job = unique("job");
    let request = |slot: i64| scheduled(&job, slot, &options);

    let slot = store_now(&*store).await;
    let live = store.claim(&request(slot)).await.expect("claim");
    let ClaimOutcome::Won(lease) = live else {
        panic!("with the replica live the claim wins, got {live:?}");
    };
    store
        .finish(&job, slot, lease.token, Finish::Success)
        .await
        .expect("the replica acknowledges the finish");

    signal(&pair.replica, libc::SIGSTOP);
    let frozen = store.claim(&request(slot + 1)).await;
    assert_not_acknowledged(frozen, "claim");
    // The URL's replicas=0 turns the wait off: the same store answers at once.
    let off = unguarded.claim(&request(slot + 2)).await.expect("claim");
    assert!(matches!(off, ClaimOutcome::Won(_)), "{off:?}");

    // An instance does not start a job on a claim that was not acknowledged.
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ran = started.clone();
    let handler = handler_fn(move |_| {
        let ran = ran.clone();
        async move {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    });
    let instance_job = unique("instance-job");
    let instance = Instance::start(
        InstanceConfig {
            store_url: url.clone(),
            namespace: namespace.clone(),
            runner: "frozen-replica".into(),
        },
        vec![Job {
            name: instance_job.clone(),
            schedule: baton_core::schedule::Schedule::parse("* * * * * *", "UTC")
                .expect("schedule"),
            options: LeaseOptions::with_lease(Duration::from_secs(5)),
            handler,
        }],
    )
    .await
    .expect("instance starts");
    let mut events = instance.subscribe();
    let skipped = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(e) if e.kind == EventKind::Skip && e.reason == "not-acknowledged" => break e,
                Ok(e) => assert!(
                    !matches!(e.kind, EventKind::Won | EventKind::Started),
                    "no claim may win while the replica is frozen: {e:?}"
                ),
                Err(e) => panic!("events: {e}"),
            }
        }
    })
    .await
    .expect("a skip event saying the claim was not acknowledged");
    assert_eq!(skipped.job, instance_job);
    assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
    instance.stop(Duration::from_secs(5)).await;
    assert!(
        !started.load(std::sync::atomic::Ordering::SeqCst),
        "the job never started"
    );

    signal(&pair.replica, libc::SIGCONT);
    let again = store.claim(&request(slot + 3)).await.expect("claim");
    assert!(
        matches!(again, ClaimOutcome::Won(_)),
        "with the replica live again claims win: {again:?}"
    );
}

/// With a replica attached, a heartbeat waits for it too: a renewal the frozen replica does not
/// hold is not acknowledged, so the runner keeps the lease end it had (the promoted replica
/// would end the lease there, and a backup take the run over) and the host stops the attempt
/// at that end instead of running on past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_that_a_frozen_replica_does_not_acknowledge_leaves_the_runners_lease_end() {
    use baton_core::instance::{handler_fn, Instance, InstanceConfig, Job};
    use baton_tests::servers::signal;
    use std::sync::Mutex;

    let r = replicated().await;
    let lease = Duration::from_secs(5);
    let options = LeaseOptions::with_lease(lease);
    let job = unique("job");
    let slot = store_now(&*r.store).await;
    let token = won(&*r.store, &job, slot, &options).await;
    let renewed = r
        .store
        .heartbeat(&job, slot, token, lease)
        .await
        .expect("the replica acknowledges the renewal");
    assert!(
        matches!(renewed, HeartbeatOutcome::Renewed { .. }),
        "{renewed:?}"
    );

    signal(&r.pair.replica, libc::SIGSTOP);
    assert_not_acknowledged(
        r.store.heartbeat(&job, slot, token, lease).await,
        "heartbeat",
    );
    // The URL's replicas=0 turns the wait off: the same renewal answers at once.
    let off = r
        .unguarded
        .heartbeat(&job, slot, token, lease)
        .await
        .expect("heartbeat");
    assert!(matches!(off, HeartbeatOutcome::Renewed { .. }), "{off:?}");
    signal(&r.pair.replica, libc::SIGCONT);

    // A runner whose renewals stop being acknowledged runs to the lease end it knows, no
    // further: the handler sees its deadline stand still, then its signal aborted. (Without the
    // wait, a renewal sent after the freeze is answered within the 1 s `WAIT` and moves the
    // deadline past the freeze by the whole lease.)
    let lease = Duration::from_secs(4);
    let deadlines: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let (stopped_tx, mut stopped) = tokio::sync::mpsc::unbounded_channel::<()>();
    let seen = deadlines.clone();
    let handler = handler_fn(move |ctx| {
        let (seen, started_tx, stopped_tx) = (seen.clone(), started_tx.clone(), stopped_tx.clone());
        async move {
            let _ = started_tx.send(ctx.slot);
            while !ctx.signal.is_aborted() {
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(ctx.deadline.get());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = stopped_tx.send(());
            Err("stopped".to_owned())
        }
    });
    let instance_job = unique("long-job");
    let instance = Instance::start(
        InstanceConfig {
            store_url: r.url.clone(),
            namespace: r.namespace.clone(),
            runner: "renewing".into(),
        },
        vec![Job {
            name: instance_job,
            schedule: baton_core::schedule::Schedule::parse("* * * * * *", "UTC")
                .expect("schedule"),
            options: LeaseOptions::with_lease(lease),
            handler,
        }],
    )
    .await
    .expect("instance starts");
    tokio::time::timeout(Duration::from_secs(10), started.recv())
        .await
        .expect("the job starts within 10 s")
        .expect("a start");
    // Renewals acknowledged for a while: the deadline moves on past the first lease.
    let first = Instant::now();
    let moved = tokio::time::timeout(lease + Duration::from_secs(3), async {
        loop {
            let last = deadlines
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last()
                .copied();
            if last.is_some_and(|d| d > first + lease) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(moved.is_ok(), "acknowledged renewals move the deadline on");

    signal(&r.pair.replica, libc::SIGSTOP);
    let frozen_at = Instant::now();
    let stop = tokio::time::timeout(lease + Duration::from_secs(3), stopped.recv()).await;
    let latest = deadlines
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .copied()
        .max()
        .expect("deadlines seen");
    signal(&r.pair.replica, libc::SIGCONT);
    instance.stop(Duration::from_secs(5)).await;
    assert!(
        latest <= frozen_at + lease,
        "the deadline moved {:?} past the last renewal the replica could hold",
        latest - (frozen_at + lease)
    );
    stop.expect("the attempt stops once the lease it knows ends")
        .expect("a stop");
}

/// With a replica attached, a state write waits for it too: one the frozen replica does not
/// hold is answered as not acknowledged (the guest hears `store(…)`: it is on the primary, and
/// a failover could lose it), while a refused write answers its refusal as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_write_that_a_frozen_replica_does_not_acknowledge_is_not_reported_written() {
    use baton_core::state::{StateLimits, StateOutcome, StateRefusal, StateWrite, Written};
    use baton_tests::servers::signal;

    let r = replicated().await;
    let job = unique("job");
    let options = LeaseOptions::with_lease(Duration::from_secs(30));
    let slot = store_now(&*r.store).await;
    let token = won(&*r.store, &job, slot, &options).await;
    let limits = StateLimits {
        max_keys: 1,
        ..StateLimits::default()
    };
    let write = |key: &'static str| StateWrite::Set {
        key,
        value: b"1".as_slice(),
    };
    let live = r
        .store
        .state_write(&job, slot, token, &write("a"), &limits)
        .await
        .expect("the replica acknowledges the write");
    assert_eq!(live, StateOutcome::Written(Written::Set));

    signal(&r.pair.replica, libc::SIGSTOP);
    let frozen = r
        .store
        .state_write(&job, slot, token, &write("a"), &limits)
        .await;
    let refused = r
        .store
        .state_write(&job, slot, token, &write("b"), &limits)
        .await;
    let off = r
        .unguarded
        .state_write(&job, slot, token, &write("a"), &limits)
        .await;
    signal(&r.pair.replica, libc::SIGCONT);
    assert_not_acknowledged(frozen, "state write");
    assert_eq!(
        refused.expect("a refusal is answered"),
        StateOutcome::Refused(StateRefusal::TooManyKeys { limit: 1 })
    );
    // The URL's replicas=0 turns the wait off: the same write answers at once.
    assert_eq!(off.expect("written"), StateOutcome::Written(Written::Set));
}

/// The port of the tests' Redis.
fn redis_port() -> u16 {
    redis_address()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the tests' Redis address ends in a port")
}

#[tokio::test]
async fn namespace_written_in_an_older_layout_is_refused_naming_it_and_the_fix() {
    // Layout 1 kept the namespace's job names in `{ns}:jobs` and no layout version.
    let port = redis_port();
    let namespace = unique("old-layout");
    redis_cli(port, &["SADD", &format!("{{{namespace}}}:jobs"), "nightly"]);
    let url = format!("redis://{}", redis_address());
    let refused = store::open(&url, &namespace).await;
    redis_cli(port, &["DEL", &format!("{{{namespace}}}:jobs")]);
    let err = match refused {
        Ok(_) => panic!("a namespace of layout 1 opened, but should not"),
        Err(e) => e,
    };
    let message = err.to_string();
    assert!(
        matches!(err, StoreError::Unsupported { .. }),
        "not an unsupported store: {message}"
    );
    assert!(
        message.contains(&format!("namespace {namespace:?} holds runs in layout 1"))
            && message.contains("--namespace"),
        "the error names the namespace, its layout and the fix: {message}"
    );
    // A new namespace is marked with this layout and opens again.
    let fresh = unique("new-layout");
    store::open(&url, &fresh)
        .await
        .expect("a new namespace opens");
    store::open(&url, &fresh).await.expect("and opens again");
    assert_eq!(
        redis_cli(port, &["GET", &format!("{{{fresh}}}:layout")]).trim(),
        "2"
    );
    redis_cli(port, &["DEL", &format!("{{{fresh}}}:layout")]);
}
