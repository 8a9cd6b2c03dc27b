//! The Redis and Valkey store: one Lua script per operation, on a single server or a Redis
//! Cluster.
//!
//! Every operation is one script, run by SHA (`EVALSHA`), so it is one atomic step and one round
//! trip. The store loads its scripts into the server's cache when it opens (on a cluster, into
//! every primary's), so an operation's first call is one round trip too; a server that lost its
//! cache since (a restart, a failover to a replica that never saw the scripts) answers
//! `NOSCRIPT`, and the call is sent again with the script's text. The store's clock is `TIME`
//! read inside the script. Every key of a job shares the hash tag `{<namespace>:<job>}`, so a
//! job's scripts are valid on a Redis Cluster. The keys of a job, and the records in them, are
//! the layout (see `layout.rs`): a live hash that a claim, a heartbeat and a finish each read
//! once and write once, a sorted set of the slots with state, and a key per live lease that
//! answers a losing claim alone; the job's state (see `state.rs`) beside them.
//!
//! Beside them, `{ns}:jobs` is the set of the namespace's job names, added to once per job and
//! process after a won claim, and `{ns}:layout` the layout's version: a store refuses a
//! namespace that an older Baton wrote in another layout (the keys would not be seen, and its
//! jobs would run twice).
//!
//! URLs: `redis://[user:password@]host:port[/db]`, `rediss://` for TLS, `valkey://` and
//! `valkeys://` alike; a cluster is `redis+cluster://host:port,host:port,…` (also
//! `rediss+cluster`, `valkey+cluster`, `valkeys+cluster`), naming one or more seed nodes. Any of
//! them may end in `?timeout=DURATION`: how long each operation waits for the server's answer
//! ([`RESPONSE_TIMEOUT`], 5 s, unless given), and `?replicas=auto|N`: how many replicas must
//! acknowledge a claim, a heartbeat, a finish, a release or a state write ([`Replicas`], `auto`
//! unless given).
//!
//! Durable answers. Redis and Valkey replicate asynchronously: a primary that dies takes with it
//! whatever it answered but had not yet sent to its replica, and the promoted replica goes on
//! without it. So, with replicas, every claim, heartbeat, finish, release and state write is
//! followed by `WAIT numreplicas timeout` in the same pipeline, on the same connection (on a
//! cluster the pipeline goes to the node of the job's hash tag, which ran the script): one request,
//! one round trip, answered once the replicas hold the write or the wait ([`ACK_TIMEOUT`]) is over.
//! A won claim, a renewal, a finish, a release or a state write that too few replicas acknowledged
//! is [`StoreError::NotAcknowledged`]: the job does not start on such a claim, and the runner keeps
//! the lease end it had before such a renewal, so that it never believes its lease runs longer than
//! the replica holds it (a backup may take the run over once that end has passed on the promoted
//! replica). `WAIT` narrows the window in which a failover loses an answer; it does not make Redis
//! consistent: a replica that acknowledged can still lose the write if it dies too, and a failover
//! that promotes a replica that did not acknowledge (one that was not counted) still loses it. A
//! primary also answers reads from what it holds before the replicas do: a claim it answered
//! `Running` or `Overlap` from a renewal that the promoted replica never received may be answered
//! otherwise after the failover. A state write that was not acknowledged is on the primary: the
//! guest is told so, and a failover now could lose it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, RedisError, RedisFuture, Script};
use serde::Deserialize;

use crate::lease::{
    millis, ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, Run, RunState, Status, Token,
    TokenOutcome,
};
use crate::operate::{OperateOutcome, Operation, Operator, Request, OPERATIONS_KEPT};
use crate::state::{StateEntry, StateKey, StateLimits, StateOutcome, StateWrite};
use crate::store::contract::{Cause, ServerTime, StepFloor, Store, StoreError};
use crate::store::url::{redact, take_parameter, take_timeout, DEFAULT_TIMEOUT};

/// How long opening a store waits for the server before it gives up: 5 s.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one operation waits for the server's answer before it fails with a retryable
/// error, unless the URL's `?timeout=DURATION` says otherwise: 5 s
/// ([`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT)).
pub const RESPONSE_TIMEOUT: Duration = DEFAULT_TIMEOUT;

/// The oldest Redis this store runs on: 6.2.
pub const MIN_REDIS_VERSION: (u32, u32) = (6, 2);

/// The store URL's query parameter that sets how many replicas must acknowledge a claim, a
/// finish or a release before the store answers it: `?replicas=auto` (the default) or
/// `?replicas=N`; see [`Replicas`].
pub const REPLICAS_PARAMETER: &str = "replicas";

/// The most replicas `?replicas=N` may name: 16.
pub const MAX_REPLICAS: u32 = 16;

/// How long a write (a claim, a heartbeat, a finish, a release, a state write) waits for its
/// replicas' acknowledgement (`WAIT`'s timeout): 1 s, or half the response timeout when that is shorter, so that the answer always
/// comes before the client gives up on it.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// How often `?replicas=auto` reads again how many replicas the primary has: every 5 s.
pub const REPLICAS_REFRESH: Duration = Duration::from_secs(5);

/// How many replicas must acknowledge a claim, a heartbeat, a finish, a release or a state
/// write (`WAIT numreplicas`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Replicas {
    /// As many as the primary reports connected (`connected_slaves` of `INFO replication`; on a
    /// cluster, the fewest any primary has), read when the store opens, every
    /// [`REPLICAS_REFRESH`], and after a write that was not acknowledged: safe on a server with
    /// replicas, free on one without (no `WAIT` is sent while the count is 0). The default.
    #[default]
    Auto,
    /// Exactly this many; `0` sends no `WAIT` at all. A count the primary cannot reach makes
    /// every claim [`StoreError::NotAcknowledged`].
    Count(u32),
}

