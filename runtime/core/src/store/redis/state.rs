//! Job state on Redis and Valkey (see [`crate::state`]): two hashes under the job's hash tag,
//! so that a job's state and its leases share a slot of a Redis Cluster and one script can check
//! the lease and write:
//!
//! - `{ns:job}:state`: key to value;
//! - `{ns:job}:state-writers`: key to the JSON record of the attempt that wrote it (slot,
//!   attempt, fence, the store's clock at the write, and the value's size).
//!
//! A write is one script (`state.lua`), one round trip; with replicas, followed by `WAIT` in the
//! same pipeline, like a claim (see the store's module documentation).

use serde::Deserialize;

use super::RedisStore;
use crate::lease::Token;
use crate::state::{
    StateEntry, StateKey, StateLimits, StateOutcome, StateRefusal, StateWrite, Writer, Written,
};
use crate::store::contract::StoreError;

/// What the state script answers.
#[derive(Deserialize)]
#[serde(tag = "o", rename_all = "kebab-case")]
enum StateAnswer {
    Set,
    Deleted { existed: bool },
    Incremented { sum: String },
    Swapped { swapped: bool },
    Fenced { state: Option<super::StateAnswer> },
    TooManyKeys,
    NotAnInteger,
    Overflow,
}

/// A writer's record as the script keeps it.
#[derive(Deserialize)]
struct WriterRecord {
    #[serde(flatten)]
    writer: Writer,
    size: u64,
}

impl RedisStore {
    /// The job's state keys: the live hash (for the lease check), the values and their
    /// writers.
    pub(super) fn state_keys_of(&self, job: &str) -> [String; 3] {
        let keys = self.job_keys(job);
        let [values, writers] = keys.state();
        [keys.live(), values, writers]
    }

    fn writer_record(&self, job: &str, raw: &str) -> Result<WriterRecord, StoreError> {
        serde_json::from_str(raw).map_err(|e| StoreError::Malformed {
            store: self.place.clone(),
            job: job.to_owned(),
            reason: format!("state writer record {raw:?}: {e}"),
        })
    }

    pub(super) async fn get_state(
        &self,
        job: &str,
        key: &str,
    ) -> Result<Option<StateEntry>, StoreError> {
        let [_, values, writers] = self.state_keys_of(job);
        let mut pipe = redis::pipe();
        pipe.hget(&values, key).hget(&writers, key);
        let (value, writer): (Option<Vec<u8>>, Option<String>) = pipe
            .query_async(&mut self.counted())
            .await
            .map_err(|e| self.error(e))?;
        let (Some(value), Some(writer)) = (value, writer) else {
            return Ok(None);
        };
        Ok(Some(StateEntry {
            key: key.to_owned(),
            value,
            writer: self.writer_record(job, &writer)?.writer,
        }))
    }

    pub(super) async fn list_state(&self, job: &str) -> Result<Vec<StateKey>, StoreError> {
        let [_, _, writers] = self.state_keys_of(job);
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&writers);
        let all: Vec<(String, String)> = cmd
            .query_async(&mut self.counted())
            .await
            .map_err(|e| self.error(e))?;
        let mut keys = all
            .into_iter()
            .map(|(key, raw)| {
                let record = self.writer_record(job, &raw)?;
                Ok(StateKey {
                    key,
                    size: record.size,
                    writer: record.writer,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(keys)
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
        // ARGV: slot, token, operation, key, value (or the increment), whether to compare (1 or
        // 0), the expected value, the most keys a job may have.
        let by;
        let (value, compare, expected): (&[u8], &str, &[u8]) = match *write {
            StateWrite::Set { value, .. } => (value, "0", b""),
            StateWrite::Delete { .. } => (b"", "0", b""),
            StateWrite::Increment { by: n, .. } => {
                by = n.to_string();
                (by.as_bytes(), "0", b"")
            }
            StateWrite::CompareAndSwap { expected, new, .. } => match expected {
                Some(expected) => (new, "1", expected),
                None => (new, "0", b""),
            },
        };
        let (slot, token, max_keys) = (
            slot.to_string(),
            token.to_string(),
            limits.max_keys.to_string(),
        );
        let args: [&[u8]; 8] = [
            slot.as_bytes(),
            token.as_bytes(),
            write.operation().as_bytes(),
            write.key().as_bytes(),
            value,
            compare.as_bytes(),
            expected,
            max_keys.as_bytes(),
        ];
        let (answer, acknowledged) = self
            .durable_script(
                self.counted_leases(),
                &self.scripts.state,
                &self.state_keys_of(job),
                &args,
            )
            .await?;
        let answer: StateAnswer = self.parse(job, &answer)?;
        let wrote = matches!(
            answer,
            StateAnswer::Set
                | StateAnswer::Deleted { .. }
                | StateAnswer::Incremented { .. }
                | StateAnswer::Swapped { .. }
        );
        if wrote {
            // A write the replicas do not hold could be lost with the primary after the guest
            // was told it was written.
            self.check_acknowledged("state write", acknowledged)?;
        }
        Ok(match answer {
            StateAnswer::Set => StateOutcome::Written(Written::Set),
            StateAnswer::Deleted { existed } => StateOutcome::Written(Written::Deleted(existed)),
            StateAnswer::Incremented { sum } => {
                let sum = sum.parse().map_err(|_| StoreError::Malformed {
                    store: self.place.clone(),
                    job: job.to_owned(),
                    reason: format!("an increment answered {sum:?}, not an integer"),
                })?;
                StateOutcome::Written(Written::Incremented(sum))
            }
            StateAnswer::Swapped { swapped } => StateOutcome::Written(Written::Swapped(swapped)),
            StateAnswer::Fenced { state } => StateOutcome::Fenced(state.map(Into::into)),
            StateAnswer::TooManyKeys => StateOutcome::Refused(StateRefusal::TooManyKeys {
                limit: limits.max_keys,
            }),
            StateAnswer::NotAnInteger => StateOutcome::Refused(StateRefusal::NotAnInteger),
            StateAnswer::Overflow => StateOutcome::Refused(StateRefusal::Overflow),
        })
    }

    pub(super) async fn remove_state(&self, job: &str, key: &str) -> Result<bool, StoreError> {
        let [_, values, writers] = self.state_keys_of(job);
        let mut pipe = redis::pipe();
        pipe.hdel(&values, key).hdel(&writers, key);
        let (removed, _): (u32, u32) = pipe
            .query_async(&mut self.counted())
            .await
            .map_err(|e| self.error(e))?;
        Ok(removed == 1)
    }
}
