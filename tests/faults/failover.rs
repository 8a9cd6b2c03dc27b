//! Failover of an asynchronously replicated Redis while a run holds its lease: the replica is
//! held back (frozen, and 40 MB written to the primary so that what follows cannot sit in its
//! socket buffers), the primary is killed, and the replica is promoted, on a single primary
//! promoted by hand (`REPLICAOF NO ONE`, as Sentinel does, with the runners' address moved to
//! it by a proxy) and on a Redis Cluster (the cluster promotes it).
//!
//! Two instances run a job every second against the store; each start of the handler records
//! its runner, slot, attempt and fence, and each instance's `success` events are what its
//! runner logged. After the failover, the promoted store must hold every one of them: no fence
//! of the job was handed out twice, no attempt was started twice, no finish a runner logged is
//! missing, and no job started on a claim the replica did not acknowledge (every start is an
//! attempt of the promoted store's record, with its fence).
//!
//! `cargo test --test faults -- failover --nocapture` runs them and prints what each trial saw.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::instance::{handler_fn, Event, EventKind, Instance, InstanceConfig, Job};
use baton_core::lease::{AttemptOutcome, LeaseOptions, Overlap, Run};
use baton_core::schedule::Schedule;
use baton_core::store;
use baton_tests::proxy::Proxy;
use baton_tests::servers::{
    redis_cli, signal, start_redis_cluster_with_replicas, start_redis_with_replica, Server,
};
use baton_tests::unique;

/// How many times each failover is tried.
const TRIALS: usize = 5;

/// The job's name in every trial (each trial has a namespace of its own).
const JOB: &str = "failover";

/// One start of the handler, as the runner saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Start {
    runner: String,
    slot: i64,
    attempt: u32,
    fence: u64,
}

/// What the two runners saw: the handler's starts and their events.
#[derive(Default)]
struct Seen {
    starts: Mutex<Vec<Start>>,
    events: Mutex<Vec<Event>>,
}

/// What one trial counted, for the summary line.
#[derive(Debug, Default)]
struct Figures {
    starts: usize,
    successes: usize,
    not_acknowledged: usize,
    runs: usize,
}

/// The job: every second, side by side (`overlap = allow`), a lease of 3 s renewed every
/// 500 ms; the handler records its start and works for 1.2 s (or until its signal aborts).
fn job(seen: Arc<Seen>) -> Job {
    let options = LeaseOptions {
        heartbeat: Duration::from_millis(500),
        overlap: Overlap::Allow,
        ..LeaseOptions::with_lease(Duration::from_secs(3))
    };
    let handler = handler_fn(move |ctx| {
        let seen = seen.clone();
        async move {
            seen.starts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Start {
                    runner: ctx.runner.clone(),
                    slot: ctx.slot,
                    attempt: ctx.attempt,
                    fence: ctx.fence,
                });
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(1_200)) => Ok(()),
                _ = ctx.signal.aborted() => Err("aborted".to_owned()),
            }
        }
    });
    Job {
        name: JOB.to_owned(),
        schedule: Schedule::parse("* * * * * *", "UTC").expect("a schedule"),
        options,
        handler,
    }
}

/// Starts two instances on `url` in `namespace`, their events gathered into `seen`.
async fn runners(url: &str, namespace: &str, seen: &Arc<Seen>) -> Vec<Instance> {
    let mut instances = Vec::new();
    for runner in ["runner-a", "runner-b"] {
        let instance = Instance::start(
            InstanceConfig {
                store_url: url.to_owned(),
                namespace: namespace.to_owned(),
                runner: runner.to_owned(),
            },
            vec![job(seen.clone())],
        )
        .await
        .expect("an instance starts");
        let mut events = instance.subscribe();
        let seen = seen.clone();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(e) => seen
                        .events
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(e),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        instances.push(instance);
    }
    instances
}

/// Writes 40 MB to the server on `port` under `key`, so that what the primary writes next
/// stays in its own output buffer while the replica is frozen, and dies with it.
fn hold_back_the_replica(port: u16, key: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "-x", "set", key])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-cli runs");
    let filler = vec![b'x'; 40 * 1024 * 1024];
    child
        .stdin
        .take()
        .expect("redis-cli's stdin")
        .write_all(&filler)
        .expect("40 MB to the primary");
    let status = child.wait().expect("redis-cli ends");
    assert!(status.success(), "redis-cli -x set failed: {status}");
}

