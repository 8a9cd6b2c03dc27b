//! The harness: one store (for Redis, Valkey and PostgreSQL a server of our own, restartable with
//! its data; for SQLite a file), one jobs directory, and several real `baton run` processes with
//! their own runner ids, each (on a network store) behind its own fault proxy; the faults; and
//! what the checker reads at the end.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_tests::process::{baton, baton_command};
use baton_tests::proxy::{Mode, Proxy};
use baton_tests::servers::{self, Server};

use crate::checker::{self, Event, Hit, Input, JobSpec, Span};

/// Every job's lease: 1 s.
pub const LEASE_MS: i64 = 1_000;
/// Every job's heartbeat: 150 ms.
pub const HEARTBEAT_MS: i64 = 150;
/// `--stop-timeout` of every runner: 100 ms.
pub const STOP_TIMEOUT_MS: i64 = 100;
/// How long a host may take to stop a guest once it can run, in the checker: 1 s. The host
/// stops a fenced guest within milliseconds (see `cargo test --test wasm_host`); the allowance
/// is for a loaded 2-core machine running a dozen hosts.
pub const STOP_LATENCY_MS: i64 = 1_000;
/// How late after its slot a well-behaved job's first attempt may start: 1 s. An attempt a
/// fault is to hit started no later either (see [`Cluster::next_attempt`]): the fault hits it
/// 0.3 s in and a backup takes it over about a lease later, before the job's next slot
/// (`effects` every 5 s, `probe` every 3 s); an attempt started later (a catch-up claim of a
/// runner that has just started) could see the next slot start first, and then no takeover is
/// owed.
pub const ON_TIME_MS: i64 = 1_000;

/// How many of the runners' last lines a scenario that waited in vain prints: 60.
const LINES_ON_FAILURE: usize = 60;

/// Whether a file of a job's data directory is one of the side-effect guest's,
/// `<slot>-<attempt>-<runner>.log`; the probe's `writes.log` has lines of its own, which its
/// scenario counts.
fn is_effect_file(name: &str) -> bool {
    let slot = name.split('-').next().unwrap_or_default();
    name.ends_with(".log") && !slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit())
}

/// The machine's clock, ms: the store's clock for every store of these tests.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The stores the matrix covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One file shared by the runner processes.
    Sqlite,
    /// A `redis-server` of our own, with an append-only file.
    Redis,
    /// A `valkey-server` of our own, with an append-only file.
    Valkey,
    /// A PostgreSQL server of our own (`initdb` in a temporary directory).
    Postgres,
    /// A Redis Cluster of our own: three primaries with a replica each.
    RedisCluster,
}

impl Backend {
    /// Every backend, in report order.
    pub const ALL: [Backend; 5] = [
        Backend::Sqlite,
        Backend::Redis,
        Backend::Valkey,
        Backend::Postgres,
        Backend::RedisCluster,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Redis => "redis",
            Backend::Valkey => "valkey",
            Backend::Postgres => "postgres",
            Backend::RedisCluster => "redis-cluster",
        }
    }
}

/// A job of a scenario: its component, its TOML, and what the checker knows of it.
#[derive(Clone)]
pub struct Job {
    /// What the checker knows of it.
    pub spec: JobSpec,
    /// The component's path (`env!("GUEST_…")`).
    pub guest: &'static str,
    /// The job file's lines beyond the lease options every job shares.
    pub toml: String,
}

fn every(period_s: i64) -> String {
    if period_s == 1 {
        "* * * * * *".into()
    } else {
        format!("*/{period_s} * * * * *")
    }
}

/// The side-effect guest every `period_s` seconds, `steps` steps of `step_ms`.
pub fn effects_job(
    name: &str,
    period_s: i64,
    steps: u32,
    step_ms: u32,
    extra: &str,
    well_behaved: bool,
) -> Job {
    Job {
        spec: JobSpec::every(name, period_s * 1000, well_behaved),
        guest: env!("GUEST_SIDE_EFFECT"),
        toml: format!(
            "schedule = \"{}\"\n{extra}\n[grants]\ndata_dir = \"data/{name}\"\nenv = {{ STEPS = \"{steps}\", STEP_MS = \"{step_ms}\" }}\n",
            every(period_s)
        ),
    }
}

/// The well-behaved jobs of every scenario: `effects` (every 5 s, 1.2 s of side effects in
/// 20 ms steps: long enough to be hit mid-attempt, and a takeover of a hit attempt comes well
/// before the next slot, which would otherwise interrupt the run instead on a loaded machine),
/// `tick` (every second, one step) and `state`
/// (every 3 s, 50 steps of two state writes and 10 ms; see [`state_job`]).
pub fn well_behaved() -> Vec<Job> {
    vec![
        effects_job("effects", 5, 60, 20, "", true),
        effects_job("tick", 1, 1, 1, "", true),
        state_job("state", 3, 50, 10),
    ]
}

