//! The SQLite store: one file on one machine, shared by every host process on it.
//!
//! WAL journal, every write in a `BEGIN IMMEDIATE` transaction (so two processes serialize on
//! the file's write lock and see each other's claims), a busy timeout, and the schema version in
//! `PRAGMA user_version` with forward migrations. The clock is the machine's kernel clock, read
//! past libc (see `clock_ms`): every host that shares the file shares it, whatever its own libc
//! says the time is. Calls run on tokio's blocking threads, never on the async workers.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

use super::contract::{Store, StoreError};
use super::model;
use crate::lease::{
    ClaimKind, ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, LeaseOptions, Run, Token,
    TokenOutcome,
};
use crate::operate::{self, OperateOutcome, Operation, Operator, Request};
use crate::state::{StateEntry, StateKey, StateLimits, StateOutcome, StateWrite, Writer};

/// How long a call waits for another process's write lock before it fails, unless the URL's
/// `?timeout=DURATION` says otherwise (`sqlite://baton.db?timeout=30s`): 10 s.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The schema, one script per version; version N is reached by running scripts 1..=N.
const MIGRATIONS: &[&str] = &[
    // 1: runs and per-job fences.
    "CREATE TABLE baton_jobs (
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        fence INTEGER NOT NULL,
        PRIMARY KEY (namespace, job)
    );
    CREATE TABLE baton_runs (
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        slot INTEGER NOT NULL,
        status TEXT NOT NULL,
        lease_end INTEGER NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (namespace, job, slot)
    );
    CREATE INDEX baton_runs_by_status ON baton_runs (namespace, job, status, slot);",
    // 2: the scratch table of `baton bench`'s raw primitive (see `Store::raw_primitive`).
    "CREATE TABLE baton_bench_scratch (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        PRIMARY KEY (namespace, key)
    );",
    // 3: each job's state, every key with the attempt that wrote it (see `crate::state`).
    "CREATE TABLE baton_state (
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        key TEXT NOT NULL,
        value BLOB NOT NULL,
        slot INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        fence INTEGER NOT NULL,
        written_at INTEGER NOT NULL,
        PRIMARY KEY (namespace, job, key)
    );",
    // 4: pauses in force and the record of operations (pause, resume, trigger).
    "CREATE TABLE baton_paused (
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (namespace, job)
    );
    CREATE TABLE baton_operations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        at INTEGER NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX baton_operations_by_time ON baton_operations (namespace, at);",
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Opens `sqlite://PATH` (relative, or `sqlite:///absolute/path`), with `?timeout=` as its busy
/// timeout ([`BUSY_TIMEOUT`] unless given).
pub(crate) async fn open(url: &str, namespace: &str) -> Result<Arc<dyn Store>, StoreError> {
    let (without, busy_timeout) = super::url::take_timeout(url, BUSY_TIMEOUT)?;
    let path = without
        .strip_prefix("sqlite://")
        .unwrap_or_default()
        .to_owned();
    if path.is_empty() {
        return Err(StoreError::InvalidUrl {
            url: url.into(),
            reason: "no file path after sqlite://".into(),
        });
    }
    let store = SqliteStore::open_with(path, namespace, busy_timeout).await?;
    Ok(Arc::new(store))
}

/// A store in one SQLite file.
pub struct SqliteStore {
    path: Arc<str>,
    namespace: Arc<str>,
    conn: Arc<Mutex<Connection>>,
    /// Calls onto the file: see [`Store::round_trips`].
    round_trips: AtomicU64,
    /// The store's clock (µs since the Unix epoch) when it is not the machine's: a simulated
    /// store's, read inside each call's transaction as the machine's would be. Calls then run
    /// on the caller's thread, in the order they are made.
    simulated_clock: Option<SimulatedClock>,
    /// A simulated store's replica: what it holds since [`SqliteStore::replicate`] is what a
    /// [`SqliteStore::fail_over`] keeps. Shared by every client of the database.
    replica: Arc<Mutex<Option<Connection>>>,
}

/// A store clock given from outside, µs since the Unix epoch (see [`SqliteStore::simulated`]).
pub type SimulatedClock = Arc<dyn Fn() -> i64 + Send + Sync>;

