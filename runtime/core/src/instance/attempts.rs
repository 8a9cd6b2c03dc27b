//! The attempts an instance runs now, as `stop`, an operator's pause and the backups see them:
//! each one's signal, and the notice that tells it stop gave up on it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::sync::lock;
use crate::fence::{AbortReason, Signal};

/// A running attempt, as `stop` sees it.
struct Running {
    signal: Signal,
    abandon: Arc<Notify>,
}

/// The running attempts, by job and slot.
#[derive(Default)]
pub(super) struct Attempts {
    running: Mutex<BTreeMap<(String, i64), Running>>,
    /// Woken whenever one ends.
    ended: Notify,
}

impl Attempts {
    /// Notes the attempt of `job`'s run at `slot` as running, with its signal and the notice
    /// that stop gave up on it.
    pub(super) fn begin(&self, job: &str, slot: i64, signal: Signal, abandon: Arc<Notify>) {
        lock(&self.running).insert((job.to_owned(), slot), Running { signal, abandon });
    }

    /// Notes that the attempt of `job`'s run at `slot` ended.
    pub(super) fn end(&self, job: &str, slot: i64) {
        lock(&self.running).remove(&(job.to_owned(), slot));
        self.ended.notify_waiters();
    }

    /// Whether this instance runs an attempt of `job`'s run at `slot`.
    pub(super) fn is_running(&self, job: &str, slot: i64) -> bool {
        lock(&self.running).contains_key(&(job.to_owned(), slot))
    }

    /// How many attempts run now.
    pub(super) fn len(&self) -> usize {
        lock(&self.running).len()
    }

    /// Aborts the signal of every attempt (of `job`, if given) with `why`.
    pub(super) fn abort(&self, job: Option<&str>, why: AbortReason) {
        for ((of, _), running) in lock(&self.running).iter() {
            if job.is_none_or(|job| job == of) {
                running.signal.abort(why);
            }
        }
    }

    /// Aborts every attempt still running with [`AbortReason::StopTimeout`] and tells it stop
    /// gave up on it; returns how many there were.
    pub(super) fn abandon_all(&self) -> usize {
        let running = lock(&self.running);
        for attempt in running.values() {
            attempt.signal.abort(AbortReason::StopTimeout);
            attempt.abandon.notify_one();
        }
        running.len()
    }

    /// Waits until no attempt runs, or `deadline` passes.
    pub(super) async fn all_ended(&self, deadline: Instant) {
        loop {
            let ended = self.ended.notified();
            if lock(&self.running).is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return;
            }
        }
    }
}
