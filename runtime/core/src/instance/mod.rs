//! The instance: one per host, one loop per job — claims at each slot, heartbeats, backups,
//! catch-up on start, overlap, late claims and hand-over on stop, exactly as `spec/leases.md`
//! says.
//!
//! One slot's path, part by part: the job's schedule loop ([`schedule_loop`]) finds it due and
//! sends its claim ([`claim`]); a win starts an attempt ([`attempt`]), whose lease keeper
//! ([`lease_keeper`]) renews the lease and fences it; an answer `running`, or an attempt that
//! ended without ending the run, leaves the run watched by a backup's checks ([`claim`] too,
//! since a check sends a claim again). The parts each own their data ([`shared`]): the line to
//! the store and its outage tracker ([`link`], [`outage`]), the event sink ([`events`]), the
//! running attempts ([`attempts`]), the watched runs ([`watches`]), the job table ([`job`]) and
//! the tasks' lifecycle ([`lifecycle`]).
//!
//! The lease engine (claims, heartbeats, timers) runs on a runtime of its own, so a busy
//! handler can never delay a heartbeat; handlers run on the runtime that started the instance.
//! Its clocks, randomness and runtime are the seams of [`Env`](crate::env::Env): a simulation
//! runs the same code on paused time with one seed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;

use crate::env::Env;

use crate::store::{self, Store, StoreError};

mod attempt;
mod attempts;
mod claim;
mod error;
mod events;
mod handler;
mod job;
mod lease_keeper;
mod lifecycle;
mod link;
mod operations;
mod outage;
mod schedule_loop;
mod shared;
mod sync;
mod watches;

pub use crate::env::BootTime;
pub use crate::event::{Event, EventKind};
pub use crate::fence::{AbortReason, LeaseDeadline, Signal};
pub use attempt::STOP_GRACE;
pub use error::InstanceError;
pub use handler::{handler_fn, Handler, RunContext};
pub use job::Job;

use lifecycle::Lifecycle;
use link::StoreLink;
use shared::Inner;
use sync::lock;

/// How many events a slow subscriber may fall behind before it misses some: 4096.
pub const EVENT_BUFFER: usize = 4096;

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

/// What `stop` did with the attempts that were running.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Attempts that ended within the timeout (finished or handed over).
    pub ended: usize,
    /// Attempts still running at the timeout; they are no longer renewed.
    pub abandoned: usize,
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
        job::check_jobs(&jobs)?;
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
        job::check_jobs(&jobs)?;
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
        let connected = handle
            .spawn(StoreLink::connect(store, env.clock.clone()))
            .await;
        let link = match connected {
            Ok(Ok(link)) => link,
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
        let life = Lifecycle::new(
            handle,
            tokio::runtime::Handle::current(),
            env.own_runtime,
            env.frozen.clone(),
        );
        let inner = Arc::new(Inner {
            runner,
            link,
            events,
            attempts: attempts::Attempts::default(),
            watches: watches::Watches::default(),
            jobs: job::JobTable::default(),
            life,
            env,
            metrics,
        });
        for job in jobs {
            let job = Arc::new(job);
            inner.jobs.put(job.clone());
            inner.spawn(schedule_loop::run(inner.clone(), job));
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
        job.validate()?;
        if self.stopped.load(Ordering::Acquire) {
            return Err(InstanceError::Stopped);
        }
        let job = Arc::new(job);
        self.inner.jobs.put(job.clone());
        self.inner
            .spawn(schedule_loop::run(self.inner.clone(), job));
        Ok(())
    }

    /// Removes a job: no more claims or takeovers of it. An attempt already running goes on to
    /// its end. Returns whether the job was there.
    pub fn remove_job(&self, name: &str) -> bool {
        let removed = self.inner.jobs.remove(name);
        self.inner.watches.forget_job(name);
        self.inner.metrics.forget_job(name);
        removed
    }

    /// The current version of one of the instance's jobs.
    pub fn job(&self, name: &str) -> Option<Job> {
        self.inner.jobs.current(name).map(|job| Job::clone(&job))
    }

    /// The names of the instance's jobs, sorted.
    pub fn job_names(&self) -> Vec<String> {
        self.inner.jobs.names()
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
        self.inner.store().clone()
    }

    /// This instance's runner id.
    pub fn runner(&self) -> &str {
        &self.inner.runner
    }

    /// How many attempts this instance runs now.
    pub fn running(&self) -> usize {
        self.inner.attempts.len()
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
        inner.life.begin_stop();
        let started = inner.attempts.len();
        inner.attempts.abort(None, AbortReason::Stopping);
        inner
            .attempts
            .all_ended(tokio::time::Instant::now() + timeout)
            .await;
        let abandoned = inner.attempts.abandon_all();
        // Let the abandoned attempts end and release their leases before the engine goes.
        if abandoned > 0 {
            let grace = STOP_GRACE + Duration::from_secs(2);
            inner
                .attempts
                .all_ended(tokio::time::Instant::now() + grace)
                .await;
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
        self.inner.life.kill();
        if let Some(engine) = lock(&self.engine).take() {
            engine.shutdown_background();
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.inner.life.begin_stop();
        self.end_tasks();
    }
}

/// Re-measures the store clock's offset every minute.
async fn resync_clock(inner: Arc<Inner>) {
    while !inner.sleep_or_stop(Duration::from_secs(60)).await {
        // A retryable failure is part of an outage, and logged as such.
        match inner.link.observed(inner.link.sync()).await {
            Err(e) if !e.is_retryable() => {
                tracing::warn!(error = %e, "cannot read the store's clock");
            }
            _ => {}
        }
    }
}
