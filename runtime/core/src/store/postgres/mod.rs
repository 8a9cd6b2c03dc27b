//! The PostgreSQL store: PostgreSQL 13 or newer, through a pool of connections of its own
//! (`connections.rs`: nothing is sent but the statements).
//!
//! Every operation is one round trip: a call of one PL/pgSQL function (`baton_claim`,
//! `baton_heartbeat`, `baton_finish`, `baton_release`) that runs the algorithm of the store
//! contract (see `model.rs`) inside its own transaction, with the time read from the server's
//! `clock_timestamp()` once it holds its lock. Claims of one job serialize on a lock of the
//! job's row in `baton_jobs`, which holds its fence counter, so two claims of different slots
//! can never both see "no live run"; a claim also locks the runs it may change, so a heartbeat,
//! finish or release (which lock only their run's row) never races it.
//!
//! The tables and functions live in one schema, `baton` unless the URL says
//! `?schema=NAME`, created and upgraded by embedded migrations; a run is kept as the JSON record
//! of [`Run`], with the namespace, job, slot, status and lease end in columns beside it.

/// Runs one statement on a connection of the store's own pool, within the store's timeout
/// (`?timeout=`, [`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT) unless given), which covers the wait for a connection
/// too: `bounded!(self, c => query.fetch_one(c))`. Counted (see [`Store::round_trips`]). A
/// statement cut short this way still ends on the server; its connection is closed.
macro_rules! bounded {
    ($store:expr, $c:ident => $statement:expr) => {{
        let store = $store;
        let deadline = tokio::time::Instant::now() + store.timeout;
        match store.pool.acquire(deadline).await {
            Err(e) => Err(store.no_connection(e)),
            Ok(mut held) => {
                store
                    .round_trips
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let answer = {
                    let $c: &mut sqlx::PgConnection = held.connection();
                    tokio::time::timeout_at(deadline, $statement).await
                };
                held.ended(&answer);
                store.answered(answer)
            }
        }
    }};
}

mod connections;
mod schema;
mod state;
mod url;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{Connection, PgConnection, Row};

use crate::lease::{
    millis, ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, Lease, Overlap, Run, RunState,
    Status, Token, TokenOutcome,
};
use crate::operate::{OperateOutcome, Operation, Operator, Request, OPERATIONS_KEPT};
use crate::state::{StateEntry, StateKey, StateLimits, StateOutcome, StateWrite};
use crate::store::contract::{ServerTime, Store, StoreError};
use crate::store::url::TIMEOUT_PARAMETER;

pub use schema::{MIN_SERVER_VERSION, SCHEMA_VERSION};
pub use url::DEFAULT_SCHEMA;

use connections::{Connections, NoConnection};
use url::Target;

/// How long opening the store waits for the server before it fails with
/// [`StoreError::Unreachable`]: 5 s. Each operation then waits for a connection of the pool and
/// for the server's answer as long as the URL's `?timeout=` says, 5 s unless given
/// ([`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT)).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How many connections one store keeps to the server at most. 10.
pub const POOL_SIZE: u32 = 10;

/// How many connections one store opens at once and keeps open while idle: 2, so that a claim
/// and a heartbeat at the same moment both find a connection ready, and a slot's first claim
/// does not wait for a new connection (a new server process) while its rivals' leases run.
pub const WARM_CONNECTIONS: u32 = 2;

/// Opens a PostgreSQL store from a `postgres://` or `postgresql://` URL:
/// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?schema=NAME&timeout=DURATION]`, with any other
/// parameter sqlx understands (`sslmode`, …). The schema defaults to `baton`, and is created if
/// needed; `timeout` bounds each operation's wait for a connection and an answer, 5 s unless
/// given (see [`TIMEOUT_PARAMETER`](crate::store::TIMEOUT_PARAMETER)).
///
/// Fails with [`StoreError::Unreachable`] when the server does not answer within
/// [`CONNECT_TIMEOUT`], [`StoreError::Unsupported`] for a server that is not PostgreSQL 13 or
/// newer, and [`StoreError::NewerSchema`] for a schema written by a newer Baton; each names the
/// server, never the password.
pub async fn open(url: &str, namespace: &str) -> Result<Arc<dyn Store>, StoreError> {
    let target = Target::parse(url)?;
    set_up(&target).await?;
    let pool = Connections::open(target.options.clone(), POOL_SIZE, WARM_CONNECTIONS)
        .await
        .map_err(|e| map_error(&target.store(), e))?;
    Ok(Arc::new(PostgresStore {
        sql: Queries::new(&target.quoted_schema()),
        state_sql: state::Queries::new(&target.quoted_schema()),
        store: target.store(),
        namespace: namespace.to_owned(),
        pool,
        round_trips: AtomicU64::new(0),
        timeout: target.timeout,
    }))
}

