//! Claim (won and running), heartbeat, a state write and finish, each next to the store's raw primitive
//! ([`Store::raw_primitive`]) on the same client and connections, at several numbers of
//! concurrent clients.
//!
//! For each number of clients the benchmark runs rounds of five phases, one operation kind a
//! phase: raw primitive, claim of a new slot (won), the same claim by another runner
//! (running), heartbeat, a fenced state write (an increment with the attempt's token), finish. Every client works on jobs of its own, so claims do not wait
//! for one another's rows, and each round claims the next slot of every job after the last
//! round finished the previous one: the claim that wins is the everyday claim of a job's new
//! slot, with the overlap check finding nothing alive. Round 0 warms up (prepared statements,
//! loaded scripts, the registration of job names) and is not counted. Alternating the phases
//! round by round keeps the ratios honest when the machine's load changes during the run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{claim_request, ratio, BenchError, Stats};
use baton_core::lease::{
    ClaimOutcome, Finish, HeartbeatOutcome, LeaseOptions, Token, TokenOutcome,
};
use baton_core::state::{StateLimits, StateOutcome, StateWrite, Written};
use baton_core::store::Store;

/// How the store operations are measured.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The numbers of concurrent clients, one measurement each. Defaults to 1, 8 and 64.
    pub clients: Vec<usize>,
    /// How many operations of each kind to measure at each number of clients, over all
    /// rounds and clients (at least one per client and round). Defaults to 3000.
    pub samples: usize,
    /// How many measured rounds the phases alternate in: more, shorter phases keep the
    /// ratios steadier when the load changes. Defaults to 10.
    pub rounds: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            clients: vec![1, 8, 64],
            samples: 3000,
            rounds: 10,
        }
    }
}

/// One operation kind's figures at one number of clients.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpFigures {
    /// Each operation's latency, sent to answered.
    pub latency: Stats,
    /// Operations a second, all clients together, over the phases' wall time.
    pub throughput_per_s: f64,
    /// Requests the store client sent per operation ([`Store::round_trips`]).
    pub round_trips_per_op: f64,
}

/// The figures at one number of concurrent clients.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClientsRow {
    /// How many clients ran at once.
    pub clients: usize,
    /// The raw primitive.
    pub raw_primitive: OpFigures,
    /// A claim of a new slot that wins.
    pub claim_won: OpFigures,
    /// A claim of a slot another runner holds (the answer is running).
    pub claim_running: OpFigures,
    /// A heartbeat that renews.
    pub heartbeat: OpFigures,
    /// A fenced state write that is accepted: an increment of one key with the current
    /// attempt's token (see [`Store::state_write`]).
    pub state_write: OpFigures,
    /// A finish that is accepted.
    pub finish: OpFigures,
    /// Median latency of each operation over the raw primitive's, measured in the same run.
    pub ratios: Ratios,
}

/// Median latencies over the raw primitive's median latency.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Ratios {
    /// Claim (won) / raw primitive.
    pub claim_won: f64,
    /// Claim (running) / raw primitive.
    pub claim_running: f64,
    /// Heartbeat / raw primitive.
    pub heartbeat: f64,
    /// State write / raw primitive.
    pub state_write: f64,
    /// Finish / raw primitive.
    pub finish: f64,
    /// Claim (won) p99 / raw primitive p99.
    pub claim_won_p99: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Raw,
    Won,
    Running,
    Heartbeat,
    StateWrite,
    Finish,
}

const PHASES: [Phase; 6] = [
    Phase::Raw,
    Phase::Won,
    Phase::Running,
    Phase::Heartbeat,
    Phase::StateWrite,
    Phase::Finish,
];

#[derive(Default)]
struct Collected {
    samples: Vec<Duration>,
    wall: Duration,
    ops: usize,
    round_trips: u64,
}

/// One client's jobs and the tokens of their current runs.
struct Client {
    jobs: Vec<String>,
    tokens: Vec<Token>,
}

