//! Fenced job state: a small key-value store per job, kept in the cluster's own store beside the
//! job's leases.
//!
//! Keys are scoped to the namespace and the job: one job can neither read nor write another's.
//! Reads are plain. Every write ([`StateWrite`]) carries the token of the attempt that sends it,
//! and the store accepts it only if that token is still the current attempt of a live run by the
//! store's own clock, checked in the same atomic step that writes (the Lua script, the PL/pgSQL
//! function, the SQLite transaction). A write from an attempt that is no longer current (its
//! run taken over, finished, released, or its lease run out) is [`StateOutcome::Fenced`], and
//! the value stays as it was, even when the writer's host believes it is still alive.
//!
//! Every accepted write records who wrote the key ([`Writer`]: the slot, attempt and fence of
//! the attempt, and the store's clock at the write), so that `baton state` can show it and a
//! checker can prove from the store's own records that no stale write was ever accepted.
//!
//! [`StateHandle`](crate::state_handle::StateHandle) is what an attempt gets to reach its job's
//! state.

use serde::{Deserialize, Serialize};

use crate::lease::RunState;

/// The longest key, in bytes of UTF-8, unless the limits say otherwise: 256.
pub const DEFAULT_MAX_KEY_BYTES: u32 = 256;
/// The largest value, in bytes, unless the limits say otherwise: 64 KiB.
pub const DEFAULT_MAX_VALUE_BYTES: u32 = 64 * 1024;
/// The most keys one job may hold, unless the limits say otherwise: 1024.
pub const DEFAULT_MAX_KEYS: u32 = 1024;

/// The limits of one job's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateLimits {
    /// The longest key, in bytes (keys are UTF-8 and never empty). Defaults to 256.
    pub max_key_bytes: u32,
    /// The largest value, in bytes. Defaults to 64 KiB.
    pub max_value_bytes: u32,
    /// The most keys the job may hold; a write that would add one more is refused. Defaults to
    /// 1024.
    pub max_keys: u32,
}

impl Default for StateLimits {
    fn default() -> Self {
        StateLimits {
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_keys: DEFAULT_MAX_KEYS,
        }
    }
}

/// Who wrote a key: the attempt whose token the store accepted, and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    /// The slot of the attempt's run (UTC ms).
    pub slot: i64,
    /// The attempt's number.
    pub attempt: u32,
    /// The attempt's fence.
    #[serde(deserialize_with = "crate::lease::fence_from_json")]
    pub fence: u64,
    /// When the store accepted the write, on the store's clock (ms).
    pub written_at: i64,
}

/// One key of a job's state, with its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateEntry {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
    /// The attempt that wrote it last.
    pub writer: Writer,
}

/// One key of a job's state, without its value: what a listing shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateKey {
    /// The key.
    pub key: String,
    /// The size of its value, in bytes.
    pub size: u64,
    /// The attempt that wrote it last.
    pub writer: Writer,
}

/// A write to a job's state. Each is one atomic step on the store, fenced by the attempt's
/// token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateWrite<'a> {
    /// Sets `key` to `value`.
    Set {
        /// The key.
        key: &'a str,
        /// The new value.
        value: &'a [u8],
    },
    /// Deletes `key`; answers whether it existed.
    Delete {
        /// The key.
        key: &'a str,
    },
    /// Adds `by` to the integer held by `key` (0 when absent), and answers the sum. An integer
    /// value is the decimal text of a signed 64-bit number (`-12`, `0`, `345`: no sign `+`, no
    /// leading zeros, no spaces), as `increment` writes it.
    Increment {
        /// The key.
        key: &'a str,
        /// What to add (may be negative).
        by: i64,
    },
    /// Sets `key` to `new` only if its value is `expected` now (`None`: the key is absent);
    /// answers whether it did.
    CompareAndSwap {
        /// The key.
        key: &'a str,
        /// The value the key must hold, or `None` for a key that must be absent.
        expected: Option<&'a [u8]>,
        /// The new value.
        new: &'a [u8],
    },
}

