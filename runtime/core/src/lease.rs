//! The lease protocol's types, in the words of `spec/leases.md`.
//!
//! A *claim* decides who starts a run; a *lease* is how the cluster finds out that the runner
//! stopped. A run is identified by its job and its *slot* (the scheduled instant, in UTC
//! milliseconds); every try at it is an *attempt* with its own random *token*. All times in this
//! module that come from a store (`lease_end`, `started_at`, …) are milliseconds since the Unix
//! epoch on the store's clock, never on a host's.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The tolerance the store adds to `max_late` (and to the catch-up window) before it calls a
/// claim late, and to the retention window before it trims a run: 10 seconds, as the spec says.
pub const LATE_TOLERANCE: Duration = Duration::from_secs(10);

/// The random value of one attempt: 128 bits, shown as 32 lower-case hex digits.
///
/// The store acts on a heartbeat, a finish or a release only when it carries the token of the
/// run's current attempt; that is what fences a runner that was only frozen.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Token([u8; 16]);

impl Token {
    /// A fresh token from the operating system's random source.
    pub fn random() -> Self {
        Token(rand::random())
    }

    /// The token of these 16 bytes (a seeded random source's, in a simulation).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Token(bytes)
    }

    /// The token's 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

/// A token that is not 32 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("a token is 32 hex digits, not {0:?}")]
pub struct ParseTokenError(String);

impl FromStr for Token {
    type Err = ParseTokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut bytes = [0u8; 16];
        hex::decode_to_slice(s, &mut bytes).map_err(|_| ParseTokenError(s.to_owned()))?;
        Ok(Token(bytes))
    }
}

impl From<Token> for String {
    fn from(token: Token) -> String {
        token.to_string()
    }
}

impl TryFrom<String> for Token {
    type Error = ParseTokenError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// The stored status of a run.
///
/// "Expired" is not a status: it is what a `Running` run is once its lease end is in the past
/// (see [`Run::is_expired`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// An attempt holds, or held until its lease ran out, the run.
    Running,
    /// The handler returned normally; finished with the current token.
    Success,
    /// The handler returned an error; finished with the current token. Not retried.
    Failed,
    /// No more attempts: `max_attempts` runners died, or a newer run of the job started first.
    Interrupted,
}

impl Status {
    /// The status's name as stored and printed: `running`, `success`, `failed`, `interrupted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Success => "success",
            Status::Failed => "failed",
            Status::Interrupted => "interrupted",
        }
    }

    /// Whether the run has ended for good (every status but `running`).
    pub fn is_finished(self) -> bool {
        self != Status::Running
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "running" => Status::Running,
            "success" => Status::Success,
            "failed" => Status::Failed,
            "interrupted" => Status::Interrupted,
            _ => return Err(UnknownName::new("status", s)),
        })
    }
}

/// A name that is not one of an enumeration's values, as read back from a store or a file.
#[derive(Debug, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownName {
    what: &'static str,
    value: String,
}

impl UnknownName {
    fn new(what: &'static str, value: &str) -> Self {
        UnknownName {
            what,
            value: value.to_owned(),
        }
    }
}

/// Why an instance sends a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimKind {
    /// The slot is due now.
    Scheduled,
    /// The instance started and claims the latest slot it missed, within the catch-up window.
    CatchUp,
    /// A backup checks a run it watches, and takes it over if its lease ran out.
    Takeover,
    /// An operator asked for a run now (`baton trigger`): the slot is the store's clock at the
    /// trigger, and the claim follows every rule a scheduled claim does.
    Manual,
}

impl ClaimKind {
    /// The kind's name as stored and printed: `scheduled`, `catch-up`, `takeover`, `manual`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Scheduled => "scheduled",
            ClaimKind::CatchUp => "catch-up",
            ClaimKind::Takeover => "takeover",
            ClaimKind::Manual => "manual",
        }
    }
}

impl fmt::Display for ClaimKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ClaimKind {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "scheduled" => ClaimKind::Scheduled,
            "catch-up" => ClaimKind::CatchUp,
            "takeover" => ClaimKind::Takeover,
            "manual" => ClaimKind::Manual,
            _ => return Err(UnknownName::new("claim kind", s)),
        })
    }
}

/// How one attempt ended, as the store recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptOutcome {
    /// Finished with success.
    Success,
    /// Finished with failed.
    Failed,
    /// Its lease ran out without a finish or a release: the runner died (or was frozen). Counts
    /// toward `max_attempts`.
    Died,
    /// Released on stop: a hand-over. Does not count toward `max_attempts`.
    HandedOver,
}

