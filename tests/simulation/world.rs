//! One simulated schedule: a store, three nodes running the real `Instance` with a native
//! handler, and the faults one seed draws, all in one thread on tokio's paused time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::env::{Clock, Env, Switch, TokioClock};
use baton_core::instance::{handler_fn, Event, Instance, Job, RunContext};
use baton_core::lease::{LeaseOptions, Run};
use baton_core::schedule::Schedule;
use baton_core::store::sqlite::SqliteStore;
use baton_core::store::Store;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::faults::FaultyStore;

/// The wall-clock instant every schedule starts at (2026-01-01T00:00:00Z), ms.
pub const START_MS: i64 = 1_767_225_600_000;

/// How long a schedule runs, simulated: 5 minutes.
pub const LENGTH: Duration = Duration::from_secs(300);

/// Faults strike only before this (simulated); the rest is quiet, so every run must end.
pub const FAULTS_UNTIL: Duration = Duration::from_secs(210);

/// The nodes of every schedule.
pub const NODES: [&str; 3] = ["n1", "n2", "n3"];

/// The jobs: a short one every 15 s, and one every 20 s that may run past its next slot (so
/// overlaps are skipped).
pub fn jobs() -> Vec<(&'static str, &'static str, u64)> {
    vec![
        ("short", "*/15 * * * * *", 4),
        ("long", "*/20 * * * * *", 26),
    ]
}

/// The lease options of every job: a 6 s lease, renewed every second.
pub fn options() -> LeaseOptions {
    LeaseOptions::with_lease(Duration::from_secs(6))
}

/// Something a handler did, as the host would let it: each step checked against the lease
/// deadline and the signal, as the host's fence checks each side effect.
#[derive(Clone, Debug)]
pub struct Effect {
    /// Simulated ms since the start.
    pub at_ms: i64,
    /// The node.
    pub node: String,
    /// The job.
    pub job: String,
    /// The slot.
    pub slot: i64,
    /// The attempt.
    pub attempt: u32,
    /// Its fence.
    pub fence: u64,
}

/// The schedule's history: every event, effect and fault, in the order they happened.
#[derive(Clone)]
pub struct History {
    start: Instant,
    lines: Arc<Mutex<Vec<String>>>,
    effects: Arc<Mutex<Vec<Effect>>>,
}

impl History {
    /// A history that starts now.
    pub fn new() -> Self {
        History {
            start: Instant::now(),
            lines: Arc::default(),
            effects: Arc::default(),
        }
    }

    /// Simulated ms since the start.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Writes a line of the history.
    pub fn note(&self, line: String) {
        let at = self.now_ms();
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("{at:>7} {line}"));
    }

    fn effect(&self, node: &str, ctx: &RunContext) {
        let effect = Effect {
            at_ms: self.now_ms(),
            node: node.to_owned(),
            job: ctx.job.clone(),
            slot: ctx.slot,
            attempt: ctx.attempt,
            fence: ctx.fence,
        };
        self.note(format!(
            "{node} effect {} {} attempt {} fence {}",
            ctx.job, ctx.slot, ctx.attempt, ctx.fence
        ));
        self.effects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(effect);
    }

    fn event(&self, event: Event) {
        self.note(format!(
            "{} {} {} {} attempt {:?} {}",
            event.runner,
            event.kind.as_str(),
            event.job,
            event.slot,
            event.attempt,
            event.reason
        ));
    }
}

/// Spans of simulated time (ms since the start) in which the store is out of reach.
#[derive(Debug, Default)]
pub struct Spans(Vec<(i64, i64)>);

impl Spans {
    /// These spans (ms since the start, end excluded).
    pub fn new(spans: Vec<(i64, i64)>) -> Self {
        Spans(spans)
    }

    /// Whether `at` falls in a span.
    pub fn contains(&self, at: i64) -> bool {
        self.0.iter().any(|(from, to)| (*from..*to).contains(&at))
    }

    /// When the last span ends (0 if none).
    pub fn last_end(&self) -> i64 {
        self.0.iter().map(|(_, to)| *to).max().unwrap_or(0)
    }
}

