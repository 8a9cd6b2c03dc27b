//! Shared support for Baton's test binaries: fixtures that open a fresh, isolated store of each
//! backend, and small helpers for waiting on the store's clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_core::store::{self, Store};

pub mod attempt;
pub mod backends;
pub mod captured;
pub mod http_server;
pub mod process;
pub mod proxy;
pub mod servers;

/// A store opened for one test, isolated from every other test by its own namespace (and, for
/// SQLite, its own file).
pub struct Fixture {
    /// The URL the store was opened with: give it to another client or process.
    pub url: String,
    /// The test's own namespace.
    pub namespace: String,
    /// The test's first client.
    pub store: Arc<dyn Store>,
    /// Whatever must live as long as the test (a temporary directory, a server).
    _keep: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// How to open more clients of a store that no URL reaches (the simulation's in-memory
    /// store): given a namespace, a client of the same database in it.
    opener: Option<Opener>,
}

/// Opens another client of a store in a namespace (see [`Fixture::in_process`]).
pub type Opener = Arc<dyn Fn(&str) -> Arc<dyn Store> + Send + Sync>;

/// A counting TCP proxy in front of the store (see [`Fixture::counted_at_the_wire`]).
pub struct Wire {
    /// The proxy, which counts.
    pub proxy: proxy::Proxy,
    /// The store URL through the proxy: for a client or an instance whose round trips are to
    /// be counted.
    pub url: String,
}

/// A client whose round trips are counted (see [`Fixture::counted`]).
pub struct Counted {
    /// The client.
    pub store: Arc<dyn Store>,
    wire: Option<Wire>,
}

impl Counted {
    /// Round trips so far: those that crossed the wire, or, on a store without one (SQLite) or
    /// whose client follows redirects past a proxy (Redis Cluster), the client's own count.
    pub fn round_trips(&self) -> u64 {
        match &self.wire {
            Some(wire) => wire.proxy.round_trips(),
            None => self.store.round_trips(),
        }
    }

    /// Connection tests answered alone, seen at the wire (a PostgreSQL client's bare `Sync`,
    /// which a pool that tests the connections it takes back sends); 0 elsewhere.
    pub fn pings(&self) -> u64 {
        self.wire.as_ref().map_or(0, |w| w.proxy.pings())
    }

    /// Where the round trips are counted: `wire` or `client`.
    pub fn counted_where(&self) -> &'static str {
        if self.wire.is_some() {
            "wire"
        } else {
            "client"
        }
    }
}

impl Fixture {
    /// Opens the store at `url` in a namespace of its own.
    pub async fn open(url: String, keep: Option<Box<dyn std::any::Any + Send + Sync>>) -> Self {
        let namespace = unique("t");
        let store = store::open(&url, &namespace)
            .await
            .unwrap_or_else(|e| panic!("cannot open test store {url}: {e}"));
        Fixture {
            url,
            namespace,
            store,
            _keep: keep,
            opener: None,
        }
    }

    /// A store that no URL reaches, only this process: `open` gives a client of it in a
    /// namespace. `url` names it in messages; other processes cannot use it.
    pub fn in_process(url: String, open: Opener) -> Self {
        let namespace = unique("t");
        Fixture {
            url,
            store: open(&namespace),
            namespace,
            _keep: None,
            opener: Some(open),
        }
    }

    /// Whether another process can reach the store by its URL (false for the simulation's
    /// in-memory store, whose other clients live in this process).
    pub fn reaches_other_processes(&self) -> bool {
        self.opener.is_none()
    }

    /// A client of the same store in another namespace.
    pub async fn in_namespace(&self, namespace: &str) -> Arc<dyn Store> {
        if let Some(open) = &self.opener {
            return open(namespace);
        }
        store::open(&self.url, namespace)
            .await
            .unwrap_or_else(|e| panic!("cannot open {} in namespace {namespace}: {e}", self.url))
    }

    /// The same namespace, but instances started from it reach the store at `url` (e.g. a
    /// fault proxy's), while the test's own client still talks to the store directly.
    pub fn reached_through(&self, url: String) -> Fixture {
        Fixture {
            url,
            namespace: self.namespace.clone(),
            store: self.store.clone(),
            _keep: None,
            opener: self.opener.clone(),
        }
    }

    /// A TCP proxy in front of the store that counts round trips at the wire
    /// ([`proxy::Proxy::round_trips`]), and the store URL through it; `None` for a store with no
    /// wire to count on (a SQLite file) or one whose client follows the servers' own addresses
    /// (a Redis Cluster's redirects).
    pub async fn counted_at_the_wire(&self) -> Option<Wire> {
        let (scheme, rest) = self.url.split_once("://")?;
        if !self.reaches_other_processes() || scheme == "sqlite" || scheme.contains("cluster") {
            return None;
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (user, target) = match authority.rsplit_once('@') {
            Some((user, target)) => (format!("{user}@"), target),
            None => (String::new(), authority),
        };
        let proxy = proxy::Proxy::start(target.to_owned()).await;
        let mut url = format!("{scheme}://{user}127.0.0.1:{}{tail}", proxy.port);
        if scheme.starts_with("postgres") {
            // Without TLS, so the proxy tells a connection test from a statement.
            let sep = if url.contains('?') { '&' } else { '?' };
            url = format!("{url}{sep}sslmode=disable");
        }
        Some(Wire { proxy, url })
    }

    /// Another client of the same store and namespace whose round trips are counted: at the
    /// wire on Redis, Valkey and PostgreSQL ([`Fixture::counted_at_the_wire`]), else by the
    /// client itself (a SQLite file, or a Redis Cluster, whose client follows redirects past
    /// any proxy).
    pub async fn counted(&self) -> Counted {
        let wire = self.counted_at_the_wire().await;
        match wire {
            Some(wire) => Counted {
                store: store::open(&wire.url, &self.namespace)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("cannot open {} through the counting proxy: {e}", wire.url)
                    }),
                wire: Some(wire),
            },
            None => Counted {
                store: self.another().await,
                wire: None,
            },
        }
    }

    /// Another client of the same store and namespace, as a second instance would have.
    pub async fn another(&self) -> Arc<dyn Store> {
        if let Some(open) = &self.opener {
            return open(&self.namespace);
        }
        store::open(&self.url, &self.namespace)
            .await
            .unwrap_or_else(|e| panic!("cannot open a second client of {}: {e}", self.url))
    }
}