/// Checks the server and migrates the schema, on a connection of its own.
async fn set_up(target: &Target) -> Result<(), StoreError> {
    let mut conn = connect(target).await?;
    schema::check_server(&mut conn, target).await?;
    schema::migrate(&mut conn, target).await?;
    // The setup connection is not the pool's; a failure to say goodbye changes nothing.
    let _ = conn.close().await;
    Ok(())
}

/// Opens the setup connection, within [`CONNECT_TIMEOUT`].
async fn connect(target: &Target) -> Result<PgConnection, StoreError> {
    let store = target.store();
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&target.options)).await {
        Err(_) => Err(StoreError::Unreachable {
            store,
            source: format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()).into(),
        }),
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(sqlx::Error::Protocol(reason))) => Err(StoreError::Unsupported {
            store,
            reason: format!(
                "it does not speak the PostgreSQL protocol ({reason}); \
                 PostgreSQL 13 or newer is needed"
            ),
        }),
        Ok(Err(e)) => Err(map_error(&store, e)),
    }
}

/// Maps a sqlx error to the store's: lost or refused connections are
/// [`StoreError::Unreachable`], records that do not decode [`StoreError::Malformed`], anything
/// else the server said [`StoreError::Backend`] (both retryable).
pub(crate) fn map_error(store: &str, e: sqlx::Error) -> StoreError {
    let store = store.to_owned();
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unreachable {
            store,
            source: e.into(),
        },
        sqlx::Error::Database(ref db) if db.code().is_some_and(|c| is_connection_code(&c)) => {
            StoreError::Unreachable {
                store,
                source: e.into(),
            }
        }
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => StoreError::Malformed {
            store,
            job: String::new(),
            reason: e.to_string(),
        },
        other => StoreError::Backend {
            store,
            source: other.into(),
        },
    }
}

/// SQLSTATEs that mean the connection or the server went away: class 08 (connection
/// exception), admin or crash shutdown, cannot connect now, too many connections.
fn is_connection_code(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
}

/// The SQL of every operation, with the schema filled in.
struct Queries {
    claim: String,
    heartbeat: String,
    finish: String,
    release: String,
    now: String,
    get: String,
    unfinished: String,
    history: String,
    jobs: String,
    forget_job: String,
    raw_primitive: String,
    clear_raw_primitive: String,
    raw_release: String,
    server_time: String,
    operate: String,
    paused: String,
    operations: String,
}

