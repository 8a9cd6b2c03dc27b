//! Baton's Wasm host: jobs as components of the `baton:job` world (`wit/baton-job.wit`), and
//! the [`jobs`] directory they are loaded from.
//!
//! - [`engine`]: one wasmtime engine with epoch interruption and the pooling allocator; each
//!   component compiled once per file content and kept pre-instantiated.
//! - `bindings`: the host side of each version of the world (0.2.0, and 0.1.0 for components
//!   built before it): run info, `signal-aborted`, logging.
//! - `attempt`: a fresh store per attempt, with its sandbox and limits.
//! - `epoch`: the watchdog thread that ticks the epoch and checks lease deadlines.
//! - [`log`]: guest output as tagged log lines, under a budget.
//!
//! A [`WasmJob`] is an [`instance::Handler`](baton_core::instance::Handler): the lease engine knows
//! nothing of Wasm. The host stops a guest itself when its attempt is lost, self-fenced, past
//! the stop timeout or past its run timeout: it flags the attempt and bumps the epoch, so a
//! guest that computes traps at its next epoch check (within about a millisecond) and a guest
//! blocked in a host call has its call dropped.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;

use crate::jobs::JobSpec;
use baton_core::instance::{Handler, RunContext};

mod attempt;
mod bindings;
pub mod config;
mod disk_cache;
pub mod engine;
mod epoch;
mod fence;
pub mod jobs;
pub mod log;
pub mod outbound;
mod state;

pub use attempt::{Sandbox, DATA_DIR_IN_GUEST};
pub use bindings::WORLD_VERSIONS;
pub use engine::{ComponentKind, LoadedComponent, MAX_INSTANCES, MAX_MEMORY};
pub use epoch::TICK;
pub use jobs::boundary::{AllowedDirs, GrantedDir};
pub use log::{tracing_sink, GuestLine, LineSource, LogSink, LOG_BUDGET};

/// A component that cannot be used. Every message names the file, the reason and the fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The engine could not be set up (e.g. the address space for the pool is not available).
    #[error("cannot start the wasm engine: {message}")]
    Engine {
        /// Why.
        message: String,
    },
    /// The file cannot be read.
    #[error("{path}: cannot read: {source}", path = .path.display())]
    Read {
        /// The component file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not WebAssembly at all.
    #[error("{path}: not a WebAssembly file; build the job for wasm32-wasip2 (e.g. `cargo build --target wasm32-wasip2`) and copy the .wasm here", path = .path.display())]
    NotWasm {
        /// The file.
        path: PathBuf,
    },
    /// The file is WebAssembly but does not compile as a component (e.g. a core module).
    #[error("{path}: not a valid WebAssembly component: {message}; build it for wasm32-wasip2, which makes a component", path = .path.display())]
    Compile {
        /// The file.
        path: PathBuf,
        /// The compiler's message.
        message: String,
    },
    /// The file is a core WebAssembly module (e.g. built for `wasm32-wasip1`), not a component.
    #[error("{path}: a core WebAssembly module (built for wasm32-wasip1?), not a component; rebuild it for wasm32-wasip2 (`rustup target add wasm32-wasip2`, then `cargo build --target wasm32-wasip2`), which makes a component (adapting the module with `wasm-tools component new` and the WASI preview-1 command adapter is not tried here)", path = .path.display())]
    CoreModule {
        /// The file.
        path: PathBuf,
    },
    /// The component exports neither `run` (the `baton:job` world) nor `wasi:cli/run` (a
    /// command): it is of another world.
    #[error("{path}: neither a command nor a baton:job component: it exports {exports}, but neither `wasi:cli/run` (a program with `fn main` built for wasm32-wasip2) nor `run` (the world baton:job/job@0.2.0 of wit/baton-job.wit; in Rust: `baton_guest::job!`)", path = .path.display(), exports = list(.exports))]
    NotAJob {
        /// The file.
        path: PathBuf,
        /// What it exports instead.
        exports: Vec<String>,
    },
    /// The component exports `run` with another type.
    #[error("{path}: does not implement the world baton:job/job@0.2.0: {message}; `run` must be `func() -> result<_, string>` as in wit/baton-job.wit", path = .path.display())]
    WrongExport {
        /// The file.
        path: PathBuf,
        /// The type checker's message.
        message: String,
    },
    /// The component imports something the sandbox does not offer.
    #[error("{path}: imports what Baton does not offer: {message}; a job may import baton:job/host and baton:job/state (0.2.0; host alone at 0.1.0 for older jobs), WASI 0.2 (cli, clocks, random, filesystem, io), wasi:http/outgoing-handler and wasi:config/store only", path = .path.display())]
    Imports {
        /// The file.
        path: PathBuf,
        /// The linker's message.
        message: String,
    },
    /// A job file asks for a limit the host cannot give.
    #[error("{path}: limits.memory of {asked} is over the host's maximum of {max}; lower it", path = .path.display(), asked = crate::jobs::format_size(*.asked), max = crate::jobs::format_size(MAX_MEMORY))]
    MemoryLimit {
        /// The job file.
        path: PathBuf,
        /// What it asked for, bytes.
        asked: u64,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "nothing".to_owned()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Settings of a [`WasmHost`].
#[derive(Clone)]
pub struct HostConfig {
    /// Where guest log lines go. Defaults to [`tracing_sink`].
    pub log_sink: LogSink,
    /// How many threads run guest calls. Defaults to the number of CPUs, at least 2.
    pub guest_threads: usize,
    /// Told the kind of every guest trap (see [`TrapSink`]). Defaults to none.
    pub trap_sink: Option<TrapSink>,
    /// Told the outcome of every outbound request of a guest (see [`OutboundSink`]). Defaults to
    /// none.
    pub outbound_sink: Option<OutboundSink>,
    /// Where compiled components are kept across restarts, keyed by content and engine (see
    /// [`default_cache_dir`]). Defaults to none: every start compiles again.
    pub cache_dir: Option<PathBuf>,
}

/// The compile cache `baton run` uses unless told otherwise: `$XDG_CACHE_HOME/baton`, else
/// `$HOME/.cache/baton`; `None` when neither is set.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("baton"))
}

/// Where the kinds of guest traps go, e.g. [`baton_core::metrics::Metrics::guest_trap`]: `lost`,
/// `self-fenced`, `stop-timeout`, `run-timeout` (the host stopped the guest), `memory-cap`,
/// `unreachable` (a panic, or `unreachable`), `stack-overflow`, `out-of-bounds`,
/// `division-by-zero`, `other` (another trap), `host` (a host call failed).
pub type TrapSink = Arc<dyn Fn(&'static str) + Send + Sync>;

/// Where the outcomes of guests' outbound requests go, e.g.
/// [`baton_core::metrics::Metrics::outbound_request`]: `sent`, `denied`, `fenced`, `failed`.
pub type OutboundSink = Arc<dyn Fn(&'static str) + Send + Sync>;

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            log_sink: tracing_sink(),
            guest_threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .max(2),
            trap_sink: None,
            outbound_sink: None,
            cache_dir: None,
        }
    }
}