/// Takes `?replicas=auto|N` off a store URL: returns the URL without it and the setting,
/// [`Replicas::Auto`] when the URL gives none. Fails with [`StoreError::InvalidUrl`] naming the
/// parameter for any other value, or a count over [`MAX_REPLICAS`].
pub fn take_replicas(url: &str) -> Result<(String, Replicas), StoreError> {
    let invalid = |reason: String| StoreError::InvalidUrl {
        url: redact(url),
        reason,
    };
    let (rest, value) = take_parameter(url, REPLICAS_PARAMETER).map_err(invalid)?;
    let replicas = match value.as_deref() {
        None | Some("auto") => Replicas::Auto,
        Some(n) => match n.parse::<u32>() {
            Ok(n) if n <= MAX_REPLICAS => Replicas::Count(n),
            _ => {
                return Err(invalid(format!(
                    "the {REPLICAS_PARAMETER} parameter {n:?} is neither auto nor a count from 0 \
                     to {MAX_REPLICAS}"
                )))
            }
        },
    };
    Ok((rest, replicas))
}

mod floor;
mod layout;
mod state;

use layout::JobKeys;

const COMMON: &str = include_str!("common.lua");

/// A script and its text: the text is sent with `EVAL` when a pipeline's `EVALSHA` finds the
/// script not loaded.
struct Lua {
    script: Script,
    code: String,
}

impl Lua {
    fn new(body: &str) -> Self {
        let code = format!("{COMMON}\n{body}");
        Lua {
            script: Script::new(&code),
            code,
        }
    }
}

/// The scripts, each with the shared helpers in front.
struct Scripts {
    claim: Lua,
    heartbeat: Lua,
    finish: Lua,
    /// The fenced write of the job's state (`state.lua`).
    state: Lua,
    operate: Lua,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            claim: Lua::new(include_str!("claim.lua")),
            heartbeat: Lua::new(include_str!("heartbeat.lua")),
            finish: Lua::new(include_str!("finish.lua")),
            state: Lua::new(include_str!("state.lua")),
            operate: Lua::new(include_str!("operate.lua")),
        }
    }
}

/// What the store waits for after a write: the setting, and the count of replicas it asks
/// `WAIT` for now.
struct Durability {
    setting: Replicas,
    /// The replicas to wait for: the count given, or the last reading of `auto`.
    required: AtomicU32,
    /// `WAIT`'s timeout.
    timeout: Duration,
    /// Wakes the `auto` reading early: a write was not acknowledged, perhaps because the
    /// primary lost its replicas (a promoted replica has none).
    recount: tokio::sync::Notify,
}

/// A connection to one server or to a cluster; both reconnect by themselves.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The connection in `shared` now.
fn current(shared: &Shared) -> Connection {
    shared.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A connection that can be replaced while clones of it are in use.
type Shared = Arc<std::sync::RwLock<Connection>>;

/// What reopens a cluster's connection: the client, and until when it goes on doing so.
struct Reopen {
    client: redis::cluster::ClusterClient,
    until: Mutex<Option<std::time::Instant>>,
}

/// How often a cluster's connection is opened again while operations fail: every 1 s.
const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// For how long after the last operation that failed as unreachable a cluster's connection is
/// opened again every [`REOPEN_EVERY`]: 30 s, longer than a cluster takes to promote a replica
/// with its default node timeout (15 s).
const REOPEN_FOR: Duration = Duration::from_secs(30);

/// A connection that counts every request sent on it (a command, or a pipeline: one round
/// trip each), for [`Store::round_trips`].
struct Counted {
    connection: Connection,
    sent: Arc<AtomicU64>,
}

impl redis::aio::ConnectionLike for Counted {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        match &mut self.connection {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        match &mut self.connection {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.connection {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// A store on a Redis or Valkey server, or a Redis Cluster.
pub struct RedisStore {
    /// Claims and everything else go on this connection.
    connection: Shared,
    /// Heartbeats, finishes and releases go on a connection of their own, so that a burst of
    /// claims (every job of a busy host due on the same second) cannot queue a lease's renewal
    /// or a run's end behind it. On a cluster it is the same connection, which already talks to
    /// each node on its own.
    leases: Shared,
    /// On a cluster: how to open its connection again (see [`RedisStore::reopen_cluster`]).
    cluster: Option<Arc<Reopen>>,
    /// Requests sent: see [`Store::round_trips`].
    sent: Arc<AtomicU64>,
    namespace: String,
    /// Where the store is, for messages: host and port (of the first seed), never a password.
    place: String,
    scripts: Arc<Scripts>,
    /// The jobs this client has added to `{ns}:jobs` already.
    registered: Mutex<HashSet<String>>,
    /// How many replicas must acknowledge a write.
    durability: Arc<Durability>,
}

/// Opens a Redis or Valkey store from a `redis://`, `rediss://`, `valkey://` or `valkeys://`
/// URL, or a cluster from `redis+cluster://seed,seed,…`, in a namespace.
///
/// Fails within [`CONNECT_TIMEOUT`] with [`StoreError::Unreachable`] (naming host and port) when
/// the server cannot be reached, and with [`StoreError::Unsupported`] for a server that does
/// not speak the Redis protocol or is older than Redis 6.2.
pub async fn open(url: &str, namespace: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(RedisStore::open(url, namespace).await?))
}

/// Splits a cluster URL into seed URLs: `redis+cluster://u:p@h1:1,h2:2` gives
/// `redis://u:p@h1:1` and `redis://u:p@h2:2`.
fn cluster_seeds(url: &str) -> Result<Option<Vec<String>>, StoreError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let Some(base) = scheme.strip_suffix("+cluster") else {
        return Ok(None);
    };
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), rest),
    };
    let hosts = hosts.split(['/', '?']).next().unwrap_or("");
    let seeds: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{base}://{userinfo}{h}"))
        .collect();
    if seeds.is_empty() {
        return Err(StoreError::InvalidUrl {
            url: redact(url),
            reason: format!("no seed node after {scheme}://; write {scheme}://HOST:PORT,HOST:PORT"),
        });
    }
    Ok(Some(seeds))
}