impl AttemptOutcome {
    /// The outcome's name as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Success => "success",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Died => "died",
            AttemptOutcome::HandedOver => "handed-over",
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a handler ended, for [`finish`](crate::store::Store::finish).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Finish {
    /// The handler returned normally.
    Success,
    /// The handler returned an error.
    Failed,
}

impl Finish {
    /// The run status this finish records.
    pub fn status(self) -> Status {
        match self {
            Finish::Success => Status::Success,
            Finish::Failed => Status::Failed,
        }
    }

    /// The attempt outcome this finish records.
    pub fn outcome(self) -> AttemptOutcome {
        match self {
            Finish::Success => AttemptOutcome::Success,
            Finish::Failed => AttemptOutcome::Failed,
        }
    }
}

/// One try at a run, as kept in the run's record: the whole story of a run can be read back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1 for the first try; each takeover adds one.
    pub attempt: u32,
    /// Who ran it.
    pub runner: String,
    /// Its token.
    pub token: Token,
    /// Why it was claimed.
    pub reason: ClaimKind,
    /// The job's fence value won with this attempt.
    #[serde(deserialize_with = "fence_from_json")]
    pub fence: u64,
    /// When the claim was won (store clock, ms).
    pub started_at: i64,
    /// When it ended (store clock, ms): the finish, the release, or, for a runner that died, the
    /// lease end it never renewed. `None` while it runs.
    pub ended_at: Option<i64>,
    /// How it ended; `None` while it runs.
    pub outcome: Option<AttemptOutcome>,
    /// The digest of what the runner ran (e.g. a component's SHA-256), if it said.
    pub digest: Option<String>,
}

/// A run of a job: its slot and everything the store records with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The job's name.
    pub job: String,
    /// The scheduled instant, UTC milliseconds since the Unix epoch.
    pub slot: i64,
    /// The stored status.
    pub status: Status,
    /// The current attempt's number.
    pub attempt: u32,
    /// The current attempt's token.
    pub token: Token,
    /// The current attempt's runner.
    pub runner: String,
    /// Until when the runner is known to be alive (store clock, ms).
    pub lease_end: i64,
    /// Whether the current attempt released its lease (a hand-over); a released lease stays
    /// released.
    pub released: bool,
    /// The fence value of the current attempt.
    #[serde(deserialize_with = "fence_from_json")]
    pub fence: u64,
    /// Every attempt, oldest first.
    pub attempts: Vec<Attempt>,
}

impl Run {
    /// Whether the run is running but its lease end has passed at `now` (store clock, ms).
    pub fn is_expired(&self, now: i64) -> bool {
        self.status == Status::Running && self.lease_end <= now
    }

    /// Whether the run is running with a live lease at `now` (store clock, ms).
    pub fn is_alive(&self, now: i64) -> bool {
        self.status == Status::Running && self.lease_end > now
    }

    /// How many attempts ended because their runner died: what `max_attempts` counts.
    pub fn deaths(&self) -> u32 {
        let died = self
            .attempts
            .iter()
            .filter(|a| a.outcome == Some(AttemptOutcome::Died))
            .count();
        u32::try_from(died).unwrap_or(u32::MAX)
    }

    /// Whether any attempt of the run was handed over on stop.
    pub fn handed_over(&self) -> bool {
        self.attempts
            .iter()
            .any(|a| a.outcome == Some(AttemptOutcome::HandedOver))
    }

    /// The current attempt's record.
    pub fn current(&self) -> Option<&Attempt> {
        self.attempts.last()
    }

    /// What a caller whose token was refused is told about the run.
    pub fn state(&self) -> RunState {
        RunState {
            attempt: self.attempt,
            status: self.status,
            released: self.released,
        }
    }
}

/// The lease an instance holds after it won a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Which try this is.
    pub attempt: u32,
    /// The attempt's token, for heartbeat, finish and release.
    pub token: Token,
    /// The job's fence value for this attempt: it grows with every won claim of the job, so it
    /// can be passed to an external system that refuses smaller ones. It is never below the
    /// store's clock in microseconds at the claim (see [`next_fence`]).
    pub fence: u64,
    /// Until when the lease holds (store clock, ms).
    pub lease_end: i64,
}