impl Queries {
    fn new(schema: &str) -> Self {
        Queries {
            claim: format!(
                "SELECT outcome, attempt_no, fence_no, lease_until, held_by, other_slot, \
                 run_status FROM {schema}.baton_claim_reading_first(\
                 $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
            ),
            heartbeat: format!(
                "SELECT accepted, lease_until, attempt_no, run_status, run_released \
                 FROM {schema}.baton_heartbeat($1, $2, $3, $4, $5)"
            ),
            finish: format!(
                "SELECT accepted, attempt_no, run_status, run_released \
                 FROM {schema}.baton_finish($1, $2, $3, $4, $5)"
            ),
            release: format!(
                "SELECT accepted, attempt_no, run_status, run_released \
                 FROM {schema}.baton_release($1, $2, $3, $4)"
            ),
            now: format!("SELECT {schema}.baton_clock()"),
            get: format!(
                "SELECT record::text FROM {schema}.baton_runs \
                 WHERE namespace = $1 AND job = $2 AND slot = $3"
            ),
            unfinished: format!(
                "SELECT record::text FROM {schema}.baton_runs \
                 WHERE namespace = $1 AND job = $2 AND status = 'running' ORDER BY slot"
            ),
            history: format!(
                "SELECT record::text FROM {schema}.baton_runs \
                 WHERE namespace = $1 AND job = $2 ORDER BY slot DESC LIMIT $3"
            ),
            jobs: format!(
                "SELECT j.job FROM {schema}.baton_jobs j WHERE j.namespace = $1 \
                 AND EXISTS (SELECT 1 FROM {schema}.baton_runs r \
                             WHERE r.namespace = j.namespace AND r.job = j.job) \
                 ORDER BY j.job"
            ),
            forget_job: format!(
                "WITH gone AS (DELETE FROM {schema}.baton_runs WHERE namespace = $1 AND job = $2), \
                 state AS (DELETE FROM {schema}.baton_state WHERE namespace = $1 AND job = $2), \
                 unpaused AS (DELETE FROM {schema}.baton_paused WHERE namespace = $1 AND job = $2), \
                 unlogged AS (DELETE FROM {schema}.baton_operations \
                              WHERE namespace = $1 AND job = $2) \
                 DELETE FROM {schema}.baton_jobs WHERE namespace = $1 AND job = $2"
            ),
            raw_primitive: format!(
                "INSERT INTO {schema}.baton_bench_scratch (namespace, key) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING"
            ),
            raw_release: format!(
                "DELETE FROM {schema}.baton_bench_scratch WHERE namespace = $1 AND key = $2"
            ),
            // The top-level statements of this database: Baton's steps call its functions,
            // the raw primitive and its release write the scratch table. Times in ms.
            server_time: format!(
                "SELECT coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '%{schema}.baton\\_%(%' \
                 AND query NOT LIKE '%baton\\_bench\\_scratch%'), 0)::float8, \
                 coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '%baton\\_bench\\_scratch%' \
                 AND (query LIKE 'INSERT%' OR query LIKE 'DELETE%')), 0)::float8 \
                 FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database \
                 WHERE datname = current_database())"
            ),
            clear_raw_primitive: format!(
                "DELETE FROM {schema}.baton_bench_scratch \
                 WHERE namespace = $1 AND starts_with(key, $2)"
            ),
            operate: format!(
                "SELECT outcome, record FROM {schema}.baton_operate($1, $2, $3, $4, $5, $6, $7, $8)"
            ),
            paused: format!(
                "SELECT record::text FROM {schema}.baton_paused WHERE namespace = $1 ORDER BY job"
            ),
            operations: format!(
                "SELECT record::text FROM {schema}.baton_operations \
                 WHERE namespace = $1 AND ($2::text IS NULL OR job = $2) AND at >= $3 \
                 ORDER BY id DESC LIMIT $4"
            ),
        }
    }
}

/// A store in a PostgreSQL database.
struct PostgresStore {
    pool: Connections,
    namespace: String,
    /// `HOST:PORT/DB`, for messages.
    store: String,
    sql: Queries,
    /// The SQL of the job state's operations.
    state_sql: state::Queries,
    /// Statements executed: see [`Store::round_trips`].
    round_trips: AtomicU64,
    /// How long a statement waits for a connection and its answer: `?timeout=`.
    timeout: Duration,
}

impl PostgresStore {
    /// The store's error for a statement's end: its answer, or no answer within the timeout.
    fn answered<T>(
        &self,
        answer: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        match answer {
            Ok(answer) => answer.map_err(|e| self.error(e)),
            Err(_) => Err(self.timed_out()),
        }
    }

    /// The store's error when no connection could be had.
    fn no_connection(&self, e: NoConnection) -> StoreError {
        match e {
            NoConnection::TimedOut => self.timed_out(),
            NoConnection::Failed(e) => self.error(e),
        }
    }

    fn timed_out(&self) -> StoreError {
        StoreError::Unreachable {
            store: self.store.clone(),
            source: format!(
                "no answer within {:?} (the store's timeout; set it with ?{TIMEOUT_PARAMETER}=)",
                self.timeout
            )
            .into(),
        }
    }

