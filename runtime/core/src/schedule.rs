//! Schedules: cron expressions in an IANA time zone, turned into slots (UTC instants in ms).
//!
//! Expressions have five fields (`min hour dom month dow`) or six with seconds first, and the
//! macros `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight` and `@hourly`.
//! Parsing and matching are the `croner` crate's; time zones are `chrono-tz`'s.
//!
//! # Daylight-saving changes
//!
//! A schedule is a list of local wall-clock times, and each matching local time is exactly one
//! slot:
//!
//! - A local time that does not exist (the clock springs forward over it) runs once, at the first
//!   instant after the gap. In `Europe/Berlin` on 2026-03-29, `30 2 * * *` runs at 03:00 CEST
//!   (01:00 UTC). Several skipped times of the same gap share that one slot.
//! - A local time that happens twice (the clock falls back over it) runs once, at its first
//!   occurrence. In `Europe/Berlin` on 2026-10-25, `30 2 * * *` runs at 02:30 CEST (00:30 UTC),
//!   not again at 02:30 CET; an every-15-minutes job does not repeat 02:00–02:45 in the second
//!   pass of that hour.

use chrono::{DateTime, Duration as ChronoDuration, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

/// A schedule that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The cron expression does not parse.
    #[error("invalid cron expression {expr:?}: {reason}; expected 5 fields (min hour dom month dow), 6 with seconds first, or a macro such as @hourly")]
    InvalidCron {
        /// The expression given.
        expr: String,
        /// The parser's reason.
        reason: String,
    },
    /// The time zone is not an IANA name.
    #[error("unknown time zone {zone:?}; use an IANA name such as UTC, Europe/Berlin or America/New_York")]
    UnknownTimeZone {
        /// The zone given.
        zone: String,
    },
}

/// A cron expression in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    expr: String,
    cron: Cron,
    tz: Tz,
}

/// How many matching local times a search passes over (times of a repeated hour already run)
/// before it gives up.
const MAX_STEPS: usize = 10_000;

