//! The outage tracker: a spell in which the store could not be reached begins with the first
//! call that fails after one was answered, and ends with the next call answered. It is logged
//! once when it begins and once when it ends, not once per failed call.

use std::sync::Mutex;

use tokio::time::Instant;

use super::sync::lock;

/// The store outage going on now, if any.
#[derive(Default)]
pub(super) struct OutageTracker {
    current: Mutex<Option<Outage>>,
}

/// An outage going on.
struct Outage {
    /// When it began, on the store's clock as this host estimates it (ms).
    since: i64,
    /// When it began, on the monotonic clock.
    began: Instant,
}

impl OutageTracker {
    /// Notes a store call that failed, or went unanswered, for a reason worth retrying, at
    /// `now` (store clock as estimated, ms): the first one after the store answered begins an
    /// outage, and only that one is logged.
    pub(super) fn failed(&self, now: i64, error: &dyn std::fmt::Display) {
        let mut outage = lock(&self.current);
        if outage.is_some() {
            tracing::debug!(error = %error, "store call failed during an outage");
            return;
        }
        *outage = Some(Outage {
            since: now,
            began: Instant::now(),
        });
        tracing::warn!(
            since = %crate::schedule::format_utc(now),
            error = %error,
            "store out of reach; claims, heartbeats and backups go on retrying"
        );
    }

    /// Notes a store call answered at `now` (store clock as estimated, ms): it ends an outage,
    /// if one is going on, with one line that says when it began and how long it lasted.
    pub(super) fn answered(&self, now: i64) {
        let Some(outage) = lock(&self.current).take() else {
            return;
        };
        let lasted = outage.began.elapsed();
        tracing::warn!(
            since = %crate::schedule::format_utc(outage.since),
            until = %crate::schedule::format_utc(now),
            outage_ms = u64::try_from(lasted.as_millis()).unwrap_or(u64::MAX),
            "store reachable again"
        );
    }
}
