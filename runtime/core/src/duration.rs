//! Durations as people write them in job files, store URLs and flags: `500ms`, `30s`, `5m`,
//! `2h`, `1d`.

use std::time::Duration;

/// Parses a duration such as `500ms`, `30s`, `5m`, `2h`, `1d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("{s:?} has no unit; write e.g. \"30s\", \"500ms\", \"5m\""))?;
    let (number, unit) = s.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a number and a unit, e.g. \"30s\""))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}; use ms, s, m, h or d"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is out of range"))
}

/// A duration as a job file writes it: `500ms`, `30s`, `5m`, `2h`, or seconds with a fraction.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("5 weeks").is_err());
    }
}
