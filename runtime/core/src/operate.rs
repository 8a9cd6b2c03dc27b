//! Operating a cluster: pause, resume and trigger, and the record of who did each, when, from
//! where and why.
//!
//! A pause is a flag in the store that every claim of the job reads in its own atomic step
//! ([`ClaimOutcome::Paused`](crate::lease::ClaimOutcome::Paused)), so a pause never races a
//! claim: once the store has answered a pause, no attempt of the job starts on any node until it
//! is resumed. A trigger is a run whose slot is the store's clock at the trigger; the instances
//! read it from the store's record of operations and claim it as a
//! [`ClaimKind::Manual`](crate::lease::ClaimKind::Manual) claim, under every rule a scheduled
//! claim follows, so exactly one node runs it.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often an instance reads the store's record of operations, to start the runs an
/// operator triggered and to stop the attempts of a job paused with `--stop`: every second. A
/// trigger is claimed within this (plus a store round trip) of being recorded.
pub const OPERATIONS_POLL: Duration = Duration::from_secs(1);

/// How many operations the store keeps per namespace: the newest 10 000.
pub const OPERATIONS_KEPT: usize = 10_000;

/// What an operator did to a job; also the name of the event each node emits when it sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// The job was paused: its claims answer paused until it is resumed.
    Paused,
    /// The job was resumed: the next slot of its schedule runs.
    Resumed,
    /// A run of the job was asked for now.
    Triggered,
}

impl Action {
    /// The action's name: `paused`, `resumed`, `triggered`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Paused => "paused",
            Action::Resumed => "resumed",
            Action::Triggered => "triggered",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an operator asks the store to do to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Pause the job. With `stop`, the attempts running now are told to stop (their signal
    /// aborts) and are not handed over; without, they run to their end.
    Pause {
        /// Whether running attempts are told to stop.
        stop: bool,
    },
    /// Resume the job: its next slot runs by the schedule; slots missed while it was paused are
    /// not caught up.
    Resume,
    /// Run the job now, at a slot that is the store's current time.
    Trigger,
}

impl Request {
    /// The request's name as the stores' scripts and functions take it: `pause`, `resume`,
    /// `trigger`.
    pub fn as_str(self) -> &'static str {
        match self {
            Request::Pause { .. } => "pause",
            Request::Resume => "resume",
            Request::Trigger => "trigger",
        }
    }

    /// Whether it is a pause that tells running attempts to stop.
    pub fn stops(self) -> bool {
        matches!(self, Request::Pause { stop: true })
    }
}

/// Who asks, from where, and why: recorded with the operation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operator {
    /// The host the request came from (a host name, or an HTTP client's address).
    pub host: String,
    /// The user who asked.
    pub user: String,
    /// Why, if they said.
    pub reason: Option<String>,
}

/// One operation as the store recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// The job.
    pub job: String,
    /// What was done.
    pub action: Action,
    /// When, on the store's clock (ms since the Unix epoch).
    pub at: i64,
    /// The host the request came from.
    pub host: String,
    /// The user who asked.
    pub user: String,
    /// Why, if they said.
    #[serde(default)]
    pub reason: Option<String>,
    /// For a pause: whether running attempts were told to stop.
    #[serde(default)]
    pub stop: bool,
    /// For a trigger: the slot of the manual run (the store's clock at the trigger).
    #[serde(default)]
    pub slot: Option<i64>,
}

impl Operation {
    /// The record of `request` on `job`, by `by`, at `now` (store clock, ms).
    pub fn new(job: &str, request: Request, by: &Operator, now: i64) -> Self {
        let (action, stop, slot) = match request {
            Request::Pause { stop } => (Action::Paused, stop, None),
            Request::Resume => (Action::Resumed, false, None),
            Request::Trigger => (Action::Triggered, false, Some(now)),
        };
        Operation {
            job: job.to_owned(),
            action,
            at: now,
            host: by.host.clone(),
            user: by.user.clone(),
            reason: by.reason.clone(),
            stop,
            slot,
        }
    }
}

/// What the store answers an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperateOutcome {
    /// Done and recorded.
    Done(Operation),
    /// A trigger of a paused job: refused, with the pause in force.
    Paused(Operation),
}