    /// Runs `sql` with the namespace and `arg` as its parameters; returns the rows it changed.
    async fn execute(&self, sql: &str, arg: &str) -> Result<u64, StoreError> {
        let done = bounded!(self, c => sqlx::query(sql)
            .bind(&self.namespace)
            .bind(arg)
            .execute(c))?;
        Ok(done.rows_affected())
    }

    fn error(&self, e: sqlx::Error) -> StoreError {
        map_error(&self.store, e)
    }

    fn malformed(&self, job: &str, reason: impl Into<String>) -> StoreError {
        StoreError::Malformed {
            store: self.store.clone(),
            job: job.to_owned(),
            reason: reason.into(),
        }
    }

    fn decode_operation(&self, job: &str, record: &str) -> Result<Operation, StoreError> {
        serde_json::from_str(record)
            .map_err(|e| self.malformed(job, format!("operation record: {e}")))
    }

    fn decode_run(&self, job: &str, record: &str) -> Result<Run, StoreError> {
        serde_json::from_str(record).map_err(|e| self.malformed(job, format!("run record: {e}")))
    }

    async fn runs(
        &self,
        job: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<Run>, StoreError> {
        let rows = bounded!(self, c => query.fetch_all(c))?;
        rows.iter()
            .map(|row| {
                let record: String = row.try_get(0).map_err(|e| self.error(e))?;
                self.decode_run(job, &record)
            })
            .collect()
    }

    /// The state a refused heartbeat, finish or release reports; `None` when the run has no
    /// state at all.
    fn refused_state(
        &self,
        job: &str,
        attempt: Option<i32>,
        status: Option<String>,
        released: Option<bool>,
    ) -> Result<Option<RunState>, StoreError> {
        let (Some(attempt), Some(status)) = (attempt, status) else {
            return Ok(None);
        };
        Ok(Some(RunState {
            attempt: self.attempt(job, attempt)?,
            status: self.status(job, &status)?,
            released: released.unwrap_or(false),
        }))
    }

    fn attempt(&self, job: &str, attempt: i32) -> Result<u32, StoreError> {
        u32::try_from(attempt).map_err(|_| self.malformed(job, format!("attempt {attempt}")))
    }

    fn status(&self, job: &str, status: &str) -> Result<Status, StoreError> {
        status
            .parse()
            .map_err(|e| self.malformed(job, format!("{e}")))
    }

    fn claim_outcome(
        &self,
        job: &str,
        token: Token,
        row: &PgRow,
    ) -> Result<ClaimOutcome, StoreError> {
        let get_err = |e| self.error(e);
        let outcome: String = row.try_get("outcome").map_err(get_err)?;
        let attempt: Option<i32> = row.try_get("attempt_no").map_err(get_err)?;
        let fence: Option<i64> = row.try_get("fence_no").map_err(get_err)?;
        let lease_end: Option<i64> = row.try_get("lease_until").map_err(get_err)?;
        let held_by: Option<String> = row.try_get("held_by").map_err(get_err)?;
        let other_slot: Option<i64> = row.try_get("other_slot").map_err(get_err)?;
        let run_status: Option<String> = row.try_get("run_status").map_err(get_err)?;
        let missing =
            |what: &str| self.malformed(job, format!("claim answer {outcome:?} without {what}"));
        Ok(match outcome.as_str() {
            "won" => ClaimOutcome::Won(Lease {
                attempt: self.attempt(job, attempt.ok_or_else(|| missing("attempt"))?)?,
                token,
                fence: fence
                    .and_then(|f| u64::try_from(f).ok())
                    .ok_or_else(|| missing("fence"))?,
                lease_end: lease_end.ok_or_else(|| missing("lease end"))?,
            }),
            "running" => ClaimOutcome::Running {
                attempt: self.attempt(job, attempt.ok_or_else(|| missing("attempt"))?)?,
                runner: held_by.ok_or_else(|| missing("runner"))?,
                lease_end: lease_end.ok_or_else(|| missing("lease end"))?,
            },
            "overlap" => ClaimOutcome::Overlap {
                blocking_slot: other_slot.ok_or_else(|| missing("blocking slot"))?,
            },
            "late" => ClaimOutcome::Late,
            "superseded" => ClaimOutcome::Superseded {
                newer_slot: other_slot.ok_or_else(|| missing("newer slot"))?,
            },
            "finished" => ClaimOutcome::Finished {
                status: self.status(job, &run_status.ok_or_else(|| missing("status"))?)?,
            },
            "interrupted" => ClaimOutcome::Interrupted,
            "paused" => ClaimOutcome::Paused,
            other => return Err(self.malformed(job, format!("unknown claim answer {other:?}"))),
        })
    }

    async fn token_step(
        &self,
        sql: &str,
        job: &str,
        slot: i64,
        token: Token,
        result: Option<Finish>,
    ) -> Result<TokenOutcome, StoreError> {
        let mut query = sqlx::query(sql)
            .bind(&self.namespace)
            .bind(job)
            .bind(slot)
            .bind(token.to_string());
        if let Some(result) = result {
            query = query.bind(result.status().as_str());
        }
        let row = bounded!(self, c => query.fetch_one(c))?;
        let get_err = |e| self.error(e);
        let accepted: bool = row.try_get("accepted").map_err(get_err)?;
        if accepted {
            return Ok(TokenOutcome::Accepted);
        }
        Ok(TokenOutcome::Refused(self.refused_state(
            job,
            row.try_get("attempt_no").map_err(get_err)?,
            row.try_get("run_status").map_err(get_err)?,
            row.try_get("run_released").map_err(get_err)?,
        )?))
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn now(&self) -> Result<i64, StoreError> {
        bounded!(self, c => sqlx::query_scalar(&self.sql.now).fetch_one(c))
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let options = request.options;
        let row = bounded!(self, c => sqlx::query(&self.sql.claim)
                    .bind(&self.namespace)
                    .bind(request.job)
                    .bind(request.slot)
                    .bind(request.kind.as_str())
                    .bind(request.runner)
                    .bind(request.token.to_string())
                    .bind(request.digest)
                    .bind(millis(options.lease))
                    .bind(i32::try_from(options.max_attempts).unwrap_or(i32::MAX))
                    .bind(options.overlap == Overlap::Skip)
                    .bind(millis(options.lateness_limit(request.kind)))
                    .bind(millis(options.retention()))
                    .bind(i32::try_from(options.history_size).unwrap_or(i32::MAX))
                    .fetch_one(c))?;
        self.claim_outcome(request.job, request.token, &row)
    }

    async fn heartbeat(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        lease: Duration,
    ) -> Result<HeartbeatOutcome, StoreError> {
        let row = bounded!(self, c => sqlx::query(&self.sql.heartbeat)
                    .bind(&self.namespace)
                    .bind(job)
                    .bind(slot)
                    .bind(token.to_string())
                    .bind(millis(lease))
                    .fetch_one(c))?;
        let get_err = |e| self.error(e);
        if row.try_get::<bool, _>("accepted").map_err(get_err)? {
            let lease_end: Option<i64> = row.try_get("lease_until").map_err(get_err)?;
            let lease_end =
                lease_end.ok_or_else(|| self.malformed(job, "renewed without a lease end"))?;
            return Ok(HeartbeatOutcome::Renewed { lease_end });
        }
        Ok(HeartbeatOutcome::Lost(self.refused_state(
            job,
            row.try_get("attempt_no").map_err(get_err)?,
            row.try_get("run_status").map_err(get_err)?,
            row.try_get("run_released").map_err(get_err)?,
        )?))
    }

    async fn finish(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        result: Finish,
    ) -> Result<TokenOutcome, StoreError> {
        self.token_step(&self.sql.finish, job, slot, token, Some(result))
            .await
    }

    async fn release(
        &self,
        job: &str,
        slot: i64,
        token: Token,
    ) -> Result<TokenOutcome, StoreError> {
        self.token_step(&self.sql.release, job, slot, token, None)
            .await
    }

    async fn get(&self, job: &str, slot: i64) -> Result<Option<Run>, StoreError> {
        let record: Option<String> = bounded!(self, c => sqlx::query_scalar(&self.sql.get)
                    .bind(&self.namespace)
                    .bind(job)
                    .bind(slot)
                    .fetch_optional(c))?;
        record.map(|r| self.decode_run(job, &r)).transpose()
    }

    async fn unfinished(&self, job: &str) -> Result<Vec<Run>, StoreError> {
        let query = sqlx::query(&self.sql.unfinished)
            .bind(&self.namespace)
            .bind(job);
        self.runs(job, query).await
    }

    async fn history(&self, job: &str, limit: usize) -> Result<Vec<Run>, StoreError> {
        let query = sqlx::query(&self.sql.history)
            .bind(&self.namespace)
            .bind(job)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX));
        self.runs(job, query).await
    }