/// Host and port of a redis URL, for messages.
fn place_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.contains(':') || host.starts_with('[') {
        host.to_owned()
    } else {
        format!("{host}:6379")
    }
}

impl RedisStore {
    /// Opens the store; see [`open`].
    pub async fn open(url: &str, namespace: &str) -> Result<Self, StoreError> {
        let (url, response_timeout) = take_timeout(url, RESPONSE_TIMEOUT)?;
        let (url, replicas) = take_replicas(&url)?;
        let url = url.as_str();
        let seeds = cluster_seeds(url)?;
        let place = match &seeds {
            Some(seeds) => format!("cluster {}", place_of(&seeds[0])),
            None => place_of(url),
        };
        let invalid = |e: RedisError| StoreError::InvalidUrl {
            url: redact(url),
            reason: e.to_string(),
        };
        let connect = async {
            // A cluster opens while any seed answers: one node may be down.
            let mut unreachable = None;
            for seed in seeds
                .as_deref()
                .unwrap_or(std::slice::from_ref(&url.to_owned()))
            {
                if !(seed.starts_with("redis://") || seed.starts_with("valkey://")) {
                    unreachable = None;
                    break;
                }
                match probe(&place_of(seed)).await {
                    Ok(()) => {
                        unreachable = None;
                        break;
                    }
                    Err(e @ StoreError::Unreachable { .. }) => unreachable = Some(e),
                    Err(e) => return Err(e),
                }
            }
            if let Some(e) = unreachable {
                return Err(e);
            }
            match &seeds {
                None => {
                    // A `valkey://` URL is a `redis://` URL to the client.
                    let client = redis::Client::open(url).map_err(invalid)?;
                    let config = redis::aio::ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(CONNECT_TIMEOUT))
                        .set_response_timeout(Some(response_timeout))
                        .set_number_of_retries(2);
                    let open = || async {
                        ConnectionManager::new_with_config(client.clone(), config.clone())
                            .await
                            .map(Connection::Single)
                            .map_err(|e| connect_error(&place, e))
                    };
                    Ok((open().await?, open().await?, None))
                }
                Some(seeds) => {
                    let client = redis::cluster::ClusterClientBuilder::new(seeds.clone())
                        .connection_timeout(CONNECT_TIMEOUT)
                        .response_timeout(response_timeout)
                        .build()
                        .map_err(invalid)?;
                    let connection = client
                        .get_async_connection()
                        .await
                        .map(Connection::Cluster)
                        .map_err(|e| connect_error(&place, e))?;
                    let reopen = Arc::new(Reopen {
                        client,
                        until: Mutex::new(None),
                    });
                    Ok((connection.clone(), connection, Some(reopen)))
                }
            }
        };
        let (connection, leases, cluster) = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| StoreError::Unreachable {
            store: place.clone(),
            source: format!("no answer within {CONNECT_TIMEOUT:?} (the connect timeout)").into(),
        })??;
        let store = RedisStore {
            connection: Arc::new(std::sync::RwLock::new(connection)),
            leases: Arc::new(std::sync::RwLock::new(leases)),
            cluster,
            sent: Arc::new(AtomicU64::new(0)),
            namespace: namespace.to_owned(),
            place,
            scripts: Arc::new(Scripts::new()),
            registered: Mutex::new(HashSet::new()),
            durability: Arc::new(Durability {
                setting: replicas,
                required: AtomicU32::new(match replicas {
                    Replicas::Auto => 0,
                    Replicas::Count(n) => n,
                }),
                timeout: ACK_TIMEOUT.min(response_timeout / 2),
                recount: tokio::sync::Notify::new(),
            }),
        };
        let checks = async {
            store.check_server().await?;
            store.check_layout().await?;
            store.load_scripts().await;
            if store.durability.setting == Replicas::Auto {
                let count = replica_count(&mut store.counted())
                    .await
                    .map_err(|e| connect_error(&store.place, e))?;
                store.durability.required.store(count, Ordering::Relaxed);
            }
            Ok::<(), StoreError>(())
        };
        tokio::time::timeout(CONNECT_TIMEOUT, checks)
            .await
            .map_err(|_| StoreError::Unreachable {
                store: store.place.clone(),
                source: format!("no answer within {CONNECT_TIMEOUT:?} (the connect timeout)")
                    .into(),
            })??;
        if store.durability.setting == Replicas::Auto {
            store.watch_replicas();
        }
        Ok(store)
    }

    /// How many replicas a write waits for now.
    pub fn replicas_required(&self) -> u32 {
        self.durability.required.load(Ordering::Relaxed)
    }

    /// Reads the primary's replica count every [`REPLICAS_REFRESH`] for `?replicas=auto`, and
    /// at once after a write was not acknowledged, until the store is dropped. A failed reading
    /// keeps the last one.
    fn watch_replicas(&self) {
        let durability = Arc::downgrade(&self.durability);
        // Upkeep, not an operation: its readings are not in `round_trips`, which counts what
        // the store's operations send.
        let shared = self.connection.clone();
        let upkeep = Arc::new(AtomicU64::new(0));
        tokio::spawn(async move {
            loop {
                let Some(woken) = durability.upgrade() else {
                    return;
                };
                let _ = tokio::time::timeout(REPLICAS_REFRESH, woken.recount.notified()).await;
                drop(woken);
                let Some(durability) = durability.upgrade() else {
                    return;
                };
                let mut connection = Counted {
                    connection: current(&shared),
                    sent: upkeep.clone(),
                };
                match replica_count(&mut connection).await {
                    Ok(count) => durability.required.store(count, Ordering::Relaxed),
                    Err(e) => tracing::debug!(error = %e, "cannot read the replica count"),
                }
            }
        });
    }

    /// Loads every script into the server's script cache (on a cluster, every primary's), so
    /// that no operation's first call costs a `NOSCRIPT` answer and a second round trip: one
    /// whose answer is lost (the server went away) would otherwise leave the script unloaded
    /// and the operation not done. A failure (a cluster node down while the store opens) is
    /// logged and left to `NOSCRIPT`. Upkeep, not an operation: not in `round_trips`.
    async fn load_scripts(&self) {
        let scripts = &self.scripts;
        let mut connection = Counted {
            connection: current(&self.connection),
            sent: Arc::new(AtomicU64::new(0)),
        };
        for script in [
            &scripts.claim.script,
            &scripts.heartbeat.script,
            &scripts.finish.script,
            &scripts.state.script,
            &scripts.operate.script,
        ] {
            if let Err(e) = script.load_async(&mut connection).await {
                tracing::warn!(store = %self.place, error = %e,
                    "cannot load the store's scripts ahead; each is loaded on its first call");
                return;
            }
        }
    }

    /// Refuses a server older than Redis 6.2 (Valkey reports a Redis version too).
    async fn check_server(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        // A cluster answers with one reply per node: every node must be recent enough.
        let info: redis::Value = {
            let mut c = self.counted();
            cmd.query_async(&mut c).await
        }
        .map_err(|e| connect_error(&self.place, e))?;
        let mut texts = Vec::new();
        collect_text(&info, &mut texts);
        let versions: Vec<&str> = texts
            .iter()
            .filter_map(|t| t.lines().find_map(|l| l.strip_prefix("redis_version:")))
            .map(str::trim)
            .collect();
        if versions.is_empty() {
            return Err(StoreError::Unsupported {
                store: self.place.clone(),
                reason: "the server's INFO names no redis_version; Baton needs Redis 6.2 or \
                         later, or Valkey"
                    .into(),
            });
        }
        for version in versions {
            check_version(&self.place, version)?;
        }
        Ok(())
    }

    /// Refuses a namespace written in another layout of this store, whose runs this one would
    /// not see (its jobs would run twice); marks a new namespace with this layout's version.
    async fn check_layout(&self) -> Result<(), StoreError> {
        let (layout_key, jobs_key) = (self.layout_key(), self.jobs_key());
        let mut c = self.counted();
        let (version, has_jobs): (Option<String>, bool) = redis::pipe()
            .get(&layout_key)
            .exists(&jobs_key)
            .query_async(&mut c)
            .await
            .map_err(|e| connect_error(&self.place, e))?;
        let found = match version {
            Some(v) if v == layout::LAYOUT_VERSION => return Ok(()),
            Some(v) => v,
            None if has_jobs => "1".to_owned(),
            None => {
                let () = redis::cmd("SET")
                    .arg(&layout_key)
                    .arg(layout::LAYOUT_VERSION)
                    .arg("NX")
                    .query_async(&mut c)
                    .await
                    .map_err(|e| connect_error(&self.place, e))?;
                return Ok(());
            }
        };
        Err(StoreError::Unsupported {
            store: self.place.clone(),
            reason: format!(
                "namespace {:?} holds runs in layout {found} of the Redis store, and this Baton \
                 reads layout {}: give this cluster a new namespace (--namespace), or run the \
                 Baton that wrote it",
                self.namespace,
                layout::LAYOUT_VERSION
            ),
        })
    }

    /// A handle on the connection that counts what it sends.
    fn counted(&self) -> Counted {
        self.counted_on(&self.connection)
    }

    /// A handle on the leases' connection that counts what it sends.
    fn counted_leases(&self) -> Counted {
        self.counted_on(&self.leases)
    }

    fn counted_on(&self, connection: &Shared) -> Counted {
        Counted {
            connection: current(connection),
            sent: self.sent.clone(),
        }
    }

    /// The key of the raw primitive `key`, with the namespace's hash tag.
    fn scratch_key(&self, key: &str) -> String {
        format!("{{{}}}:bench:{key}", self.namespace)
    }

    /// The keys of `job`.
    fn job_keys(&self, job: &str) -> JobKeys {
        JobKeys::new(&self.namespace, job)
    }

    /// The keys of a script that acts with a token on `slot`: the live hash and the lease key.
    fn token_keys(&self, job: &str, slot: i64) -> [String; 2] {
        let keys = self.job_keys(job);
        [keys.live(), keys.lease(slot)]
    }

    /// The key of the namespace's layout version.
    fn layout_key(&self) -> String {
        format!("{{{}}}:layout", self.namespace)
    }

    /// The namespace's pauses in force (a hash from job to the pause, kept beside each job's
    /// own flag for listing them all) and its record of operations (a sorted set by time).
    fn operation_keys(&self) -> (String, String) {
        (
            format!("{{{}}}:paused", self.namespace),
            format!("{{{}}}:operations", self.namespace),
        )
    }

    fn jobs_key(&self) -> String {
        format!("{{{}}}:jobs", self.namespace)
    }

    /// Runs a script with these keys and arguments; returns its answer.
    async fn script<A: redis::ToRedisArgs>(
        &self,
        mut on: Counted,
        lua: &Lua,
        keys: &[String],
        args: &[A],
    ) -> Result<String, StoreError> {
        let mut invocation = lua.script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        invocation
            .invoke_async(&mut on)
            .await
            .map_err(|e| self.error(e))
    }

    /// Runs a script that writes, followed by `WAIT` for the required replicas in the same
    /// pipeline (one round trip), when any are required; returns its answer parsed and how many
    /// replicas acknowledged (`None` when none were asked for).
    async fn durable_script<A: redis::ToRedisArgs>(
        &self,
        mut on: Counted,
        lua: &Lua,
        keys: &[String],
        args: &[A],
    ) -> Result<(String, Option<u32>), StoreError> {
        let required = self.replicas_required();
        if required == 0 {
            return Ok((self.script(on, lua, keys, args).await?, None));
        }
        let timeout_ms = u64::try_from(self.durability.timeout.as_millis()).unwrap_or(u64::MAX);
        let pipeline = |by_hash: bool| {
            let mut pipe = redis::pipe();
            let eval = if by_hash {
                pipe.cmd("EVALSHA").arg(lua.script.get_hash())
            } else {
                pipe.cmd("EVAL").arg(&lua.code)
            };
            eval.arg(keys.len()).arg(keys).arg(args);
            pipe.cmd("WAIT").arg(required).arg(timeout_ms);
            pipe
        };
        let answered: Result<(String, u32), RedisError> = match pipeline(true)
            .query_async(&mut on)
            .await
        {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                pipeline(false).query_async(&mut on).await
            }
            other => other,
        };
        let (answer, acknowledged) = answered.map_err(|e| self.error(e))?;
        Ok((answer, Some(acknowledged)))
    }

    /// Fails with [`StoreError::NotAcknowledged`] when fewer replicas than required
    /// acknowledged the `operation`.
    fn check_acknowledged(
        &self,
        operation: &'static str,
        acknowledged: Option<u32>,
    ) -> Result<(), StoreError> {
        let Some(acknowledged) = acknowledged else {
            return Ok(());
        };
        let required = self.replicas_required();
        if acknowledged >= required {
            return Ok(());
        }
        self.durability.recount.notify_one();
        Err(StoreError::NotAcknowledged {
            store: self.place.clone(),
            operation,
            acknowledged,
            required,
            timeout: self.durability.timeout,
        })
    }

    fn parse<T: for<'de> Deserialize<'de>>(
        &self,
        job: &str,
        answer: &str,
    ) -> Result<T, StoreError> {
        serde_json::from_str(answer).map_err(|e| StoreError::Malformed {
            store: self.place.clone(),
            job: job.to_owned(),
            reason: format!("unexpected script answer {answer:?}: {e}"),
        })
    }

    /// A record or an answer of the layout that did not read, as an error naming the job.
    fn malformed(&self, job: &str, reason: String) -> StoreError {
        StoreError::Malformed {
            store: self.place.clone(),
            job: job.to_owned(),
            reason,
        }
    }

    fn error(&self, e: RedisError) -> StoreError {
        let error = operation_error(&self.place, e);
        if matches!(error, StoreError::Unreachable { .. }) {
            self.reopen_cluster();
        }
        error
    }

    /// Opens a cluster's connection again after an operation failed as unreachable: every
    /// [`REOPEN_EVERY`] for [`REOPEN_FOR`], in the background. After a primary died, the
    /// connection goes on sending its hash slots to the dead address, each request timing out,
    /// and the client does not always ask the cluster for its slots again; the promotion of the
    /// replica comes only after the cluster's node timeout. A new connection reads the slots
    /// from the seeds, so the first one opened after the promotion sends them to the new
    /// primary; requests in flight finish on the old one.
    fn reopen_cluster(&self) {
        let Some(reopen) = &self.cluster else {
            return;
        };
        {
            let mut until = reopen.until.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            let running = until.is_some_and(|u| u > now);
            *until = Some(now + REOPEN_FOR);
            if running {
                return;
            }
        }
        let (reopen, connection, leases) =
            (reopen.clone(), self.connection.clone(), self.leases.clone());
        tokio::spawn(async move {
            loop {
                let opened =
                    tokio::time::timeout(CONNECT_TIMEOUT, reopen.client.get_async_connection());
                match opened.await {
                    Ok(Ok(fresh)) => {
                        for shared in [&connection, &leases] {
                            *shared.write().unwrap_or_else(|p| p.into_inner()) =
                                Connection::Cluster(fresh.clone());
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "cannot open the cluster's connection again")
                    }
                    Err(_) => {
                        tracing::debug!("cannot open the cluster's connection again: timed out")
                    }
                }
                tokio::time::sleep(REOPEN_EVERY).await;
                let until = *reopen.until.lock().unwrap_or_else(|p| p.into_inner());
                if until.is_none_or(|u| u <= std::time::Instant::now()) {
                    return;
                }
            }
        });
    }

    /// Adds the job to the namespace's set of jobs, once per job and client. A failure is left
    /// for the next won claim to mend: the claim's answer stands.
    async fn register(&self, job: &str) {
        let known = self
            .registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(job);
        if known {
            return;
        }
        let key = self.jobs_key();
        let added: Result<(), RedisError> = {
            let mut c = self.counted();
            c.sadd(key, job).await
        };
        match added {
            Ok(()) => {
                self.registered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(job.to_owned());
            }
            Err(e) => tracing::warn!(job, error = %e, "could not record the job's name"),
        }
    }

    async fn records(&self, job: &str, slots: Vec<String>) -> Result<Vec<Run>, StoreError> {
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.job_keys(job).live()).arg(&slots);
        let raw: Vec<Option<String>> = {
            let mut c = self.counted();
            cmd.query_async(&mut c).await
        }
        .map_err(|e| self.error(e))?;
        slots
            .iter()
            .zip(raw)
            .filter_map(|(slot, record)| record.map(|r| (slot, r)))
            .map(|(slot, record)| {
                let slot = slot
                    .parse()
                    .map_err(|_| self.malformed(job, format!("slot {slot:?} is not a number")))?;
                layout::decode_record(job, slot, &record).map_err(|e| self.malformed(job, e))
            })
            .collect()
    }

    fn decode_operation(&self, job: &str, record: &str) -> Result<Operation, StoreError> {
        serde_json::from_str(record).map_err(|e| StoreError::Malformed {
            store: self.place.clone(),
            job: job.to_owned(),
            reason: format!("operation record: {e}"),
        })
    }
}

