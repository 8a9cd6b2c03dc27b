//! A job's configuration and secrets: the `[config]` table of its job file, offered to the guest
//! through `wasi:config/store` (`get`, `get-all`).
//!
//! Each value is a literal string, or `{ env = "NAME" }` (a variable of the host's environment),
//! or `{ file = "PATH" }` (a file's content without its final newline; the path is beneath the
//! jobs directory, or beneath a directory the node grants as `@NAME/…`: see
//! [`crate::jobs::boundary`]). Both are read when the job loads, and both are secrets: a
//! [`ConfigValue`] from them never shows in `Debug`, in an error, or in a log line of the host,
//! and the attempt's log lines and error have its text replaced with `[redacted]`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::jobs::boundary::{Boundary, PathError};

/// What every secret is replaced with in log lines and errors.
pub const REDACTED: &str = "[redacted]";

/// Secrets shorter than this are not searched for in log lines (`[redacted]` everywhere a
/// two-letter secret happens to appear would hide more than it protects): 4 bytes.
const SHORTEST_REDACTED: usize = 4;

/// Where a configuration value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// Written in the job file.
    Literal,
    /// An environment variable of the host.
    Env(String),
    /// A file on the host.
    File(PathBuf),
}

/// One value of a job's `[config]`. A value from `env` or `file` is a secret: its `Debug`
/// shows only where it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigValue {
    value: String,
    source: ConfigSource,
}

impl ConfigValue {
    /// A value and where it came from.
    pub fn new(value: impl Into<String>, source: ConfigSource) -> Self {
        ConfigValue {
            value: value.into(),
            source,
        }
    }

    /// Whether the value is a secret (it came from `env` or `file`).
    pub fn is_secret(&self) -> bool {
        self.source != ConfigSource::Literal
    }

    /// Where the value came from.
    pub fn source(&self) -> &ConfigSource {
        &self.source
    }

    /// The value itself, for the guest. Never log it.
    pub fn expose(&self) -> &str {
        &self.value
    }
}

impl std::fmt::Debug for ConfigValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            ConfigSource::Literal => write!(f, "{:?}", self.value),
            ConfigSource::Env(name) => write!(f, "{REDACTED} (env {name})"),
            ConfigSource::File(path) => write!(f, "{REDACTED} (file {})", path.display()),
        }
    }
}

/// A `[config]` entry that cannot be used. Messages name the key and the source, never a value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The value is neither a string, `{ env = "NAME" }` nor `{ file = "PATH" }`.
    #[error(
        "config.{key}: {found}; write a string, {{ env = \"NAME\" }} or {{ file = \"PATH\" }}"
    )]
    Malformed {
        /// The key.
        key: String,
        /// What was found instead.
        found: String,
    },
    /// The environment variable is not set (or not UTF-8).
    #[error("config.{key}: the environment variable {name} is not set for the host; set it where `baton run` starts, or remove the key")]
    MissingEnv {
        /// The key.
        key: String,
        /// The variable.
        name: String,
    },
    /// The file is outside the jobs directory, or cannot be read (or is not UTF-8).
    #[error("config.{key}: file {source}")]
    File {
        /// The key.
        key: String,
        /// Where the path leads and why it is refused.
        #[source]
        source: Box<PathError>,
    },
}

/// Reads a job file's `[config]` table: literals as they are, `env` and `file` from the host.
pub(crate) fn read(
    table: &toml::Table,
    boundary: &Boundary<'_>,
) -> Result<BTreeMap<String, ConfigValue>, ConfigError> {
    let mut out = BTreeMap::new();
    for (key, value) in table {
        let malformed = |found: String| ConfigError::Malformed {
            key: key.clone(),
            found,
        };
        let value = match value {
            toml::Value::String(s) => ConfigValue::new(s.clone(), ConfigSource::Literal),
            toml::Value::Table(t) => {
                let keys: Vec<&str> = t.keys().map(String::as_str).collect();
                match (keys.as_slice(), t.values().next()) {
                    (["env"], Some(toml::Value::String(name))) => {
                        let value = std::env::var(name).map_err(|_| ConfigError::MissingEnv {
                            key: key.clone(),
                            name: name.clone(),
                        })?;
                        ConfigValue::new(value, ConfigSource::Env(name.clone()))
                    }
                    (["file"], Some(toml::Value::String(file))) => {
                        let (path, text) =
                            boundary.read_file(Path::new(file)).map_err(|source| {
                                ConfigError::File {
                                    key: key.clone(),
                                    source: Box::new(source),
                                }
                            })?;
                        let text = text
                            .strip_suffix('\n')
                            .map(|t| t.strip_suffix('\r').unwrap_or(t))
                            .unwrap_or(&text);
                        ConfigValue::new(text, ConfigSource::File(path))
                    }
                    _ => {
                        return Err(malformed(format!(
                            "a table with {}",
                            if keys.is_empty() {
                                "no keys".to_owned()
                            } else {
                                keys.join(", ")
                            }
                        )))
                    }
                }
            }
            other => return Err(malformed(format!("a {}", other.type_str()))),
        };
        out.insert(key.clone(), value);
    }
    Ok(out)
}

