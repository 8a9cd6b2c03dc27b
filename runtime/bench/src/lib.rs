//! `baton bench`: what Baton costs and how fast it recovers, each figure measured in the same
//! run as what a user would use instead, so that the ratio holds on a noisy machine.
//!
//! One module per measurement:
//!
//! - [`store_ops`]: claim (won and running), heartbeat and finish against the store's raw
//!   primitive, at several numbers of concurrent clients;
//! - [`round_trips`]: store requests per successful run of a real [`Instance`], counted;
//! - [`wasm`]: the per-run overhead of a Wasm job against starting a native process, and the
//!   zombie stop (abort to guest stopped, for a guest that ignores the signal);
//! - [`failover`]: takeover after a killed runner and hand-over after stop, against the
//!   spec's bounds;
//! - [`scale`]: several host processes running many jobs every second on one store;
//! - [`capacity`]: the store's own time per due slot, against a lock on the same slots.
//!
//! Every figure is measured, never estimated; where a section cannot run (no components), the
//! report says why instead of a number.
//!
//! [`Instance`]: baton_core::instance::Instance

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use baton_core::instance::InstanceError;
use baton_core::lease::{
    ClaimKind, ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, Run, Token, TokenOutcome,
};
use baton_core::operate::{OperateOutcome, Operation, Operator, Request};
use baton_core::store::{Store, StoreError};

pub mod capacity;
pub mod failover;
pub mod report;
pub mod round_trips;
pub mod scale;
pub mod store_ops;
pub mod wasm;

/// Why a benchmark could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The store failed an operation.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An instance could not start.
    #[error(transparent)]
    Instance(#[from] InstanceError),
    /// The store answered something the benchmark cannot go on from, e.g. a claim of a fresh
    /// slot that did not win: another client is using the benchmark's namespace.
    #[error("{what}: expected {expected}, the store answered {got}")]
    Unexpected {
        /// The step.
        what: String,
        /// What the benchmark needed.
        expected: String,
        /// What came back.
        got: String,
    },
    /// Something did not happen within its time.
    #[error("{what} did not happen within {within:?}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long it was awaited.
        within: Duration,
    },
    /// The Wasm host could not start or a component could not be loaded.
    #[error("{0}")]
    Wasm(String),
    /// A process could not be started or waited for.
    #[error("{program}: {source}")]
    Process {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A host process of the scale run failed or reported something unreadable.
    #[error("scale host {host}: {reason}")]
    ScaleHost {
        /// The host's index.
        host: usize,
        /// What went wrong.
        reason: String,
    },
}

/// The spread of some measured durations, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// How many were measured.
    pub count: usize,
    /// The median, µs.
    pub median_us: f64,
    /// The 99th percentile (nearest rank), µs.
    pub p99_us: f64,
    /// The smallest, µs.
    pub min_us: f64,
    /// The largest, µs.
    pub max_us: f64,
    /// The mean, µs.
    pub mean_us: f64,
}

impl Stats {
    /// The statistics of `samples`; all zero when there are none.
    pub fn of(mut samples: Vec<Duration>) -> Stats {
        if samples.is_empty() {
            return Stats::default();
        }
        samples.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let n = samples.len();
        let median = if n % 2 == 1 {
            us(samples[n / 2])
        } else {
            (us(samples[n / 2 - 1]) + us(samples[n / 2])) / 2.0
        };
        // Nearest rank: the smallest sample at or above 99 % of them.
        let rank = ((n as f64) * 0.99).ceil() as usize;
        let p99 = us(samples[rank.clamp(1, n) - 1]);
        let total: f64 = samples.iter().copied().map(us).sum();
        Stats {
            count: n,
            median_us: median,
            p99_us: p99,
            min_us: us(samples[0]),
            max_us: us(samples[n - 1]),
            mean_us: total / n as f64,
        }
    }

    /// The statistics of figures already in milliseconds (store-clock differences).
    pub fn of_ms(samples: &[i64]) -> Stats {
        Stats::of(
            samples
                .iter()
                .map(|ms| Duration::from_millis(u64::try_from(*ms).unwrap_or(0)))
                .collect(),
        )
    }
}

/// `a / b`, or 0 when `b` is 0.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// How many store operations of each kind went through a [`Tally`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    /// Claims sent.
    pub claims: u64,
    /// Heartbeats sent.
    pub heartbeats: u64,
    /// Finishes sent.
    pub finishes: u64,
    /// Releases sent.
    pub releases: u64,
    /// Every other operation (clock reads, reads of runs).
    pub other: u64,
    /// The backend's own count of requests sent ([`Store::round_trips`]).
    pub round_trips: u64,
}