/// The store fails over to its replica at `at_ms` (simulated, since the start), losing every
/// write of the last `lag_ms`. With `acknowledged`, a write waits for the replica (as Baton's
/// Redis store waits with `WAIT`): one the replica did not get is answered as not
/// acknowledged, never as done. Without, writes are answered at once (`?replicas=0`), and some
/// that were answered are lost.
#[derive(Clone, Copy, Debug)]
pub struct Failover {
    /// When it fails over.
    pub at_ms: i64,
    /// How far the replica lags.
    pub lag_ms: i64,
    /// Whether writes wait for the replica.
    pub acknowledged: bool,
}

impl Failover {
    /// Whether a write applied at `at` (simulated ms) is lost in this failover.
    pub fn loses(&self, at: i64) -> bool {
        at > self.at_ms - self.lag_ms && at <= self.at_ms
    }
}

/// The writes of each runner lost in a failover without acknowledgements: (job, slot, node).
pub type LostWrites = Arc<Mutex<std::collections::BTreeSet<(String, i64, String)>>>;

/// What a finished schedule leaves for the checker.
pub struct Outcome {
    /// The history, one line per event, effect and fault.
    pub lines: Vec<String>,
    /// What the handlers did.
    pub effects: Vec<Effect>,
    /// Every run of every job in the store at the end.
    pub runs: Vec<Run>,
    /// The runners' writes that a failover lost after they were answered.
    pub lost_writes: std::collections::BTreeSet<(String, i64, String)>,
    /// When (simulated ms) the last fault of any kind ended.
    pub quiet_from: i64,
    /// The spans (simulated ms since the start, end excluded) the store was out of reach.
    pub outages: Vec<(i64, i64)>,
}

/// What happens to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeFaultKind {
    /// Its process is gone at once: no release, no finish.
    Crash,
    /// It stops with hand-over.
    Stop,
    /// Its process is frozen (`SIGSTOP`): nothing of it runs, time goes on; then it wakes.
    Freeze,
}

/// A node's fault at `at`: after `down`, a crashed or stopped node starts again with its clock
/// off by `skew_ms`, and a frozen one wakes.
#[derive(Clone, Copy, Debug)]
struct NodeFault {
    node: usize,
    at: Duration,
    kind: NodeFaultKind,
    down: Duration,
    skew_ms: i64,
}

/// A node: its instance while it is up, and the flag its handlers watch (a crashed process runs
/// no code, so its handlers stop).
struct Node {
    name: &'static str,
    instance: Option<Instance>,
    alive: Arc<AtomicBool>,
    frozen: Arc<Switch>,
}

/// Runs the schedule of `seed` to its end and returns what happened.
pub fn run(seed: u64) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime for the simulation");
    runtime.block_on(simulate(seed))
}

