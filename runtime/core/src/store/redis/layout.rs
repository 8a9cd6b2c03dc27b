//! The Redis layout of a job's runs (version [`LAYOUT_VERSION`]) and the scripts' answers.
//!
//! Every key of a job has the hash tag `{<namespace>:<job>}`:
//!
//! - `{ns:job}:live`: a hash of everything a claim, a heartbeat and a finish read and write, so
//!   that each reads it once and writes it once: the newest slot with state (`n`), the fence
//!   counter (`f`), the pause in force (`p`), the running runs with their lease ends (`r`), how
//!   many runs have state (`c`), and each run's record under its slot (see [`decode_record`]);
//! - `{ns:job}:slots`: a sorted set of every slot with state, for the history and its trim;
//! - `{ns:job}:lease:<slot>`: the live lease of a slot, a copy of the record's current attempt
//!   that expires at the lease end and is removed by a finish, a release or a pause, so that a
//!   claim of a slot whose lease is alive (every losing claim of a due slot) is answered from it
//!   alone.
//!
//! The scripts never decode JSON: a record is a head line of the fields the rules read, then the
//! attempts as a JSON array kept as text (see `common.lua`). Their answers are words separated by
//! spaces, parsed here.

use crate::lease::{Attempt, ClaimOutcome, HeartbeatOutcome, Lease, Run, RunState, Status};
use crate::lease::{Token, TokenOutcome};

/// The layout's version, kept in `{ns}:layout`: a store refuses a namespace written in another.
pub const LAYOUT_VERSION: &str = "2";

/// The keys of one job.
pub(super) struct JobKeys {
    tag: String,
}

impl JobKeys {
    /// The keys of `job` in `namespace`.
    pub(super) fn new(namespace: &str, job: &str) -> Self {
        JobKeys {
            tag: format!("{{{namespace}:{job}}}"),
        }
    }

    /// The live hash.
    pub(super) fn live(&self) -> String {
        format!("{}:live", self.tag)
    }

    /// The sorted set of every slot with state.
    pub(super) fn slots(&self) -> String {
        format!("{}:slots", self.tag)
    }

    /// The prefix of the lease keys: the slot follows it.
    pub(super) fn lease_prefix(&self) -> String {
        format!("{}:lease:", self.tag)
    }

    /// The lease key of `slot`.
    pub(super) fn lease(&self, slot: i64) -> String {
        format!("{}{slot}", self.lease_prefix())
    }

    /// The lease keys of `slots`, as the live hash names them (see [`running_slots`]).
    pub(super) fn leases(&self, slots: &[String]) -> Vec<String> {
        let prefix = self.lease_prefix();
        slots.iter().map(|slot| format!("{prefix}{slot}")).collect()
    }

    /// The job's state and its writers (see `state.rs`).
    pub(super) fn state(&self) -> [String; 2] {
        [
            format!("{}:state", self.tag),
            format!("{}:state-writers", self.tag),
        ]
    }
}

/// Fields of the live hash that are not runs.
pub(super) const RUNNING_FIELD: &str = "r";

/// The slots of the running runs in the live hash's `r` field (` <slot>:<lease end>` each).
pub(super) fn running_slots(field: Option<&str>) -> Vec<String> {
    field
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|entry| entry.split_once(':').map(|(slot, _)| slot.to_owned()))
        .collect()
}

/// The run of `job` at `slot` from its record: the head line `<status> <attempt> <lease end>
/// <released 0|1> <fence> <deaths> <token> <runner as a JSON string>`, then the attempts as a
/// JSON array.
pub(super) fn decode_record(job: &str, slot: i64, raw: &str) -> Result<Run, String> {
    let (head, attempts) = raw
        .split_once('\n')
        .ok_or_else(|| format!("run record of slot {slot} has no head line"))?;
    let mut words = head.splitn(8, ' ');
    let mut next = |what: &str| {
        words
            .next()
            .ok_or_else(|| format!("run record of slot {slot} has no {what}"))
    };
    let status: Status = word(next("status")?, "status")?;
    let attempt = word(next("attempt")?, "attempt")?;
    let lease_end = word(next("lease end")?, "lease end")?;
    let released = next("released flag")? == "1";
    let fence = word(next("fence")?, "fence")?;
    let _deaths: u32 = word(next("deaths")?, "deaths")?;
    let token: Token = word(next("token")?, "token")?;
    let runner: String = serde_json::from_str(next("runner")?)
        .map_err(|e| format!("run record of slot {slot}: runner: {e}"))?;
    let attempts: Vec<Attempt> = serde_json::from_str(attempts)
        .map_err(|e| format!("run record of slot {slot}: attempts: {e}"))?;
    Ok(Run {
        job: job.to_owned(),
        slot,
        status,
        attempt,
        token,
        runner,
        lease_end,
        released,
        fence,
        attempts,
    })
}

/// `text` parsed as a `T`, or an error naming `what`.
fn word<T: std::str::FromStr>(text: &str, what: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{what} {text:?} is not what a record holds"))
}