/// Sends one `PING` over a plain connection and reads the first byte of the answer, so that a
/// server of another kind (one that hangs up, or answers in another protocol) is named as such
/// rather than as a broken pipe. A Redis error reply (`-NOAUTH …`) counts as Redis.
async fn probe(place: &str) -> Result<(), StoreError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let unreachable = |e: std::io::Error| StoreError::Unreachable {
        store: place.to_owned(),
        source: Box::new(e),
    };
    let mut socket = tokio::net::TcpStream::connect(place)
        .await
        .map_err(unreachable)?;
    socket
        .write_all(b"*1\r\n$4\r\nPING\r\n")
        .await
        .map_err(unreachable)?;
    let mut first = [0u8; 1];
    let answer = match socket.read(&mut first).await {
        Ok(0) | Err(_) => "hung up without an answer".to_owned(),
        Ok(_) if b"+-$*:%_#,(=!>|~".contains(&first[0]) => return Ok(()),
        Ok(_) => format!("answered with byte {:#04x}", first[0]),
    };
    Err(StoreError::Unsupported {
        store: place.to_owned(),
        reason: format!(
            "it {answer} to a Redis PING, so it is not a Redis or Valkey server; point the URL \
             at a Redis 6.2+ or Valkey server"
        ),
    })
}

