//! Job state on PostgreSQL (see [`crate::state`]): the table `baton_state`, one row per key with
//! its value and its writer, and the function `baton_state_write`, the fenced write, one call
//! and one round trip (migration 5).

use sqlx::Row;

use super::PostgresStore;
use crate::lease::Token;
use crate::state::{
    StateEntry, StateKey, StateLimits, StateOutcome, StateRefusal, StateWrite, Writer, Written,
};
use crate::store::contract::StoreError;

/// The SQL of the state operations, with the schema filled in.
pub(super) struct Queries {
    write: String,
    get: String,
    keys: String,
    remove: String,
}

impl Queries {
    pub(super) fn new(schema: &str) -> Self {
        Queries {
            write: format!(
                "SELECT outcome, flag, sum, attempt_no, run_status, run_released \
                 FROM {schema}.baton_state_write($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
            ),
            get: format!(
                "SELECT value, slot, attempt, fence, written_at FROM {schema}.baton_state \
                 WHERE namespace = $1 AND job = $2 AND key = $3"
            ),
            keys: format!(
                "SELECT key, octet_length(value)::bigint, slot, attempt, fence, written_at \
                 FROM {schema}.baton_state WHERE namespace = $1 AND job = $2 ORDER BY key"
            ),
            remove: format!(
                "DELETE FROM {schema}.baton_state WHERE namespace = $1 AND job = $2 AND key = $3"
            ),
        }
    }
}

impl PostgresStore {
    fn writer(&self, row: &sqlx::postgres::PgRow, first: usize) -> Result<Writer, StoreError> {
        let get_err = |e| self.error(e);
        let attempt: i32 = row.try_get(first + 1).map_err(get_err)?;
        let fence: i64 = row.try_get(first + 2).map_err(get_err)?;
        Ok(Writer {
            slot: row.try_get(first).map_err(get_err)?,
            attempt: u32::try_from(attempt).unwrap_or(0),
            fence: u64::try_from(fence).unwrap_or(0),
            written_at: row.try_get(first + 3).map_err(get_err)?,
        })
    }

    pub(super) async fn get_state(
        &self,
        job: &str,
        key: &str,
    ) -> Result<Option<StateEntry>, StoreError> {
        let row = bounded!(self, c => sqlx::query(&self.state_sql.get)
                    .bind(&self.namespace)
                    .bind(job)
                    .bind(key)
                    .fetch_optional(c))?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(StateEntry {
            key: key.to_owned(),
            value: row.try_get(0).map_err(|e| self.error(e))?,
            writer: self.writer(&row, 1)?,
        }))
    }

    pub(super) async fn list_state(&self, job: &str) -> Result<Vec<StateKey>, StoreError> {
        let rows = bounded!(self, c => sqlx::query(&self.state_sql.keys)
                    .bind(&self.namespace)
                    .bind(job)
                    .fetch_all(c))?;
        rows.iter()
            .map(|row| {
                let size: i64 = row.try_get(1).map_err(|e| self.error(e))?;
                Ok(StateKey {
                    key: row.try_get(0).map_err(|e| self.error(e))?,
                    size: u64::try_from(size).unwrap_or(0),
                    writer: self.writer(row, 2)?,
                })
            })
            .collect()
    }

    pub(super) async fn write_state(
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
        let (value, by, expect, expected): (Option<&[u8]>, i64, bool, Option<&[u8]>) = match *write
        {
            StateWrite::Set { value, .. } => (Some(value), 0, false, None),
            StateWrite::Delete { .. } => (None, 0, false, None),
            StateWrite::Increment { by, .. } => (None, by, false, None),
            StateWrite::CompareAndSwap { expected, new, .. } => {
                (Some(new), 0, expected.is_some(), expected)
            }
        };
        let row = bounded!(self, c => sqlx::query(&self.state_sql.write)
                    .bind(&self.namespace)
                    .bind(job)
                    .bind(slot)
                    .bind(token.to_string())
                    .bind(write.operation())
                    .bind(write.key())
                    .bind(value)
                    .bind(by)
                    .bind(expect)
                    .bind(expected)
                    .bind(i32::try_from(limits.max_keys).unwrap_or(i32::MAX))
                    .fetch_one(c))?;
        let get_err = |e| self.error(e);
        let outcome: String = row.try_get("outcome").map_err(get_err)?;
        let flag: Option<bool> = row.try_get("flag").map_err(get_err)?;
        let missing = |what: &str| {
            self.malformed(
                job,
                format!("state write answer {outcome:?} without {what}"),
            )
        };
        Ok(match outcome.as_str() {
            "set" => StateOutcome::Written(Written::Set),
            "deleted" => {
                StateOutcome::Written(Written::Deleted(flag.ok_or_else(|| missing("flag"))?))
            }
            "swapped" => {
                StateOutcome::Written(Written::Swapped(flag.ok_or_else(|| missing("flag"))?))
            }
            "incremented" => {
                let sum: Option<i64> = row.try_get("sum").map_err(get_err)?;
                StateOutcome::Written(Written::Incremented(sum.ok_or_else(|| missing("sum"))?))
            }
            "fenced" => StateOutcome::Fenced(self.refused_state(
                job,
                row.try_get("attempt_no").map_err(get_err)?,
                row.try_get("run_status").map_err(get_err)?,
                row.try_get("run_released").map_err(get_err)?,
            )?),
            "too-many-keys" => StateOutcome::Refused(StateRefusal::TooManyKeys {
                limit: limits.max_keys,
            }),
            "not-an-integer" => StateOutcome::Refused(StateRefusal::NotAnInteger),
            "overflow" => StateOutcome::Refused(StateRefusal::Overflow),
            other => {
                return Err(self.malformed(job, format!("unknown state write answer {other:?}")))
            }
        })
    }

    pub(super) async fn remove_state(&self, job: &str, key: &str) -> Result<bool, StoreError> {
        Ok(self.execute3(&self.state_sql.remove, job, key).await? == 1)
    }

    async fn execute3(&self, sql: &str, job: &str, key: &str) -> Result<u64, StoreError> {
        let done = bounded!(self, c => sqlx::query(sql)
            .bind(&self.namespace)
            .bind(job)
            .bind(key)
            .execute(c))?;
        Ok(done.rows_affected())
    }
}