/// The secrets' texts worth searching for in log lines and errors, longest first.
#[derive(Clone, Debug, Default)]
pub(crate) struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// The secrets of a job's configuration.
    pub(crate) fn new<'a>(values: impl IntoIterator<Item = &'a ConfigValue>) -> Self {
        let mut secrets: Vec<String> = values
            .into_iter()
            .filter(|v| v.is_secret() && v.value.len() >= SHORTEST_REDACTED)
            .map(|v| v.value.clone())
            .collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { secrets }
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub(crate) fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), REDACTED);
            }
        }
        text
    }

    /// Whether there is nothing to redact.
    pub(crate) fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        toml::from_str(text).expect("toml")
    }

    /// Reads `table` as a job file of the jobs directory `dir` would, with nothing granted.
    fn read_in(
        table: &toml::Table,
        dir: &Path,
    ) -> Result<BTreeMap<String, ConfigValue>, ConfigError> {
        let none = crate::jobs::boundary::AllowedDirs::new();
        read(
            table,
            &Boundary::open(dir, &none).expect("the jobs directory opens"),
        )
    }

    #[test]
    fn literals_env_and_files_are_read_and_only_the_latter_are_secrets() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("key"), "s3cret-from-file\n").expect("write");
        std::env::set_var("BATON_CONFIG_TEST_TOKEN", "s3cret-from-env");
        let config = read_in(
            &table(
                r#"
                url = "http://example.com"
                token = { env = "BATON_CONFIG_TEST_TOKEN" }
                key = { file = "key" }
                "#,
            ),
            dir.path(),
        )
        .expect("valid");
        assert_eq!(config["url"].expose(), "http://example.com");
        assert!(!config["url"].is_secret());
        assert_eq!(config["token"].expose(), "s3cret-from-env");
        assert_eq!(config["key"].expose(), "s3cret-from-file");
        assert!(config["token"].is_secret() && config["key"].is_secret());
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("s3cret") && debug.contains("BATON_CONFIG_TEST_TOKEN"),
            "{debug}"
        );
    }

    #[test]
    fn a_missing_source_names_the_key_and_the_source() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = read_in(
            &table(r#"token = { env = "BATON_CONFIG_TEST_UNSET" }"#),
            dir.path(),
        )
        .expect_err("unset");
        let msg = e.to_string();
        assert!(
            msg.contains("config.token") && msg.contains("BATON_CONFIG_TEST_UNSET"),
            "{msg}"
        );
        let msg = read_in(&table(r#"key = { file = "nope" }"#), dir.path())
            .expect_err("missing")
            .to_string();
        assert!(msg.contains("config.key") && msg.contains("nope"), "{msg}");
        let msg = read_in(&table("n = 3"), dir.path())
            .expect_err("a number")
            .to_string();
        assert!(msg.contains("config.n") && msg.contains("integer"), "{msg}");
    }

    #[test]
    fn secrets_are_redacted_longest_first() {
        let r = Redactor::new(&[
            ConfigValue::new("abcd", ConfigSource::Env("A".into())),
            ConfigValue::new("abcdefgh", ConfigSource::Env("B".into())),
            ConfigValue::new("visible", ConfigSource::Literal),
        ]);
        assert_eq!(
            r.redact("x abcdefgh y abcd visible"),
            "x [redacted] y [redacted] visible"
        );
    }
}