/// Measures every number of clients of `settings` on `store`, which should be opened in a
/// namespace of its own: the jobs are forgotten and the raw primitive's keys cleared at the
/// end, and nothing else in the namespace is touched.
pub async fn measure(
    store: Arc<dyn Store>,
    settings: &Settings,
) -> Result<Vec<ClientsRow>, BenchError> {
    let mut rows = Vec::new();
    for &clients in &settings.clients {
        rows.push(measure_clients(store.clone(), clients, settings).await?);
    }
    Ok(rows)
}

async fn measure_clients(
    store: Arc<dyn Store>,
    clients: usize,
    settings: &Settings,
) -> Result<ClientsRow, BenchError> {
    let clients = clients.max(1);
    let rounds = settings.rounds.max(1);
    let per_client = settings.samples.div_ceil(rounds * clients).max(1);
    let run_id = super::unique_name("raw");
    let mut state: Vec<Client> = (0..clients)
        .map(|c| Client {
            jobs: (0..per_client)
                .map(|i| format!("bench-{run_id}-c{clients}-k{c}-j{i}"))
                .collect(),
            tokens: vec![Token::random(); per_client],
        })
        .collect();
    let mut collected: Vec<Collected> = PHASES.iter().map(|_| Collected::default()).collect();
    let result = async {
        let mut slot = i64::MIN;
        for round in 0..=rounds {
            // A new slot of every job, never late by the store's clock.
            slot = store.now().await?.max(slot + 1);
            for (p, phase) in PHASES.iter().enumerate() {
                let (samples, wall, round_trips) =
                    run_phase(&store, &mut state, *phase, slot, &run_id, round).await?;
                if round > 0 {
                    let c = &mut collected[p];
                    c.ops += samples.len();
                    c.samples.extend(samples);
                    c.wall += wall;
                    c.round_trips += round_trips;
                }
            }
        }
        Ok::<(), BenchError>(())
    }
    .await;
    let cleanup = clean_up(&store, &state, &run_id).await;
    result?;
    cleanup?;
    let figures = |c: Collected| OpFigures {
        throughput_per_s: ratio(c.ops as f64, c.wall.as_secs_f64()),
        round_trips_per_op: ratio(c.round_trips as f64, c.ops as f64),
        latency: Stats::of(c.samples),
    };
    let mut it = collected.into_iter().map(figures);
    let mut next = || it.next().unwrap_or_default();
    let (raw, won, running, heartbeat, state_write, finish) =
        (next(), next(), next(), next(), next(), next());
    let m = |f: &OpFigures| ratio(f.latency.median_us, raw.latency.median_us);
    Ok(ClientsRow {
        clients,
        ratios: Ratios {
            claim_won: m(&won),
            claim_running: m(&running),
            heartbeat: m(&heartbeat),
            state_write: m(&state_write),
            finish: m(&finish),
            claim_won_p99: ratio(won.latency.p99_us, raw.latency.p99_us),
        },
        raw_primitive: raw,
        claim_won: won,
        claim_running: running,
        heartbeat,
        state_write,
        finish,
    })
}