/// Every text in a reply (a cluster's INFO is a map from node to text).
fn collect_text(value: &redis::Value, out: &mut Vec<String>) {
    match value {
        redis::Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => {
            out.push(s.clone())
        }
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|v| collect_text(v, out))
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(_, v)| collect_text(v, out)),
        _ => {}
    }
}

/// How many replicas the primary reports connected (`connected_slaves` of `INFO
/// replication`); on a cluster, whose `INFO` answers for every node, the fewest any primary
/// has, so that `WAIT` never asks a primary for more replicas than it has.
async fn replica_count(on: &mut Counted) -> Result<u32, RedisError> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    let info: redis::Value = cmd.query_async(on).await?;
    let mut texts = Vec::new();
    collect_text(&info, &mut texts);
    Ok(texts
        .iter()
        .filter(|t| t.lines().any(|l| l.trim() == "role:master"))
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("connected_slaves:"))
                .and_then(|n| n.trim().parse::<u32>().ok())
        })
        .min()
        .unwrap_or(0))
}

/// Refuses a Redis older than [`MIN_REDIS_VERSION`].
fn check_version(place: &str, version: &str) -> Result<(), StoreError> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < MIN_REDIS_VERSION {
        return Err(StoreError::Unsupported {
            store: place.to_owned(),
            reason: format!(
                "Redis {version} is too old; Baton needs Redis {}.{} or later (or Valkey)",
                MIN_REDIS_VERSION.0, MIN_REDIS_VERSION.1
            ),
        });
    }
    Ok(())
}