/// A name no other test in this process, or in another process running now, uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}-{}-{n}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// The store's clock, ms.
pub async fn store_now(store: &dyn Store) -> i64 {
    store.now().await.expect("store clock")
}

/// Waits until the store's clock is past `instant` (ms, store clock).
pub async fn wait_past(store: &dyn Store, instant: i64) {
    loop {
        let now = store_now(store).await;
        if now > instant {
            return;
        }
        let left = u64::try_from(instant - now).unwrap_or(0) + 1;
        tokio::time::sleep(Duration::from_millis(left.min(50))).await;
    }
}

/// Whether the test run is under CI, where a missing server fails a test instead of skipping it.
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// The `baton` binary of this build, built once per test process if needed (the tests crate
/// cannot name another package's binary, so it is built into the same target directory).
pub fn baton_binary() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_binary("baton", "baton"))
        .clone()
}

/// The native example (`examples/native`: the lease engine with a Rust closure as the job, on
/// SQLite), built once per test process if needed.
pub fn native_example_binary() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_binary("baton-native-example", "baton-native-example"))
        .clone()
}

/// Builds binary `bin` of workspace package `package` into this test's target directory and
/// returns its path.
fn workspace_binary(package: &str, bin: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test runs from <target>/<profile>/deps")
        .to_path_buf();
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env(
            "CARGO_TARGET_DIR",
            profile_dir.parent().expect("the target directory"),
        )
        .status()
        .unwrap_or_else(|e| panic!("run cargo build for {package}: {e}"));
    assert!(status.success(), "cargo build -p {package} failed");
    profile_dir.join(bin)
}

/// Takes the write lock of the SQLite file at `path` on a connection of its own (`BEGIN
/// EXCLUSIVE`, waiting up to 10 s for it), and returns once it holds it: every other
/// connection's write waits until the returned sender sends or is dropped.
pub fn lock_sqlite_file(path: &std::path::Path) -> std::sync::mpsc::Sender<()> {
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let path = path.to_owned();
    std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(&path).expect("open the file");
        conn.busy_timeout(Duration::from_secs(10))
            .expect("busy timeout");
        conn.execute_batch("BEGIN EXCLUSIVE")
            .expect("lock the file");
        locked_tx.send(()).expect("report the lock");
        let _ = release_rx.recv();
        let _ = conn.execute_batch("ROLLBACK");
    });
    locked_rx.recv().expect("the file is locked");
    release_tx
}

/// Where a test leaves a report for `tests/run.sh` to print once every test has run (test
/// output is shown only for failing tests): `TMPDIR/baton-reports`, where `TMPDIR` is the
/// test's `env!("CARGO_TARGET_TMPDIR")`.
pub fn reports_dir(target_tmpdir: &str) -> std::path::PathBuf {
    std::path::Path::new(target_tmpdir).join("baton-reports")
}

/// Prints `text` and leaves it as the report `name` (see [`reports_dir`]), so a CI log shows
/// it after the tests. A report that cannot be written is only noted: the test's own output
/// still has it.
pub fn publish_report(target_tmpdir: &str, name: &str, text: &str) {
    println!("{text}");
    let dir = reports_dir(target_tmpdir);
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(format!("{name}.txt")), format!("{text}\n")));
    if let Err(e) = written {
        eprintln!("cannot leave the report {name} in {}: {e}", dir.display());
    }
}

/// Claims slot `base + i` of job `{job}-{i}` for i in 0..`count` (overlap allowed, a fresh token
/// each) once the store's clock reaches `start_at` (ms), as `runner`; returns the slots won.
/// The body of the cross-process race (`baton-claim-racer`), and of its in-process form for a
/// store no other process reaches.
pub async fn race_claims(
    store: &dyn Store,
    job: &str,
    base: i64,
    count: i64,
    runner: &str,
    start_at: i64,
) -> anyhow::Result<Vec<i64>> {
    use baton_core::lease::{ClaimKind, ClaimOutcome, ClaimRequest, LeaseOptions, Overlap, Token};
    while store.now().await? < start_at {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let options = LeaseOptions {
        overlap: Overlap::Allow,
        ..LeaseOptions::default()
    };
    let mut won = Vec::new();
    for i in 0..count {
        let job = format!("{job}-{i}");
        let slot = base + i;
        let request = ClaimRequest {
            job: &job,
            slot,
            kind: ClaimKind::Scheduled,
            runner,
            token: Token::random(),
            digest: None,
            options: &options,
        };
        match store.claim(&request).await? {
            ClaimOutcome::Won(_) => won.push(slot),
            ClaimOutcome::Running { .. } => {}
            other => anyhow::bail!("unexpected answer for slot {slot}: {other:?}"),
        }
    }
    Ok(won)
}