struct HostInner {
    compiler: engine::Compiler,
    watchdog: epoch::Watchdog,
    /// The runtime guest calls run on; `None` only while dropping.
    guests: Option<tokio::runtime::Runtime>,
    guest_handle: tokio::runtime::Handle,
    log_sink: LogSink,
    trap_sink: Option<TrapSink>,
    outbound_sink: Option<OutboundSink>,
    running: AtomicUsize,
}

impl Drop for HostInner {
    fn drop(&mut self) {
        // Dropping a runtime inside another one panics; let it wind down on its own.
        if let Some(guests) = self.guests.take() {
            guests.shutdown_background();
        }
    }
}

/// The Wasm component host: the engine, the compiled components, the epoch watchdog and the
/// runtime that guest calls run on (not the lease engine's). Cheap to clone.
#[derive(Clone)]
pub struct WasmHost {
    inner: Arc<HostInner>,
}

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The engine could not be set up.
    #[error(transparent)]
    Engine(#[from] LoadError),
    /// A thread or runtime could not be started.
    #[error("cannot start the wasm host's threads: {0}")]
    Threads(#[source] std::io::Error),
}

impl WasmHost {
    /// Starts a host: the engine, the watchdog thread and the guest runtime.
    pub fn new(config: HostConfig) -> Result<WasmHost, HostError> {
        let compiler = engine::Compiler::new(config.cache_dir.as_deref())?;
        let watchdog =
            epoch::Watchdog::start(compiler.engine.clone()).map_err(HostError::Threads)?;
        let guests = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.guest_threads.max(1))
            .thread_name("baton-guest")
            .enable_all()
            .build()
            .map_err(HostError::Threads)?;
        Ok(WasmHost {
            inner: Arc::new(HostInner {
                compiler,
                watchdog,
                guest_handle: guests.handle().clone(),
                guests: Some(guests),
                log_sink: config.log_sink,
                trap_sink: config.trap_sink,
                outbound_sink: config.outbound_sink,
                running: AtomicUsize::new(0),
            }),
        })
    }

    /// Loads a component file (compiled once per content; the same bytes share the code).
    pub fn load(&self, path: impl Into<PathBuf>) -> Result<Arc<LoadedComponent>, LoadError> {
        self.inner.compiler.load(&path.into())
    }

    /// A job of a job file: its component loaded, its sandbox the job file's grants (the data
    /// directory as it was opened when the job file loaded).
    pub fn job(&self, spec: &JobSpec) -> Result<WasmJob, LoadError> {
        if spec.limits.memory > MAX_MEMORY {
            return Err(LoadError::MemoryLimit {
                path: spec.toml_path.clone(),
                asked: spec.limits.memory,
            });
        }
        let data_dir = spec
            .grants
            .data_dir
            .clone()
            .map(|dir| (dir, spec.grants.data_dir_read_only));
        let component = self.load(&spec.wasm_path)?;
        Ok(WasmJob {
            host: self.clone(),
            component,
            sandbox: Arc::new(Sandbox {
                job_file: spec.toml_path.clone(),
                memory: spec.limits.memory,
                run_timeout: spec.limits.run_timeout,
                data_dir,
                env: spec
                    .grants
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                outbound: outbound::Outbound {
                    allowed: spec.grants.allowed_outbound_hosts.clone(),
                    limits: spec.limits.http.clone(),
                },
                config: spec.config.clone(),
                args: spec.args.clone(),
            }),
            running: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// A job that runs `component` in `sandbox`.
    pub fn job_from(&self, component: Arc<LoadedComponent>, sandbox: Sandbox) -> WasmJob {
        WasmJob {
            host: self.clone(),
            component,
            sandbox: Arc::new(sandbox),
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// How many guests run now (instantiated and called, not yet returned).
    pub fn running_guests(&self) -> usize {
        self.inner.running.load(Ordering::Acquire)
    }
}

/// One job's component and sandbox: a [`Handler`] whose every attempt runs in a fresh store.
#[derive(Clone)]
pub struct WasmJob {
    host: WasmHost,
    component: Arc<LoadedComponent>,
    sandbox: Arc<Sandbox>,
    running: Arc<AtomicUsize>,
}

impl WasmJob {
    /// The component this job runs.
    pub fn component(&self) -> &Arc<LoadedComponent> {
        &self.component
    }

    /// How many attempts of this job (this handler and its clones) have a guest running now.
    pub fn running_guests(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
}

/// Counts a running guest, in the host and in its job, while alive.
struct Running {
    host: Arc<HostInner>,
    job: Arc<AtomicUsize>,
}

impl Running {
    fn start(host: Arc<HostInner>, job: Arc<AtomicUsize>) -> Running {
        host.running.fetch_add(1, Ordering::AcqRel);
        job.fetch_add(1, Ordering::AcqRel);
        Running { host, job }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.host.running.fetch_sub(1, Ordering::AcqRel);
        self.job.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Aborts the guest's task when the handler's future is dropped (e.g. at the stop timeout).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[async_trait]
impl Handler for WasmJob {
    async fn run(&self, ctx: RunContext) -> Result<(), String> {
        let host = self.host.inner.clone();
        let component = self.component.clone();
        let sandbox = self.sandbox.clone();
        let log = log::AttemptLog::new(&ctx.job, ctx.slot, ctx.attempt, host.log_sink.clone())
            .redacting(config::Redactor::new(sandbox.config.values()));
        let (job, slot, attempt) = (ctx.job.clone(), ctx.slot, ctx.attempt);
        let _watch = host
            .watchdog
            .watch(ctx.deadline.clone(), ctx.signal.clone());
        let task = {
            let spawner = host.guest_handle.clone();
            let host = host.clone();
            let log = log.clone();
            let job_running = self.running.clone();
            spawner.spawn(async move {
                let mut running = None;
                let result = attempt::run(
                    &host.compiler.engine,
                    &component,
                    &sandbox,
                    log,
                    ctx,
                    host.trap_sink.as_ref(),
                    host.outbound_sink.as_ref(),
                    || running = Some(Running::start(host.clone(), job_running)),
                )
                .await;
                drop(running);
                result
            })
        };
        let _abort = AbortOnDrop(task.abort_handle());
        let result = match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err("the wasm host panicked running the guest".to_owned()),
            Err(_) => Err("the guest's call was cancelled".to_owned()),
        };
        log.finish();
        if let Err(message) = &result {
            if message.starts_with(attempt::STOPPED_PREFIX) {
                tracing::warn!(job = %job, slot = %baton_core::schedule::format_utc(slot), attempt, "{message}");
            }
        }
        result
    }

    fn digest(&self) -> Option<String> {
        Some(self.component.digest.clone())
    }
}