async fn simulate(seed: u64) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let history = History::new();
    let store_clock = Arc::new(TokioClock::new(START_MS));
    let sqlite = {
        let clock = store_clock.clone();
        Arc::new(
            SqliteStore::simulated("sim", Arc::new(move || clock.wall_ms() * 1_000))
                .expect("the simulated store opens"),
        )
    };
    let store: Arc<dyn Store> = sqlite.clone();
    // The faults this seed draws: store outages, the rates of request faults, node faults.
    let mut outages = Vec::new();
    for _ in 0..rng.random_range(0..=2) {
        let from = rng.random_range(5_000..FAULTS_UNTIL.as_millis() as i64 - 30_000);
        outages.push((from, from + rng.random_range(500..25_000)));
    }
    let outages = Arc::new(Spans::new(outages));
    let failovers: Vec<Failover> = (0..rng.random_range(0..=1))
        .map(|_| Failover {
            at_ms: rng.random_range(20_000..FAULTS_UNTIL.as_millis() as i64 - 40_000),
            lag_ms: rng.random_range(100..3_000),
            acknowledged: rng.random_bool(0.5),
        })
        .collect();
    let failovers = Arc::new(failovers);
    let lost_writes: LostWrites = Arc::default();
    let rates = [
        rng.random_range(0..=30),
        rng.random_range(0..=30),
        rng.random_range(0..=15),
        rng.random_range(0..=40),
    ];
    let mut node_faults = Vec::new();
    for _ in 0..rng.random_range(0..=4) {
        let at = Duration::from_millis(
            rng.random_range(2_000..FAULTS_UNTIL.as_millis() as u64 - 40_000),
        );
        node_faults.push(NodeFault {
            node: rng.random_range(0..NODES.len()),
            at,
            kind: match rng.random_range(0..10) {
                0..=3 => NodeFaultKind::Crash,
                4..=6 => NodeFaultKind::Freeze,
                _ => NodeFaultKind::Stop,
            },
            down: Duration::from_millis(rng.random_range(100..30_000)),
            skew_ms: rng.random_range(-300_000..=300_000),
        });
    }
    node_faults.sort_by_key(|f| f.at);
    history.note(format!(
        "seed {seed}: failovers {failovers:?}, outages {:?}, rates (lost, answer lost, delayed, slow per mille) {rates:?}, node faults {node_faults:?}",
        outages.0
    ));
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(rng.random())));
    let started = Instant::now();
    {
        let (sqlite, history, failovers) = (sqlite.clone(), history.clone(), failovers.clone());
        tokio::spawn(async move {
            for f in failovers.iter() {
                let replicated = Duration::from_millis((f.at_ms - f.lag_ms) as u64);
                tokio::time::sleep_until(started + replicated).await;
                sqlite.replicate().expect("the replica catches up");
                tokio::time::sleep_until(started + Duration::from_millis(f.at_ms as u64)).await;
                sqlite.fail_over().expect("the store fails over");
                history.note(format!(
                    "the store fails over, losing the writes of the last {} ms",
                    f.lag_ms
                ));
            }
        });
    }
    let faults = Faults {
        rng: rng.clone(),
        outages: outages.clone(),
        failovers: failovers.clone(),
        lost_writes: lost_writes.clone(),
        rates,
    };
    let mut nodes: Vec<Node> = Vec::new();
    for name in NODES {
        let mut node = Node {
            name,
            instance: None,
            alive: Arc::new(AtomicBool::new(false)),
            frozen: Arc::new(Switch::new()),
        };
        start(&mut node, &store, &faults, &history, 0).await;
        nodes.push(node);
    }
    let mut quiet_from = outages
        .last_end()
        .max(failovers.iter().map(|f| f.at_ms).max().unwrap_or(0));
    for fault in node_faults {
        tokio::time::sleep_until(started + fault.at).await;
        let node = &mut nodes[fault.node];
        if fault.kind == NodeFaultKind::Freeze {
            history.note(format!("{} freezes", node.name));
            node.frozen.set(true);
            tokio::time::sleep(fault.down).await;
            history.note(format!("{} wakes", node.name));
            node.frozen.set(false);
            quiet_from = quiet_from.max(history.now_ms());
            continue;
        }
        let Some(instance) = node.instance.take() else {
            continue;
        };
        if fault.kind == NodeFaultKind::Crash {
            history.note(format!("{} crashes", node.name));
            node.alive.store(false, Ordering::Release);
            drop(instance);
        } else {
            history.note(format!("{} stops with hand-over", node.name));
            instance.stop(Duration::from_secs(2)).await;
            node.alive.store(false, Ordering::Release);
            drop(instance);
        }
        tokio::time::sleep(fault.down).await;
        start(node, &store, &faults, &history, fault.skew_ms).await;
        quiet_from = quiet_from.max(history.now_ms());
    }
    tokio::time::sleep_until(started + LENGTH).await;
    for node in &mut nodes {
        if let Some(instance) = node.instance.take() {
            instance.stop(Duration::from_secs(5)).await;
        }
        node.alive.store(false, Ordering::Release);
    }
    let mut runs = Vec::new();
    for (job, _, _) in jobs() {
        runs.extend(
            store
                .history(job, 1_000)
                .await
                .expect("the store's history"),
        );
    }
    let lines = std::mem::take(&mut *history.lines.lock().unwrap_or_else(|p| p.into_inner()));
    let effects = std::mem::take(&mut *history.effects.lock().unwrap_or_else(|p| p.into_inner()));
    let lost_writes = std::mem::take(&mut *lost_writes.lock().unwrap_or_else(|p| p.into_inner()));
    Outcome {
        lines,
        effects,
        runs,
        lost_writes,
        quiet_from: quiet_from.max(FAULTS_UNTIL.as_millis() as i64 - 40_000),
        outages: outages.0.clone(),
    }
}

