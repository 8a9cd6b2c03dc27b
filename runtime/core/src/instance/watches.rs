//! The runs an instance watches as a backup, and what it knows of each job's newest slots:
//! the newest it has seen started and the newest it has sent a claim for.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::sync::lock;

/// The watched runs, and the newest slots seen started and claimed, per job.
#[derive(Default)]
pub(super) struct Watches {
    watched: Mutex<HashSet<(String, i64)>>,
    /// The newest slot of each job this instance has seen started (a claim answered won,
    /// running or finished). A backup of an older slot has nothing left to take over: the
    /// store interrupts a dead run once a newer one has started, so its watch ends.
    newest_started: Mutex<HashMap<String, i64>>,
    /// The newest slot of each job this instance has sent a claim for. A claim of an older slot
    /// that went unanswered is not sent again once a newer one is out: the newer run comes
    /// first (rule 3), so a store outage leaves one claim to send again per job, not one per
    /// slot that fell due during it.
    newest_claimed: Mutex<HashMap<String, i64>>,
}

/// Raises the slot kept for `job` in `newest` to `slot`.
fn raise(newest: &Mutex<HashMap<String, i64>>, job: &str, slot: i64) {
    let mut newest = lock(newest);
    let entry = newest.entry(job.to_owned()).or_insert(slot);
    *entry = (*entry).max(slot);
}

/// Whether the slot kept for `job` in `newest` is newer than `slot`.
fn newer(newest: &Mutex<HashMap<String, i64>>, job: &str, slot: i64) -> bool {
    lock(newest).get(job).is_some_and(|newest| *newest > slot)
}

impl Watches {
    /// Begins watching `slot` of `job`; false if it is watched already.
    pub(super) fn begin(&self, job: &str, slot: i64) -> bool {
        lock(&self.watched).insert((job.to_owned(), slot))
    }

    /// Ends the watch of `slot` of `job`.
    pub(super) fn end(&self, job: &str, slot: i64) {
        lock(&self.watched).remove(&(job.to_owned(), slot));
    }

    /// How many runs are watched now.
    pub(super) fn len(&self) -> usize {
        lock(&self.watched).len()
    }

    /// Notes that `slot` of `job` has started (some runner won its claim).
    pub(super) fn saw_started(&self, job: &str, slot: i64) {
        raise(&self.newest_started, job, slot);
    }

    /// Whether a slot of `job` newer than `slot` has started: a takeover of `slot` can then
    /// only be answered interrupted (rule 3, the newer run first), never won.
    pub(super) fn newer_started(&self, job: &str, slot: i64) -> bool {
        newer(&self.newest_started, job, slot)
    }

    /// Notes that this instance sends a claim for `slot` of `job`.
    pub(super) fn saw_claimed(&self, job: &str, slot: i64) {
        raise(&self.newest_claimed, job, slot);
    }

    /// Whether this instance has sent a claim for a slot of `job` newer than `slot`.
    pub(super) fn newer_claimed(&self, job: &str, slot: i64) -> bool {
        newer(&self.newest_claimed, job, slot)
    }

    /// Forgets what it knew of a removed job's slots.
    pub(super) fn forget_job(&self, job: &str) {
        lock(&self.newest_started).remove(job);
        lock(&self.newest_claimed).remove(job);
    }
}
