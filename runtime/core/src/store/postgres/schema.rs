//! The server check and the schema's embedded migrations.

use sqlx::{Connection, Executor, PgConnection};

use super::map_error;
use super::url::Target;
use crate::store::contract::StoreError;

/// The schema, one script per version; version N is reached by running scripts 1..=N. `@schema@`
/// in a script stands for the store's schema, quoted.
const MIGRATIONS: &[(&str, &str)] = &[
    (
        "runs, per-job fences and the functions of the store operations",
        include_str!("migrations/0001_runs_and_claims.sql"),
    ),
    (
        "the claim reads the clock once it holds every row it decides on",
        include_str!("migrations/0002_claim_clock_after_locks.sql"),
    ),
    (
        "the scratch table of baton bench",
        include_str!("migrations/0003_bench_scratch.sql"),
    ),
    (
        "a new fence is at least the store's clock in microseconds",
        include_str!("migrations/0004_fence_floor_is_the_clock.sql"),
    ),
    (
        "each job's state, every write fenced by the writer's lease",
        include_str!("migrations/0005_job_state.sql"),
    ),
    (
        "pause, resume and trigger: a paused job's claim answers paused",
        include_str!("migrations/0006_pause_and_trigger.sql"),
    ),
    (
        "a heartbeat after the lease ran out is refused by the store's clock",
        include_str!("migrations/0007_heartbeat_after_the_lease_end_is_refused.sql"),
    ),
    (
        "a losing claim is answered from a read without locks or writes",
        include_str!("migrations/0008_losing_claim_reads_without_locks.sql"),
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The oldest PostgreSQL this store runs on: 13 (`server_version_num` 130000).
pub const MIN_SERVER_VERSION: i64 = 130_000;

/// The first key of the advisory lock migrations hold (the second is the schema's hash):
/// "btn" in ASCII.
const MIGRATION_LOCK: i32 = 0x0062_746e;

/// Refuses a server that is not PostgreSQL, or older than 13.
pub(crate) async fn check_server(
    conn: &mut PgConnection,
    target: &Target,
) -> Result<(), StoreError> {
    let answer: Result<(String, String), sqlx::Error> =
        sqlx::query_as("SELECT current_setting('server_version_num'), version()")
            .fetch_one(conn)
            .await;
    let verdict = match answer {
        Ok((number, version)) => server_supported(&number, &version),
        Err(e) => Err(format!(
            "it does not answer as PostgreSQL does ({e}); PostgreSQL 13 or newer is needed"
        )),
    };
    verdict.map_err(|reason| StoreError::Unsupported {
        store: target.server.clone(),
        reason,
    })
}

/// Whether a server that reports these `server_version_num` and `version()` is supported; the
/// error says what was found and what is needed.
fn server_supported(number: &str, version: &str) -> Result<(), String> {
    if !version.starts_with("PostgreSQL ") {
        let found = version
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        return Err(format!(
            "it reports itself as {found:?}, not PostgreSQL; PostgreSQL 13 or newer is needed"
        ));
    }
    let num: i64 = number.trim().parse().map_err(|_| {
        format!(
            "it reports the unreadable version number {number:?}; PostgreSQL 13 or newer is needed"
        )
    })?;
    if num < MIN_SERVER_VERSION {
        let shown = version
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        return Err(format!(
            "it runs {shown} (server_version_num {num}); PostgreSQL 13 or newer is needed"
        ));
    }
    Ok(())
}

/// Brings the schema up to date, under a transaction-scoped advisory lock so that concurrent
/// openers migrate one at a time, and refuses a schema newer than this build knows.
pub(crate) async fn migrate(conn: &mut PgConnection, target: &Target) -> Result<(), StoreError> {
    migrate_locked(conn, target)
        .await
        .map_err(|e| map_error(&target.store(), e))?
}

/// The migration transaction; the outer error is the server's, the inner one the refusal of a
/// newer schema.
async fn migrate_locked(
    conn: &mut PgConnection,
    target: &Target,
) -> Result<Result<(), StoreError>, sqlx::Error> {
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(MIGRATION_LOCK)
        .bind(&target.schema)
        .execute(tx.as_mut())
        .await?;
    let schema = target.quoted_schema();
    let table = format!("{schema}.baton_migrations");
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(tx.as_mut())
        .await?;
    let found: i64 = if exists {
        let sql = format!("SELECT coalesce(max(version), 0)::bigint FROM {table}");
        sqlx::query_scalar(&sql).fetch_one(tx.as_mut()).await?
    } else {
        0
    };
    if found > SCHEMA_VERSION {
        return Ok(Err(StoreError::NewerSchema {
            path: target.described(),
            found,
            supported: SCHEMA_VERSION,
        }));
    }
    if found < SCHEMA_VERSION {
        let sql = format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {table} (
                 version bigint PRIMARY KEY,
                 description text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             );"
        );
        tx.as_mut().execute(sql.as_str()).await?;
    }
    let insert = format!("INSERT INTO {table} (version, description) VALUES ($1, $2)");
    for (i, (description, script)) in MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        if version <= found {
            continue;
        }
        let script = script.replace("@schema@", &schema);
        tx.as_mut().execute(script.as_str()).await?;
        sqlx::query(&insert)
            .bind(version)
            .bind(*description)
            .execute(tx.as_mut())
            .await?;
    }
    tx.commit().await?;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::server_supported;

    #[test]
    fn postgresql_13_and_newer_are_supported() {
        assert!(server_supported("130000", "PostgreSQL 13.0 on x86_64").is_ok());
        assert!(server_supported("150020", "PostgreSQL 15.20 (Debian)").is_ok());
    }

    #[test]
    fn postgresql_older_than_13_is_refused_saying_what_is_needed() {
        let err = server_supported("120015", "PostgreSQL 12.15 on x86_64").unwrap_err();
        assert!(err.contains("PostgreSQL 12.15"), "{err}");
        assert!(err.contains("PostgreSQL 13 or newer is needed"), "{err}");
    }

    #[test]
    fn a_server_that_is_not_postgresql_is_refused() {
        let err = server_supported("130000", "CockroachDB CCL v23.1.0").unwrap_err();
        assert!(err.contains("not PostgreSQL"), "{err}");
    }
}