thread_local! {
    /// The clock of the simulated store whose call runs on this thread now, if any.
    static CALL_CLOCK: std::cell::RefCell<Option<SimulatedClock>> = const { std::cell::RefCell::new(None) };
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    ///
    /// Fails with [`StoreError::Corrupt`] for a file that is not a database,
    /// [`StoreError::ReadOnly`] for one that cannot be written, and
    /// [`StoreError::NewerSchema`] for one written by a newer Baton; each names the path.
    pub async fn open(path: impl Into<String>, namespace: &str) -> Result<Self, StoreError> {
        Self::open_with(path, namespace, BUSY_TIMEOUT).await
    }

    /// Opens the database as [`SqliteStore::open`] does, with calls that wait up to
    /// `busy_timeout` for another process's write lock (the URL's `?timeout=`).
    pub async fn open_with(
        path: impl Into<String>,
        namespace: &str,
        busy_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let path: Arc<str> = path.into().into();
        let p = path.clone();
        let conn = tokio::task::spawn_blocking(move || open_blocking(&p, busy_timeout))
            .await
            .map_err(|e| StoreError::Backend {
                store: path.to_string(),
                source: e.into(),
            })??;
        Ok(SqliteStore {
            path,
            namespace: namespace.into(),
            conn: Arc::new(Mutex::new(conn)),
            round_trips: AtomicU64::new(0),
            simulated_clock: None,
            replica: Arc::new(Mutex::new(None)),
        })
    }

    /// A store in a private in-memory database whose clock is `clock` (µs since the Unix
    /// epoch): the store of the deterministic simulation. Its calls run at once on the
    /// caller's thread, so their order is the order they are made in, and their times are
    /// `clock`'s, read inside the transaction as the machine's clock is for a file.
    pub fn simulated(namespace: &str, clock: SimulatedClock) -> Result<Self, StoreError> {
        let conn = open_blocking(":memory:", BUSY_TIMEOUT)?;
        Ok(SqliteStore {
            path: ":memory:".into(),
            namespace: namespace.into(),
            conn: Arc::new(Mutex::new(conn)),
            round_trips: AtomicU64::new(0),
            simulated_clock: Some(clock),
            replica: Arc::new(Mutex::new(None)),
        })
    }

    /// Another client of a simulated store's database, in `namespace`: what a second node, or
    /// another process, is to a store it reaches by URL. It shares the database, its clock and
    /// its replica, and counts its own round trips. Refused on a store that is not simulated.
    pub fn another(&self, namespace: &str) -> Result<Self, StoreError> {
        let Some(clock) = &self.simulated_clock else {
            return Err(StoreError::Backend {
                store: self.path.to_string(),
                source: "only a simulated store has other clients in the process".into(),
            });
        };
        Ok(SqliteStore {
            path: self.path.clone(),
            namespace: namespace.into(),
            conn: self.conn.clone(),
            round_trips: AtomicU64::new(0),
            simulated_clock: Some(clock.clone()),
            replica: self.replica.clone(),
        })
    }

    /// A simulated store's replica catches up: it now holds every write so far. Writes after
    /// this and before a [`SqliteStore::fail_over`] are the unreplicated ones a failover loses.
    /// Refused on a store that is not simulated.
    pub fn replicate(&self) -> Result<(), StoreError> {
        let replica = self.simulated_only("replicate")?;
        let mut copy = match lock_replica(replica).take() {
            Some(copy) => copy,
            None => open_blocking(":memory:", BUSY_TIMEOUT)?,
        };
        copy_database(&lock(&self.conn), &mut copy).map_err(|e| map_error(&self.path, e))?;
        *lock_replica(replica) = Some(copy);
        Ok(())
    }

    /// A simulated store fails over to its replica: every write since the last
    /// [`SqliteStore::replicate`] is lost, as an asynchronous replica loses what it had not yet
    /// received. Refused on a store that is not simulated, or before any `replicate`.
    pub fn fail_over(&self) -> Result<(), StoreError> {
        let replica = self.simulated_only("fail over")?;
        let guard = lock_replica(replica);
        let Some(copy) = guard.as_ref() else {
            return Err(StoreError::Backend {
                store: self.path.to_string(),
                source: "no replica to fail over to: call replicate first".into(),
            });
        };
        copy_database(copy, &mut lock(&self.conn)).map_err(|e| map_error(&self.path, e))
    }

    fn simulated_only(&self, what: &str) -> Result<&Mutex<Option<Connection>>, StoreError> {
        if self.simulated_clock.is_none() {
            return Err(StoreError::Backend {
                store: self.path.to_string(),
                source: format!("only a simulated store can {what}").into(),
            });
        }
        Ok(&self.replica)
    }

    /// Runs `f` on the connection, on a blocking thread.
    async fn with_conn<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &str) -> Result<T, rusqlite::Error> + Send + 'static,
    {
        let conn = self.conn.clone();
        let namespace = self.namespace.clone();
        let path = self.path.clone();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        if let Some(clock) = &self.simulated_clock {
            CALL_CLOCK.with(|c| *c.borrow_mut() = Some(clock.clone()));
            let result = f(&mut lock(&conn), &namespace).map_err(|e| map_error(&path, e));
            CALL_CLOCK.with(|c| *c.borrow_mut() = None);
            return result;
        }
        tokio::task::spawn_blocking(move || {
            let mut guard = lock(&conn);
            f(&mut guard, &namespace).map_err(|e| map_error(&path, e))
        })
        .await
        .map_err(|e| StoreError::Backend {
            store: self.path.to_string(),
            source: e.into(),
        })?
    }
}