    async fn jobs(&self) -> Result<Vec<String>, StoreError> {
        bounded!(self, c => sqlx::query_scalar(&self.sql.jobs)
                .bind(&self.namespace)
                .fetch_all(c))
    }

    async fn forget_job(&self, job: &str) -> Result<(), StoreError> {
        self.execute(&self.sql.forget_job, job).await?;
        Ok(())
    }

    async fn raw_primitive(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.execute(&self.sql.raw_primitive, key).await? == 1)
    }

    async fn raw_release(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.execute(&self.sql.raw_release, key).await? == 1)
    }

    async fn server_time(&self) -> Result<Option<ServerTime>, StoreError> {
        // Without the extension loaded (`shared_preload_libraries`) the view does not exist
        // or refuses to be read: the server keeps no such counts.
        let read: Result<(f64, f64), StoreError> =
            bounded!(self, c => sqlx::query_as(&self.sql.server_time).fetch_one(c));
        match read {
            Ok((steps_ms, primitive_ms)) => Ok(Some(ServerTime {
                steps_us: steps_ms * 1_000.0,
                primitive_us: primitive_ms * 1_000.0,
                source: "pg_stat_statements",
            })),
            Err(StoreError::Backend { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn clear_raw_primitive(&self, prefix: &str) -> Result<(), StoreError> {
        self.execute(&self.sql.clear_raw_primitive, prefix).await?;
        Ok(())
    }

    async fn state_get(&self, job: &str, key: &str) -> Result<Option<StateEntry>, StoreError> {
        self.get_state(job, key).await
    }

    async fn state_keys(&self, job: &str) -> Result<Vec<StateKey>, StoreError> {
        self.list_state(job).await
    }

    async fn state_write(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        write: &StateWrite<'_>,
        limits: &StateLimits,
    ) -> Result<StateOutcome, StoreError> {
        self.write_state(job, slot, token, write, limits).await
    }

    async fn state_remove(&self, job: &str, key: &str) -> Result<bool, StoreError> {
        self.remove_state(job, key).await
    }

    fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    async fn operate(
        &self,
        job: &str,
        request: Request,
        by: &Operator,
    ) -> Result<OperateOutcome, StoreError> {
        let (action, stop) = (request.as_str(), request.stops());
        let row = bounded!(self, c => sqlx::query(&self.sql.operate)
                    .bind(&self.namespace)
                    .bind(job)
                    .bind(action)
                    .bind(&by.host)
                    .bind(&by.user)
                    .bind(by.reason.as_deref())
                    .bind(stop)
                    .bind(i32::try_from(OPERATIONS_KEPT).unwrap_or(i32::MAX))
                    .fetch_one(c))?;
        let outcome: String = row.try_get("outcome").map_err(|e| self.error(e))?;
        let record: String = row.try_get("record").map_err(|e| self.error(e))?;
        let op = self.decode_operation(job, &record)?;
        Ok(match outcome.as_str() {
            "paused" => OperateOutcome::Paused(op),
            _ => OperateOutcome::Done(op),
        })
    }

    async fn paused(&self) -> Result<Vec<Operation>, StoreError> {
        let records: Vec<String> = bounded!(self, c => sqlx::query_scalar(&self.sql.paused)
                    .bind(&self.namespace)
                    .fetch_all(c))?;
        records
            .iter()
            .map(|r| self.decode_operation("", r))
            .collect()
    }

    async fn operations(
        &self,
        job: Option<&str>,
        since: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, StoreError> {
        let records: Vec<String> = bounded!(self, c => sqlx::query_scalar(&self.sql.operations)
                    .bind(&self.namespace)
                    .bind(job)
                    .bind(since)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(c))?;
        records
            .iter()
            .map(|r| self.decode_operation(job.unwrap_or_default(), r))
            .collect()
    }
}
