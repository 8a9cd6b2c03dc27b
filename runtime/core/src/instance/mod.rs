//! The instance: one per host, one loop per job — claims at each slot, heartbeats, backups,
//! catch-up on start, overlap, late claims and hand-over on stop, exactly as `spec/leases.md`
//! says.
//!
//! The lease engine (claims, heartbeats, timers) runs on a runtime of its own, so a busy
//! handler can never delay a heartbeat; handlers run on the runtime that started the instance.
//! Its clocks, randomness and runtime are the seams of [`Env`](crate::env::Env): a simulation
//! runs the same code on paused time with one seed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;

use crate::env::{Clock, Env, Switch};

use crate::lease::{LeaseOptions, OptionsError};
use crate::schedule::Schedule;
use crate::store::{self, Store, StoreError};

mod attempt;
mod events;
mod handler;
mod job;
mod operations;
mod outage;
mod watches;

pub use events::{Event, EventKind};
pub use handler::{handler_fn, AbortReason, BootTime, Handler, LeaseDeadline, RunContext, Signal};

/// How long a handler may take to end once its signal aborts at the stop timeout before its
/// lease is left to run out instead of released: 500 ms.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

/// How many events a slow subscriber may fall behind before it misses some: 4096.
pub const EVENT_BUFFER: usize = 4096;

/// A job as the instance runs it.
#[derive(Clone)]
pub struct Job {
    /// The job's name, unique in the namespace.
    pub name: String,
    /// When it runs.
    pub schedule: Schedule,
    /// Its lease options.
    pub options: LeaseOptions,
    /// What it runs.
    pub handler: Arc<dyn Handler>,
}

/// Where and as whom an instance runs.
#[derive(Clone, Debug)]
pub struct InstanceConfig {
    /// The store's URL (see [`store::open`]).
    pub store_url: String,
    /// The namespace in the store. Defaults to `baton`.
    pub namespace: String,
    /// This instance's runner id, unique in the cluster.
    pub runner: String,
}

impl InstanceConfig {
    /// A configuration with the default namespace.
    pub fn new(store_url: impl Into<String>, runner: impl Into<String>) -> Self {
        InstanceConfig {
            store_url: store_url.into(),
            namespace: store::DEFAULT_NAMESPACE.to_owned(),
            runner: runner.into(),
        }
    }
}

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A job's lease options are out of range.
    #[error("job {job:?}: {source}")]
    Options {
        /// The job.
        job: String,
        /// What is wrong.
        #[source]
        source: OptionsError,
    },
    /// Two jobs have the same name.
    #[error("job {0:?} is defined twice")]
    DuplicateJob(String),
    /// The instance was stopped; it takes no more jobs.
    #[error("the instance is stopped")]
    Stopped,
    /// The lease engine's runtime could not be built.
    #[error("cannot start the lease engine: {0}")]
    Runtime(#[source] std::io::Error),
}

/// What `stop` did with the attempts that were running.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Attempts that ended within the timeout (finished or handed over).
    pub ended: usize,
    /// Attempts still running at the timeout; they are no longer renewed.
    pub abandoned: usize,
}

/// A running attempt, as `stop` sees it.
struct ActiveAttempt {
    signal: Signal,
    abandon: Arc<Notify>,
}

/// The store's clock as this host estimates it: its own clock plus a measured offset, so slots
/// fall due by the store's time, whatever this host's clock says.
struct StoreClock {
    clock: Arc<dyn Clock>,
    offset_ms: AtomicI64,
}

impl StoreClock {
    fn now(&self) -> i64 {
        self.clock.wall_ms() + self.offset_ms.load(Ordering::Relaxed)
    }

    async fn sync(&self, store: &dyn Store) -> Result<(), StoreError> {
        let before = self.clock.wall_ms();
        let t0 = Instant::now();
        let store_now = store.now().await?;
        let half_trip = i64::try_from(t0.elapsed().as_millis() / 2).unwrap_or(0);
        self.offset_ms
            .store(store_now - (before + half_trip), Ordering::Relaxed);
        Ok(())
    }
}