/// The state-writing guest every `period_s` seconds: `steps` fenced writes of its job's state,
/// `step_ms` apart, a key of each attempt's own and a shared counter, going on whatever the
/// store answers. The checker holds every key's last writer to that attempt's lease.
pub fn state_job(name: &str, period_s: i64, steps: u32, step_ms: u32) -> Job {
    Job {
        spec: JobSpec::every(name, period_s * 1000, true),
        guest: env!("GUEST_STATE_WRITER"),
        toml: format!(
            "schedule = \"{}\"\n[grants]\nenv = {{ STEPS = \"{steps}\", STEP_MS = \"{step_ms}\" }}\n",
            every(period_s)
        ),
    }
}

/// The HTTP guest every 3 s: 60 steps, 20 ms apart, each appending a line
/// (`<slot> <attempt> <wall-clock ms> <n>`) to `writes.log` in its data directory and then
/// sending a `GET` to `url`, whose origin its job file allows.
pub fn probe_job(name: &str, origin: &str) -> Job {
    Job {
        spec: JobSpec::every(name, 3_000, true),
        guest: env!("GUEST_HTTP_PROBE"),
        toml: format!(
            "schedule = \"{}\"\n[grants]\ndata_dir = \"data/{name}\"\nallowed_outbound_hosts = [\"{origin}\"]\n\
             env = {{ URLS = \"{origin}/{name}\", REPEAT = \"60\", INTERVAL_MS = \"20\", KEEP_GOING = \"1\", WRITE = \"1\" }}\n",
            every(3)
        ),
    }
}

/// The same side effects from a plain WASI program (`guests/cli`, a command component: no
/// Baton SDK, its run's facts from `BATON_*` variables), every `period_s` seconds: `steps`
/// lines `step_ms` apart, never asking whether to stop.
pub fn command_effects_job(name: &str, period_s: i64, steps: u32, step_ms: u32) -> Job {
    Job {
        spec: JobSpec::every(name, period_s * 1000, true),
        guest: env!("GUEST_CLI"),
        toml: format!(
            "schedule = \"{}\"\nargs = [\"--effects\", \"{steps}\", \"{step_ms}\"]\n[grants]\ndata_dir = \"data/{name}\"\n",
            every(period_s)
        ),
    }
}

fn misbehaving_job(name: &str, guest: &'static str, period_s: i64, extra: &str) -> Job {
    Job {
        spec: JobSpec::every(name, period_s * 1000, false),
        guest,
        toml: format!("schedule = \"{}\"\n{extra}\n", every(period_s)),
    }
}

/// The Wasm host's misbehaving test guests, beside the well-behaved jobs: a busy loop and a
/// sleeper stopped at their run timeout, a memory hog, a trap, a panic and a log flood.
pub fn misbehaving() -> Vec<Job> {
    vec![
        misbehaving_job(
            "spin",
            env!("GUEST_BUSY_LOOP"),
            2,
            "[limits]\nrun_timeout = \"200ms\"",
        ),
        misbehaving_job(
            "sleeper",
            env!("GUEST_SLEEPER"),
            4,
            "[limits]\nrun_timeout = \"1s\"",
        ),
        misbehaving_job("hog", env!("GUEST_HOG"), 2, "[limits]\nmemory = \"16MiB\""),
        misbehaving_job("trap", env!("GUEST_TRAP"), 2, ""),
        misbehaving_job("panic", env!("GUEST_PANIC"), 2, ""),
        misbehaving_job("flood", env!("GUEST_FLOOD"), 4, ""),
    ]
}

/// The store of one scenario.
enum Store {
    Sqlite {
        path: PathBuf,
        /// Releases the lock of a "stopped" file.
        lock: Option<mpsc::Sender<()>>,
    },
    RedisLike {
        binary: PathBuf,
        port: u16,
        dir: tempfile::TempDir,
        server: Option<Server>,
    },
    Postgres {
        server: servers::Postgres,
    },
    Cluster {
        cluster: servers::Cluster,
    },
}

const REDIS_PERSISTENCE: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];

impl Store {
    fn start(backend: Backend, dir: &Path) -> Store {
        match backend {
            Backend::Sqlite => Store::Sqlite {
                path: dir.join("baton.db"),
                lock: None,
            },
            Backend::Redis | Backend::Valkey => {
                let binary = if backend == Backend::Redis {
                    PathBuf::from("redis-server")
                } else {
                    servers::valkey_server_binary()
                };
                let port = servers::free_port(false);
                let dir = tempfile::tempdir().expect("server directory");
                let server =
                    servers::start_redis_like_in(&binary, port, dir.path(), &REDIS_PERSISTENCE);
                Store::RedisLike {
                    binary,
                    port,
                    dir,
                    server: Some(server),
                }
            }
            Backend::Postgres => Store::Postgres {
                server: servers::Postgres::start(),
            },
            // A node timeout of 1 s: a dead primary's replica is promoted within seconds.
            Backend::RedisCluster => Store::Cluster {
                cluster: servers::start_redis_cluster_with_replicas(1_000),
            },
        }
    }

