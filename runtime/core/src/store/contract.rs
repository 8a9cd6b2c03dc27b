//! The store contract of `DESIGN.md`: every operation is atomic and reads the time from the
//! store's own clock. Each backend implements [`Store`]; the shared conformance suite holds
//! them all to it.

use std::time::Duration;

use async_trait::async_trait;

use crate::lease::{
    ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, Run, Token, TokenOutcome,
};
use crate::operate::{OperateOutcome, Operation, Operator, Request};
use crate::state::{StateEntry, StateKey, StateLimits, StateOutcome, StateWrite};

/// The server's own time spent on commands, cumulative since it started counting (see
/// [`Store::server_time`]): two readings' difference is what happened between them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerTime {
    /// On Baton's atomic steps (the scripts on Redis, the functions on PostgreSQL), µs.
    pub steps_us: f64,
    /// On the raw primitive and its release (`SET` and `DEL`; the scratch table's `INSERT`
    /// and `DELETE`), µs.
    pub primitive_us: f64,
    /// Where the figures come from: `INFO commandstats` or `pg_stat_statements`.
    pub source: &'static str,
}

/// The floor of a script-based step on the server (see [`Store::step_floor`]): the server's own
/// time of each of Baton's atomic steps when it makes only the calls it cannot do without and
/// runs no logic of its own, µs a call.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct StepFloor {
    /// A script that only returns.
    pub empty_script_us: f64,
    /// A losing claim: one read of the slot's lease key, found.
    pub losing_claim_us: f64,
    /// A won claim: the clock, one read and one write of the job's live hash, and the lease
    /// key written with its expiry.
    pub won_claim_us: f64,
    /// A finish: one read and one write of the live hash, the clock, and the lease key deleted.
    pub finish_us: f64,
    /// How many times each step was called.
    pub calls: u32,
}

impl StepFloor {
    /// The floor of one due slot claimed by `hosts` hosts: one won claim, `hosts - 1` losing
    /// ones, and the finish, µs.
    pub fn per_slot_us(&self, hosts: usize) -> f64 {
        self.won_claim_us + self.finish_us + self.losing_claim_us * hosts.saturating_sub(1) as f64
    }
}

/// The boxed cause of a store error.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What can go wrong talking to a store. Messages name the store (a path, or a host and port,
/// never a password) and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL is malformed.
    #[error("invalid store url {url:?}: {reason}")]
    InvalidUrl {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The URL's scheme names no backend.
    #[error(
        "unknown store scheme {scheme:?}; use sqlite://PATH, redis://HOST:PORT, \
         valkey://HOST:PORT or postgres://USER@HOST:PORT/DB"
    )]
    UnknownScheme {
        /// The scheme given.
        scheme: String,
    },
    /// The store could not be reached (refused, timed out, dropped). Worth retrying.
    #[error("cannot reach store {store}: {source}")]
    Unreachable {
        /// Host and port, or path.
        store: String,
        /// Why.
        #[source]
        source: Cause,
    },
    /// The store is a server of the wrong kind, or too old.
    #[error("store {store} is not supported: {reason}")]
    Unsupported {
        /// Host and port.
        store: String,
        /// What was found and what is needed.
        reason: String,
    },
    /// The database file is not a database, or is damaged.
    #[error("{path} is not a Baton database or is corrupt ({source}); move it aside or point --store at another file")]
    Corrupt {
        /// The file.
        path: String,
        /// The database's own error.
        #[source]
        source: Cause,
    },
    /// The database file or its directory cannot be written.
    #[error("{path} is read-only ({source}); Baton must write to its store: fix the file's permissions or use another path")]
    ReadOnly {
        /// The file.
        path: String,
        /// The database's own error.
        #[source]
        source: Cause,
    },
    /// The database was written by a newer Baton.
    #[error("{path} has schema version {found}, but this Baton knows versions up to {supported}; upgrade Baton")]
    NewerSchema {
        /// The file or database.
        path: String,
        /// The version found.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// A stored record could not be read back.
    #[error("store {store} holds a malformed record for job {job:?}: {reason}")]
    Malformed {
        /// Host and port, or path.
        store: String,
        /// The job.
        job: String,
        /// What is wrong.
        reason: String,
    },
    /// The URL names a backend this build of Baton was compiled without.
    #[error(
        "this build has no {scheme} store: build baton-core with the cargo feature {feature:?}"
    )]
    NotBuilt {
        /// The URL's scheme.
        scheme: String,
        /// The cargo feature that adds the backend.
        feature: &'static str,
    },
    /// The store acted on a write, but fewer of its replicas than required acknowledged it
    /// within the wait (Redis and Valkey, `?replicas=`): a failover now could lose it. Sending
    /// the same call again is safe (a claim with the same token wins its own run back; a finish
    /// already recorded is refused with the run's state) and waits for the replicas again. An
    /// instance does not start a job on a claim that ends so.
    #[error(
        "store {store}: {acknowledged} of {required} replicas acknowledged the {operation} \
         within {timeout:?}; a failover now could lose it"
    )]
    NotAcknowledged {
        /// Host and port.
        store: String,
        /// What was written: `claim`, `heartbeat`, `finish`, `release` or `state write`.
        operation: &'static str,
        /// How many replicas acknowledged it.
        acknowledged: u32,
        /// How many were required.
        required: u32,
        /// How long the store waited for them.
        timeout: Duration,
    },
    /// Any other error the backend reported.
    #[error("store {store}: {source}")]
    Backend {
        /// Host and port, or path.
        store: String,
        /// The backend's error.
        #[source]
        source: Cause,
    },
}