/// Checks what the runners saw against the promoted store's record of the job; returns the
/// violations found and the trial's figures.
fn check(seen: &Seen, runs: &[Run]) -> (Vec<String>, Figures) {
    let starts = seen
        .starts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let events = seen
        .events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut violations = Vec::new();
    let mut by_fence: HashMap<u64, &Start> = HashMap::new();
    let mut by_attempt: HashMap<(i64, u32), &Start> = HashMap::new();
    for s in &starts {
        if let Some(other) = by_fence.insert(s.fence, s) {
            violations.push(format!(
                "fence {} handed out twice: {other:?} and {s:?}",
                s.fence
            ));
        }
        if let Some(other) = by_attempt.insert((s.slot, s.attempt), s) {
            violations.push(format!(
                "slot {} attempt {} started twice: {other:?} and {s:?}",
                s.slot, s.attempt
            ));
        }
    }
    let by_slot: HashMap<i64, &Run> = runs.iter().map(|r| (r.slot, r)).collect();
    for s in &starts {
        let held = by_slot.get(&s.slot).and_then(|r| {
            r.attempts
                .iter()
                .find(|a| a.attempt == s.attempt && a.runner == s.runner && a.fence == s.fence)
        });
        if held.is_none() {
            violations.push(format!(
                "{s:?} started on a claim the promoted store does not hold: {:?}",
                by_slot.get(&s.slot)
            ));
        }
    }
    let successes: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == EventKind::Success)
        .collect();
    for e in &successes {
        let held = by_slot.get(&e.slot).and_then(|r| {
            r.attempts.iter().find(|a| {
                Some(a.attempt) == e.attempt
                    && a.runner == e.runner
                    && a.outcome == Some(AttemptOutcome::Success)
            })
        });
        if held.is_none() {
            violations.push(format!(
                "{} logged success of slot {} attempt {:?}, which the promoted store does not hold: {:?}",
                e.runner,
                e.slot,
                e.attempt,
                by_slot.get(&e.slot)
            ));
        }
    }
    let figures = Figures {
        starts: starts.len(),
        successes: successes.len(),
        not_acknowledged: events
            .iter()
            .filter(|e| e.kind == EventKind::Skip && e.reason == "not-acknowledged")
            .count(),
        runs: runs.len(),
    };
    (violations, figures)
}

/// Stops the runners and reads the job's record from the promoted store.
async fn finish_trial(instances: Vec<Instance>, promoted_url: &str, namespace: &str) -> Vec<Run> {
    for instance in &instances {
        instance.stop(Duration::from_secs(5)).await;
    }
    drop(instances);
    let promoted = store::open(promoted_url, namespace)
        .await
        .expect("open the promoted store");
    promoted
        .history(JOB, 10_000)
        .await
        .expect("the promoted store's history")
}

/// One trial on a single primary and its replica, promoted by hand behind a proxy.
async fn single_primary_trial() -> (Vec<String>, Figures) {
    let pair = tokio::task::spawn_blocking(start_redis_with_replica)
        .await
        .expect("a primary and its replica");
    let proxy = Proxy::start(format!("127.0.0.1:{}", pair.primary.port)).await;
    let url = format!("redis://127.0.0.1:{}?timeout=2s", proxy.port);
    let namespace = unique("failover");
    let seen = Arc::new(Seen::default());
    let instances = runners(&url, &namespace, &seen).await;

    tokio::time::sleep(Duration::from_millis(2_500)).await;
    signal(&pair.replica, libc::SIGSTOP);
    let port = pair.primary.port;
    tokio::task::spawn_blocking(move || hold_back_the_replica(port, "filler"))
        .await
        .expect("filler written");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let primary: Server = pair.primary;
    signal(&primary, libc::SIGKILL);
    signal(&pair.replica, libc::SIGCONT);
    let replica_port = pair.replica.port;
    tokio::task::spawn_blocking(move || redis_cli(replica_port, &["replicaof", "no", "one"]))
        .await
        .expect("the replica promoted");
    proxy.retarget(format!("127.0.0.1:{replica_port}"));
    tokio::time::sleep(Duration::from_millis(4_000)).await;

    let runs = finish_trial(
        instances,
        &format!("redis://127.0.0.1:{replica_port}"),
        &namespace,
    )
    .await;
    drop(primary);
    check(&seen, &runs)
}

