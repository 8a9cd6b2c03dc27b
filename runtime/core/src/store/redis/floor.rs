//! The floor of a script on this server: what the server's own time per due slot would be if
//! each of Baton's atomic steps made only the calls it cannot do without, and no Lua logic at
//! all (see [`crate::store::StepFloor`]). `baton bench capacity` prints it beside the real
//! steps' time, so that what the scripts themselves cost on a given server can be told from
//! what Baton's rules add.
//!
//! The bare steps, on a scratch hash and lease key of the namespace (under its hash tag, so
//! they run on a cluster too):
//!
//! - a losing claim: `GET` of the lease key, found;
//! - a won claim: `TIME`, `HMGET` of the run's field and the five live fields, `HSET` of the
//!   run's record and four live fields, `SET` of the lease key with `PX`;
//! - a finish: `HMGET` of the run's record and the running runs, `TIME`, `HSET` of the record
//!   and the running runs, `DEL` of the lease key.
//!
//! Each is called [`CALLS`] times, [`BATCH`] calls a request, and timed by the server's `INFO
//! commandstats` (the difference of two readings of the scripts' `usec`). Each finish deletes a
//! lease key of its own, written by a plain `SET` just before it in the same request, which the
//! server counts apart from the scripts.

use redis::{AsyncCommands, Script};

use super::RedisStore;
use crate::store::contract::{StepFloor, Store, StoreError};

/// How many calls of each step go in one request.
const BATCH: u32 = 50;

/// How many times each bare step is called: 10 requests of [`BATCH`].
const CALLS: u32 = 10 * BATCH;

/// A run record as long as one of a single attempt (a head line and the attempt as JSON).
const RECORD_BYTES: usize = 256;

const EMPTY: &str = "return 1";

const LOSING_CLAIM: &str = "local held = redis.call('GET', KEYS[2])
if held then return 'running ' .. held end
return 'absent'";

const WON_CLAIM: &str = "local t = redis.call('TIME')
local live = redis.call('HMGET', KEYS[1], ARGV[1], 'n', 'f', 'p', 'r', 'c')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], 'n', ARGV[1], 'f', t[1] .. t[2], 'r', ' 1:2',
  'c', '1')
redis.call('SET', KEYS[2], ARGV[2], 'PX', 600000)
return 'won'";

const FINISH: &str = "local live = redis.call('HMGET', KEYS[1], ARGV[1], 'r')
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], 'r', '')
redis.call('DEL', KEYS[2])
return 'accepted'";

impl RedisStore {
    /// Measures the floor of each step, as [`Store::step_floor`] describes.
    pub(super) async fn measure_floor(&self) -> Result<StepFloor, StoreError> {
        let keys = [
            self.scratch_key("floor:live"),
            self.scratch_key("floor:lease"),
        ];
        let record = "x".repeat(RECORD_BYTES);
        let args = ["1".to_owned(), record];
        let measured = self.floor_of_each(&keys, &args).await;
        // Both keys carry the namespace's hash tag: one command on a cluster too.
        let () = self.counted().del(&keys).await.map_err(|e| self.error(e))?;
        measured
    }

    async fn floor_of_each(
        &self,
        keys: &[String; 2],
        args: &[String; 2],
    ) -> Result<StepFloor, StoreError> {
        let [live, lease] = keys;
        let (same, fresh) = (Leases::Same(lease), Leases::Fresh(lease));
        let empty_script_us = self.time_calls(EMPTY, live, same, args).await?;
        let won_claim_us = self.time_calls(WON_CLAIM, live, same, args).await?;
        // The lease key exists now, as a losing claim finds it.
        let losing_claim_us = self.time_calls(LOSING_CLAIM, live, same, args).await?;
        let finish_us = self.time_calls(FINISH, live, fresh, args).await?;
        Ok(StepFloor {
            empty_script_us,
            losing_claim_us,
            won_claim_us,
            finish_us,
            calls: CALLS,
        })
    }

    /// Calls the script `source` [`CALLS`] times on the live hash `live` and the lease keys of `leases`;
    /// the server's time per call, µs. The calls go [`BATCH`] a request, so that the server
    /// runs them back to back, as it runs the many hosts' steps of a busy store, not one a
    /// round trip.
    async fn time_calls(
        &self,
        source: &str,
        live: &str,
        leases: Leases<'_>,
        args: &[String; 2],
    ) -> Result<f64, StoreError> {
        let script = Script::new(source);
        let mut c = self.counted();
        // Loads the script into the server's cache, outside the measured calls.
        script.load_async(&mut c).await.map_err(|e| self.error(e))?;
        let before = self.server_time().await?.unwrap_or_default();
        for _ in 0..CALLS / BATCH {
            let mut pipe = redis::pipe();
            for call in 0..BATCH {
                let lease = match leases {
                    Leases::Same(key) => key.to_owned(),
                    Leases::Fresh(prefix) => {
                        // A plain SET: the server counts it apart from the scripts' time.
                        let key = format!("{prefix}:{call}");
                        pipe.set_options(&key, 1, Default::default()).ignore();
                        key
                    }
                };
                pipe.cmd("EVALSHA")
                    .arg(script.get_hash())
                    .arg(2)
                    .arg(live)
                    .arg(lease)
                    .arg(args)
                    .ignore();
            }
            let () = pipe.query_async(&mut c).await.map_err(|e| self.error(e))?;
        }
        let after = self.server_time().await?.unwrap_or_default();
        Ok((after.steps_us - before.steps_us) / f64::from(CALLS))
    }
}

/// The lease key each bare step is called with.
#[derive(Clone, Copy)]
enum Leases<'a> {
    /// This one key, every call.
    Same(&'a str),
    /// A key of its own for each call, under this prefix, written just before it: each finish
    /// deletes a lease key that exists, as a real finish does.
    Fresh(&'a str),
}