    /// Where the server listens, for a proxy.
    fn target(&self) -> Option<String> {
        match self {
            Store::Sqlite { .. } => None,
            Store::RedisLike { port, .. } => Some(format!("127.0.0.1:{port}")),
            Store::Postgres { server } => Some(format!("127.0.0.1:{}", server.port)),
            Store::Cluster { .. } => None,
        }
    }

    /// The URL, directly or through a proxy on `via`.
    fn url(&self, backend: Backend, via: Option<u16>) -> String {
        let host_port = via.map(|p| format!("127.0.0.1:{p}"));
        match self {
            Store::Sqlite { path, .. } => format!("sqlite://{}", path.display()),
            Store::RedisLike { port, .. } => {
                let scheme = if backend == Backend::Valkey {
                    "valkey"
                } else {
                    "redis"
                };
                let hp = host_port.unwrap_or(format!("127.0.0.1:{port}"));
                format!("{scheme}://{hp}")
            }
            Store::Postgres { server } => {
                let hp = host_port.unwrap_or(format!("127.0.0.1:{}", server.port));
                server.url(&hp, "schema=baton_faults")
            }
            Store::Cluster { cluster } => cluster.url(),
        }
    }
}

/// Whether another connection holds the write lock of the SQLite file at `path` now and still
/// 100 ms later: a runner stopped inside its transaction, not one passing through its own.
fn write_lock_held(path: &Path) -> bool {
    let Ok(conn) = rusqlite::Connection::open(path) else {
        return false;
    };
    // Not to wait for the lock (rusqlite waits 5 s by default): only to see it.
    if conn.busy_timeout(Duration::ZERO).is_err() {
        return false;
    }
    for _ in 0..3 {
        if conn.execute_batch("BEGIN IMMEDIATE").is_ok() {
            let _ = conn.execute_batch("ROLLBACK");
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// libfaketime's preload library (what the `faketime` command preloads):
/// `BATON_TEST_LIBFAKETIME`, else where Debian's `libfaketime` package puts it.
fn libfaketime() -> PathBuf {
    if let Some(path) = std::env::var_os("BATON_TEST_LIBFAKETIME") {
        return PathBuf::from(path);
    }
    let multiarch = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"));
    let fixed = ["/usr/lib/faketime", "/usr/local/lib/faketime"]
        .into_iter()
        .map(|d| Path::new(d).join("libfaketime.so.1"));
    multiarch
        .chain(fixed)
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime.so.1 not found: install faketime (`apt-get install faketime`), or \
                 set BATON_TEST_LIBFAKETIME to the library"
            )
        })
}

/// One `baton run` process.
pub struct Runner {
    /// Its runner id.
    pub id: String,
    child: Option<Child>,
    proxy: Option<Proxy>,
}

impl Runner {
    fn pid(&self) -> Option<libc::pid_t> {
        self.child
            .as_ref()
            .and_then(|c| libc::pid_t::try_from(c.id()).ok())
    }

    fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on a child this harness started and has not reaped.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

/// How a runner is started.
#[derive(Clone, Copy, Default)]
pub struct RunnerOptions {
    /// Its clock is this far off (e.g. "-3h"), through libfaketime (`FAKETIME`).
    pub faketime: Option<(&'static str, i64)>,
    /// How long its store operations wait for an answer: the store URL's `?timeout=` (e.g.
    /// "30s"); the store's default when `None`.
    pub store_timeout: Option<&'static str>,
}

/// A fault injected at a time, against a runner: the checker's takeover time counts from it.
#[derive(Clone, Debug)]
pub struct Fault {
    /// The runner hit.
    pub runner: String,
    /// When (ms).
    pub at: i64,
}

/// The moment a frozen runner was woken, just before its `SIGCONT`.
#[derive(Clone, Copy, Debug)]
pub struct Woken {
    /// On the monotonic clock (as the HTTP server records a request).
    pub instant: Instant,
    /// On the machine's wall clock, ms (as a guest writes it).
    pub at: i64,
}

/// One scenario's cluster.
pub struct Cluster {
    /// The store's kind.
    pub backend: Backend,
    namespace: String,
    dir: tempfile::TempDir,
    store: Store,
    runners: Vec<Runner>,
    events: Arc<Mutex<Vec<Event>>>,
    /// The runners' other lines (warnings, errors), when read, for a failure's message.
    chatter: Arc<Mutex<Vec<String>>>,
    jobs: Vec<Job>,
    skew: HashMap<String, i64>,
    freezes: Vec<Span>,
    outages: Vec<Span>,
    all_down: Vec<Span>,
    disturbed: Vec<Span>,
    /// When each runner was up (see [`Input::lives`]).
    lives: Vec<Span>,
    /// When one runner alone was cut off the store (see [`Input::cut_off`]).
    cut_off: Vec<Span>,
    window_from: i64,
    store_down_since: Option<i64>,
    /// Faults after which a backup takes over within lease + 2 × heartbeat.
    pub deaths: Vec<Fault>,
    /// Whether a frozen runner held the SQLite file's write lock (see [`Cluster::freeze`]).
    pub frozen_holding_the_file: bool,
    /// Faults after which a backup takes over within the stop timeout + 2 × heartbeat.
    pub hand_overs: Vec<Fault>,
    /// The attempts that faults whose point is a takeover hit.
    hits: Vec<Hit>,
}

impl Cluster {
    /// A jobs directory with `jobs` and a fresh store namespace; no runner yet.
    pub fn new(backend: Backend, jobs: Vec<Job>) -> Cluster {
        let dir = tempfile::tempdir().expect("scenario directory");
        let jobs_dir = dir.path().join("jobs");
        std::fs::create_dir_all(&jobs_dir).expect("jobs directory");
        for job in &jobs {
            let name = &job.spec.name;
            std::fs::copy(job.guest, jobs_dir.join(format!("{name}.wasm")))
                .unwrap_or_else(|e| panic!("copy {}: {e}", job.guest));
            let toml = format!(
                "lease = \"{LEASE_MS}ms\"\nheartbeat = \"{HEARTBEAT_MS}ms\"\nmax_attempts = {}\nhistory_size = 10000\n{}",
                job.spec.max_attempts, job.toml
            );
            std::fs::write(jobs_dir.join(format!("{name}.toml")), toml).expect("job file");
        }
        let store = Store::start(backend, dir.path());
        Cluster {
            backend,
            namespace: baton_tests::unique("faults"),
            dir,
            store,
            runners: Vec::new(),
            events: Arc::new(Mutex::new(Vec::new())),
            chatter: Arc::new(Mutex::new(Vec::new())),
            jobs,
            skew: HashMap::new(),
            freezes: Vec::new(),
            outages: Vec::new(),
            all_down: Vec::new(),
            disturbed: Vec::new(),
            lives: Vec::new(),
            cut_off: Vec::new(),
            window_from: i64::MAX,
            store_down_since: None,
            deaths: Vec::new(),
            frozen_holding_the_file: false,
            hand_overs: Vec::new(),
            hits: Vec::new(),
        }
    }