fn lock_replica(replica: &Mutex<Option<Connection>>) -> MutexGuard<'_, Option<Connection>> {
    replica
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Copies the whole database of `from` over that of `to` (SQLite's online backup).
fn copy_database(from: &Connection, to: &mut Connection) -> Result<(), rusqlite::Error> {
    rusqlite::backup::Backup::new(from, to)?.run_to_completion(1_000, Duration::ZERO, None)
}

fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic while holding the lock leaves the connection usable: SQLite rolls back the
    // transaction that was open when the guard was dropped.
    conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn open_blocking(path: &str, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if let Some(parent) = Path::new(path).parent() {
        if !parent.as_os_str().is_empty() && !parent.is_dir() {
            return Err(StoreError::Backend {
                store: path.to_owned(),
                source: format!(
                    "directory {} does not exist; create it first",
                    parent.display()
                )
                .into(),
            });
        }
    }
    // Checked by hand as well, because the superuser may write to a file whose mode says no.
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().readonly() {
            return Err(StoreError::ReadOnly {
                path: path.to_owned(),
                source: "the file's permissions allow no writes".into(),
            });
        }
    }
    let setup = || -> Result<Connection, rusqlite::Error> {
        let conn = Connection::open_with_flags(path, flags)?;
        conn.busy_timeout(busy_timeout)?;
        // Reading the header first turns a foreign file into NotADatabase here, not later.
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(conn)
    };
    let mut conn = setup().map_err(|e| map_error(path, e))?;
    if is_read_only(&conn) {
        return Err(StoreError::ReadOnly {
            path: path.to_owned(),
            source: "the file was opened read-only".into(),
        });
    }
    migrate(&mut conn, path)?;
    Ok(conn)
}

fn is_read_only(conn: &Connection) -> bool {
    conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false)
}

fn migrate(conn: &mut Connection, path: &str) -> Result<(), StoreError> {
    let run = |conn: &mut Connection| -> Result<Result<(), StoreError>, rusqlite::Error> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if found > SCHEMA_VERSION {
            return Ok(Err(StoreError::NewerSchema {
                path: path.to_owned(),
                found,
                supported: SCHEMA_VERSION,
            }));
        }
        for (i, script) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
            tx.execute_batch(script)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        }
        tx.commit()?;
        Ok(Ok(()))
    };
    run(conn).map_err(|e| map_error(path, e))?
}

fn map_error(path: &str, e: rusqlite::Error) -> StoreError {
    let path = path.to_owned();
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path,
            source: e.into(),
        },
        Some(ErrorCode::ReadOnly) => StoreError::ReadOnly {
            path,
            source: e.into(),
        },
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => StoreError::Unreachable {
            store: path,
            source: e.into(),
        },
        _ => match e {
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..) => StoreError::Malformed {
                store: path,
                job: String::new(),
                reason: e.to_string(),
            },
            other => StoreError::Backend {
                store: path,
                source: other.into(),
            },
        },
    }
}

/// The store's clock for SQLite, ms since the Unix epoch: the kernel's realtime clock, the one
/// clock every process on the machine that holds the file shares. Every time the store decides
/// with (now, lease ends, lateness, what history to keep) is read here, inside the
/// transaction, never from SQLite's own `'now'`.
///
/// Why a raw system call on Linux. A SQLite store has no server: its claim is a transaction in
/// the runner's own process. If that process read the time the usual way (`SystemTime`, which
/// goes through libc and the vDSO), a runner whose libc lies about the time (`faketime`, which
/// is an `LD_PRELOAD` of `clock_gettime` and friends) would not be a runner with a wrong
/// clock but a store with one, and two runners on one file would decide leases on two clocks.
/// `syscall(SYS_clock_gettime, CLOCK_REALTIME)` asks the kernel directly, past any such
/// wrapper, so the store's clock stays the machine's, as it is for a server's `TIME` or
/// `clock_timestamp()`. Elsewhere, and should the call fail, it is [`SystemTime`].
fn clock_ms() -> i64 {
    clock_us().div_euclid(1_000)
}