/// An error while opening: refused or timed out is unreachable; an answer that is not the
/// Redis protocol means the server is of another kind.
fn connect_error(place: &str, e: RedisError) -> StoreError {
    if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() {
        return StoreError::Unreachable {
            store: place.to_owned(),
            source: Box::new(e),
        };
    }
    if matches!(e.kind(), redis::ErrorKind::Parse) {
        return StoreError::Unsupported {
            store: place.to_owned(),
            reason: format!(
                "it does not speak the Redis protocol ({e}); point the URL at a Redis 6.2+ or \
                 Valkey server"
            ),
        };
    }
    operation_error(place, e)
}

/// An error of an operation: lost connections and timeouts are unreachable (retry), the rest is
/// the backend's.
fn operation_error(place: &str, e: RedisError) -> StoreError {
    let source: Cause = Box::new(e);
    let retry = source
        .downcast_ref::<RedisError>()
        .is_some_and(|e| e.is_io_error() || e.is_timeout() || e.is_connection_dropped());
    if retry {
        StoreError::Unreachable {
            store: place.to_owned(),
            source,
        }
    } else {
        StoreError::Backend {
            store: place.to_owned(),
            source,
        }
    }
}

/// What the operate script answers.
#[derive(Deserialize)]
#[serde(tag = "o", rename_all = "kebab-case")]
enum OperateAnswer {
    Done { op: Operation },
    Paused { op: Operation },
}

/// The state the token scripts report with a refusal.
#[derive(Deserialize)]
struct StateAnswer {
    attempt: u32,
    status: Status,
    released: bool,
}