/// Runs one phase on every client at once; returns each operation's latency, the phase's wall
/// time and the requests the store sent during it.
async fn run_phase(
    store: &Arc<dyn Store>,
    state: &mut [Client],
    phase: Phase,
    slot: i64,
    run_id: &str,
    round: usize,
) -> Result<(Vec<Duration>, Duration, u64), BenchError> {
    let options = LeaseOptions::default();
    let start = Arc::new(tokio::sync::Barrier::new(state.len() + 1));
    let mut tasks = Vec::with_capacity(state.len());
    for (c, client) in state.iter().enumerate() {
        let store = store.clone();
        let start = start.clone();
        let jobs = client.jobs.clone();
        let tokens = client.tokens.clone();
        let raw_prefix = format!("{run_id}-r{round}-k{c}-");
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let mut samples = Vec::with_capacity(jobs.len());
            let mut new_tokens = tokens.clone();
            for (i, job) in jobs.iter().enumerate() {
                let began = Instant::now();
                match phase {
                    Phase::Raw => {
                        let key = format!("{raw_prefix}{i}");
                        let wrote = store.raw_primitive(&key).await?;
                        expect(wrote, "raw primitive of a new key", "written", || {
                            "the key exists".into()
                        })?;
                    }
                    Phase::Won => {
                        let token = Token::random();
                        let request = claim_request(job, slot, "bench-a", token, &options);
                        let outcome = store.claim(&request).await?;
                        expect(
                            matches!(outcome, ClaimOutcome::Won(_)),
                            "claim of a new slot",
                            "won",
                            || format!("{outcome:?}"),
                        )?;
                        new_tokens[i] = token;
                    }
                    Phase::Running => {
                        let request =
                            claim_request(job, slot, "bench-b", Token::random(), &options);
                        let outcome = store.claim(&request).await?;
                        expect(
                            matches!(outcome, ClaimOutcome::Running { .. }),
                            "claim of a slot another runner holds",
                            "running",
                            || format!("{outcome:?}"),
                        )?;
                    }
                    Phase::Heartbeat => {
                        let outcome = store.heartbeat(job, slot, tokens[i], options.lease).await?;
                        expect(
                            matches!(outcome, HeartbeatOutcome::Renewed { .. }),
                            "heartbeat with the current token",
                            "renewed",
                            || format!("{outcome:?}"),
                        )?;
                    }
                    Phase::StateWrite => {
                        let write = StateWrite::Increment {
                            key: "bench",
                            by: 1,
                        };
                        let outcome = store
                            .state_write(job, slot, tokens[i], &write, &StateLimits::default())
                            .await?;
                        expect(
                            matches!(outcome, StateOutcome::Written(Written::Incremented(_))),
                            "state write with the current token",
                            "incremented",
                            || format!("{outcome:?}"),
                        )?;
                    }
                    Phase::Finish => {
                        let outcome = store.finish(job, slot, tokens[i], Finish::Success).await?;
                        expect(
                            outcome == TokenOutcome::Accepted,
                            "finish with the current token",
                            "accepted",
                            || format!("{outcome:?}"),
                        )?;
                    }
                }
                samples.push(began.elapsed());
            }
            Ok::<_, BenchError>((samples, new_tokens))
        }));
    }
    let round_trips_before = store.round_trips();
    start.wait().await;
    let began = Instant::now();
    let mut all = Vec::new();
    let mut failure = None;
    for (client, task) in state.iter_mut().zip(tasks) {
        match task.await {
            Ok(Ok((samples, tokens))) => {
                all.extend(samples);
                client.tokens = tokens;
            }
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(join) => {
                failure = failure.or(Some(BenchError::Unexpected {
                    what: "a benchmark client".into(),
                    expected: "to end".into(),
                    got: join.to_string(),
                }))
            }
        }
    }
    let wall = began.elapsed();
    if let Some(e) = failure {
        return Err(e);
    }
    Ok((all, wall, store.round_trips() - round_trips_before))
}

fn expect(
    ok: bool,
    what: &str,
    expected: &str,
    got: impl FnOnce() -> String,
) -> Result<(), BenchError> {
    if ok {
        Ok(())
    } else {
        Err(BenchError::Unexpected {
            what: what.into(),
            expected: expected.into(),
            got: got(),
        })
    }
}

/// Forgets the benchmark's jobs and clears its raw keys.
async fn clean_up(
    store: &Arc<dyn Store>,
    state: &[Client],
    run_id: &str,
) -> Result<(), BenchError> {
    for client in state {
        for job in &client.jobs {
            store.forget_job(job).await?;
        }
    }
    store.clear_raw_primitive(run_id).await?;
    Ok(())
}
