//! A job as the instance runs it, and the table of the current version of each.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::error::InstanceError;
use super::handler::Handler;
use super::lifecycle::Lifecycle;
use super::sync::lock;
use crate::lease::LeaseOptions;
use crate::schedule::Schedule;

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

impl Job {
    /// Checks the job's lease options.
    pub(super) fn validate(&self) -> Result<(), InstanceError> {
        self.options
            .validate()
            .map_err(|source| InstanceError::Options {
                job: self.name.clone(),
                source,
            })
    }
}

/// Checks each job's options, and that no two have one name.
pub(super) fn check_jobs(jobs: &[Job]) -> Result<(), InstanceError> {
    let mut names = HashSet::new();
    for job in jobs {
        job.validate()?;
        if !names.insert(job.name.clone()) {
            return Err(InstanceError::DuplicateJob(job.name.clone()));
        }
    }
    Ok(())
}

/// The current version of every job, by name. A job's loop, backups and takeovers ask it
/// whether the version they run is still current; a replaced or removed job's loop ends.
#[derive(Default)]
pub(super) struct JobTable {
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    /// Woken whenever a job is replaced or removed.
    retired: Notify,
}

impl JobTable {
    /// Makes `job` the current version of its name; an older version's loop ends.
    pub(super) fn put(&self, job: Arc<Job>) {
        lock(&self.jobs).insert(job.name.clone(), job);
        self.retired.notify_waiters();
    }

    /// Removes the job of that name; returns whether it was there.
    pub(super) fn remove(&self, name: &str) -> bool {
        let removed = lock(&self.jobs).remove(name).is_some();
        self.retired.notify_waiters();
        removed
    }

    /// The current version of a job, if it is still one of the instance's jobs.
    pub(super) fn current(&self, name: &str) -> Option<Arc<Job>> {
        lock(&self.jobs).get(name).cloned()
    }

    /// The names of the jobs, sorted.
    pub(super) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.jobs).keys().cloned().collect();
        names.sort();
        names
    }

    /// Whether `job` is still the current version of its job.
    pub(super) fn is_current(&self, job: &Arc<Job>) -> bool {
        lock(&self.jobs)
            .get(&job.name)
            .is_some_and(|current| Arc::ptr_eq(current, job))
    }

    /// Sleeps for `d`, or until stop begins or `job` is replaced or removed; returns whether
    /// the loop of this version of the job must end.
    pub(super) async fn sleep_or_retired(
        &self,
        life: &Lifecycle,
        job: &Arc<Job>,
        d: Duration,
    ) -> bool {
        let until = Instant::now() + d;
        loop {
            let retired = self.retired.notified();
            if !self.is_current(job) {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            tokio::select! {
                biased;
                stopping = life.sleep_or_stop(left) => return stopping || !self.is_current(job),
                _ = retired => {}
            }
        }
    }
}