/// The state the instance's tasks share.
pub(crate) struct Inner {
    store: Arc<dyn Store>,
    runner: String,
    /// Where its events go: metrics, log lines, subscribers.
    events: events::EventSink,
    stopping: AtomicBool,
    stop_notify: Notify,
    attempts: Mutex<BTreeMap<(String, i64), ActiveAttempt>>,
    attempt_ended: Notify,
    /// The runs it watches as a backup, and each job's newest slots started and claimed.
    watches: watches::Watches,
    /// The current version of every job, by name.
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    /// Woken whenever a job is replaced or removed.
    retired: Notify,
    work: tokio::runtime::Handle,
    /// Where the lease engine's tasks run.
    engine: tokio::runtime::Handle,
    /// Set once the instance stops or is dropped, when its tasks share a runtime with others:
    /// every task it spawned ends at its next await.
    kill: Arc<Switch>,
    /// The instance's seams: clocks, randomness, runtime.
    env: Env,
    clock: StoreClock,
    /// What this instance counted: every event, and each heartbeat's latency.
    metrics: Arc<crate::metrics::Metrics>,
    /// The store outage going on now, if any: its calls fail or go unanswered.
    outage: outage::OutageTracker,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Spawns one of the lease engine's tasks (see [`Env::own_runtime`]).
    fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.env.own_runtime {
            return self.engine.spawn(task);
        }
        let killed = self.kill.clone();
        let frozen = self.env.frozen.clone();
        self.engine.spawn(async move {
            tokio::select! {
                biased;
                () = killed.wait_for(true) => {}
                _ = unless_frozen(task, frozen) => {}
            }
        })
    }

    /// A fresh claim token.
    fn token(&self) -> crate::lease::Token {
        self.env.entropy.token()
    }

    /// Sleeps for `d`, or until stop begins; returns whether the instance is stopping.
    async fn sleep_or_stop(&self, d: Duration) -> bool {
        let stopped = self.stop_notify.notified();
        if self.is_stopping() {
            return true;
        }
        tokio::select! {
            biased;
            _ = stopped => true,
            _ = tokio::time::sleep(d) => self.is_stopping(),
        }
    }

    /// The current version of a job, if it is still one of the instance's jobs.
    fn current_job(&self, name: &str) -> Option<Arc<Job>> {
        lock(&self.jobs).get(name).cloned()
    }

    /// Whether `job` is still the current version of its job.
    fn is_current(&self, job: &Arc<Job>) -> bool {
        lock(&self.jobs)
            .get(&job.name)
            .is_some_and(|current| Arc::ptr_eq(current, job))
    }

    /// Sleeps for `d`, or until stop begins or `job` is replaced or removed; returns whether
    /// the loop of this version of the job must end.
    async fn sleep_or_retired(&self, job: &Arc<Job>, d: Duration) -> bool {
        let until = Instant::now() + d;
        loop {
            let retired = self.retired.notified();
            if !self.is_current(job) {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            tokio::select! {
                biased;
                stopping = self.sleep_or_stop(left) => return stopping || !self.is_current(job),
                _ = retired => {}
            }
        }
    }

    /// Notes a store call that failed, or went unanswered, for a reason worth retrying (see
    /// [`outage::OutageTracker`]).
    fn store_failed(&self, error: &dyn std::fmt::Display) {
        self.outage.failed(self.clock.now(), error);
    }

    /// Awaits a store call and notes its answer or its failure (see [`Inner::store_failed`]).
    async fn observed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = call.await;
        match &result {
            Ok(_) => self.outage.answered(self.clock.now()),
            Err(e) if e.is_retryable() => self.store_failed(e),
            Err(_) => {}
        }
        result
    }
}

