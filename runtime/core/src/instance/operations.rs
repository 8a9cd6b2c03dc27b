//! What an instance does about operators' actions: it reads the store's record of operations
//! every poll, emits `paused`, `resumed` and `triggered` for its jobs, claims each run an
//! operator triggered (a manual claim, under every rule a scheduled claim follows, so exactly
//! one node runs it), and tells the running attempts of a job paused with `--stop` to stop.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::claim;
use super::shared::Inner;
use crate::event::EventKind;
use crate::fence::AbortReason;
use crate::lease::{millis, ClaimKind, LATE_TOLERANCE};
use crate::operate::{Action, Operation};

/// How many operations one poll reads at most: 1000.
const POLL_LIMIT: usize = 1000;

/// Reads the operations of the last [`LATE_TOLERANCE`] every `every`, and acts on each one once.
/// The window is wider than the poll, so an operation recorded while a poll was under way (with
/// a store time just before it) is still seen by the next one.
pub(super) async fn watch(inner: Arc<Inner>, every: Duration) {
    let window = millis(LATE_TOLERANCE.max(every * 3));
    let mut seen: HashSet<(String, Action, i64)> = HashSet::new();
    loop {
        let since = inner.link.now() - window;
        match inner
            .link
            .observed(inner.store().operations(None, since, POLL_LIMIT))
            .await
        {
            Ok(mut ops) => {
                ops.reverse();
                for op in ops {
                    if seen.insert((op.job.clone(), op.action, op.at)) {
                        act(&inner, &op);
                    }
                }
                seen.retain(|(_, _, at)| *at >= since);
            }
            Err(e) if e.is_retryable() => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the store's record of operations"),
        }
        if inner.sleep_or_stop(every).await {
            return;
        }
    }
}

/// Who did it, from where, and why, as an event's reason says it.
fn by(op: &Operation) -> String {
    let mut by = format!("{}@{}", op.user, op.host);
    if op.stop {
        by.push_str(" (stop)");
    }
    if let Some(reason) = op.reason.as_deref().filter(|r| !r.is_empty()) {
        by.push_str(": ");
        by.push_str(reason);
    }
    by
}

fn act(inner: &Arc<Inner>, op: &Operation) {
    let Some(job) = inner.jobs.current(&op.job) else {
        return;
    };
    let name = &job.name;
    match op.action {
        Action::Paused => {
            inner
                .events
                .emit(EventKind::Paused, name, op.at, None, &by(op));
            if op.stop {
                inner.attempts.abort(Some(name), AbortReason::Paused);
            }
        }
        Action::Resumed => inner
            .events
            .emit(EventKind::Resumed, name, op.at, None, &by(op)),
        Action::Triggered => {
            let slot = op.slot.unwrap_or(op.at);
            inner
                .events
                .emit(EventKind::Triggered, name, slot, None, &by(op));
            let task_inner = inner.clone();
            inner.spawn(async move {
                claim::claim_and_handle(&task_inner, &job, slot, ClaimKind::Manual).await;
            });
        }
    }
}