/// The claim script's answer as a claim outcome; `token` is the claim's own.
pub(super) fn claim_outcome(answer: &str, token: Token) -> Result<ClaimOutcome, String> {
    let (verb, rest) = answer.split_once(' ').unwrap_or((answer, ""));
    let mut words = rest.splitn(4, ' ');
    let mut next = |what: &str| {
        words
            .next()
            .ok_or_else(|| format!("claim answer {answer:?} has no {what}"))
    };
    Ok(match verb {
        "won" => ClaimOutcome::Won(Lease {
            attempt: word(next("attempt")?, "attempt")?,
            lease_end: word(next("lease end")?, "lease end")?,
            fence: word(next("fence")?, "fence")?,
            token,
        }),
        "running" => {
            let attempt = word(next("attempt")?, "attempt")?;
            let lease_end = word(next("lease end")?, "lease end")?;
            let _fence: u64 = word(next("fence")?, "fence")?;
            let runner = serde_json::from_str(next("runner")?)
                .map_err(|e| format!("claim answer {answer:?}: runner: {e}"))?;
            ClaimOutcome::Running {
                attempt,
                runner,
                lease_end,
            }
        }
        "overlap" => ClaimOutcome::Overlap {
            blocking_slot: word(next("slot")?, "slot")?,
        },
        "late" => ClaimOutcome::Late,
        "superseded" => ClaimOutcome::Superseded {
            newer_slot: word(next("slot")?, "slot")?,
        },
        "finished" => ClaimOutcome::Finished {
            status: word(next("status")?, "status")?,
        },
        "interrupted" => ClaimOutcome::Interrupted,
        "paused" => ClaimOutcome::Paused,
        _ => return Err(format!("unexpected claim answer {answer:?}")),
    })
}

/// The run's state a refused token is told: `<attempt> <status> <released 0|1>`, or none.
fn refused_state(answer: &str, rest: &str) -> Result<Option<RunState>, String> {
    if rest.is_empty() {
        return Ok(None);
    }
    let mut words = rest.split(' ');
    let mut next = |what: &str| {
        words
            .next()
            .ok_or_else(|| format!("answer {answer:?} has no {what}"))
    };
    Ok(Some(RunState {
        attempt: word(next("attempt")?, "attempt")?,
        status: word(next("status")?, "status")?,
        released: next("released flag")? == "1",
    }))
}

/// The heartbeat script's answer.
pub(super) fn heartbeat_outcome(answer: &str) -> Result<HeartbeatOutcome, String> {
    let (verb, rest) = answer.split_once(' ').unwrap_or((answer, ""));
    match verb {
        "renewed" => Ok(HeartbeatOutcome::Renewed {
            lease_end: word(rest, "lease end")?,
        }),
        "lost" => Ok(HeartbeatOutcome::Lost(refused_state(answer, rest)?)),
        _ => Err(format!("unexpected heartbeat answer {answer:?}")),
    }
}

/// The finish script's answer (a finish or a release).
pub(super) fn token_outcome(answer: &str) -> Result<TokenOutcome, String> {
    let (verb, rest) = answer.split_once(' ').unwrap_or((answer, ""));
    match verb {
        "accepted" => Ok(TokenOutcome::Accepted),
        "refused" => Ok(TokenOutcome::Refused(refused_state(answer, rest)?)),
        _ => Err(format!("unexpected finish answer {answer:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_decodes_head_and_attempts_with_a_runner_that_has_spaces() {
        let token = Token::random();
        let raw = format!(
            "success 2 1700000001000 0 1700000000500000 1 {token} \"host a\"\n\
             [{{\"attempt\":1,\"runner\":\"b\",\"token\":\"{token}\",\"reason\":\"scheduled\",\
             \"fence\":\"1700000000000000\",\"started_at\":1700000000000,\
             \"outcome\":\"died\",\"ended_at\":1700000000400}},\
             {{\"attempt\":2,\"runner\":\"host a\",\"token\":\"{token}\",\"reason\":\"takeover\",\
             \"fence\":\"1700000000500000\",\"started_at\":1700000000500,\
             \"digest\":\"abc\",\"outcome\":\"success\",\"ended_at\":1700000001000}}]"
        );
        let run = decode_record("job", 1_700_000_000_000, &raw).expect("decodes");
        assert_eq!(run.status, Status::Success);
        assert_eq!(run.attempt, 2);
        assert_eq!(run.runner, "host a");
        assert_eq!(run.fence, 1_700_000_000_500_000);
        assert_eq!(run.attempts.len(), 2);
        assert_eq!(run.attempts[1].digest.as_deref(), Some("abc"));
        assert_eq!(run.attempts[0].ended_at, Some(1_700_000_000_400));
    }

    #[test]
    fn claim_answers_parse_and_an_unknown_one_is_an_error() {
        let token = Token::random();
        assert_eq!(
            claim_outcome("running 3 1700 99 \"r 1\"", token),
            Ok(ClaimOutcome::Running {
                attempt: 3,
                runner: "r 1".into(),
                lease_end: 1700
            })
        );
        assert_eq!(
            claim_outcome("won 1 1700 42", token),
            Ok(ClaimOutcome::Won(Lease {
                attempt: 1,
                token,
                fence: 42,
                lease_end: 1700
            }))
        );
        assert!(claim_outcome("maybe", token).is_err());
        assert_eq!(
            token_outcome("refused 2 running 1"),
            Ok(TokenOutcome::Refused(Some(RunState {
                attempt: 2,
                status: Status::Running,
                released: true
            })))
        );
        assert_eq!(
            running_slots(Some(" 10:20 30:40")),
            vec!["10".to_owned(), "30".to_owned()]
        );
    }

    #[test]
    fn the_lease_keys_of_the_running_slots_are_the_keys_claims_write() {
        let keys = JobKeys::new("ns", "job");
        assert_eq!(
            keys.leases(&running_slots(Some(" 10:20 -30:40"))),
            vec![keys.lease(10), keys.lease(-30)]
        );
    }
}