impl OpCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &OpCounts) -> OpCounts {
        OpCounts {
            claims: self.claims - earlier.claims,
            heartbeats: self.heartbeats - earlier.heartbeats,
            finishes: self.finishes - earlier.finishes,
            releases: self.releases - earlier.releases,
            other: self.other - earlier.other,
            round_trips: self.round_trips - earlier.round_trips,
        }
    }
}

#[derive(Default)]
struct Counters {
    claims: AtomicU64,
    heartbeats: AtomicU64,
    finishes: AtomicU64,
    releases: AtomicU64,
    other: AtomicU64,
}

/// A store that counts the operations sent through it, by kind, and passes each on unchanged.
/// Beside the backend's own request count it shows which operation each round trip belonged
/// to.
pub struct Tally {
    inner: Arc<dyn Store>,
    counters: Arc<Counters>,
}

/// A handle on a [`Tally`]'s counts that outlives the instance holding the store.
#[derive(Clone)]
pub struct TallyHandle {
    inner: Arc<dyn Store>,
    counters: Arc<Counters>,
}

impl Tally {
    /// Wraps `inner`; the handle reads the counts.
    pub fn wrap(inner: Arc<dyn Store>) -> (Arc<dyn Store>, TallyHandle) {
        let counters = Arc::new(Counters::default());
        let handle = TallyHandle {
            inner: inner.clone(),
            counters: counters.clone(),
        };
        (Arc::new(Tally { inner, counters }), handle)
    }
}

impl TallyHandle {
    /// The counts so far.
    pub fn counts(&self) -> OpCounts {
        let c = &self.counters;
        OpCounts {
            claims: c.claims.load(Ordering::Acquire),
            heartbeats: c.heartbeats.load(Ordering::Acquire),
            finishes: c.finishes.load(Ordering::Acquire),
            releases: c.releases.load(Ordering::Acquire),
            other: c.other.load(Ordering::Acquire),
            round_trips: self.inner.round_trips(),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::AcqRel);
}

#[async_trait]
impl Store for Tally {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn now(&self) -> Result<i64, StoreError> {
        bump(&self.counters.other);
        self.inner.now().await
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        bump(&self.counters.claims);
        self.inner.claim(request).await
    }

    async fn heartbeat(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        lease: Duration,
    ) -> Result<HeartbeatOutcome, StoreError> {
        bump(&self.counters.heartbeats);
        self.inner.heartbeat(job, slot, token, lease).await
    }

    async fn finish(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        result: Finish,
    ) -> Result<TokenOutcome, StoreError> {
        bump(&self.counters.finishes);
        self.inner.finish(job, slot, token, result).await
    }

    async fn release(
        &self,
        job: &str,
        slot: i64,
        token: Token,
    ) -> Result<TokenOutcome, StoreError> {
        bump(&self.counters.releases);
        self.inner.release(job, slot, token).await
    }

    async fn get(&self, job: &str, slot: i64) -> Result<Option<Run>, StoreError> {
        bump(&self.counters.other);
        self.inner.get(job, slot).await
    }

    async fn unfinished(&self, job: &str) -> Result<Vec<Run>, StoreError> {
        bump(&self.counters.other);
        self.inner.unfinished(job).await
    }

    async fn history(&self, job: &str, limit: usize) -> Result<Vec<Run>, StoreError> {
        bump(&self.counters.other);
        self.inner.history(job, limit).await
    }

    async fn jobs(&self) -> Result<Vec<String>, StoreError> {
        bump(&self.counters.other);
        self.inner.jobs().await
    }

    async fn forget_job(&self, job: &str) -> Result<(), StoreError> {
        bump(&self.counters.other);
        self.inner.forget_job(job).await
    }

    async fn raw_primitive(&self, key: &str) -> Result<bool, StoreError> {
        bump(&self.counters.other);
        self.inner.raw_primitive(key).await
    }

    async fn clear_raw_primitive(&self, prefix: &str) -> Result<(), StoreError> {
        bump(&self.counters.other);
        self.inner.clear_raw_primitive(prefix).await
    }

    async fn raw_release(&self, key: &str) -> Result<bool, StoreError> {
        bump(&self.counters.other);
        self.inner.raw_release(key).await
    }

    async fn server_time(&self) -> Result<Option<baton_core::store::ServerTime>, StoreError> {
        self.inner.server_time().await
    }