/// The store's clock for SQLite in microseconds since the Unix epoch (see [`clock_ms`]): the
/// floor of a new fence ([`next_fence`](crate::lease::next_fence)).
fn clock_us() -> i64 {
    if let Some(simulated) = CALL_CLOCK.with(|c| c.borrow().as_ref().map(|clock| clock())) {
        return simulated;
    }
    #[cfg(target_os = "linux")]
    {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime(2) writes one `timespec` through the pointer, which points at
        // `now` for the whole call; the call touches nothing else.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_clock_gettime,
                libc::CLOCK_REALTIME,
                &mut now as *mut libc::timespec,
            )
        };
        if rc == 0 {
            // `time_t` and `c_long` are `i64` here, `i32` on 32-bit targets.
            #[allow(clippy::useless_conversion)]
            let (secs, nanos) = (i64::from(now.tv_sec), i64::from(now.tv_nsec));
            return secs * 1_000_000 + nanos / 1_000;
        }
    }
    system_clock_us()
}

/// The process's own idea of the time, ms since the Unix epoch.
#[cfg(test)]
fn system_clock_ms() -> i64 {
    system_clock_us().div_euclid(1_000)
}

/// The process's own idea of the time, µs since the Unix epoch.
fn system_clock_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn decode(record: String) -> Result<Run, rusqlite::Error> {
    serde_json::from_str(&record).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn encode(run: &Run) -> Result<String, rusqlite::Error> {
    serde_json::to_string(run).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn load(conn: &Connection, ns: &str, job: &str, slot: i64) -> Result<Option<Run>, rusqlite::Error> {
    conn.prepare_cached(
        "SELECT record FROM baton_runs WHERE namespace = ?1 AND job = ?2 AND slot = ?3",
    )?
    .query_row(params![ns, job, slot], |r| r.get::<_, String>(0))
    .optional()?
    .map(decode)
    .transpose()
}

fn save(conn: &Connection, ns: &str, run: &Run) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(
        "INSERT INTO baton_runs (namespace, job, slot, status, lease_end, record)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (namespace, job, slot) DO UPDATE
         SET status = excluded.status, lease_end = excluded.lease_end, record = excluded.record",
    )?
    .execute(params![
        ns,
        run.job,
        run.slot,
        run.status.as_str(),
        run.lease_end,
        encode(run)?
    ])?;
    Ok(())
}

fn query_runs(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<Run>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params, |r| r.get::<_, String>(0))?;
    rows.map(|r| r.and_then(decode)).collect()
}

/// An owned copy of a claim, to move onto a blocking thread.
struct OwnedClaim {
    job: String,
    slot: i64,
    kind: ClaimKind,
    runner: String,
    token: Token,
    digest: Option<String>,
    options: LeaseOptions,
}

impl OwnedClaim {
    fn new(r: &ClaimRequest<'_>) -> Self {
        OwnedClaim {
            job: r.job.to_owned(),
            slot: r.slot,
            kind: r.kind,
            runner: r.runner.to_owned(),
            token: r.token,
            digest: r.digest.map(str::to_owned),
            options: *r.options,
        }
    }

    fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            job: &self.job,
            slot: self.slot,
            kind: self.kind,
            runner: &self.runner,
            token: self.token,
            digest: self.digest.as_deref(),
            options: &self.options,
        }
    }
}