/// What a claim returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The claim won: run the job under this lease.
    Won(Lease),
    /// The run is held by a live lease: become its backup.
    Running {
        /// The current attempt.
        attempt: u32,
        /// Who runs it.
        runner: String,
        /// Until when its lease holds (store clock, ms).
        lease_end: i64,
    },
    /// Refused under `overlap = skip`: an earlier run of the job has a live lease.
    Overlap {
        /// The slot of the run that blocks this one.
        blocking_slot: i64,
    },
    /// The claim arrived later than `max_late` (or the catch-up window) plus 10 s after its slot,
    /// by the store's clock.
    Late,
    /// A newer slot of the job already has a run; this older slot will not start.
    Superseded {
        /// The newest slot that has a run.
        newer_slot: i64,
    },
    /// The run has ended.
    Finished {
        /// How it ended.
        status: Status,
    },
    /// The run's lease had run out and it cannot have another attempt (attempts used up, or a
    /// newer run of the job exists): this claim marked it interrupted.
    Interrupted,
    /// The job is paused (`baton pause`): no attempt of it starts, on any node, until it is
    /// resumed. Read in the claim's own atomic step, so a pause never races a claim.
    Paused,
}

/// What the store says of a run when it refuses a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunState {
    /// The run's current attempt.
    pub attempt: u32,
    /// The run's status.
    pub status: Status,
    /// Whether the current attempt released its lease.
    pub released: bool,
}

/// What a heartbeat returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// The lease now ends at `lease_end` (store clock, ms).
    Renewed {
        /// The new lease end.
        lease_end: i64,
    },
    /// The token is not the current attempt's, or the lease was released, or the run ended: the
    /// attempt is lost. `None` when the run has no state at all.
    Lost(Option<RunState>),
}

/// What a finish or a release returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenOutcome {
    /// The store acted on it.
    Accepted,
    /// Refused: the token is not the current attempt's, the lease was released, or the run has
    /// ended. `None` when the run has no state at all.
    Refused(Option<RunState>),
}

/// What a new run does while an earlier run of the job still holds a live lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// Refuse the new run: the claim returns [`ClaimOutcome::Overlap`]. The default.
    #[default]
    Skip,
    /// Run them side by side.
    Allow,
}

impl Overlap {
    /// The policy's name: `skip` or `allow`.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
        }
    }
}

impl FromStr for Overlap {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "skip" => Ok(Overlap::Skip),
            "allow" => Ok(Overlap::Allow),
            _ => Err(UnknownName::new("overlap policy (skip or allow)", s)),
        }
    }
}

/// The lease options of a job, with the spec's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseOptions {
    /// How long a lease lasts without a heartbeat. Defaults to 30 s; from 100 ms to 24 h.
    pub lease: Duration,
    /// How often the runner renews its lease. Defaults to 5 s, or `lease / 6` when that is
    /// smaller; must be under `lease / 2`, and at least 10 ms.
    pub heartbeat: Duration,
    /// How many attempts a run may have when runners die. Defaults to 3; from 1 to 100.
    pub max_attempts: u32,
    /// What a new run does while an earlier one holds a live lease. Defaults to skip.
    pub overlap: Overlap,
    /// How long after a slot an instance that starts still catches it up. Defaults to 5 min;
    /// from 0 to 7 days.
    pub catch_up: Duration,
    /// How late (by the store's clock, plus a 10 s tolerance) a scheduled claim may arrive.
    /// Defaults to 30 s: one lease. A claim is sent at its slot, so one that arrives more than
    /// 40 s after it was held up longer than a healthy runner is ever silent, and would start so
    /// late that it could run into the next slot of a job that runs every minute. From 0 to 24 h.
    pub max_late: Duration,
    /// How many finished runs of a job the store keeps. Defaults to 100: enough to read a job's
    /// recent story with `baton history`, small enough that 10 000 jobs stay cheap. A run that a
    /// late claim could still ask about is kept whatever this says. From 1 to 100 000.
    pub history_size: u32,
}

/// The default lease: 30 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default heartbeat interval when the lease allows it: 5 s.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// The default number of attempts: 3.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The default catch-up window: 5 min.
pub const DEFAULT_CATCH_UP: Duration = Duration::from_secs(300);
/// The default for how late a claim may be: 30 s (plus the 10 s tolerance).
pub const DEFAULT_MAX_LATE: Duration = Duration::from_secs(30);
/// The default history size: 100 finished runs a job.
pub const DEFAULT_HISTORY_SIZE: u32 = 100;

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions::with_lease(DEFAULT_LEASE)
    }
}

/// A lease option out of its allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// One option's value is outside its range.
    #[error("{option} is {value}, but must be {allowed}")]
    OutOfRange {
        /// The option's name, as written in a job file.
        option: &'static str,
        /// The value given.
        value: String,
        /// The allowed range.
        allowed: String,
    },
    /// The heartbeat is not under half the lease.
    #[error(
        "heartbeat is {heartbeat:?}, but must be under half of lease ({lease:?}); \
         leave heartbeat out to get min(5 s, lease / 6)"
    )]
    HeartbeatTooLong {
        /// The heartbeat given.
        heartbeat: Duration,
        /// The lease given.
        lease: Duration,
    },
}