/// A running instance. Dropping it without [`Instance::stop`] stops renewing every lease at once.
pub struct Instance {
    inner: Arc<Inner>,
    /// The lease engine's own runtime, when it has one ([`Env::own_runtime`]).
    engine: Mutex<Option<tokio::runtime::Runtime>>,
    /// Set once the instance stopped: it takes no more jobs.
    stopped: AtomicBool,
    /// The receiver made before the jobs started, for the first subscriber.
    first_events: Mutex<Option<broadcast::Receiver<Event>>>,
}

impl Instance {
    /// Opens the store and starts one loop per job: catch-up first, then a claim at every slot.
    /// Call it from within a tokio runtime: handlers run there.
    pub async fn start(config: InstanceConfig, jobs: Vec<Job>) -> Result<Instance, InstanceError> {
        Instance::start_with(config, jobs, |store| store).await
    }

    /// [`Instance::start`], with the store the instance opens passed through `layer` first: a
    /// library user (or `baton bench`) can wrap it to count or observe every operation the
    /// instance sends. The store is opened on the lease engine's runtime, as with `start`.
    pub async fn start_with<L>(
        config: InstanceConfig,
        jobs: Vec<Job>,
        layer: L,
    ) -> Result<Instance, InstanceError>
    where
        L: FnOnce(Arc<dyn Store>) -> Arc<dyn Store> + Send + 'static,
    {
        check_jobs(&jobs)?;
        let engine = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("baton-lease")
            .enable_all()
            .build()
            .map_err(InstanceError::Runtime)?;
        let url = config.store_url.clone();
        let namespace = config.namespace.clone();
        let opened = engine
            .spawn(async move { Ok::<_, StoreError>(layer(store::open(&url, &namespace).await?)) })
            .await;
        let opened = opened.unwrap_or_else(|join| {
            Err(StoreError::Backend {
                store: store::redact(&config.store_url),
                source: join.into(),
            })
        });
        let store = match opened {
            Ok(store) => store,
            Err(e) => {
                // Dropping a runtime inside another one panics: let it wind down on its own.
                engine.shutdown_background();
                return Err(InstanceError::Store(e));
            }
        };
        Instance::launch(store, config.runner, jobs, Env::default(), Some(engine)).await
    }

