//! What the parts of an instance share: each part owns its own data (the line to the store,
//! the event sink, the running attempts, the watched runs, the job table, the tasks' life), and
//! a slot's path — the schedule loop, the claim, the attempt and its lease keeper, the
//! backups' checks — reaches them through their narrow calls.

use std::sync::Arc;
use std::time::Duration;

use super::attempts::Attempts;
use super::events::EventSink;
use super::job::{Job, JobTable};
use super::lifecycle::Lifecycle;
use super::link::StoreLink;
use super::watches::Watches;
use crate::env::Env;
use crate::lease::Token;
use crate::metrics::Metrics;
use crate::store::Store;

/// The parts of one instance.
pub(super) struct Inner {
    /// This instance's runner id.
    pub(super) runner: String,
    /// The line to the store.
    pub(super) link: StoreLink,
    /// Where its events go: metrics, log lines, subscribers.
    pub(super) events: EventSink,
    /// The attempts it runs now.
    pub(super) attempts: Attempts,
    /// The runs it watches as a backup, and each job's newest slots started and claimed.
    pub(super) watches: Watches,
    /// The current version of every job.
    pub(super) jobs: JobTable,
    /// Where its tasks run, and their stop.
    pub(super) life: Lifecycle,
    /// Its seams: clocks, randomness.
    pub(super) env: Env,
    /// What it counted: every event, and each heartbeat's latency.
    pub(super) metrics: Arc<Metrics>,
}

impl Inner {
    /// The store.
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        self.link.store()
    }

    /// A fresh claim token.
    pub(super) fn token(&self) -> Token {
        self.env.entropy.token()
    }

    /// Whether stop has begun.
    pub(super) fn is_stopping(&self) -> bool {
        self.life.is_stopping()
    }

    /// Spawns one of the lease engine's tasks.
    pub(super) fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<()>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.life.spawn(task)
    }

    /// Sleeps for `d`, or until stop begins; returns whether the instance is stopping.
    pub(super) async fn sleep_or_stop(&self, d: Duration) -> bool {
        self.life.sleep_or_stop(d).await
    }

    /// Sleeps for `d`, or until stop begins or `job` is replaced or removed; returns whether
    /// the loop of this version of the job must end.
    pub(super) async fn sleep_or_retired(&self, job: &Arc<Job>, d: Duration) -> bool {
        self.jobs.sleep_or_retired(&self.life, job, d).await
    }

    /// A random time in [heartbeat, 2 × heartbeat]: how long a backup waits between checks.
    pub(super) fn backup_delay(&self, job: &Job) -> Duration {
        let hb = job.options.heartbeat;
        hb + hb.mul_f64(self.env.entropy.unit())
    }
}