impl From<StateAnswer> for RunState {
    fn from(s: StateAnswer) -> Self {
        RunState {
            attempt: s.attempt,
            status: s.status,
            released: s.released,
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn now(&self) -> Result<i64, StoreError> {
        let cmd = redis::cmd("TIME");
        let (secs, micros): (i64, i64) = {
            let mut c = self.counted();
            cmd.query_async(&mut c).await
        }
        .map_err(|e| self.error(e))?;
        Ok(secs * 1000 + micros / 1000)
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let o = request.options;
        let job = self.job_keys(request.job);
        let keys = [job.live(), job.lease(request.slot), job.slots()];
        let args = [
            request.job.to_owned(),
            request.slot.to_string(),
            request.kind.as_str().to_owned(),
            json_string(request.runner),
            request.token.to_string(),
            request.digest.map(json_string).unwrap_or_default(),
            millis(o.lease).to_string(),
            o.max_attempts.to_string(),
            o.overlap.as_str().to_owned(),
            millis(o.lateness_limit(request.kind)).to_string(),
            millis(o.retention()).to_string(),
            o.history_size.to_string(),
        ];
        let (answer, acknowledged) = self
            .durable_script(self.counted(), &self.scripts.claim, &keys, &args)
            .await?;
        let outcome = layout::claim_outcome(&answer, request.token)
            .map_err(|e| self.malformed(request.job, e))?;
        if let ClaimOutcome::Won(_) = outcome {
            // A win the replicas do not hold could be lost with the primary, and the run won
            // again by another runner: the job must not start on it.
            self.check_acknowledged("claim", acknowledged)?;
            self.register(request.job).await;
        }
        Ok(outcome)
    }

    async fn heartbeat(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        lease: Duration,
    ) -> Result<HeartbeatOutcome, StoreError> {
        let keys = self.token_keys(job, slot);
        let args = [
            slot.to_string(),
            token.to_string(),
            millis(lease).to_string(),
        ];
        let (answer, acknowledged) = self
            .durable_script(self.counted_leases(), &self.scripts.heartbeat, &keys, &args)
            .await?;
        let outcome = layout::heartbeat_outcome(&answer).map_err(|e| self.malformed(job, e))?;
        if let HeartbeatOutcome::Renewed { .. } = outcome {
            // A renewal the replicas do not hold could be lost with the primary: the promoted
            // replica would end the lease earlier than the runner believes, and a backup take
            // it over while the runner goes on. The runner keeps the lease end it had.
            self.check_acknowledged("heartbeat", acknowledged)?;
        }
        Ok(outcome)
    }

    async fn finish(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        result: Finish,
    ) -> Result<TokenOutcome, StoreError> {
        let keys = self.token_keys(job, slot);
        let args = [
            slot.to_string(),
            token.to_string(),
            result.status().as_str().to_owned(),
        ];
        let (answer, acknowledged) = self
            .durable_script(self.counted_leases(), &self.scripts.finish, &keys, &args)
            .await?;
        // Checked whatever the answer: a finish sent again after it was not acknowledged is
        // refused with the run's state, and must still wait for the first one to be held.
        self.check_acknowledged("finish", acknowledged)?;
        layout::token_outcome(&answer).map_err(|e| self.malformed(job, e))
    }

    async fn release(
        &self,
        job: &str,
        slot: i64,
        token: Token,
    ) -> Result<TokenOutcome, StoreError> {
        let keys = self.token_keys(job, slot);
        let args = [slot.to_string(), token.to_string(), "release".to_owned()];
        let (answer, acknowledged) = self
            .durable_script(self.counted_leases(), &self.scripts.finish, &keys, &args)
            .await?;
        self.check_acknowledged("release", acknowledged)?;
        layout::token_outcome(&answer).map_err(|e| self.malformed(job, e))
    }

    async fn get(&self, job: &str, slot: i64) -> Result<Option<Run>, StoreError> {
        Ok(self
            .records(job, vec![slot.to_string()])
            .await?
            .into_iter()
            .next())
    }

    async fn unfinished(&self, job: &str) -> Result<Vec<Run>, StoreError> {
        let running: Option<String> = {
            let mut c = self.counted();
            c.hget(self.job_keys(job).live(), layout::RUNNING_FIELD)
                .await
        }
        .map_err(|e| self.error(e))?;
        let slots = layout::running_slots(running.as_deref());
        let mut runs = self.records(job, slots).await?;
        runs.retain(|r| r.status == Status::Running);
        runs.sort_by_key(|r| r.slot);
        Ok(runs)
    }

    async fn history(&self, job: &str, limit: usize) -> Result<Vec<Run>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = self.job_keys(job).slots();
        let stop = isize::try_from(limit).unwrap_or(isize::MAX) - 1;
        let slots: Vec<String> = {
            let mut c = self.counted();
            c.zrevrange(key, 0, stop).await
        }
        .map_err(|e| self.error(e))?;
        self.records(job, slots).await
    }

    async fn jobs(&self) -> Result<Vec<String>, StoreError> {
        let key = self.jobs_key();
        let mut jobs: Vec<String> = {
            let mut c = self.counted();
            c.smembers(key).await
        }
        .map_err(|e| self.error(e))?;
        jobs.sort();
        Ok(jobs)
    }

    async fn forget_job(&self, job: &str) -> Result<(), StoreError> {
        let job_keys = self.job_keys(job);
        let mut c = self.counted();
        let running: Option<String> = c
            .hget(job_keys.live(), layout::RUNNING_FIELD)
            .await
            .map_err(|e| self.error(e))?;
        let mut keys = vec![job_keys.live(), job_keys.slots()];
        keys.extend(job_keys.state());
        keys.extend(job_keys.leases(&layout::running_slots(running.as_deref())));
        let jobs_key = self.jobs_key();
        // Two keys slots apart on a cluster: two commands, the job's keys first.
        let () = c.del(keys).await.map_err(|e| self.error(e))?;
        let () = c.srem(jobs_key, job).await.map_err(|e| self.error(e))?;
        let () = c
            .hdel(self.operation_keys().0, job)
            .await
            .map_err(|e| self.error(e))?;
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(job);
        Ok(())
    }

    async fn raw_primitive(&self, key: &str) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.scratch_key(key))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(RAW_PRIMITIVE_TTL_MS);
        let answer: Option<String> = cmd
            .query_async(&mut self.counted())
            .await
            .map_err(|e| self.error(e))?;
        Ok(answer.is_some())
    }

    async fn raw_release(&self, key: &str) -> Result<bool, StoreError> {
        let deleted: u64 = self
            .counted()
            .del(self.scratch_key(key))
            .await
            .map_err(|e| self.error(e))?;
        Ok(deleted == 1)
    }

    async fn server_time(&self) -> Result<Option<ServerTime>, StoreError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("commandstats");
        // A cluster answers for every primary: their times add up.
        let info: redis::Value = cmd
            .query_async(&mut self.counted())
            .await
            .map_err(|e| self.error(e))?;
        let mut texts = Vec::new();
        collect_text(&info, &mut texts);
        let mut time = ServerTime {
            source: "INFO commandstats",
            ..ServerTime::default()
        };
        for line in texts.iter().flat_map(|t| t.lines()) {
            let Some((name, fields)) = line.trim().split_once(':') else {
                continue;
            };
            let usec = fields
                .split(',')
                .find_map(|f| f.strip_prefix("usec="))
                .and_then(|u| u.parse::<f64>().ok())
                .unwrap_or(0.0);
            match name {
                "cmdstat_evalsha" | "cmdstat_eval" | "cmdstat_evalsha_ro" | "cmdstat_eval_ro" => {
                    time.steps_us += usec
                }
                "cmdstat_set" | "cmdstat_del" => time.primitive_us += usec,
                _ => {}
            }
        }
        Ok(Some(time))
    }

    async fn step_floor(&self) -> Result<Option<StepFloor>, StoreError> {
        Ok(Some(self.measure_floor().await?))
    }

    async fn clear_raw_primitive(&self, prefix: &str) -> Result<(), StoreError> {
        if self.cluster.is_some() {
            // SCAN walks one node of a cluster; the keys expire by themselves there.
            return Ok(());
        }
        let pattern = format!("{}*", self.scratch_key(&glob_escape(prefix)));
        let mut c = self.counted();
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, keys): (u64, Vec<String>) =
                scan.query_async(&mut c).await.map_err(|e| self.error(e))?;
            // One key a command, so that a cluster never sees keys of two slots together.
            for key in keys {
                let () = c.del(key).await.map_err(|e| self.error(e))?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
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
        self.sent.load(Ordering::Relaxed)
    }

    async fn operate(
        &self,
        job: &str,
        request: Request,
        by: &Operator,
    ) -> Result<OperateOutcome, StoreError> {
        let (action, stop) = (request.as_str(), request.stops());
        let args = [
            job.to_owned(),
            action.to_owned(),
            by.host.clone(),
            by.user.clone(),
            by.reason.clone().unwrap_or_default(),
            if stop { "1" } else { "0" }.to_owned(),
            self.job_keys(job).lease_prefix(),
        ];
        let keys = [self.job_keys(job).live()];
        let answer = self
            .script(self.counted(), &self.scripts.operate, &keys, &args)
            .await?;
        let answer: OperateAnswer = self.parse(job, &answer)?;
        let op = match answer {
            OperateAnswer::Paused { op } => return Ok(OperateOutcome::Paused(op)),
            OperateAnswer::Done { op } => op,
        };
        // The namespace's keys live apart from the job's on a cluster: a second request, after
        // the job's own flag (which the claims read) is set.
        let (paused_key, operations_key) = self.operation_keys();
        let record = serde_json::to_string(&op).map_err(|e| StoreError::Backend {
            store: self.place.clone(),
            source: e.into(),
        })?;
        let mut pipe = redis::pipe();
        match request {
            Request::Pause { .. } => {
                pipe.hset(&paused_key, job, &record).ignore();
            }
            Request::Resume => {
                pipe.hdel(&paused_key, job).ignore();
            }
            Request::Trigger => {}
        }
        pipe.zadd(&operations_key, &record, op.at).ignore();
        let kept = isize::try_from(OPERATIONS_KEPT).unwrap_or(isize::MAX);
        pipe.zremrangebyrank(&operations_key, 0, -(kept + 1))
            .ignore();
        let () = pipe
            .query_async(&mut self.counted())
            .await
            .map_err(|e| self.error(e))?;
        Ok(OperateOutcome::Done(op))
    }

    async fn paused(&self) -> Result<Vec<Operation>, StoreError> {
        let (paused_key, _) = self.operation_keys();
        let records: Vec<(String, String)> = {
            let mut c = self.counted();
            c.hgetall(paused_key).await
        }
        .map_err(|e| self.error(e))?;
        let mut paused = records
            .iter()
            .map(|(job, record)| self.decode_operation(job, record))
            .collect::<Result<Vec<_>, _>>()?;
        paused.sort_by(|a, b| a.job.cmp(&b.job));
        Ok(paused)
    }

    async fn operations(
        &self,
        job: Option<&str>,
        since: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, StoreError> {
        let (_, operations_key) = self.operation_keys();
        // Newest first; the operations of one job are filtered here (operators act rarely, and
        // the record is capped).
        let records: Vec<String> = {
            let mut c = self.counted();
            c.zrevrangebyscore(operations_key, "+inf", since).await
        }
        .map_err(|e| self.error(e))?;
        let mut ops = Vec::new();
        for record in &records {
            let op = self.decode_operation(job.unwrap_or_default(), record)?;
            if job.is_none_or(|j| j == op.job) {
                ops.push(op);
            }
            if ops.len() >= limit {
                break;
            }
        }
        Ok(ops)
    }
}