    /// Starts an instance on a store already open, with the given seams: what a simulation
    /// does, with [`Env::simulated`], for several instances on one store in one process.
    pub async fn start_on(
        store: Arc<dyn Store>,
        runner: impl Into<String>,
        jobs: Vec<Job>,
        env: Env,
    ) -> Result<Instance, InstanceError> {
        check_jobs(&jobs)?;
        let engine = if env.own_runtime {
            Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("baton-lease")
                    .enable_all()
                    .build()
                    .map_err(InstanceError::Runtime)?,
            )
        } else {
            None
        };
        Instance::launch(store, runner.into(), jobs, env, engine).await
    }

    /// Measures the store's clock, then starts the loops: on `engine` if given, else on the
    /// runtime this is called on.
    async fn launch(
        store: Arc<dyn Store>,
        runner: String,
        jobs: Vec<Job>,
        env: Env,
        engine: Option<tokio::runtime::Runtime>,
    ) -> Result<Instance, InstanceError> {
        let handle = match &engine {
            Some(rt) => rt.handle().clone(),
            None => tokio::runtime::Handle::current(),
        };
        let synced = {
            let store = store.clone();
            let clock = StoreClock {
                clock: env.clock.clone(),
                offset_ms: AtomicI64::new(0),
            };
            handle
                .spawn(async move { clock.sync(&*store).await.map(|()| clock) })
                .await
        };
        let clock = match synced {
            Ok(Ok(clock)) => clock,
            Ok(Err(e)) => {
                // Dropping a runtime inside another one panics: let it wind down on its own.
                if let Some(engine) = engine {
                    engine.shutdown_background();
                }
                return Err(InstanceError::Store(e));
            }
            Err(join) => {
                if let Some(engine) = engine {
                    engine.shutdown_background();
                }
                return Err(InstanceError::Store(StoreError::Backend {
                    store: "the store".into(),
                    source: join.into(),
                }));
            }
        };
        let (events, first_events) = broadcast::channel(EVENT_BUFFER);
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let events = events::EventSink::new(runner.clone(), events, metrics.clone());
        let inner = Arc::new(Inner {
            store,
            runner,
            events,
            stopping: AtomicBool::new(false),
            stop_notify: Notify::new(),
            attempts: Mutex::new(BTreeMap::new()),
            attempt_ended: Notify::new(),
            watches: watches::Watches::default(),
            jobs: Mutex::new(HashMap::new()),
            retired: Notify::new(),
            work: tokio::runtime::Handle::current(),
            engine: handle,
            kill: Arc::new(Switch::new()),
            env,
            clock,
            metrics,
            outage: outage::OutageTracker::default(),
        });
        for job in jobs {
            let job = Arc::new(job);
            lock(&inner.jobs).insert(job.name.clone(), job.clone());
            inner.spawn(job::job_loop(inner.clone(), job));
        }
        inner.spawn(resync_clock(inner.clone()));
        Ok(Instance {
            inner,
            engine: Mutex::new(engine),
            stopped: AtomicBool::new(false),
            first_events: Mutex::new(Some(first_events)),
        })
    }

    /// A stream of events: the first call gets every event since the instance started, later
    /// calls every event from then on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        lock(&self.first_events)
            .take()
            .unwrap_or_else(|| self.inner.events.subscribe())
    }

    /// Adds a job, or replaces the job of that name: from now on its claims, takeovers and
    /// backups use the new version (its schedule, options and handler), starting with catch-up
    /// as on start. An attempt already running keeps the version it started with.
    pub fn upsert_job(&self, job: Job) -> Result<(), InstanceError> {
        job.options
            .validate()
            .map_err(|source| InstanceError::Options {
                job: job.name.clone(),
                source,
            })?;
        if self.stopped.load(Ordering::Acquire) {
            return Err(InstanceError::Stopped);
        }
        let job = Arc::new(job);
        lock(&self.inner.jobs).insert(job.name.clone(), job.clone());
        self.inner.retired.notify_waiters();
        self.inner.spawn(job::job_loop(self.inner.clone(), job));
        Ok(())
    }

    /// Removes a job: no more claims or takeovers of it. An attempt already running goes on to
    /// its end. Returns whether the job was there.
    pub fn remove_job(&self, name: &str) -> bool {
        let removed = lock(&self.inner.jobs).remove(name).is_some();
        self.inner.watches.forget_job(name);
        self.inner.metrics.forget_job(name);
        self.inner.retired.notify_waiters();
        removed
    }

    /// The current version of one of the instance's jobs.
    pub fn job(&self, name: &str) -> Option<Job> {
        lock(&self.inner.jobs).get(name).map(|job| Job::clone(job))
    }

    /// The names of the instance's jobs, sorted.
    pub fn job_names(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.inner.jobs).keys().cloned().collect();
        names.sort();
        names
    }

    /// What this instance counted (claims by outcome, takeovers, lost attempts, run durations,
    /// heartbeat latency, …), for `/metrics`. A Wasm host adds its guest traps to the same.
    pub fn metrics(&self) -> Arc<crate::metrics::Metrics> {
        self.inner.metrics.clone()
    }

    /// Starts reading the store's record of operations every `every` (the binary's default is
    /// [`OPERATIONS_POLL`](crate::operate::OPERATIONS_POLL), 1 s): from then on this instance
    /// claims the runs an operator triggers (`baton trigger`) within `every` plus a store round
    /// trip, emits `paused`, `resumed` and `triggered` for its jobs, and tells the attempts of
    /// a job paused with `--stop` to stop. Off until called, so an instance that only runs its
    /// schedule sends nothing more; a pause holds either way, since the claim reads it.
    pub fn watch_operations(&self, every: Duration) -> Result<(), InstanceError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(InstanceError::Stopped);
        }
        self.inner
            .spawn(operations::watch(self.inner.clone(), every));
        Ok(())
    }

    /// The store this instance claims in.
    pub fn store(&self) -> Arc<dyn Store> {
        self.inner.store.clone()
    }

    /// This instance's runner id.
    pub fn runner(&self) -> &str {
        &self.inner.runner
    }

    /// How many attempts this instance runs now.
    pub fn running(&self) -> usize {
        lock(&self.inner.attempts).len()
    }

    /// How many runs this instance watches now as a backup (each one check waiting), the
    /// claims it will send again with their token among them.
    pub fn watching(&self) -> usize {
        self.inner.watches.len()
    }

    /// Stops the instance: no new claims; every running handler's signal aborts. A handler that
    /// then returns an error is released (handed over to a backup at its next check); one that
    /// returns normally is finished as success. At `timeout` the signal of a handler still
    /// running aborts again with [`AbortReason::StopTimeout`]: one that ends within
    /// [`STOP_GRACE`] then (the Wasm host interrupts its guest at once) is released too; one
    /// that does not is no longer renewed, and a backup takes over when its lease runs out.
    pub async fn stop(&self, timeout: Duration) -> StopReport {
        let inner = &self.inner;
        inner.stopping.store(true, Ordering::Release);
        inner.stop_notify.notify_waiters();
        let started = lock(&inner.attempts).len();
        for active in lock(&inner.attempts).values() {
            active.signal.abort(AbortReason::Stopping);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ended = inner.attempt_ended.notified();
            if lock(&inner.attempts).is_empty() {
                break;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                break;
            }
        }
        let abandoned = {
            let attempts = lock(&inner.attempts);
            for active in attempts.values() {
                active.signal.abort(AbortReason::StopTimeout);
                active.abandon.notify_one();
            }
            attempts.len()
        };
        // Let the abandoned attempts end and release their leases before the engine goes.
        if abandoned > 0 {
            let deadline = tokio::time::Instant::now() + STOP_GRACE + Duration::from_secs(2);
            loop {
                let ended = inner.attempt_ended.notified();
                if lock(&inner.attempts).is_empty() {
                    break;
                }
                if tokio::time::timeout_at(deadline, ended).await.is_err() {
                    break;
                }
            }
        }
        self.end_tasks();
        StopReport {
            ended: started.saturating_sub(abandoned),
            abandoned,
        }
    }
}

