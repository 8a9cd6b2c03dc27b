//! One fixture function per backend; the conformance suite runs every case against each.
//!
//! Redis and PostgreSQL are the servers of the machine: `BATON_TEST_REDIS_URL` (default
//! `redis://127.0.0.1:6379`) and `BATON_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). Valkey and the Redis Cluster are servers this
//! test process starts on free ports (see [`crate::servers`]). Every fixture opens the store in
//! a namespace of its own, so the tests run in parallel. A server that cannot be reached fails
//! the test with the way to start it; nothing is skipped.

use std::sync::{Arc, OnceLock};

use baton_core::store::Store;

use crate::servers::{self, Cluster, Server};
use crate::Fixture;

/// The Redis server the tests use: `BATON_TEST_REDIS_URL`, or `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("BATON_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The host and port of the machine's Redis ([`redis_url`]), for a proxy in front of it.
pub fn redis_address() -> String {
    redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned()
}

/// The PostgreSQL database the tests use: `BATON_TEST_POSTGRES_URL`, or
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn postgres_url() -> String {
    std::env::var("BATON_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The PostgreSQL URL the fixtures open: [`postgres_url`] with `schema=` a schema named after
/// the content of the store's migrations. Code of another version (another branch, an older
/// checkout) sharing the database then never meets this one's schema version.
pub fn postgres_store_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        use sha2::{Digest, Sha256};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../runtime/core/src/store/postgres/migrations");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        let mut hash = Sha256::new();
        for file in files {
            hash.update(std::fs::read(&file).unwrap_or_default());
        }
        let digest = hex::encode(hash.finalize());
        let url = postgres_url();
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}schema=baton_test_{}", &digest[..12])
    })
    .clone()
}

/// A fresh SQLite file in a temporary directory.
pub async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("baton.db").display());
    Fixture::open(url, Some(Box::new(dir))).await
}

/// The deterministic simulation's store: the SQLite backend on a private in-memory database,
/// its clock given from outside (here the machine's, in µs, since the cases wait in real time)
/// and its calls run on the caller's thread. No URL reaches it; its other clients are opened in
/// this process ([`Fixture::in_process`]).
pub async fn simulated() -> Fixture {
    let clock: baton_core::store::sqlite::SimulatedClock = Arc::new(|| {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the machine's clock is after 1970");
        i64::try_from(since_epoch.as_micros()).expect("µs since the epoch fit in an i64")
    });
    let first = Arc::new(
        baton_core::store::sqlite::SqliteStore::simulated("unused", clock)
            .expect("open the simulated store"),
    );
    let open: crate::Opener = Arc::new(move |namespace: &str| -> Arc<dyn Store> {
        Arc::new(
            first
                .another(namespace)
                .expect("another client of the simulated store"),
        )
    });
    Fixture::in_process("simulated://in-memory".to_owned(), open)
}

/// The machine's Redis, in a namespace of the test's own.
pub async fn redis() -> Fixture {
    Fixture::open(redis_url(), None).await
}

/// A Valkey server started by this test process (one for the whole process), in a namespace of
/// the test's own.
pub async fn valkey() -> Fixture {
    static VALKEY: OnceLock<Server> = OnceLock::new();
    let port = tokio::task::spawn_blocking(|| VALKEY.get_or_init(servers::start_valkey).port)
        .await
        .expect("start valkey-server");
    Fixture::open(format!("valkey://127.0.0.1:{port}"), None).await
}

/// The machine's PostgreSQL, in a namespace of the test's own (in the schema of
/// [`postgres_store_url`]).
pub async fn postgres() -> Fixture {
    Fixture::open(postgres_store_url(), None).await
}

/// A three-node Redis Cluster started by this test process (one for the whole process), in a
/// namespace of the test's own.
pub async fn redis_cluster() -> Fixture {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    let url =
        tokio::task::spawn_blocking(|| CLUSTER.get_or_init(servers::start_redis_cluster).url())
            .await
            .expect("start the redis cluster");
    Fixture::open(url, None).await
}

/// A Redis Cluster of three primaries with a replica each, started by this test process (one
/// for the whole process), in a namespace of the test's own.
pub async fn redis_cluster_with_replicas() -> Fixture {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    let url = tokio::task::spawn_blocking(|| {
        CLUSTER
            .get_or_init(|| servers::start_redis_cluster_with_replicas(5_000))
            .url()
    })
    .await
    .expect("start the redis cluster with replicas");
    Fixture::open(url, None).await
}