    /// Starts `baton run` as runner `id`; returns its index once it logged that it runs.
    pub async fn start_runner(&mut self, id: &str, options: RunnerOptions) -> usize {
        let proxy = match self.store.target() {
            Some(target) => Some(Proxy::start(target).await),
            None => None,
        };
        let mut url = self.store.url(self.backend, proxy.as_ref().map(|p| p.port));
        if let Some(timeout) = options.store_timeout {
            let sep = if url.contains('?') { '&' } else { '?' };
            url = format!("{url}{sep}timeout={timeout}");
        }
        let jobs = self.dir.path().join("jobs").display().to_string();
        let mut cmd = baton_command();
        if let Some((offset, skew)) = options.faketime {
            self.skew.insert(id.to_owned(), skew);
            // Preloaded into `baton` itself rather than through the `faketime` command, which
            // forks: the runner stays this process's child, so `kill -9` (and the death of the
            // test process) reaches it, not only the wrapper.
            cmd.env("LD_PRELOAD", libfaketime()).env("FAKETIME", offset);
        }
        cmd.args(["run", "--jobs", &jobs, "--store", &url, "--runner", id])
            .args(["--namespace", &self.namespace, "--log-format", "json"])
            .args(["--stop-timeout", &format!("{STOP_TIMEOUT_MS}ms")])
            .env("RUST_LOG", "info,baton_wasm=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = servers::spawn_tied_to_process(cmd).expect("start baton run");
        let stderr = child.stderr.take().expect("the runner's stderr");
        let events = self.events.clone();
        let chatter = self.chatter.clone();
        let runner = id.to_owned();
        // `BATON_FAULTS_ECHO=1` prints every line the runners log, to follow a scenario.
        let echo = std::env::var_os("BATON_FAULTS_ECHO").is_some();
        std::thread::spawn(move || {
            // Read to the end whatever the bytes: a reader that stopped at a line that is not
            // UTF-8 would leave the pipe full and the runner blocked on its next log line.
            for line in BufReader::new(stderr).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line);
                if echo {
                    eprintln!("[{runner} {}] {line}", now_ms());
                }
                match checker::parse_event(&runner, now_ms(), &line) {
                    Some(e) => events.lock().unwrap_or_else(|p| p.into_inner()).push(e),
                    None => {
                        eprintln!("[{runner}] {line}");
                        chatter
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!("  {} {runner} {line}", now_ms()));
                    }
                }
            }
        });
        self.runners.push(Runner {
            id: id.to_owned(),
            child: Some(child),
            proxy,
        });
        let started = now_ms();
        self.lives.push(Span {
            runner: Some(id.to_owned()),
            from: started,
            to: i64::MAX,
        });
        let index = self.runners.len() - 1;
        let who = id.to_owned();
        self.wait_event(Duration::from_secs(60), "the runner to start", |e| {
            e.runner == who && e.kind.starts_with("baton is running")
        })
        .await;
        // A host that starts compiles its components and catches up: a disturbance.
        self.disturb(started, now_ms() + 1_000);
        index
    }

    /// Starts `n` runners `r1…rn` and opens the window of slots the checker accounts for.
    pub async fn start(&mut self, n: usize) {
        for i in 1..=n {
            self.start_runner(&format!("r{i}"), RunnerOptions::default())
                .await;
        }
        self.open_window();
    }