fn claim_blocking(
    conn: &mut Connection,
    ns: &str,
    c: &OwnedClaim,
) -> Result<ClaimOutcome, rusqlite::Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let clock_us = clock_us();
    let now = clock_us.div_euclid(1_000);
    let this = load(&tx, ns, &c.job, c.slot)?;
    let newest_slot: Option<i64> = tx
        .prepare_cached("SELECT max(slot) FROM baton_runs WHERE namespace = ?1 AND job = ?2")?
        .query_row(params![ns, c.job], |r| r.get(0))?;
    // Other running runs matter only to a claim that would create a run (step 2).
    let running = if this.is_none() {
        query_runs(
            &tx,
            "SELECT record FROM baton_runs
             WHERE namespace = ?1 AND job = ?2 AND status = 'running' AND slot <> ?3",
            params![ns, c.job, c.slot],
        )?
    } else {
        Vec::new()
    };
    let fence: i64 = tx
        .prepare_cached("SELECT fence FROM baton_jobs WHERE namespace = ?1 AND job = ?2")?
        .query_row(params![ns, c.job], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    let paused = load_pause(&tx, ns, &c.job)?.is_some();
    let view = model::ClaimView {
        this,
        newest_slot,
        running,
        fence: u64::try_from(fence).unwrap_or(0),
        clock_us,
        paused,
    };
    let request = c.request();
    let effects = model::claim(now, &request, view);
    for run in &effects.writes {
        save(&tx, ns, run)?;
    }
    if matches!(effects.outcome, ClaimOutcome::Won(_)) {
        tx.prepare_cached(
            "INSERT INTO baton_jobs (namespace, job, fence) VALUES (?1, ?2, ?3)
             ON CONFLICT (namespace, job) DO UPDATE SET fence = excluded.fence",
        )?
        .execute(params![
            ns,
            c.job,
            i64::try_from(effects.fence).unwrap_or(i64::MAX)
        ])?;
    }
    if effects.created {
        let keep_after = now - crate::lease::millis(c.options.retention());
        tx.prepare_cached(
            "DELETE FROM baton_runs
             WHERE namespace = ?1 AND job = ?2 AND status <> 'running' AND slot < ?3
               AND slot NOT IN (
                 SELECT slot FROM baton_runs
                 WHERE namespace = ?1 AND job = ?2 AND status <> 'running'
                 ORDER BY slot DESC LIMIT ?4)",
        )?
        .execute(params![ns, c.job, keep_after, c.options.history_size])?;
    }
    tx.commit()?;
    Ok(effects.outcome)
}