impl<'a> StateWrite<'a> {
    /// The key written.
    pub fn key(&self) -> &'a str {
        match *self {
            StateWrite::Set { key, .. }
            | StateWrite::Delete { key }
            | StateWrite::Increment { key, .. }
            | StateWrite::CompareAndSwap { key, .. } => key,
        }
    }

    /// The operation's name, as the stores' scripts and functions take it: `set`, `delete`,
    /// `increment`, `compare-and-swap`.
    pub fn operation(&self) -> &'static str {
        match self {
            StateWrite::Set { .. } => "set",
            StateWrite::Delete { .. } => "delete",
            StateWrite::Increment { .. } => "increment",
            StateWrite::CompareAndSwap { .. } => "compare-and-swap",
        }
    }

    /// The value the write would store, if it stores one given by the caller.
    pub fn new_value(&self) -> Option<&'a [u8]> {
        match *self {
            StateWrite::Set { value, .. } => Some(value),
            StateWrite::CompareAndSwap { new, .. } => Some(new),
            StateWrite::Delete { .. } | StateWrite::Increment { .. } => None,
        }
    }

    /// Why the write is refused before it reaches the store, if it is: a key that is empty or
    /// too long, a value too large. Every backend checks this first, without a round trip.
    pub fn refusal(&self, limits: &StateLimits) -> Option<StateRefusal> {
        let key = self.key();
        if key.is_empty() {
            return Some(StateRefusal::EmptyKey);
        }
        if key.len() > limits.max_key_bytes as usize {
            return Some(StateRefusal::KeyTooLong {
                bytes: key.len(),
                limit: limits.max_key_bytes,
            });
        }
        if let Some(value) = self.new_value() {
            if value.len() > limits.max_value_bytes as usize {
                return Some(StateRefusal::ValueTooLarge {
                    bytes: value.len(),
                    limit: limits.max_value_bytes,
                });
            }
        }
        None
    }
}

/// Why a write was refused for what it asked, not for who asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateRefusal {
    /// The key is empty.
    #[error("a state key must not be empty")]
    EmptyKey,
    /// The key is longer than the limit.
    #[error("the state key is {bytes} bytes long, over the limit of {limit} bytes")]
    KeyTooLong {
        /// Its length, in bytes.
        bytes: usize,
        /// The limit.
        limit: u32,
    },
    /// The value is larger than the limit.
    #[error("the state value is {bytes} bytes, over the limit of {limit} bytes")]
    ValueTooLarge {
        /// Its size, in bytes.
        bytes: usize,
        /// The limit.
        limit: u32,
    },
    /// The write would add a key to a job that holds the most keys it may.
    #[error("the job holds {limit} state keys, the most it may; delete some first")]
    TooManyKeys {
        /// The limit.
        limit: u32,
    },
    /// An increment of a value that is not an integer.
    #[error("the state value is not a decimal 64-bit integer, so it cannot be incremented")]
    NotAnInteger,
    /// An increment whose sum leaves the signed 64-bit range.
    #[error("the increment would overflow a signed 64-bit integer")]
    Overflow,
}

/// What an accepted write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// A set stored its value.
    Set,
    /// A delete ran: whether the key existed.
    Deleted(bool),
    /// An increment stored this sum.
    Incremented(i64),
    /// A compare-and-swap ran: whether it swapped.
    Swapped(bool),
}

/// What a state write returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateOutcome {
    /// The store accepted the write (with the current token of a live run).
    Written(Written),
    /// Refused: the token is not the current attempt of a live run (taken over, finished,
    /// released, or its lease ran out by the store's clock). Nothing was written. `None` when
    /// the run has no state at all.
    Fenced(Option<RunState>),
    /// Refused for what it asked (see [`StateRefusal`]); nothing was written.
    Refused(StateRefusal),
}

/// Whether `text` is an integer value as [`StateWrite::Increment`] takes it: the decimal text of
/// a signed 64-bit number, with no sign `+`, no leading zeros and no spaces.
pub fn parse_integer(value: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(value).ok()?;
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && text != "-0";
    if !canonical {
        return None;
    }
    text.parse().ok()
}