impl Schedule {
    /// Parses `expr` in the zone named `zone` (an IANA name; `UTC` for UTC).
    pub fn parse(expr: &str, zone: &str) -> Result<Self, ScheduleError> {
        let tz: Tz = zone.parse().map_err(|_| ScheduleError::UnknownTimeZone {
            zone: zone.to_owned(),
        })?;
        let trimmed = expr.trim();
        let normalized = if trimmed.eq_ignore_ascii_case("@midnight") {
            "@daily"
        } else {
            trimmed
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(normalized)
            .map_err(|e| ScheduleError::InvalidCron {
                expr: expr.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(Schedule {
            expr: expr.to_owned(),
            cron,
            tz,
        })
    }

    /// The expression as written.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone.
    pub fn time_zone(&self) -> Tz {
        self.tz
    }

    /// The first slot strictly after `after_ms` (UTC ms), or `None` if the expression never
    /// matches again.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let after = utc(after_ms)?;
        let mut local = after.with_timezone(&self.tz).naive_local();
        for _ in 0..MAX_STEPS {
            local = self.next_local(local)?;
            let slot = self.resolve(local)?;
            if slot > after_ms {
                return Some(slot);
            }
        }
        None
    }

    /// The latest slot at or before `at_ms` (UTC ms), or `None` if there is none.
    pub fn latest_at_or_before(&self, at_ms: i64) -> Option<i64> {
        let at = utc(at_ms)?;
        let mut local = at
            .with_timezone(&self.tz)
            .naive_local()
            .with_nanosecond_zero()
            + ChronoDuration::seconds(1);
        for _ in 0..MAX_STEPS {
            local = self.previous_local(local)?;
            let slot = self.resolve(local)?;
            if slot <= at_ms {
                return Some(slot);
            }
        }
        None
    }

    /// The next `count` slots after `after_ms`.
    pub fn upcoming(&self, after_ms: i64, count: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(count);
        let mut cursor = after_ms;
        while out.len() < count {
            match self.next_after(cursor) {
                Some(slot) => {
                    out.push(slot);
                    cursor = slot;
                }
                None => break,
            }
        }
        out
    }

    /// The next matching local wall-clock time strictly after `local`.
    fn next_local(&self, local: NaiveDateTime) -> Option<NaiveDateTime> {
        let as_utc = Utc.from_utc_datetime(&local);
        self.cron
            .find_next_occurrence(&as_utc, false)
            .ok()
            .map(|t| t.naive_utc().with_nanosecond_zero())
    }

    /// The latest matching local wall-clock time strictly before `local`.
    fn previous_local(&self, local: NaiveDateTime) -> Option<NaiveDateTime> {
        let as_utc = Utc.from_utc_datetime(&local);
        self.cron
            .find_previous_occurrence(&as_utc, false)
            .ok()
            .map(|t| t.naive_utc().with_nanosecond_zero())
    }

    /// The instant of a local time, by the daylight-saving policy of this module.
    fn resolve(&self, local: NaiveDateTime) -> Option<i64> {
        use chrono::LocalResult;
        match self.tz.from_local_datetime(&local) {
            LocalResult::Single(t) => Some(t.timestamp_millis()),
            LocalResult::Ambiguous(first, _) => Some(first.timestamp_millis()),
            LocalResult::None => {
                // In a gap: the first instant after it. Gaps end on a whole minute in every zone
                // in use today; step by seconds to be safe with historic offsets.
                let mut probe = local;
                for _ in 0..(48 * 3600) {
                    probe += ChronoDuration::seconds(1);
                    let probe = probe.with_nanosecond_zero();
                    if let Some(t) = self.tz.from_local_datetime(&probe).earliest() {
                        return Some(t.timestamp_millis());
                    }
                }
                None
            }
        }
    }
}

trait ZeroNanos {
    fn with_nanosecond_zero(self) -> Self;
}

impl ZeroNanos for NaiveDateTime {
    fn with_nanosecond_zero(self) -> Self {
        use chrono::Timelike;
        self.with_nanosecond(0).unwrap_or(self)
    }
}

fn utc(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp_millis(ms)
}

/// A slot as RFC 3339 in UTC with milliseconds, e.g. `2026-03-29T01:00:00.000Z`.
pub fn format_utc(ms: i64) -> String {
    utc(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms}ms"))
}

/// A slot as RFC 3339 in a zone, with the zone's offset, e.g. `2026-03-29T03:00:00+02:00`.
pub fn format_in(ms: i64, tz: Tz) -> String {
    utc(ms)
        .map(|t| {
            t.with_timezone(&tz)
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false)
        })
        .unwrap_or_else(|| format!("{ms}ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(rfc3339: &str) -> i64 {
        DateTime::parse_from_rfc3339(rfc3339)
            .expect("valid time")
            .timestamp_millis()
    }

    fn slots(expr: &str, zone: &str, after: &str, n: usize) -> Vec<String> {
        let s = Schedule::parse(expr, zone).expect("valid schedule");
        s.upcoming(ms(after), n)
            .into_iter()
            .map(|t| format_in(t, s.time_zone()))
            .collect()
    }

    #[test]
    fn five_and_six_field_expressions_and_macros_parse() {
        assert_eq!(
            slots("*/15 * * * *", "UTC", "2026-01-01T00:00:00Z", 2),
            ["2026-01-01T00:15:00+00:00", "2026-01-01T00:30:00+00:00"]
        );
        assert_eq!(
            slots("*/10 * * * * *", "UTC", "2026-01-01T00:00:00Z", 1),
            ["2026-01-01T00:00:10+00:00"]
        );
        for (m, first) in [
            ("@hourly", "2026-01-01T01:00:00+00:00"),
            ("@daily", "2026-01-02T00:00:00+00:00"),
            ("@midnight", "2026-01-02T00:00:00+00:00"),
        ] {
            assert_eq!(slots(m, "UTC", "2026-01-01T00:00:00Z", 1), [first], "{m}");
        }
    }

    #[test]
    fn malformed_cron_and_unknown_zone_are_named() {
        let err = Schedule::parse("61 * * * *", "UTC").unwrap_err();
        assert!(err.to_string().contains("\"61 * * * *\""), "{err}");
        let err = Schedule::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(err.to_string().contains("Mars/Olympus"), "{err}");
    }

    #[test]
    fn spring_forward_runs_a_missing_local_time_once_after_the_gap() {
        // Berlin: 2026-03-29 02:00 CET -> 03:00 CEST.
        assert_eq!(
            slots("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 2),
            ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]
        );
        // Every 15 minutes: the missing 02:00..02:45 become one slot at 03:00.
        assert_eq!(
            slots("*/15 * * * *", "Europe/Berlin", "2026-03-29T00:30:00Z", 3),
            [
                "2026-03-29T01:45:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-29T03:15:00+02:00"
            ]
        );
    }

    #[test]
    fn fall_back_runs_a_repeated_local_time_once_at_its_first_occurrence() {
        // Berlin: 2026-10-25 03:00 CEST -> 02:00 CET.
        assert_eq!(
            slots("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
        );
        assert_eq!(
            slots("0,30 * * * *", "Europe/Berlin", "2026-10-24T23:45:00Z", 4),
            [
                "2026-10-25T02:00:00+02:00",
                "2026-10-25T02:30:00+02:00",
                "2026-10-25T03:00:00+01:00",
                "2026-10-25T03:30:00+01:00"
            ]
        );
    }

    #[test]
    fn latest_slot_at_or_before_an_instant() {
        let s = Schedule::parse("0 * * * *", "UTC").expect("valid");
        assert_eq!(
            s.latest_at_or_before(ms("2026-01-01T05:59:59Z")),
            Some(ms("2026-01-01T05:00:00Z"))
        );
        assert_eq!(
            s.latest_at_or_before(ms("2026-01-01T05:00:00Z")),
            Some(ms("2026-01-01T05:00:00Z"))
        );
        // Inside the repeated hour, the latest slot is the first occurrence's.
        let b = Schedule::parse("30 2 * * *", "Europe/Berlin").expect("valid");
        assert_eq!(
            b.latest_at_or_before(ms("2026-10-25T01:45:00Z")),
            Some(ms("2026-10-25T00:30:00Z"))
        );
    }
}