fn decode_operation(record: String) -> Result<Operation, rusqlite::Error> {
    serde_json::from_str(&record).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn encode_operation(op: &Operation) -> Result<String, rusqlite::Error> {
    serde_json::to_string(op).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// The pause in force on a job, if any.
fn load_pause(
    conn: &Connection,
    ns: &str,
    job: &str,
) -> Result<Option<Operation>, rusqlite::Error> {
    conn.prepare_cached("SELECT record FROM baton_paused WHERE namespace = ?1 AND job = ?2")?
        .query_row(params![ns, job], |r| r.get::<_, String>(0))
        .optional()?
        .map(decode_operation)
        .transpose()
}

/// Pause, resume or trigger, and its record, in one transaction.
fn operate_blocking(
    conn: &mut Connection,
    ns: &str,
    job: &str,
    request: Request,
    by: &Operator,
) -> Result<OperateOutcome, rusqlite::Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = clock_ms();
    let pause = load_pause(&tx, ns, job)?;
    if let (Request::Trigger, Some(pause)) = (request, pause) {
        return Ok(OperateOutcome::Paused(pause));
    }
    let op = Operation::new(job, request, by, now);
    let record = encode_operation(&op)?;
    match request {
        Request::Pause { .. } => {
            tx.prepare_cached(
                "INSERT INTO baton_paused (namespace, job, record) VALUES (?1, ?2, ?3)
                 ON CONFLICT (namespace, job) DO UPDATE SET record = excluded.record",
            )?
            .execute(params![ns, job, record])?;
        }
        Request::Resume => {
            tx.prepare_cached("DELETE FROM baton_paused WHERE namespace = ?1 AND job = ?2")?
                .execute(params![ns, job])?;
        }
        Request::Trigger => {}
    }
    tx.prepare_cached(
        "INSERT INTO baton_operations (namespace, job, at, record) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![ns, job, now, record])?;
    tx.prepare_cached(
        "DELETE FROM baton_operations WHERE namespace = ?1 AND id <= (
           SELECT id FROM baton_operations WHERE namespace = ?1
           ORDER BY id DESC LIMIT 1 OFFSET ?2)",
    )?
    .execute(params![ns, operate::OPERATIONS_KEPT as i64])?;
    tx.commit()?;
    Ok(OperateOutcome::Done(op))
}

/// Loads one run, applies `step` at the store's clock, writes what it returns, in one
/// transaction.
fn update_blocking<O>(
    conn: &mut Connection,
    ns: &str,
    job: &str,
    slot: i64,
    step: impl FnOnce(i64, Option<Run>) -> (O, Option<Run>),
) -> Result<O, rusqlite::Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = clock_ms();
    let run = load(&tx, ns, job, slot)?;
    let (outcome, write) = step(now, run);
    if let Some(run) = write {
        save(&tx, ns, &run)?;
    }
    tx.commit()?;
    Ok(outcome)
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn now(&self) -> Result<i64, StoreError> {
        match &self.simulated_clock {
            Some(clock) => Ok(clock().div_euclid(1_000)),
            None => Ok(clock_ms()),
        }
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let claim = OwnedClaim::new(request);
        self.with_conn(move |conn, ns| claim_blocking(conn, ns, &claim))
            .await
    }

    async fn heartbeat(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        lease: Duration,
    ) -> Result<HeartbeatOutcome, StoreError> {
        let job = job.to_owned();
        self.with_conn(move |conn, ns| {
            update_blocking(conn, ns, &job, slot, |now, run| {
                model::heartbeat(now, run, token, lease)
            })
        })
        .await
    }

    async fn finish(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        result: Finish,
    ) -> Result<TokenOutcome, StoreError> {
        let job = job.to_owned();
        self.with_conn(move |conn, ns| {
            update_blocking(conn, ns, &job, slot, |now, run| {
                model::finish(now, run, token, result)
            })
        })
        .await
    }

    async fn release(
        &self,
        job: &str,
        slot: i64,
        token: Token,
    ) -> Result<TokenOutcome, StoreError> {
        let job = job.to_owned();
        self.with_conn(move |conn, ns| {
            update_blocking(conn, ns, &job, slot, |now, run| {
                model::release(now, run, token)
            })
        })
        .await
    }

    async fn get(&self, job: &str, slot: i64) -> Result<Option<Run>, StoreError> {
        let job = job.to_owned();
        self.with_conn(move |conn, ns| load(conn, ns, &job, slot))
            .await
    }

    async fn unfinished(&self, job: &str) -> Result<Vec<Run>, StoreError> {
        let job = job.to_owned();
        self.with_conn(move |conn, ns| {
            query_runs(
                conn,
                "SELECT record FROM baton_runs
                 WHERE namespace = ?1 AND job = ?2 AND status = 'running' ORDER BY slot",
                params![ns, job],
            )
        })
        .await
    }

    async fn history(&self, job: &str, limit: usize) -> Result<Vec<Run>, StoreError> {
        let job = job.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_conn(move |conn, ns| {
            query_runs(
                conn,
                "SELECT record FROM baton_runs
                 WHERE namespace = ?1 AND job = ?2 ORDER BY slot DESC LIMIT ?3",
                params![ns, job, limit],
            )
        })
        .await
    }

    async fn jobs(&self) -> Result<Vec<String>, StoreError> {
        self.with_conn(move |conn, ns| {
            let mut stmt = conn.prepare_cached(
                "SELECT DISTINCT job FROM baton_runs WHERE namespace = ?1 ORDER BY job",
            )?;
            let rows = stmt.query_map(params![ns], |r| r.get::<_, String>(0))?;
            rows.collect()
        })
        .await
    }

    async fn forget_job(&self, job: &str) -> Result<(), StoreError> {
        let job = job.to_owned();
        self.with_conn(move |conn, ns| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "DELETE FROM baton_runs WHERE namespace = ?1 AND job = ?2",
                params![ns, job],
            )?;
            tx.execute(
                "DELETE FROM baton_jobs WHERE namespace = ?1 AND job = ?2",
                params![ns, job],
            )?;
            tx.execute(
                "DELETE FROM baton_state WHERE namespace = ?1 AND job = ?2",
                params![ns, job],
            )?;
            for table in ["baton_paused", "baton_operations"] {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE namespace = ?1 AND job = ?2"),
                    params![ns, job],
                )?;
            }
            tx.commit()
        })
        .await
    }

    async fn raw_primitive(&self, key: &str) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.with_conn(move |conn, ns| {
            let mut stmt = conn.prepare_cached(
                "INSERT INTO baton_bench_scratch (namespace, key) VALUES (?1, ?2)
                 ON CONFLICT DO NOTHING",
            )?;
            Ok(stmt.execute(params![ns, key])? == 1)
        })
        .await
    }

    async fn clear_raw_primitive(&self, prefix: &str) -> Result<(), StoreError> {
        let prefix = prefix.to_owned();
        self.with_conn(move |conn, ns| {
            conn.execute(
                "DELETE FROM baton_bench_scratch
                 WHERE namespace = ?1 AND substr(key, 1, length(?2)) = ?2",
                params![ns, prefix],
            )?;
            Ok(())
        })
        .await
    }

    async fn raw_release(&self, key: &str) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.with_conn(move |conn, ns| {
            let mut stmt = conn.prepare_cached(
                "DELETE FROM baton_bench_scratch WHERE namespace = ?1 AND key = ?2",
            )?;
            Ok(stmt.execute(params![ns, key])? == 1)
        })
        .await
    }

    async fn state_get(&self, job: &str, key: &str) -> Result<Option<StateEntry>, StoreError> {
        let (job, key) = (job.to_owned(), key.to_owned());
        self.with_conn(move |conn, ns| state_get_blocking(conn, ns, &job, &key))
            .await
    }

    async fn state_keys(&self, job: &str) -> Result<Vec<StateKey>, StoreError> {
        let job = job.to_owned();
        self.with_conn(move |conn, ns| state_keys_blocking(conn, ns, &job))
            .await
    }

    async fn state_write(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        write: &StateWrite<'_>,
        limits: &StateLimits,
    ) -> Result<StateOutcome, StoreError> {
        if let Some(refusal) = write.refusal(limits) {
            return Ok(StateOutcome::Refused(refusal));
        }
        let write = OwnedStateWrite::new(write);
        let (job, limits) = (job.to_owned(), *limits);
        self.with_conn(move |conn, ns| {
            state_write_blocking(conn, ns, &job, slot, token, &write.borrow(), &limits)
        })
        .await
    }

    async fn state_remove(&self, job: &str, key: &str) -> Result<bool, StoreError> {
        let (job, key) = (job.to_owned(), key.to_owned());
        self.with_conn(move |conn, ns| {
            let n = conn
                .prepare_cached(
                    "DELETE FROM baton_state WHERE namespace = ?1 AND job = ?2 AND key = ?3",
                )?
                .execute(params![ns, job, key])?;
            Ok(n == 1)
        })
        .await
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
        let (job, by) = (job.to_owned(), by.clone());
        self.with_conn(move |conn, ns| operate_blocking(conn, ns, &job, request, &by))
            .await
    }

    async fn paused(&self) -> Result<Vec<Operation>, StoreError> {
        self.with_conn(move |conn, ns| {
            let mut stmt = conn.prepare_cached(
                "SELECT record FROM baton_paused WHERE namespace = ?1 ORDER BY job",
            )?;
            let rows = stmt.query_map(params![ns], |r| r.get::<_, String>(0))?;
            rows.map(|r| r.and_then(decode_operation)).collect()
        })
        .await
    }

    async fn operations(
        &self,
        job: Option<&str>,
        since: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, StoreError> {
        let job = job.map(str::to_owned);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_conn(move |conn, ns| {
            let mut stmt = conn.prepare_cached(
                "SELECT record FROM baton_operations
                 WHERE namespace = ?1 AND (?2 IS NULL OR job = ?2) AND at >= ?3
                 ORDER BY id DESC LIMIT ?4",
            )?;
            let rows = stmt.query_map(params![ns, job, since, limit], |r| r.get::<_, String>(0))?;
            rows.map(|r| r.and_then(decode_operation)).collect()
        })
        .await
    }
}

