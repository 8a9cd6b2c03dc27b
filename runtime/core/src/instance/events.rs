//! The event sink of an instance: where each step of the protocol is counted, logged and sent.

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::event::{Event, EventKind};
use crate::metrics::Metrics;

/// The event sink of an instance: every event is counted in its metrics, logged as one
/// structured line, and sent to its subscribers.
pub(super) struct EventSink {
    runner: String,
    sender: broadcast::Sender<Event>,
    metrics: Arc<Metrics>,
}

impl EventSink {
    /// A sink for the events of `runner`.
    pub(super) fn new(
        runner: String,
        sender: broadcast::Sender<Event>,
        metrics: Arc<Metrics>,
    ) -> Self {
        EventSink {
            runner,
            sender,
            metrics,
        }
    }

    /// A new subscriber: every event from now on.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender.subscribe()
    }

    /// Emits one event.
    pub(super) fn emit(
        &self,
        kind: EventKind,
        job: &str,
        slot: i64,
        attempt: Option<u32>,
        reason: &str,
    ) {
        let event = Event {
            kind,
            job: job.to_owned(),
            slot,
            attempt,
            runner: self.runner.clone(),
            reason: reason.to_owned(),
        };
        self.metrics.observe(&event);
        tracing::info!(
            event = kind.as_str(),
            job,
            slot = %crate::schedule::format_utc(slot),
            attempt,
            runner = %self.runner,
            reason,
            "{kind}"
        );
        // No subscriber is fine.
        let _ = self.sender.send(event);
    }
}