/// One trial on a Redis Cluster of three primaries with a replica each: the primary of the
/// job's hash slot dies, and the cluster promotes its replica.
async fn cluster_trial() -> (Vec<String>, Figures) {
    let cluster = tokio::task::spawn_blocking(|| start_redis_cluster_with_replicas(1_000))
        .await
        .expect("a cluster with replicas");
    let url = format!("{}?timeout=2s", cluster.url());
    let namespace = unique("failover");
    let tag = format!("{{{namespace}:{JOB}}}");
    let (primary, replica) = cluster.primary_and_replica_of(&tag, &[]);
    let seen = Arc::new(Seen::default());
    let instances = runners(&url, &namespace, &seen).await;

    tokio::time::sleep(Duration::from_millis(2_500)).await;
    signal(&cluster.nodes[replica], libc::SIGSTOP);
    let port = cluster.nodes[primary].port;
    let filler = format!("{tag}:filler");
    tokio::task::spawn_blocking(move || hold_back_the_replica(port, &filler))
        .await
        .expect("filler written");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    signal(&cluster.nodes[primary], libc::SIGKILL);
    signal(&cluster.nodes[replica], libc::SIGCONT);
    // The cluster marks the primary failed after the node timeout and promotes its replica.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let role = redis_cli(cluster.nodes[replica].port, &["role"]);
        if role.starts_with("master") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replica was not promoted within 20 s: {role}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(4_000)).await;

    let live: Vec<String> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != primary)
        .map(|(_, n)| format!("127.0.0.1:{}", n.port))
        .collect();
    let runs = finish_trial(
        instances,
        &format!("redis+cluster://{}", live.join(",")),
        &namespace,
    )
    .await;
    check(&seen, &runs)
}

/// Runs `trial` [`TRIALS`] times; fails with every violation found.
async fn trials<F, Fut>(name: &str, trial: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (Vec<String>, Figures)>,
{
    let mut violations = Vec::new();
    for n in 1..=TRIALS {
        let (found, figures) = trial().await;
        eprintln!(
            "failover {name}, trial {n}: {} starts, {} successes logged, {} claims not acknowledged, {} runs in the promoted store, {} violations",
            figures.starts,
            figures.successes,
            figures.not_acknowledged,
            figures.runs,
            found.len()
        );
        assert!(figures.starts > 0, "trial {n}: the job never ran");
        violations.extend(found.into_iter().map(|v| format!("trial {n}: {v}")));
    }
    assert!(violations.is_empty(), "{name}:\n{}", violations.join("\n"));
}

/// A runtime for one scenario's trials.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn failover_of_a_single_primary_loses_no_fence_finish_or_acknowledged_claim() {
    let _shared = crate::machine_shared();
    runtime().block_on(trials("single primary", single_primary_trial));
}

#[test]
fn failover_of_a_cluster_primary_loses_no_fence_finish_or_acknowledged_claim() {
    let _shared = crate::machine_shared();
    runtime().block_on(trials("cluster", cluster_trial));
}

/// After the primary of a job's hash slot dies and the cluster promotes its replica, a client
/// opened before (with `?replicas=auto`, which waited for that replica) gets its claims of the
/// job answered again within a few seconds: the promoted primary has no replica, so nothing
/// waits for one any more.
#[test]
fn claims_are_answered_again_soon_after_a_cluster_primary_fails_over() {
    let _shared = crate::machine_shared();
    runtime().block_on(async {
        let cluster = tokio::task::spawn_blocking(|| start_redis_cluster_with_replicas(1_000))
            .await
            .expect("a cluster with replicas");
        let namespace = unique("failover");
        let store = store::open(&cluster.url(), &namespace)
            .await
            .expect("open the cluster store");
        let options = LeaseOptions::with_lease(Duration::from_secs(3));
        let claim = |slot: i64| {
            let store = store.clone();
            async move {
                let request = baton_core::lease::ClaimRequest {
                    job: JOB,
                    slot,
                    kind: baton_core::lease::ClaimKind::Scheduled,
                    runner: "runner-a",
                    token: baton_core::lease::Token::random(),
                    digest: None,
                    options: &options,
                };
                store.claim(&request).await
            }
        };
        let now = store.now().await.expect("the store's clock");
        let won = claim(now).await.expect("a claim before the failover");
        assert!(
            matches!(won, baton_core::lease::ClaimOutcome::Won(_)),
            "{won:?}"
        );

        let tag = format!("{{{namespace}:{JOB}}}");
        let (primary, replica) = cluster.primary_and_replica_of(&tag, &[]);
        signal(&cluster.nodes[primary], libc::SIGKILL);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !redis_cli(cluster.nodes[replica].port, &["role"]).starts_with("master") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the replica was not promoted within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let promoted = tokio::time::Instant::now();
        let mut slot = now;
        let mut failures = Vec::new();
        loop {
            slot += 1_000;
            let sent = tokio::time::Instant::now();
            match claim(slot).await {
                Ok(baton_core::lease::ClaimOutcome::Won(_)) => break,
                Ok(other) => failures.push(format!("{:?}: {other:?}", sent - promoted)),
                Err(e) => failures.push(format!("{:?}: {e}", sent - promoted)),
            }
            assert!(
                promoted.elapsed() < Duration::from_secs(10),
                "no claim won within 10 s of the promotion:\n{}",
                failures.join("\n")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "a claim won {:?} after the promotion; before it: {failures:?}",
            promoted.elapsed()
        );
    });
}