// ---- Job state (see `crate::state`) ----

/// An owned copy of a state write, to move onto a blocking thread.
enum OwnedStateWrite {
    Set(String, Vec<u8>),
    Delete(String),
    Increment(String, i64),
    CompareAndSwap(String, Option<Vec<u8>>, Vec<u8>),
}

impl OwnedStateWrite {
    fn new(write: &StateWrite<'_>) -> Self {
        match *write {
            StateWrite::Set { key, value } => OwnedStateWrite::Set(key.into(), value.to_vec()),
            StateWrite::Delete { key } => OwnedStateWrite::Delete(key.into()),
            StateWrite::Increment { key, by } => OwnedStateWrite::Increment(key.into(), by),
            StateWrite::CompareAndSwap { key, expected, new } => OwnedStateWrite::CompareAndSwap(
                key.into(),
                expected.map(<[u8]>::to_vec),
                new.to_vec(),
            ),
        }
    }

    fn borrow(&self) -> StateWrite<'_> {
        match self {
            OwnedStateWrite::Set(key, value) => StateWrite::Set { key, value },
            OwnedStateWrite::Delete(key) => StateWrite::Delete { key },
            OwnedStateWrite::Increment(key, by) => StateWrite::Increment { key, by: *by },
            OwnedStateWrite::CompareAndSwap(key, expected, new) => StateWrite::CompareAndSwap {
                key,
                expected: expected.as_deref(),
                new,
            },
        }
    }
}