impl Instance {
    /// Ends every task of the lease engine: its runtime goes, or, on a shared runtime, each
    /// task ends at its next await.
    fn end_tasks(&self) {
        self.stopped.store(true, Ordering::Release);
        self.inner.kill.set(true);
        if let Some(engine) = lock(&self.engine).take() {
            engine.shutdown_background();
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.stop_notify.notify_waiters();
        self.end_tasks();
    }
}

/// Runs `task`, not polling it while `frozen` is on (see [`Env::frozen`]).
async fn unless_frozen<F: Future<Output = ()>>(task: F, frozen: Option<Arc<Switch>>) {
    let Some(frozen) = frozen else {
        return task.await;
    };
    let mut task = std::pin::pin!(task);
    loop {
        frozen.wait_for(false).await;
        tokio::select! {
            biased;
            () = frozen.wait_for(true) => {}
            () = &mut task => return,
        }
    }
}

/// Checks each job's options, and that no two have one name.
fn check_jobs(jobs: &[Job]) -> Result<(), InstanceError> {
    let mut names = HashSet::new();
    for job in jobs {
        job.options
            .validate()
            .map_err(|source| InstanceError::Options {
                job: job.name.clone(),
                source,
            })?;
        if !names.insert(job.name.clone()) {
            return Err(InstanceError::DuplicateJob(job.name.clone()));
        }
    }
    Ok(())
}

/// Re-measures the store clock's offset every minute.
async fn resync_clock(inner: Arc<Inner>) {
    while !inner.sleep_or_stop(Duration::from_secs(60)).await {
        // A retryable failure is part of an outage, and logged as such.
        match inner.observed(inner.clock.sync(&*inner.store)).await {
            Err(e) if !e.is_retryable() => {
                tracing::warn!(error = %e, "cannot read the store's clock");
            }
            _ => {}
        }
    }
}