impl LeaseOptions {
    /// The defaults, with this lease and the heartbeat that goes with it.
    pub fn with_lease(lease: Duration) -> Self {
        LeaseOptions {
            lease,
            heartbeat: default_heartbeat(lease),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            overlap: Overlap::Skip,
            catch_up: DEFAULT_CATCH_UP,
            max_late: DEFAULT_MAX_LATE,
            history_size: DEFAULT_HISTORY_SIZE,
        }
    }

    /// Checks every option against its range; the error names the option and the range.
    pub fn validate(&self) -> Result<(), OptionsError> {
        let ms = Duration::from_millis;
        check_duration("lease", self.lease, ms(100), Duration::from_secs(86_400))?;
        check_duration("heartbeat", self.heartbeat, ms(10), self.lease)?;
        if self.heartbeat * 2 >= self.lease {
            return Err(OptionsError::HeartbeatTooLong {
                heartbeat: self.heartbeat,
                lease: self.lease,
            });
        }
        check_number("max_attempts", self.max_attempts, 1, 100)?;
        check_duration(
            "catch_up",
            self.catch_up,
            Duration::ZERO,
            Duration::from_secs(7 * 86_400),
        )?;
        check_duration(
            "max_late",
            self.max_late,
            Duration::ZERO,
            Duration::from_secs(86_400),
        )?;
        check_number("history_size", self.history_size, 1, 100_000)?;
        Ok(())
    }

    /// How long after its slot a run must be kept, whatever `history_size` says, because a late
    /// claim could still ask for it: `max(max_late, catch_up) + 10 s`.
    pub fn retention(&self) -> Duration {
        self.max_late.max(self.catch_up) + LATE_TOLERANCE
    }

    /// How late a claim of this kind may arrive before it is [`ClaimOutcome::Late`], tolerance
    /// included: the catch-up window for a catch-up claim, `max_late` otherwise, plus 10 s.
    pub fn lateness_limit(&self, kind: ClaimKind) -> Duration {
        match kind {
            ClaimKind::CatchUp => self.catch_up + LATE_TOLERANCE,
            ClaimKind::Scheduled | ClaimKind::Takeover | ClaimKind::Manual => {
                self.max_late + LATE_TOLERANCE
            }
        }
    }
}

/// The spec's default heartbeat for a lease: 5 s, or `lease / 6` when that is smaller.
pub fn default_heartbeat(lease: Duration) -> Duration {
    DEFAULT_HEARTBEAT.min(lease / 6)
}

fn check_duration(
    option: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), OptionsError> {
    if value < min || value > max {
        return Err(OptionsError::OutOfRange {
            option,
            value: format!("{value:?}"),
            allowed: format!("from {min:?} to {max:?}"),
        });
    }
    Ok(())
}

fn check_number(option: &'static str, value: u32, min: u32, max: u32) -> Result<(), OptionsError> {
    if value < min || value > max {
        return Err(OptionsError::OutOfRange {
            option,
            value: value.to_string(),
            allowed: format!("from {min} to {max}"),
        });
    }
    Ok(())
}

/// A claim, as an instance sends it to the store.
#[derive(Clone, Debug)]
pub struct ClaimRequest<'a> {
    /// The job's name.
    pub job: &'a str,
    /// The slot, UTC ms.
    pub slot: i64,
    /// Why the claim is sent.
    pub kind: ClaimKind,
    /// Who claims.
    pub runner: &'a str,
    /// The token the attempt gets if the claim wins; make a fresh one for every claim
    /// ([`Token::random`]).
    pub token: Token,
    /// The digest of what the runner will run, recorded with the attempt.
    pub digest: Option<&'a str>,
    /// The job's lease options.
    pub options: &'a LeaseOptions,
}

/// The fence a won claim gets: `max(previous + 1, clock_us)`, where `previous` is the job's
/// last fence (0 before the first) and `clock_us` the store's clock, in microseconds since the
/// Unix epoch, read inside the claim.
///
/// The `+ 1` makes the fences of a job strictly increase while the store keeps its writes. The
/// clock makes them keep increasing when it does not: a Redis or Valkey replica promoted after
/// its primary died has lost the primary's last writes, fence counters included, and a Redis
/// without persistence that restarts has lost them all. Its next fence is still larger than
/// any it lost, **as long as the clocks of the servers that hand out fences agree to within the
/// time between the lost claim and the next one** (a failover takes seconds; NTP keeps clocks
/// within milliseconds). A clock set back further than that can hand out a fence again. Every
/// backend computes this in its own atomic step (the Lua claim script, the PostgreSQL claim
/// function, SQLite's transaction), from the same clock it reads `now` from.
///
/// Fences are about 1.8e15 in 2026: beyond what a JSON number keeps in a JavaScript double
/// only after the year 2255 (2^53 µs), and far from `u64::MAX`.
pub fn next_fence(previous: u64, clock_us: i64) -> u64 {
    previous
        .saturating_add(1)
        .max(u64::try_from(clock_us).unwrap_or(0))
}

