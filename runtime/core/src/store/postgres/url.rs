//! The store URL: sqlx's own `postgres://` URL, plus Baton's `schema` and `timeout` query
//! parameters.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use crate::store::contract::StoreError;
use crate::store::url::{redact, take_parameter, take_timeout, DEFAULT_TIMEOUT};

/// The schema the store's tables and functions live in when the URL names none: `baton`.
pub const DEFAULT_SCHEMA: &str = "baton";

/// What a store URL names: where to connect, and the schema to use there.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The connection options, from the URL without Baton's own parameters.
    pub options: PgConnectOptions,
    /// The schema, as given (not quoted).
    pub schema: String,
    /// The server, for messages: `HOST:PORT`, or the socket's path; never a password.
    pub server: String,
    /// The database's name.
    pub database: String,
    /// How long an operation waits for a connection and an answer: `?timeout=`, 5 s unless
    /// given.
    pub timeout: Duration,
}

impl Target {
    /// Parses `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?schema=NAME&timeout=DURATION&…]`.
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        let invalid = |reason: String| StoreError::InvalidUrl {
            url: redact(url),
            reason,
        };
        let (without_timeout, timeout) = take_timeout(url, DEFAULT_TIMEOUT)?;
        // Baton's `schema` parameter comes off too; the rest goes to sqlx untouched.
        let (sqlx_url, schema) = take_parameter(&without_timeout, "schema").map_err(invalid)?;
        let schema = schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned());
        check_schema_name(&schema).map_err(invalid)?;
        let options = PgConnectOptions::from_str(&sqlx_url)
            .map_err(|e| invalid(hide_password(url, e.to_string())))?
            .application_name("baton");
        let server = match options.get_socket() {
            Some(dir) => dir
                .join(format!(".s.PGSQL.{}", options.get_port()))
                .display()
                .to_string(),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        };
        let database = options
            .get_database()
            .unwrap_or(options.get_username())
            .to_owned();
        Ok(Target {
            options,
            schema,
            server,
            database,
            timeout,
        })
    }

    /// The store, for error messages: `HOST:PORT/DB`.
    pub fn store(&self) -> String {
        format!("{}/{}", self.server, self.database)
    }

    /// The database and schema, for messages about the schema: `database "DB" on HOST:PORT,
    /// schema NAME`.
    pub fn described(&self) -> String {
        format!(
            "database {:?} on {}, schema {}",
            self.database, self.server, self.schema
        )
    }

    /// The schema as an SQL identifier, quoted.
    pub fn quoted_schema(&self) -> String {
        format!("\"{}\"", self.schema)
    }
}

/// A schema name Baton accepts: a plain identifier (letters, digits, `_`, not starting with a
/// digit, at most 63 bytes), so it can be quoted into SQL as it is. Case is kept.
fn check_schema_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !first_ok || !rest_ok || name.len() > 63 {
        return Err(format!(
            "schema {name:?} is not a plain name: use 1 to 63 letters, digits or _, \
             not starting with a digit"
        ));
    }
    Ok(())
}

/// An error text about a URL, with the URL's password (if any) replaced by `***`.
pub(crate) fn hide_password(url: &str, text: String) -> String {
    match password(url) {
        Some(pw) if !pw.is_empty() => text.replace(pw, "***"),
        _ => text,
    }
}

/// The password of a URL's user information, as written in the URL.
fn password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = match rest.find(['/', '?']) {
        Some(i) => &rest[..i],
        None => rest,
    };
    let (userinfo, _) = authority.rsplit_once('@')?;
    userinfo.split_once(':').map(|(_, pw)| pw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_parameter_is_taken_off_and_the_rest_kept() {
        let t = Target::parse("postgres://u:pw@db.example:6543/app?schema=jobs&sslmode=disable")
            .expect("valid url");
        assert_eq!(t.schema, "jobs");
        assert_eq!(t.server, "db.example:6543");
        assert_eq!(t.database, "app");
        assert_eq!(t.store(), "db.example:6543/app");
        let (rest, schema) = take_parameter("postgres://h/d?a=1&schema=s&b=2", "schema").unwrap();
        assert_eq!(rest, "postgres://h/d?a=1&b=2");
        assert_eq!(schema.as_deref(), Some("s"));
    }

    #[test]
    fn a_unix_socket_is_named_by_its_path() {
        let t = Target::parse("postgres://postgres@localhost/test?host=/run/postgresql")
            .expect("valid url");
        assert_eq!(t.server, "/run/postgresql/.s.PGSQL.5432");
    }

    #[test]
    fn timeout_defaults_to_5_s_and_is_not_passed_to_the_driver() {
        let t = Target::parse("postgresql://postgres@127.0.0.1/test").expect("valid url");
        assert_eq!(t.timeout, Duration::from_secs(5));
        let t = Target::parse("postgres://u@h/d?timeout=30s&schema=jobs").expect("valid url");
        assert_eq!(
            (t.timeout, t.schema.as_str()),
            (Duration::from_secs(30), "jobs")
        );
        let err = Target::parse("postgres://u:hunter2@h/d?timeout=soon").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("timeout parameter"), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
    }

    #[test]
    fn schema_defaults_to_baton_and_port_to_5432() {
        let t = Target::parse("postgresql://postgres@127.0.0.1/test").expect("valid url");
        assert_eq!(t.schema, "baton");
        assert_eq!(t.server, "127.0.0.1:5432");
        assert_eq!(t.quoted_schema(), "\"baton\"");
    }

    #[test]
    fn schema_that_is_not_a_plain_name_is_an_invalid_url_without_the_password() {
        for bad in ["a-b", "1abc", "x\"y", "", "a b"] {
            let url = format!("postgres://u:hunter2@h/d?schema={bad}");
            let err = Target::parse(&url).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, StoreError::InvalidUrl { .. }), "{msg}");
            assert!(msg.contains("schema"), "{msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
        }
    }

    #[test]
    fn password_is_hidden_in_error_texts() {
        assert_eq!(
            hide_password("postgres://u:s3cret@h/d", "bad s3cret".into()),
            "bad ***"
        );
        assert_eq!(password("postgres://u@h/d"), None);
    }
}
