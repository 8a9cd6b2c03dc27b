//! A store URL's own parts: Baton's query parameters, and the form of a URL fit for messages.

use std::time::Duration;

use super::contract::StoreError;

/// The store URL's query parameter that sets how long one operation waits for the store before
/// it fails with a retryable error: `?timeout=DURATION` (`500ms`, `30s`, `1m`, …), on every
/// backend. Redis and Valkey: the response timeout of each command, 5 s unless given
/// ([`DEFAULT_TIMEOUT`]). PostgreSQL: the wait for a connection of the pool and for the
/// server's answer, 5 s unless given. SQLite: how long a call waits for another process's write
/// lock on the file (the busy timeout), 10 s unless given.
pub const TIMEOUT_PARAMETER: &str = "timeout";

/// How long one operation on a network store waits for its answer unless the URL says
/// `?timeout=`: 5 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest and the longest `?timeout=` accepted: 10 ms and 1 h.
pub const TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(3_600));

/// Takes Baton's own query parameter `name` off a URL: returns the URL without it (its other
/// parameters kept, in order) and the parameter's value, if given. Fails, with a reason that
/// names the parameter, when it is given twice or without a value.
pub(crate) fn take_parameter(url: &str, name: &str) -> Result<(String, Option<String>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut value = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, v)) if key == name => {
                if value.replace(v.to_owned()).is_some() {
                    return Err(format!("the {name} parameter is given twice"));
                }
            }
            None if pair == name => return Err(format!("the {name} parameter has no value")),
            _ => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, value))
}

/// Takes `?timeout=DURATION` off a store URL (see [`TIMEOUT_PARAMETER`]): returns the URL
/// without it and the timeout, `default` when the URL gives none. Fails with
/// [`StoreError::InvalidUrl`] naming the parameter for a value that is not a duration or is out
/// of [`TIMEOUT_RANGE`].
pub fn take_timeout(url: &str, default: Duration) -> Result<(String, Duration), StoreError> {
    let invalid = |reason: String| StoreError::InvalidUrl {
        url: redact(url),
        reason,
    };
    let (rest, value) = take_parameter(url, TIMEOUT_PARAMETER).map_err(invalid)?;
    let Some(value) = value else {
        return Ok((rest, default));
    };
    let timeout = crate::duration::parse_duration(&value)
        .map_err(|e| invalid(format!("the {TIMEOUT_PARAMETER} parameter: {e}")))?;
    let (min, max) = TIMEOUT_RANGE;
    if timeout < min || timeout > max {
        return Err(invalid(format!(
            "the {TIMEOUT_PARAMETER} parameter {value:?} is out of range: use {min:?} to {max:?}"
        )));
    }
    Ok((rest, timeout))
}

/// A URL with its password, if any, replaced by `***`, fit for messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{user}@{host}{tail}")
            }
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_and_keeps_the_host() {
        assert_eq!(
            redact("redis://user:secret@db:6379/0"),
            "redis://user:***@db:6379/0"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:5432/test"
        );
        assert_eq!(redact("sqlite://baton.db"), "sqlite://baton.db");
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1");
    }

    #[test]
    fn timeout_is_taken_off_the_url_and_the_other_parameters_kept() {
        let (rest, t) = take_timeout("redis://h:1/0?timeout=30s", DEFAULT_TIMEOUT).unwrap();
        assert_eq!(
            (rest.as_str(), t),
            ("redis://h:1/0", Duration::from_secs(30))
        );
        let (rest, t) = take_timeout(
            "postgres://u@h/d?schema=s&timeout=250ms&sslmode=disable",
            DEFAULT_TIMEOUT,
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h/d?schema=s&sslmode=disable");
        assert_eq!(t, Duration::from_millis(250));
        let (rest, t) = take_timeout("sqlite://baton.db", Duration::from_secs(10)).unwrap();
        assert_eq!(
            (rest.as_str(), t),
            ("sqlite://baton.db", Duration::from_secs(10))
        );
    }

    #[test]
    fn a_bad_timeout_is_an_invalid_url_naming_the_parameter_not_the_password() {
        for bad in [
            "timeout=abc",
            "timeout=30",
            "timeout=0s",
            "timeout=2h",
            "timeout",
            "timeout=1s&timeout=2s",
        ] {
            let url = format!("redis://u:hunter2@h:1?{bad}");
            let err = take_timeout(&url, DEFAULT_TIMEOUT).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, StoreError::InvalidUrl { .. }), "{msg}");
            assert!(msg.contains("timeout parameter"), "{msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
        }
    }
}