/// Reads a fence from a stored record: a JSON number, or a string of decimal digits (the Redis
/// scripts write fences as strings, since their JSON encoder keeps only 14 significant digits
/// of a number and a fence has 16).
pub(crate) fn fence_from_json<'de, D>(deserializer: D) -> Result<u64, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Fence {
        Number(u64),
        Text(String),
    }
    match Fence::deserialize(deserializer)? {
        Fence::Number(n) => Ok(n),
        Fence::Text(s) => s
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("a fence is a whole number, not {s:?}"))),
    }
}

/// Milliseconds of a duration, saturating, as the stores count them.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_heartbeat_is_five_seconds_or_a_sixth_of_the_lease() {
        assert_eq!(
            default_heartbeat(Duration::from_secs(30)),
            Duration::from_secs(5)
        );
        assert_eq!(
            default_heartbeat(Duration::from_secs(60)),
            Duration::from_secs(5)
        );
        assert_eq!(
            default_heartbeat(Duration::from_millis(600)),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn defaults_are_the_specs() {
        let o = LeaseOptions::default();
        assert_eq!(o.lease, Duration::from_secs(30));
        assert_eq!(o.heartbeat, Duration::from_secs(5));
        assert_eq!(o.max_attempts, 3);
        assert_eq!(o.overlap, Overlap::Skip);
        assert_eq!(o.catch_up, Duration::from_secs(300));
        o.validate().expect("defaults are valid");
    }

    #[test]
    fn heartbeat_of_half_the_lease_is_rejected_with_its_name() {
        let mut o = LeaseOptions::with_lease(Duration::from_secs(10));
        o.heartbeat = Duration::from_secs(5);
        let err = o.validate().unwrap_err();
        assert!(err.to_string().contains("heartbeat"), "{err}");
        assert!(err.to_string().contains("under half of lease"), "{err}");
    }

    #[test]
    fn out_of_range_options_name_the_option_and_the_range() {
        let o = LeaseOptions {
            max_attempts: 0,
            ..LeaseOptions::default()
        };
        assert_eq!(
            o.validate().unwrap_err().to_string(),
            "max_attempts is 0, but must be from 1 to 100"
        );
        let o = LeaseOptions {
            lease: Duration::from_millis(10),
            ..LeaseOptions::default()
        };
        let msg = o.validate().unwrap_err().to_string();
        assert!(
            msg.starts_with("lease is 10ms, but must be from 100ms"),
            "{msg}"
        );
    }

    #[test]
    fn next_fence_is_the_previous_plus_one_or_the_clock_in_microseconds_whichever_is_larger() {
        let clock_us = 1_780_000_000_000_000;
        assert_eq!(next_fence(0, clock_us), clock_us as u64);
        assert_eq!(next_fence(clock_us as u64, clock_us), clock_us as u64 + 1);
        assert_eq!(
            next_fence(clock_us as u64 + 5, clock_us),
            clock_us as u64 + 6
        );
        assert_eq!(next_fence(7, -1), 8);
    }

    #[test]
    fn fence_is_read_from_a_json_number_or_a_string_of_digits() {
        #[derive(Deserialize)]
        struct Holder {
            #[serde(deserialize_with = "fence_from_json")]
            fence: u64,
        }
        let read = |json: &str| serde_json::from_str::<Holder>(json).map(|h| h.fence);
        assert_eq!(read(r#"{"fence":7}"#).unwrap(), 7);
        assert_eq!(
            read(r#"{"fence":"1780000000000001"}"#).unwrap(),
            1_780_000_000_000_001
        );
        assert!(read(r#"{"fence":"1.78e+15"}"#).is_err());
    }

    #[test]
    fn token_round_trips_through_hex() {
        let t = Token::random();
        let s = t.to_string();
        assert_eq!(s.len(), 32);
        assert_eq!(s.parse::<Token>().unwrap(), t);
        assert_ne!(Token::random(), t);
        assert!("xyz".parse::<Token>().is_err());
    }
}