fn writer_of(r: &rusqlite::Row<'_>, first: usize) -> Result<Writer, rusqlite::Error> {
    let fence: i64 = r.get(first + 2)?;
    Ok(Writer {
        slot: r.get(first)?,
        attempt: r.get(first + 1)?,
        fence: u64::try_from(fence).unwrap_or(0),
        written_at: r.get(first + 3)?,
    })
}

fn state_get_blocking(
    conn: &Connection,
    ns: &str,
    job: &str,
    key: &str,
) -> Result<Option<StateEntry>, rusqlite::Error> {
    conn.prepare_cached(
        "SELECT value, slot, attempt, fence, written_at FROM baton_state
         WHERE namespace = ?1 AND job = ?2 AND key = ?3",
    )?
    .query_row(params![ns, job, key], |r| {
        Ok(StateEntry {
            key: key.to_owned(),
            value: r.get(0)?,
            writer: writer_of(r, 1)?,
        })
    })
    .optional()
}

fn state_keys_blocking(
    conn: &Connection,
    ns: &str,
    job: &str,
) -> Result<Vec<StateKey>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT key, length(value), slot, attempt, fence, written_at FROM baton_state
         WHERE namespace = ?1 AND job = ?2 ORDER BY key",
    )?;
    let rows = stmt.query_map(params![ns, job], |r| {
        Ok(StateKey {
            key: r.get(0)?,
            size: r.get(1)?,
            writer: writer_of(r, 2)?,
        })
    })?;
    rows.collect()
}

/// A fenced state write in one `BEGIN IMMEDIATE` transaction: the run's token and lease are
/// checked at the store's clock, and the key written, with the file's write lock held
/// throughout, so no claim can take the run over in between.
fn state_write_blocking(
    conn: &mut Connection,
    ns: &str,
    job: &str,
    slot: i64,
    token: Token,
    write: &StateWrite<'_>,
    limits: &StateLimits,
) -> Result<StateOutcome, rusqlite::Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = clock_ms();
    let run = load(&tx, ns, job, slot)?;
    let run = match run {
        Some(run)
            if run.status == crate::lease::Status::Running
                && run.token == token
                && !run.released
                && run.lease_end > now =>
        {
            run
        }
        other => return Ok(StateOutcome::Fenced(other.map(|r| r.state()))),
    };
    let key = write.key();
    let current: Option<Vec<u8>> = tx
        .prepare_cached(
            "SELECT value FROM baton_state WHERE namespace = ?1 AND job = ?2 AND key = ?3",
        )?
        .query_row(params![ns, job, key], |r| r.get(0))
        .optional()?;
    let keys: i64 = tx
        .prepare_cached("SELECT count(*) FROM baton_state WHERE namespace = ?1 AND job = ?2")?
        .query_row(params![ns, job], |r| r.get(0))?;
    let keys = u64::try_from(keys).unwrap_or(0);
    let (change, written) = match crate::state::apply(write, current.as_deref(), keys, limits) {
        Ok(applied) => applied,
        Err(refusal) => return Ok(StateOutcome::Refused(refusal)),
    };
    match change {
        Some(Some(value)) => {
            tx.prepare_cached(
                "INSERT INTO baton_state
                     (namespace, job, key, value, slot, attempt, fence, written_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (namespace, job, key) DO UPDATE SET
                     value = excluded.value, slot = excluded.slot, attempt = excluded.attempt,
                     fence = excluded.fence, written_at = excluded.written_at",
            )?
            .execute(params![
                ns,
                job,
                key,
                value,
                slot,
                run.attempt,
                i64::try_from(run.fence).unwrap_or(i64::MAX),
                now
            ])?;
        }
        Some(None) => {
            tx.prepare_cached(
                "DELETE FROM baton_state WHERE namespace = ?1 AND job = ?2 AND key = ?3",
            )?
            .execute(params![ns, job, key])?;
        }
        None => {}
    }
    tx.commit()?;
    Ok(StateOutcome::Written(written))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_clock_is_the_machines_realtime_clock() {
        let before = system_clock_ms();
        let store = clock_ms();
        let after = system_clock_ms();
        assert!(
            before - 5 <= store && store <= after + 5,
            "{before} <= {store} <= {after}"
        );
    }
}