/// What the fault layer of every node draws from.
#[derive(Clone)]
pub struct Faults {
    /// The seeded randomness of the fault layer and the handlers.
    pub rng: Arc<Mutex<StdRng>>,
    /// When the store is out of reach.
    pub outages: Arc<Spans>,
    /// When the store fails over.
    pub failovers: Arc<Vec<Failover>>,
    /// Where answered writes a failover lost are noted.
    pub lost_writes: LostWrites,
    /// How often each request fault strikes (see [`FaultyStore`]).
    pub rates: [u32; 4],
}

/// Starts (or restarts) a node's instance, its clock off by `skew_ms`, retrying while the store
/// is out of reach as a supervisor would restart the process.
async fn start(
    node: &mut Node,
    store: &Arc<dyn Store>,
    faults: &Faults,
    history: &History,
    skew_ms: i64,
) {
    let rng = &faults.rng;
    let alive = Arc::new(AtomicBool::new(true));
    node.alive = alive.clone();
    let frozen = node.frozen.clone();
    let jobs = jobs()
        .into_iter()
        .map(|(name, cron, max_steps)| {
            let alive = alive.clone();
            let history = history.clone();
            let rng = rng.clone();
            let frozen = frozen.clone();
            let runner = node.name;
            Job {
                name: name.to_owned(),
                schedule: Schedule::parse(cron, "UTC").expect("a valid schedule"),
                options: options(),
                handler: handler_fn(move |ctx: RunContext| {
                    let (alive, history, frozen) = (alive.clone(), history.clone(), frozen.clone());
                    let steps = rng
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .random_range(1..=max_steps);
                    async move { work(runner, ctx, steps, &alive, frozen, &history).await }
                }),
            }
        })
        .collect::<Vec<_>>();
    loop {
        // The node's clock reads the true time, off by `skew_ms`.
        let clock = Arc::new(TokioClock::new(START_MS + history.now_ms()));
        clock.set_offset_ms(skew_ms);
        let seed = rng.lock().unwrap_or_else(|p| p.into_inner()).random();
        let faulty: Arc<dyn Store> = Arc::new(FaultyStore::new(
            store.clone(),
            node.name,
            faults.clone(),
            history.clone(),
        ));
        let env = Env {
            frozen: Some(frozen.clone()),
            ..Env::simulated(clock, seed)
        };
        match Instance::start_on(faulty, node.name, jobs.clone(), env).await {
            Ok(instance) => {
                let mut events = instance.subscribe();
                let forward = history.clone();
                tokio::spawn(async move {
                    while let Ok(event) = events.recv().await {
                        forward.event(event);
                    }
                });
                history.note(format!("{} starts, clock off by {skew_ms} ms", node.name));
                node.instance = Some(instance);
                return;
            }
            Err(e) => {
                history.note(format!("{} cannot start: {e}", node.name));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The native handler: `steps` steps of a second, each one side effect, which the host would
/// refuse once the lease deadline passed or the signal aborted. A frozen node's handler does
/// nothing until it wakes.
async fn work(
    node: &str,
    ctx: RunContext,
    steps: u64,
    alive: &AtomicBool,
    frozen: Arc<Switch>,
    history: &History,
) -> Result<(), String> {
    for _ in 0..steps {
        frozen.wait_for(false).await;
        if !alive.load(Ordering::Acquire) {
            return Err("the process is gone".into());
        }
        if ctx.signal.is_aborted() {
            return Err("aborted".into());
        }
        if ctx.deadline.has_passed() {
            return Err("fenced".into());
        }
        history.effect(node, &ctx);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}