impl StoreError {
    /// Whether the same call may succeed if sent again: the store was out of reach, it
    /// answered with a passing error, or its replicas did not acknowledge the write in time.
    /// Every store operation is safe to retry: a retried claim cannot make two winners, since
    /// the first one's record answers the second.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Unreachable { .. }
                | StoreError::Backend { .. }
                | StoreError::NotAcknowledged { .. }
        )
    }
}

/// The shared store: claims, leases and the record of every run.
///
/// Every method is one atomic step on the store, with all lease times read from the store's own
/// clock inside it. An I/O failure is an `Err`, never a refusal: a heartbeat that did not reach
/// the store is not [`HeartbeatOutcome::Lost`].
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The backend's name: `sqlite`, `redis`, `postgres`.
    fn backend(&self) -> &'static str;

    /// The store's clock, ms since the Unix epoch.
    async fn now(&self) -> Result<i64, StoreError>;

    /// Claims a run (rules 1, 3, 5 and 6): see [`ClaimOutcome`] for the answers.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// Renews the lease to now + `lease`, only with the current token and only while the lease
    /// was not released (rule 2).
    async fn heartbeat(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        lease: Duration,
    ) -> Result<HeartbeatOutcome, StoreError>;

    /// Records the end of the run, only with the current token (rule 4).
    async fn finish(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        result: Finish,
    ) -> Result<TokenOutcome, StoreError>;

    /// Ends the lease now and records a hand-over, only with the current token (rule 4). A
    /// backup then takes the run over, and the attempt does not count toward `max_attempts`.
    async fn release(&self, job: &str, slot: i64, token: Token)
        -> Result<TokenOutcome, StoreError>;

    /// One run's record.
    async fn get(&self, job: &str, slot: i64) -> Result<Option<Run>, StoreError>;

    /// The runs of a job whose status is running (their lease alive or not), oldest first.
    async fn unfinished(&self, job: &str) -> Result<Vec<Run>, StoreError>;

    /// Up to `limit` runs of a job, newest first.
    async fn history(&self, job: &str, limit: usize) -> Result<Vec<Run>, StoreError>;

    /// The names of the jobs that have runs in this namespace, sorted.
    async fn jobs(&self) -> Result<Vec<String>, StoreError>;

    /// Deletes every record of a job in this namespace: its runs, its fence counter, its name
    /// and its state. An instance never calls it; `baton bench` does, to leave no runs of its own behind.
    /// Deleting a job whose runs a live instance still claims breaks the spec's rules for that
    /// job (a late claim would find no state), so only forget jobs that nobody runs.
    async fn forget_job(&self, job: &str) -> Result<(), StoreError>;

    /// The backend's cheapest atomic conditional write, sent as one request on the store's own
    /// connections (pool): the floor a claim is measured against by `baton bench`. It writes
    /// `key` in this namespace if it is absent and answers whether it did:
    ///
    /// - Redis and Valkey: `SET key 1 NX PX 600000` (the key expires after 10 minutes);
    /// - PostgreSQL and SQLite: `INSERT INTO baton_bench_scratch … ON CONFLICT DO NOTHING`, one
    ///   autocommitted statement into a scratch table that holds nothing else.
    ///
    /// On Redis the key carries the namespace's hash tag, so it is valid on a cluster.
    async fn raw_primitive(&self, key: &str) -> Result<bool, StoreError>;

    /// Deletes what [`Store::raw_primitive`] wrote in this namespace under keys that start
    /// with `prefix`.
    async fn clear_raw_primitive(&self, prefix: &str) -> Result<(), StoreError>;

    /// Deletes the one `key` that [`Store::raw_primitive`] wrote, as one request, and answers
    /// whether it was there: the release of a lock built on the raw primitive (Redis and Valkey
    /// `DEL key`; PostgreSQL and SQLite one `DELETE` from the scratch table).
    async fn raw_release(&self, key: &str) -> Result<bool, StoreError>;

    /// The server's own time spent so far on Baton's atomic steps and on the raw primitive,
    /// where the server keeps such counts: Redis and Valkey `INFO commandstats` (summed over a
    /// cluster's primaries), PostgreSQL `pg_stat_statements` when that extension is loaded.
    /// `None` where nothing keeps them (SQLite, a PostgreSQL without the extension).
    async fn server_time(&self) -> Result<Option<ServerTime>, StoreError> {
        Ok(None)
    }

    /// Measures the floor of the backend's atomic steps on this server, where they are scripts
    /// that the server times (Redis and Valkey: [`StepFloor`]), on scratch keys of this
    /// namespace that it deletes afterwards. For `baton bench capacity`; `None` elsewhere.
    async fn step_floor(&self) -> Result<Option<StepFloor>, StoreError> {
        Ok(None)
    }

    /// One key of a job's state, with its value and its writer; `None` when the key has no
    /// value. A plain read: no token, no lease.
    async fn state_get(&self, job: &str, key: &str) -> Result<Option<StateEntry>, StoreError>;

    /// Every key of a job's state with its size and its writer, sorted by key. A plain read.
    async fn state_keys(&self, job: &str) -> Result<Vec<StateKey>, StoreError>;

    /// One write to a job's state, fenced: accepted only if `token` is the current attempt of
    /// the run at `slot`, that run is running, its lease not released and alive by the store's
    /// clock, all checked in the same atomic step that writes (one round trip). An accepted
    /// write records the attempt's slot, attempt and fence and the store's clock with the key.
    /// A write past `limits` is [`StateOutcome::Refused`]: key and value sizes before the store
    /// is asked, the key count inside the step.
    async fn state_write(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        write: &StateWrite<'_>,
        limits: &StateLimits,
    ) -> Result<StateOutcome, StoreError>;

    /// Deletes one key of a job's state, without a token: an operator's action (`baton state
    /// JOB --delete KEY`), never an attempt's. Answers whether the key existed.
    async fn state_remove(&self, job: &str, key: &str) -> Result<bool, StoreError>;

    /// How many requests this client has sent to the store since it was opened, counting
    /// every one whose answer it waited for: one per round trip. A retry, a script sent again
    /// after `NOSCRIPT`, or the registration of a job's name each count. On Redis and Valkey
    /// each command (or pipeline) sent on the connection counts, but not the replica count that
    /// `?replicas=auto` reads every 5 s beside the operations; on PostgreSQL each statement
    /// executed; on SQLite, which has no server, each transaction or statement on the file.
    fn round_trips(&self) -> u64;

    // Operating a cluster (see `crate::operate`).

    /// Pauses, resumes or triggers a job, at the store's clock, and records who asked. A pause
    /// sets the flag every claim of the job reads in its atomic step (pausing a paused job
    /// records the new pause); a resume clears it; a trigger of a paused job is refused with
    /// [`OperateOutcome::Paused`], otherwise it records a manual run due at the store's clock,
    /// which the instances then claim. The store does not know which jobs exist: the caller
    /// checks the name.
    async fn operate(
        &self,
        job: &str,
        request: Request,
        by: &Operator,
    ) -> Result<OperateOutcome, StoreError>;

    /// The pauses in force in this namespace, one per paused job, sorted by job.
    async fn paused(&self) -> Result<Vec<Operation>, StoreError>;

    /// The operations recorded at or after `since` (store clock, ms), of one job or (`None`)
    /// of every job in the namespace, newest first, at most `limit`. The store keeps the newest
    /// [`OPERATIONS_KEPT`](crate::operate::OPERATIONS_KEPT) of a namespace.
    async fn operations(
        &self,
        job: Option<&str>,
        since: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, StoreError>;
}