/// `text` as a JSON string, as the records keep runners and digests.
fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// How long a key of [`Store::raw_primitive`] lives: 10 minutes, so one that is never cleared
/// goes away by itself.
const RAW_PRIMITIVE_TTL_MS: u64 = 600_000;

/// `s` with the characters special to a `SCAN MATCH` pattern escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_url_gives_one_seed_per_node_with_the_credentials() {
        assert_eq!(
            cluster_seeds("redis+cluster://u:pw@a:1,b:2").unwrap(),
            Some(vec![
                "redis://u:pw@a:1".to_owned(),
                "redis://u:pw@b:2".to_owned()
            ])
        );
        assert_eq!(cluster_seeds("redis://a:1").unwrap(), None);
        assert!(cluster_seeds("valkey+cluster://").is_err());
    }

    #[test]
    fn replicas_parameter_is_auto_by_default_a_count_or_an_invalid_url() {
        assert_eq!(
            take_replicas("redis://h:1").unwrap(),
            ("redis://h:1".to_owned(), Replicas::Auto)
        );
        assert_eq!(
            take_replicas("redis://h:1?replicas=auto&timeout=1s").unwrap(),
            ("redis://h:1?timeout=1s".to_owned(), Replicas::Auto)
        );
        assert_eq!(
            take_replicas("redis://h:1?replicas=0").unwrap().1,
            Replicas::Count(0)
        );
        assert_eq!(
            take_replicas("redis://h:1?replicas=2").unwrap().1,
            Replicas::Count(2)
        );
        for bad in ["replicas=all", "replicas=-1", "replicas=17", "replicas"] {
            let err = take_replicas(&format!("redis://:pw@h:1?{bad}")).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, StoreError::InvalidUrl { .. }), "{msg}");
            assert!(msg.contains("replicas parameter"), "{msg}");
            assert!(!msg.contains("pw@"), "{msg}");
        }
    }

    #[test]
    fn place_names_host_and_port_without_the_password() {
        assert_eq!(
            place_of("redis://u:secret@db.local:6380/0"),
            "db.local:6380"
        );
        assert_eq!(place_of("valkey://cache"), "cache:6379");
    }
}