    async fn step_floor(&self) -> Result<Option<baton_core::store::StepFloor>, StoreError> {
        self.inner.step_floor().await
    }

    async fn state_get(
        &self,
        job: &str,
        key: &str,
    ) -> Result<Option<baton_core::state::StateEntry>, StoreError> {
        bump(&self.counters.other);
        self.inner.state_get(job, key).await
    }

    async fn state_keys(&self, job: &str) -> Result<Vec<baton_core::state::StateKey>, StoreError> {
        bump(&self.counters.other);
        self.inner.state_keys(job).await
    }

    async fn state_write(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        write: &baton_core::state::StateWrite<'_>,
        limits: &baton_core::state::StateLimits,
    ) -> Result<baton_core::state::StateOutcome, StoreError> {
        bump(&self.counters.other);
        self.inner
            .state_write(job, slot, token, write, limits)
            .await
    }

    async fn state_remove(&self, job: &str, key: &str) -> Result<bool, StoreError> {
        bump(&self.counters.other);
        self.inner.state_remove(job, key).await
    }

    fn round_trips(&self) -> u64 {
        self.inner.round_trips()
    }

    async fn operate(
        &self,
        job: &str,
        request: Request,
        by: &Operator,
    ) -> Result<OperateOutcome, StoreError> {
        bump(&self.counters.other);
        self.inner.operate(job, request, by).await
    }

    async fn paused(&self) -> Result<Vec<Operation>, StoreError> {
        bump(&self.counters.other);
        self.inner.paused().await
    }

    async fn operations(
        &self,
        job: Option<&str>,
        since: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, StoreError> {
        bump(&self.counters.other);
        self.inner.operations(job, since, limit).await
    }
}

/// A claim of a fresh slot, for the benchmarks that drive the store directly.
pub(crate) fn claim_request<'a>(
    job: &'a str,
    slot: i64,
    runner: &'a str,
    token: Token,
    options: &'a baton_core::lease::LeaseOptions,
) -> ClaimRequest<'a> {
    ClaimRequest {
        job,
        slot,
        kind: ClaimKind::Scheduled,
        runner,
        token,
        digest: None,
        options,
    }
}

/// A cron expression (UTC, with seconds) whose only slot each year is the whole second
/// `slot_ms`: for the benchmarks that need one run of a job at a known time.
pub(crate) fn once_at(slot_ms: i64) -> Result<baton_core::schedule::Schedule, BenchError> {
    use chrono::{Datelike, Timelike};
    let at =
        chrono::DateTime::from_timestamp_millis(slot_ms).ok_or_else(|| BenchError::Unexpected {
            what: "a one-slot schedule".into(),
            expected: "a representable time".into(),
            got: format!("{slot_ms} ms"),
        })?;
    let cron = format!(
        "{} {} {} {} {} *",
        at.second(),
        at.minute(),
        at.hour(),
        at.day(),
        at.month()
    );
    baton_core::schedule::Schedule::parse(&cron, "UTC").map_err(|e| BenchError::Unexpected {
        what: "a one-slot schedule".into(),
        expected: "a valid cron expression".into(),
        got: format!("{cron:?}: {e}"),
    })
}

/// A name for one benchmark run's namespace or keys: `bench-<pid>-<random>`.
pub fn unique_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// The machine the figures were taken on: its load averages and CPUs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Machine {
    /// The 1, 5 and 15 minute load averages from `/proc/loadavg` (empty where unreadable).
    pub load_average: Vec<f64>,
    /// The CPUs this process may use.
    pub cpus: usize,
}

impl Machine {
    /// Reads the machine's figures now.
    pub fn now() -> Machine {
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .map(|s| {
                s.split_whitespace()
                    .take(3)
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        Machine {
            load_average,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_median_and_p99_by_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let s = Stats::of(samples);
        assert_eq!(s.count, 100);
        assert_eq!(s.median_us, 50.5);
        assert_eq!(s.p99_us, 99.0);
        assert_eq!(s.min_us, 1.0);
        assert_eq!(s.max_us, 100.0);
        let one = Stats::of(vec![Duration::from_micros(7)]);
        assert_eq!((one.median_us, one.p99_us), (7.0, 7.0));
        assert_eq!(Stats::of(Vec::new()).count, 0);
    }

    #[test]
    fn once_at_names_only_that_second() {
        let slot = 1_767_225_601_000; // 2026-01-01T00:00:01Z
        let schedule = once_at(slot).expect("a schedule");
        assert_eq!(schedule.next_after(slot - 1), Some(slot));
    }
}