/// What a write does to a key that holds `current`, in a job that holds `keys` keys: the value
/// to store (`Some(None)`: delete the key; `None`: leave it) and the answer. For stores that
/// run the write in Rust inside their own transaction (SQLite); the Lua script and the PL/pgSQL
/// function implement the same steps.
#[allow(clippy::type_complexity)]
pub(crate) fn apply(
    write: &StateWrite<'_>,
    current: Option<&[u8]>,
    keys: u64,
    limits: &StateLimits,
) -> Result<(Option<Option<Vec<u8>>>, Written), StateRefusal> {
    let adds_a_key = current.is_none();
    let room = || {
        if adds_a_key && keys >= u64::from(limits.max_keys) {
            Err(StateRefusal::TooManyKeys {
                limit: limits.max_keys,
            })
        } else {
            Ok(())
        }
    };
    match *write {
        StateWrite::Set { value, .. } => {
            room()?;
            Ok((Some(Some(value.to_vec())), Written::Set))
        }
        StateWrite::Delete { .. } => {
            Ok((current.map(|_| None), Written::Deleted(current.is_some())))
        }
        StateWrite::Increment { by, .. } => {
            let now = match current {
                Some(v) => parse_integer(v).ok_or(StateRefusal::NotAnInteger)?,
                None => 0,
            };
            let sum = now.checked_add(by).ok_or(StateRefusal::Overflow)?;
            room()?;
            Ok((
                Some(Some(sum.to_string().into_bytes())),
                Written::Incremented(sum),
            ))
        }
        StateWrite::CompareAndSwap { expected, new, .. } => {
            if current != expected {
                return Ok((None, Written::Swapped(false)));
            }
            room()?;
            Ok((Some(Some(new.to_vec())), Written::Swapped(true)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_canonical_decimal_sixty_four_bit_numbers() {
        assert_eq!(parse_integer(b"0"), Some(0));
        assert_eq!(parse_integer(b"-12"), Some(-12));
        assert_eq!(parse_integer(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_integer(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b"01",
            b"-0",
            b" 1",
            b"1.5",
            b"9223372036854775808",
            b"abc",
        ] {
            assert_eq!(parse_integer(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_write_past_a_limit_is_refused_before_the_store_naming_the_limit() {
        let limits = StateLimits {
            max_key_bytes: 4,
            max_value_bytes: 2,
            max_keys: 1,
        };
        let set = |key, value| StateWrite::Set { key, value }.refusal(&limits);
        assert_eq!(set("", b""), Some(StateRefusal::EmptyKey));
        assert_eq!(
            set("abcde", b""),
            Some(StateRefusal::KeyTooLong { bytes: 5, limit: 4 })
        );
        assert_eq!(
            set("a", b"xyz"),
            Some(StateRefusal::ValueTooLarge { bytes: 3, limit: 2 })
        );
        assert_eq!(set("abcd", b"xy"), None);
        let msg = StateRefusal::KeyTooLong { bytes: 5, limit: 4 }.to_string();
        assert!(msg.contains("limit of 4 bytes"), "{msg}");
    }

    #[test]
    fn apply_adds_keys_only_below_the_limit_and_increments_exactly() {
        let limits = StateLimits {
            max_keys: 1,
            ..StateLimits::default()
        };
        let inc = StateWrite::Increment { key: "n", by: 5 };
        assert_eq!(
            apply(&inc, None, 1, &limits),
            Err(StateRefusal::TooManyKeys { limit: 1 })
        );
        assert_eq!(
            apply(&inc, Some(b"7"), 1, &limits),
            Ok((Some(Some(b"12".to_vec())), Written::Incremented(12)))
        );
        assert_eq!(
            apply(&inc, Some(b"x"), 1, &limits),
            Err(StateRefusal::NotAnInteger)
        );
        let max = i64::MAX.to_string();
        assert_eq!(
            apply(&inc, Some(max.as_bytes()), 1, &limits),
            Err(StateRefusal::Overflow)
        );
        let cas = StateWrite::CompareAndSwap {
            key: "n",
            expected: Some(b"1"),
            new: b"2",
        };
        assert_eq!(
            apply(&cas, Some(b"0"), 1, &limits),
            Ok((None, Written::Swapped(false)))
        );
        assert_eq!(
            apply(&StateWrite::Delete { key: "n" }, None, 0, &limits),
            Ok((None, Written::Deleted(false)))
        );
    }
}
