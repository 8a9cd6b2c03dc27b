//! The events an instance emits for every step of the protocol: what happened, to which run,
//! on which runner, and why.

use std::fmt;

use serde::Serialize;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// This instance won a claim (reason: the claim kind).
    Won,
    /// The handler of a won attempt started.
    Started,
    /// The attempt finished with success.
    Success,
    /// The attempt finished with failed (reason: the handler's message).
    Failed,
    /// A slot was not run (reason: `overlap`, `superseded`, `paused` (the job is paused), or
    /// `not-acknowledged`: the claim won, but the store's replicas did not acknowledge it in
    /// time, so the job did not start and the claim was released).
    Skip,
    /// The store called the claim late.
    Late,
    /// This instance became a backup of a run another instance holds.
    Backup,
    /// This instance took a run over from a runner whose lease ran out, or that handed it over.
    Takeover,
    /// The attempt lost its lease (reason: `refused` heartbeat, or `self-fenced`); nothing it
    /// does changes the run any more.
    Lost,
    /// The attempt released its lease on stop: a hand-over.
    Released,
    /// A run was marked interrupted by this instance's claim.
    Interrupted,
    /// An operator paused the job (`baton pause`; slot: when, on the store's clock; reason:
    /// who, from where, and why). Every node that runs the job emits it when it sees it.
    Paused,
    /// An operator resumed the job (slot: when; reason: who, from where, and why).
    Resumed,
    /// An operator asked for a run now (slot: the manual run's slot; reason: who, from where,
    /// and why). The run's own events follow, with reason `manual`.
    Triggered,
}

impl EventKind {
    /// The event's name: `won`, `started`, `success`, …
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Won => "won",
            EventKind::Started => "started",
            EventKind::Success => "success",
            EventKind::Failed => "failed",
            EventKind::Skip => "skip",
            EventKind::Late => "late",
            EventKind::Backup => "backup",
            EventKind::Takeover => "takeover",
            EventKind::Lost => "lost",
            EventKind::Released => "released",
            EventKind::Interrupted => "interrupted",
            EventKind::Paused => "paused",
            EventKind::Resumed => "resumed",
            EventKind::Triggered => "triggered",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event, with the run it concerns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// What happened.
    #[serde(rename = "event")]
    pub kind: EventKind,
    /// The job.
    pub job: String,
    /// The slot, UTC ms.
    pub slot: i64,
    /// The attempt, where one is known.
    pub attempt: Option<u32>,
    /// This instance's runner id.
    pub runner: String,
    /// Why (the claim kind, the skip's cause, the failure's message, …); empty where none.
    pub reason: String,
}