    /// From now on, every slot must be accounted for.
    pub fn open_window(&mut self) {
        self.window_from = self.window_from.min(now_ms() + 1_000);
    }

    /// Records a span in which a fault (and the recovery from it) goes on.
    pub fn disturb(&mut self, from: i64, to: i64) {
        self.disturbed.push(Span {
            runner: None,
            from,
            to,
        });
    }

    /// Waits for a log line that `pred` accepts, logged from now on or before.
    pub async fn wait_event(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Event) -> bool,
    ) -> Event {
        let until = Instant::now() + within;
        loop {
            let found = self
                .events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|e| pred(e))
                .cloned();
            if let Some(e) = found {
                return e;
            }
            assert!(
                Instant::now() < until,
                "{} {}: {what}: not within {within:?} (now {}); the runners' last lines:\n{}\n\
                 their last warnings and errors:\n{}\nthe runners' processes:\n{}{}",
                self.backend.name(),
                self.namespace,
                now_ms(),
                self.last_lines(LINES_ON_FAILURE),
                self.last_chatter(LINES_ON_FAILURE / 3),
                self.processes(),
                self.store_state()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Each live runner's process state and what it waits in (`/proc`), for a failure's
    /// message: a runner stopped, or blocked writing its log, shows here.
    fn processes(&self) -> String {
        self.runners
            .iter()
            .filter_map(|r| Some((r.id.as_str(), r.pid()?)))
            .map(|(id, pid)| {
                let read = |what: &str| {
                    std::fs::read_to_string(format!("/proc/{pid}/{what}")).unwrap_or_default()
                };
                let stat = read("stat");
                // The state is the field after the command's closing parenthesis.
                let state = stat
                    .rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').next())
                    .unwrap_or("?")
                    .to_owned();
                format!(
                    "  {id} pid {pid}: state {state}, waiting in {}",
                    read("wchan")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The last `n` lines the runners logged that are not events (warnings, errors).
    fn last_chatter(&self, n: usize) -> String {
        let chatter = self.chatter.lock().unwrap_or_else(|p| p.into_inner());
        chatter[chatter.len().saturating_sub(n)..].join("\n")
    }

    /// What a cluster's nodes say of the cluster (each node's `CLUSTER INFO` state and its
    /// view of the nodes), for a failure's message; nothing for another store.
    fn store_state(&self) -> String {
        let Store::Cluster { cluster } = &self.store else {
            return String::new();
        };
        let mut out = String::from("\nthe cluster's nodes:");
        // At most 2 s a question: a node may be frozen.
        let ask = |port: u16, what: &str| {
            std::process::Command::new("timeout")
                .args(["2", "redis-cli", "-p", &port.to_string(), "cluster", what])
                .stdin(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        for node in &cluster.nodes {
            let info = ask(node.port, "info");
            let state = info
                .lines()
                .find(|l| l.starts_with("cluster_state"))
                .unwrap_or("no answer");
            let nodes = ask(node.port, "nodes");
            out.push_str(&format!("\n  port {}: {state}\n{nodes}", node.port));
        }
        out
    }

    /// The last `n` lines the runners logged, one a line (when read, runner, what, job, slot,
    /// attempt, reason), for a failure's message: what the runners did before it.
    fn last_lines(&self, n: usize) -> String {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events[events.len().saturating_sub(n)..]
            .iter()
            .map(|e| {
                format!(
                    "  {} {} {} {} {} {} {}",
                    e.at,
                    e.runner,
                    e.kind,
                    e.job.as_deref().unwrap_or("-"),
                    e.slot.map_or("-".to_owned(), |s| s.to_string()),
                    e.attempt.map_or("-".to_owned(), |a| a.to_string()),
                    e.reason
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits for an attempt of `job` that starts after now, within [`ON_TIME_MS`] of its slot,
    /// on a runner still up; returns the runner's index and the event.
    pub async fn next_attempt(&self, job: &str) -> (usize, Event) {
        let after = now_ms();
        let e = self
            .wait_event(Duration::from_secs(20), "attempt to start on time", |e| {
                e.kind == "started"
                    && e.at >= after
                    && e.job.as_deref() == Some(job)
                    && e.slot.is_some_and(|slot| e.at - slot <= ON_TIME_MS)
                    && self.index_of(&e.runner).is_some()
            })
            .await;
        let i = self.index_of(&e.runner).expect("a live runner");
        (i, e)
    }

    fn index_of(&self, runner: &str) -> Option<usize> {
        self.runners
            .iter()
            .position(|r| r.id == runner && r.child.is_some())
    }

    /// The id of runner `i`.
    pub fn id(&self, i: usize) -> String {
        self.runners[i].id.clone()
    }

    /// `kill -9` runner `i`.
    pub fn kill(&mut self, i: usize) {
        let at = now_ms();
        self.runners[i].signal(libc::SIGKILL);
        if let Some(mut child) = self.runners[i].child.take() {
            let _ = child.wait();
        }
        self.ended(i, at);
        self.deaths.push(Fault {
            runner: self.id(i),
            at,
        });
        self.disturb(at - 1_000, at + LEASE_MS + 2 * HEARTBEAT_MS + 2_000);
    }

    /// Records that runner `i` stopped being up at `at`.
    fn ended(&mut self, i: usize, at: i64) {
        let id = self.id(i);
        if let Some(life) = self
            .lives
            .iter_mut()
            .rev()
            .find(|l| l.runner.as_deref() == Some(id.as_str()))
        {
            life.to = life.to.min(at);
        }
    }

    /// `kill -9` every runner still up, one right after the other; returns when the last died.
    pub fn kill_all(&mut self) -> i64 {
        for i in 0..self.runners.len() {
            if self.runners[i].child.is_some() {
                self.kill(i);
            }
        }
        now_ms()
    }

    /// Records that every runner was down from `from` (the last one's death) to `to` (the
    /// first one's start): the checker holds the slots due meanwhile to the catch-up rule.
    pub fn all_down(&mut self, from: i64, to: i64) {
        self.all_down.push(Span {
            runner: None,
            from,
            to,
        });
        self.disturb(from, to + 1_000);
    }

    /// `SIGSTOP` runner `i`, for `for_ms`, then `SIGCONT`; returns the moment just before the
    /// `SIGCONT`: whatever the runner does after it, it does after waking.
    ///
    /// On SQLite the runner may be stopped inside one of its transactions, holding the file's
    /// write lock: then every runner's call waits until it wakes, the store is out of reach for
    /// all of them meanwhile (an outage), and a takeover can only count from the wake.
    pub async fn freeze(&mut self, i: usize, for_ms: u64) -> Woken {
        let from = now_ms();
        self.runners[i].signal(libc::SIGSTOP);
        let held = match &self.store {
            Store::Sqlite { path, .. } => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || write_lock_held(&path))
                    .await
                    .unwrap_or(false)
            }
            _ => false,
        };
        tokio::time::sleep(Duration::from_millis(for_ms)).await;
        let woken = Woken {
            instant: Instant::now(),
            at: now_ms(),
        };
        self.runners[i].signal(libc::SIGCONT);
        let to = now_ms();
        let runner = self.id(i);
        self.freezes.push(Span {
            runner: Some(runner.clone()),
            from,
            to,
        });
        if held {
            self.frozen_holding_the_file = true;
            for h in self.hits.iter_mut().filter(|h| h.runner == runner) {
                h.by_another = false;
            }
            self.outages.push(Span {
                runner: None,
                from,
                to,
            });
        }
        let at = if held { to } else { from };
        self.deaths.push(Fault { runner, at });
        self.disturb(from - 1_000, to + 2_000);
        woken
    }

    /// The data directory granted to `job` (`data/<job>` beside the job files).
    pub fn data_dir(&self, job: &str) -> PathBuf {
        self.dir.path().join("jobs").join("data").join(job)
    }

    /// `SIGTERM` runner `i` and waits for it to exit (hand-over).
    pub async fn terminate(&mut self, i: usize) {
        let at = now_ms();
        self.runners[i].signal(libc::SIGTERM);
        let mut child = self.runners[i].child.take().expect("a running runner");
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    assert!(status.success(), "runner exit after SIGTERM: {status}");
                    break;
                }
                Ok(None) if Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => panic!("runner did not exit within 20 s of SIGTERM: {other:?}"),
            }
        }
        self.ended(i, at);
        self.hand_overs.push(Fault {
            runner: self.id(i),
            at,
        });
        self.disturb(at - 1_000, now_ms() + 2_000);
    }

    /// Cuts runner `i` off the store (its proxy refuses and cuts every connection), for
    /// `for_ms`, then lets it through again.
    pub async fn partition(&mut self, i: usize, for_ms: u64) {
        let proxy = self.runners[i].proxy.as_ref().expect("a proxied runner");
        let from = now_ms();
        proxy.set(Mode::Partition);
        tokio::time::sleep(Duration::from_millis(for_ms)).await;
        proxy.set(Mode::Pass);
        let to = now_ms();
        self.cut_off.push(Span {
            runner: Some(self.id(i)),
            from,
            to,
        });
        self.deaths.push(Fault {
            runner: self.id(i),
            at: from,
        });
        self.disturb(from - 1_000, to + 2_000);
    }

    /// Delays every chunk between runner `i` and the store by `delay`, each way.
    pub fn delay(&mut self, i: usize, delay: Duration) {
        let proxy = self.runners[i].proxy.as_ref().expect("a proxied runner");
        proxy.set_delay(delay);
    }

    /// Stalls what runner `i` sends to the store for `stall`: everything it sends meanwhile
    /// reaches the store when the stall ends, and the store's answers come back at once. On
    /// SQLite, where no network lies between the runner and the file, another connection holds
    /// the file's write lock for `stall`: every runner's transaction waits for it (up to its
    /// busy timeout, the store URL's `?timeout=`) and goes on when the lock is let go.
    pub fn stall_requests(&mut self, i: usize, stall: Duration) {
        match &self.store {
            Store::Sqlite { path, .. } => {
                let release = baton_tests::lock_sqlite_file(path);
                tokio::spawn(async move {
                    tokio::time::sleep(stall).await;
                    let _ = release.send(());
                });
            }
            _ => {
                let proxy = self.runners[i].proxy.as_ref().expect("a proxied runner");
                proxy.stall_requests(stall);
            }
        }
    }

    /// Stops the store: Redis and Valkey are killed (`kill -9`; their append-only file keeps
    /// the data), PostgreSQL (a server of the test's own) is stopped immediately (no
    /// checkpoint; its write-ahead log keeps the data), and a SQLite file is locked by another
    /// connection.
    pub fn stop_store(&mut self) {
        let at = now_ms();
        match &mut self.store {
            Store::Sqlite { path, lock } => {
                *lock = Some(baton_tests::lock_sqlite_file(path));
            }
            Store::RedisLike { server, .. } => {
                drop(server.take());
            }
            Store::Postgres { server } => server.stop_immediately(),
            Store::Cluster { .. } => unreachable!("a cluster is not stopped as one server"),
        }
        self.store_down_since = Some(at);
        for r in self.runners.iter().filter(|r| r.child.is_some()) {
            self.deaths.push(Fault {
                runner: r.id.clone(),
                at,
            });
        }
    }

    /// Starts the store again (same port, same data).
    pub fn start_store(&mut self) {
        match &mut self.store {
            Store::Sqlite { lock, .. } => {
                if let Some(release) = lock.take() {
                    let _ = release.send(());
                }
            }
            Store::RedisLike {
                binary,
                port,
                dir,
                server,
            } => {
                *server = Some(servers::start_redis_like_in(
                    binary,
                    *port,
                    dir.path(),
                    &REDIS_PERSISTENCE,
                ));
            }
            Store::Postgres { server } => server.start_again(),
            Store::Cluster { .. } => unreachable!("a cluster is not stopped as one server"),
        }
        if let Some(from) = self.store_down_since.take() {
            let to = now_ms();
            self.outages.push(Span {
                runner: None,
                from,
                to,
            });
            self.disturb(from - 1_000, to + 3_000);
        }
    }

    /// The cluster's key of `job` (its hash tag decides the hash slot of every key of the job).
    fn cluster_key(&self, job: &str) -> String {
        format!("{{{}:{job}}}:runs", self.namespace)
    }

    fn cluster(&self) -> &servers::Cluster {
        match &self.store {
            Store::Cluster { cluster } => cluster,
            _ => panic!("{} is not a Redis Cluster", self.backend.name()),
        }
    }

    /// Moves `job`'s hash slot from its primary to another, a key at a time, `pause` apart,
    /// while the runners go on claiming (they are sent `ASK` and `TRYAGAIN` meanwhile): an
    /// outage of the job's keys, recorded as one.
    /// Returns how many keys moved and how long it took, ms.
    pub async fn migrate_slot_of(&mut self, job: &str, pause: Duration) -> (usize, i64) {
        let key = self.cluster_key(job);
        let cluster = self.cluster();
        let slot = cluster.key_slot(&key);
        let (from, _) = cluster.primary_and_replica_of(&key, &[]);
        let to = cluster
            .primaries(&[])
            .into_iter()
            .find(|p| *p != from)
            .expect("another primary");
        let started = now_ms();
        let moved = tokio::task::block_in_place(|| cluster.migrate_slot(slot, from, to, pause));
        let ended = now_ms();
        assert_eq!(
            cluster.owner_of(&key, &[]).0,
            Some(to),
            "slot {slot} is not served by its new primary"
        );
        // A script whose keys are split between the two nodes is answered `TRYAGAIN`, and the
        // client retries it until the slot has settled: for the job's claims the store is out
        // of reach meanwhile, and a slot due then may be passed over for the next (as in any
        // outage, a runner claims only the latest due slot once it hears an answer).
        self.outage(started, ended);
        self.disturb(started - 1_000, ended + 2_000);
        (moved, ended - started)
    }

    /// Kills (`kill -9`) the primary that serves `job`'s hash slot and waits until the cluster
    /// has promoted its replica: an outage of the job's keys from the kill to the promotion,
    /// recorded as one until every runner has heard from the promoted primary. Returns how long
    /// the promotion took and how long after it the last runner heard, ms.
    pub async fn fail_over_primary_of(&mut self, job: &str) -> (i64, i64) {
        let key = self.cluster_key(job);
        let cluster = self.cluster();
        let (primary, replica) = cluster.primary_and_replica_of(&key, &[]);
        let started = now_ms();
        servers::signal(&cluster.nodes[primary], libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let role = servers::redis_cli(cluster.nodes[replica].port, &["role"]);
            if role.starts_with("master") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica of the killed primary was not promoted within 20 s: {role}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let promoted = now_ms();
        // Until a runner hears from the promoted primary (its client finds it, and requests
        // sent to the dead one time out) the job's keys are out of its reach: the outage lasts
        // until every runner has had a claim of `job` answered.
        let mut heard = promoted;
        let live: Vec<String> = self
            .runners
            .iter()
            .filter(|r| r.child.is_some())
            .map(|r| r.id.clone())
            .collect();
        for id in live {
            let answered = self
                .wait_event(
                    Duration::from_secs(30),
                    "a claim answered by the promoted primary",
                    |e| {
                        e.runner == id
                            && e.job.as_deref() == Some(job)
                            && e.at >= promoted
                            && matches!(e.kind.as_str(), "won" | "backup" | "skip")
                    },
                )
                .await;
            heard = heard.max(answered.at);
        }
        self.outage(started, heard);
        self.disturb(started - 1_000, heard + 3_000);
        (promoted - started, heard - promoted)
    }

    /// Records a span in which no runner could get a claim answered in time: the store was out
    /// of reach, or answered only after the slot's claim was late.
    pub fn outage(&mut self, from: i64, to: i64) {
        self.outages.push(Span {
            runner: None,
            from,
            to,
        });
    }

    /// Every event logged so far.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Ends the scenario: closes the window, kills every runner, and reads the store's history
    /// and the side-effect files.
    pub fn finish(mut self) -> Input {
        let window_to = now_ms() - 1_500;
        if self.store_down_since.is_some() {
            self.start_store();
        }
        for r in &mut self.runners {
            r.signal(libc::SIGKILL);
            if let Some(mut child) = r.child.take() {
                let _ = child.wait();
            }
        }
        let url = self.store.url(self.backend, None);
        let mut runs = Vec::new();
        let mut effects = Vec::new();
        let mut state = Vec::new();
        for job in &self.jobs {
            let name = &job.spec.name;
            let out = baton(
                &[
                    "history",
                    name,
                    "--store",
                    &url,
                    "--namespace",
                    &self.namespace,
                    "--json",
                    "--limit",
                    "100000",
                ],
                &[],
            );
            if out.code == Some(0) {
                runs.extend(checker::parse_history(&out.stdout).expect("history --json parses"));
            } else {
                // A job that never ran has no history: `baton history` says so.
                assert!(
                    out.stderr.contains("has no runs"),
                    "baton history {name} failed: {}",
                    out.stderr
                );
            }
            let out = baton(
                &[
                    "state",
                    name,
                    "--store",
                    &url,
                    "--namespace",
                    &self.namespace,
                    "--json",
                ],
                &[],
            );
            assert_eq!(
                out.code,
                Some(0),
                "baton state {name} failed: {}",
                out.stderr
            );
            state.extend(crate::state_writes::parse(&out.stdout).expect("state --json parses"));
            let data = self.dir.path().join("jobs").join("data").join(name);
            let effect_files = std::fs::read_dir(&data)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| is_effect_file(&e.file_name().to_string_lossy()));
            for entry in effect_files {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                effects.extend(text.lines().filter_map(|l| checker::parse_effect(name, l)));
            }
        }
        Input {
            jobs: self.jobs.iter().map(|j| j.spec.clone()).collect(),
            runs,
            effects,
            events: self.events(),
            window: (self.window_from, window_to),
            skew: self.skew.clone(),
            freezes: self.freezes.clone(),
            outages: self.outages.clone(),
            all_down: self.all_down.clone(),
            disturbed: self.disturbed.clone(),
            stop_latency: STOP_LATENCY_MS,
            on_time: ON_TIME_MS,
            lease: LEASE_MS,
            heartbeat: HEARTBEAT_MS,
            lives: self.lives.clone(),
            cut_off: self.cut_off.clone(),
            state,
            state_jobs: self
                .jobs
                .iter()
                .filter(|j| j.guest == env!("GUEST_STATE_WRITER"))
                .map(|j| j.spec.name.clone())
                .collect(),
            hits: self.hits.clone(),
        }
    }

    /// Records that a fault whose point is a takeover hits the attempt that `started` (a
    /// `started` line): the checker fails the scenario unless another runner takes it over and
    /// the run ends `success` there.
    pub fn hit(&mut self, started: &Event) {
        self.hits.push(Hit {
            job: started.job.clone().expect("a started line names its job"),
            slot: started.slot.expect("a started line names its slot"),
            runner: started.runner.clone(),
            by_another: true,
        });
    }

    /// Whether another runner than the hit one must take over the run that `started`: see
    /// [`Hit::by_another`].
    pub fn by_another(&self, started: &Event) -> bool {
        self.hits
            .iter()
            .filter(|h| Some(&h.job) == started.job.as_ref() && Some(h.slot) == started.slot)
            .all(|h| h.by_another)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for r in &mut self.runners {
            if let Some(mut child) = r.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_lock_held_by_another_connection_is_seen_and_a_free_file_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("baton.db");
        rusqlite::Connection::open(&path)
            .and_then(|c| c.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x);"))
            .expect("a database");
        assert!(!write_lock_held(&path));
        let release = baton_tests::lock_sqlite_file(&path);
        assert!(write_lock_held(&path));
        drop(release);
        let free = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !write_lock_held(&path)
        });
        assert!(free, "the lock is let go");
    }
}
