//! The jobs directory: `<name>.wasm` beside `<name>.toml`.
//!
//! A job file says when the job runs, its lease options, its limits and what it is granted:
//!
//! ```toml
//! schedule = "*/5 * * * *"      # required: cron, 5 or 6 fields, or @hourly etc.
//! time_zone = "Europe/Berlin"   # IANA name. Defaults to UTC
//! lease = "30s"                 # the lease options, each with the spec's default
//! heartbeat = "5s"
//! max_attempts = 3
//! overlap = "skip"              # or "allow"
//! catch_up = "5m"
//! max_late = "30s"
//! history_size = 100
//! args = ["--since", "1h"]      # the program's arguments after argv[0], the job's name.
//!                               # Defaults to none
//!
//! [limits]
//! memory = "64MiB"              # the component's memory cap. Defaults to 64 MiB
//! run_timeout = "10m"           # an attempt is interrupted after this. Defaults to 10 min
//! http_requests = 100           # outbound requests per attempt. Defaults to 100
//! http_connect_timeout = "10s"  # the longest a request may wait to connect. Defaults to 10 s
//! http_first_byte_timeout = "30s"     # ... for the response to begin. Defaults to 30 s
//! http_between_bytes_timeout = "30s"  # ... between two parts of the response. Defaults to 30 s
//! http_response_size = "16MiB"  # the largest response body. Defaults to 16 MiB
//!
//! [grants]
//! data_dir = "data/report"      # a directory the job may use, beneath the jobs directory,
//!                               # or "@NAME/…" beneath one the node grants (--allow-dir)
//! data_dir_read_only = false    # Defaults to false (read-write)
//! env = { REPORT_TO = "ops" }   # environment variables, besides the run's BATON_* facts
//!                               # (which no name here may take). Defaults to none
//! allowed_outbound_hosts = ["https://api.example.com", "https://*.example.org"]  # Defaults to none
//!
//! [config]                      # what the guest reads through wasi:config/store. Defaults to none
//! url = "https://api.example.com/hook"   # a literal
//! token = { env = "API_TOKEN" } # a secret, from the host's environment when the job loads
//! key = { file = "secrets/key" }  # a secret, from a file beneath the jobs directory (or "@NAME/…")
//! ```
//!
//! Every path a job file names stays beneath the jobs directory (see [`boundary`]).
//!
//! Durations are a number and a unit: `ms`, `s`, `m`, `h` or `d`. Unknown keys are errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use baton_core::duration::parse_duration;
use baton_core::lease::{LeaseOptions, OptionsError, Overlap};

pub mod boundary;
pub mod directory;
use crate::config::{ConfigError, ConfigValue};
use crate::outbound::{AllowedHost, HttpLimits};
use baton_core::schedule::{Schedule, ScheduleError};
use boundary::{AllowedDirs, Boundary, GrantedDir, PathError};

/// The default memory cap of a job: 64 MiB.
pub const DEFAULT_MEMORY: u64 = 64 * 1024 * 1024;
/// The default run timeout of an attempt: 10 minutes.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// A job file that cannot be used. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The file cannot be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The job file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, names an unknown key, or has a value of the wrong type.
    #[error("{path}: {message}")]
    Toml {
        /// The job file.
        path: PathBuf,
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// A value is well-formed but not allowed.
    #[error("{path}: {key}: {message}")]
    Invalid {
        /// The job file.
        path: PathBuf,
        /// The key.
        key: &'static str,
        /// What is wrong and what to write instead.
        message: String,
    },
    /// The schedule does not parse.
    #[error("{path}: {source}")]
    Schedule {
        /// The job file.
        path: PathBuf,
        /// Why.
        #[source]
        source: ScheduleError,
    },
    /// A lease option is out of range.
    #[error("{path}: {source}")]
    Options {
        /// The job file.
        path: PathBuf,
        /// Why.
        #[source]
        source: OptionsError,
    },
    /// A path the job file names is refused: it leads outside the jobs directory, names a
    /// directory the node does not grant, or cannot be opened.
    #[error("{path}: {key}: {source}", path = .path.display())]
    Path {
        /// The job file.
        path: PathBuf,
        /// The key, e.g. `grants.data_dir`.
        key: &'static str,
        /// What is wrong and the fix.
        #[source]
        source: Box<PathError>,
    },
    /// A `[config]` value cannot be read (a missing variable or file). The message names the
    /// job, the key and the source, never a value.
    #[error("{path}: job {job}: {source}", path = .path.display())]
    Config {
        /// The job file.
        path: PathBuf,
        /// The job.
        job: String,
        /// Which key, from where, and why.
        #[source]
        source: ConfigError,
    },
    /// There is no component beside the job file.
    #[error("{path}: no component {wasm} beside it; build the job to that path")]
    MissingComponent {
        /// The job file.
        path: PathBuf,
        /// Where the component should be.
        wasm: PathBuf,
    },
}

/// A job's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The component's memory cap, bytes. Defaults to 64 MiB.
    pub memory: u64,
    /// How long an attempt may run before it is interrupted. Defaults to 10 min.
    pub run_timeout: Duration,
    /// The limits of outbound HTTP (see [`HttpLimits`] for the defaults).
    pub http: HttpLimits,
}

/// What a job is granted beyond the sandbox (which has no files, no network, no environment).
#[derive(Clone, Debug, Default)]
pub struct GrantSpec {
    /// A directory the job may use, beneath the jobs directory or a directory the node grants,
    /// opened when the job loaded (a read-write one created if missing). Defaults to none.
    pub data_dir: Option<GrantedDir>,
    /// Whether that directory is read-only. Defaults to false.
    pub data_dir_read_only: bool,
    /// Environment variables. Defaults to none.
    pub env: BTreeMap<String, String>,
    /// Where the job may send HTTP requests. Defaults to none: every request is denied.
    pub allowed_outbound_hosts: Vec<AllowedHost>,
}

/// A job, as its file describes it.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// The job's name: the file's stem.
    pub name: String,
    /// The job file.
    pub toml_path: PathBuf,
    /// The component beside it.
    pub wasm_path: PathBuf,
    /// When it runs.
    pub schedule: Schedule,
    /// Its lease options.
    pub options: LeaseOptions,
    /// Its limits.
    pub limits: Limits,
    /// What it is granted.
    pub grants: GrantSpec,
    /// Its configuration (`[config]`), values read when the job loaded; those from `env` or
    /// `file` are secrets. Defaults to none.
    pub config: BTreeMap<String, ConfigValue>,
    /// The program's arguments after `argv[0]` (the job's name). Defaults to none.
    pub args: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    memory: Option<String>,
    run_timeout: Option<String>,
    http_requests: Option<u32>,
    http_connect_timeout: Option<String>,
    http_first_byte_timeout: Option<String>,
    http_between_bytes_timeout: Option<String>,
    http_response_size: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGrants {
    data_dir: Option<PathBuf>,
    data_dir_read_only: Option<bool>,
    env: Option<BTreeMap<String, String>>,
    allowed_outbound_hosts: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    schedule: String,
    time_zone: Option<String>,
    lease: Option<String>,
    heartbeat: Option<String>,
    max_attempts: Option<u32>,
    overlap: Option<String>,
    catch_up: Option<String>,
    max_late: Option<String>,
    history_size: Option<u32>,
    args: Option<Vec<String>>,
    limits: Option<FileLimits>,
    grants: Option<FileGrants>,
    config: Option<toml::Table>,
}

/// The environment variables every run is given, with the run's facts: `BATON_JOB`,
/// `BATON_SLOT` (RFC 3339), `BATON_SLOT_MS`, `BATON_ATTEMPT`, `BATON_REASON`, `BATON_RUNNER` and
/// `BATON_FENCE`. A job file's `env` cannot set a name that starts with `BATON_`.
pub const FACTS_PREFIX: &str = "BATON_";

/// Refuses a granted variable whose name is reserved for the run's facts.
fn reserved_env(env: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    match env.keys().find(|k| k.starts_with(FACTS_PREFIX)) {
        Some(name) => Err(format!(
            "{name} is reserved: names that start with {FACTS_PREFIX} carry the run's facts (BATON_JOB, BATON_SLOT, BATON_SLOT_MS, BATON_ATTEMPT, BATON_REASON, BATON_RUNNER, BATON_FENCE); choose another name"
        )),
        None => Ok(env),
    }
}

/// Parses a size such as `64MiB`, `512KiB`, `1GiB` or a number of bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a size, e.g. \"64MiB\""))?;
    let factor = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}; use B, KiB, MiB or GiB"
            ))
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("{s:?} is out of range"))
}

/// A size as a person writes it: `64 MiB`, `512 KiB`, `1.5 GiB`, `100 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (factor, unit) in UNITS {
        if bytes >= factor {
            let n = bytes as f64 / factor as f64;
            return if bytes.is_multiple_of(factor) {
                format!("{} {unit}", bytes / factor)
            } else {
                format!("{n:.1} {unit}")
            };
        }
    }
    format!("{bytes} B")
}

/// Reads and validates one job file; the component is expected beside it. Every path it names
/// must stay beneath its directory, or beneath a directory of `allowed` (the node's grants).
pub fn load_job(toml_path: &Path, allowed: &AllowedDirs) -> Result<JobSpec, JobError> {
    let path = toml_path.to_path_buf();
    let text = std::fs::read_to_string(toml_path).map_err(|source| JobError::Read {
        path: path.clone(),
        source,
    })?;
    let file: JobFile = toml::from_str(&text).map_err(|e| JobError::Toml {
        path: path.clone(),
        message: e.to_string().trim_end().to_owned(),
    })?;
    let invalid = |key: &'static str, message: String| JobError::Invalid {
        path: path.clone(),
        key,
        message,
    };
    let duration = |key: &'static str, v: &Option<String>| -> Result<Option<Duration>, JobError> {
        v.as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|m| invalid(key, m))
    };
    let zone = file.time_zone.as_deref().unwrap_or("UTC");
    let schedule = Schedule::parse(&file.schedule, zone).map_err(|source| JobError::Schedule {
        path: path.clone(),
        source,
    })?;
    let mut options = match duration("lease", &file.lease)? {
        Some(lease) => LeaseOptions::with_lease(lease),
        None => LeaseOptions::default(),
    };
    if let Some(hb) = duration("heartbeat", &file.heartbeat)? {
        options.heartbeat = hb;
    }
    if let Some(n) = file.max_attempts {
        options.max_attempts = n;
    }
    if let Some(o) = &file.overlap {
        options.overlap = o
            .parse::<Overlap>()
            .map_err(|e| invalid("overlap", e.to_string()))?;
    }
    if let Some(d) = duration("catch_up", &file.catch_up)? {
        options.catch_up = d;
    }
    if let Some(d) = duration("max_late", &file.max_late)? {
        options.max_late = d;
    }
    if let Some(n) = file.history_size {
        options.history_size = n;
    }
    options.validate().map_err(|source| JobError::Options {
        path: path.clone(),
        source,
    })?;
    let limits = match &file.limits {
        None => Limits {
            memory: DEFAULT_MEMORY,
            run_timeout: DEFAULT_RUN_TIMEOUT,
            http: HttpLimits::default(),
        },
        Some(l) => {
            let defaults = HttpLimits::default();
            Limits {
                memory: l
                    .memory
                    .as_deref()
                    .map(parse_size)
                    .transpose()
                    .map_err(|m| invalid("limits.memory", m))?
                    .unwrap_or(DEFAULT_MEMORY),
                run_timeout: duration("limits.run_timeout", &l.run_timeout)?
                    .unwrap_or(DEFAULT_RUN_TIMEOUT),
                http: HttpLimits {
                    requests: l.http_requests.unwrap_or(defaults.requests),
                    connect_timeout: duration(
                        "limits.http_connect_timeout",
                        &l.http_connect_timeout,
                    )?
                    .unwrap_or(defaults.connect_timeout),
                    first_byte_timeout: duration(
                        "limits.http_first_byte_timeout",
                        &l.http_first_byte_timeout,
                    )?
                    .unwrap_or(defaults.first_byte_timeout),
                    between_bytes_timeout: duration(
                        "limits.http_between_bytes_timeout",
                        &l.http_between_bytes_timeout,
                    )?
                    .unwrap_or(defaults.between_bytes_timeout),
                    response_size: l
                        .http_response_size
                        .as_deref()
                        .map(parse_size)
                        .transpose()
                        .map_err(|m| invalid("limits.http_response_size", m))?
                        .unwrap_or(defaults.response_size),
                },
            }
        }
    };
    let base = match toml_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let boundary = Boundary::open(base, allowed).map_err(|source| JobError::Read {
        path: base.to_path_buf(),
        source,
    })?;
    let grants = match file.grants {
        None => GrantSpec::default(),
        Some(g) => GrantSpec {
            data_dir: g
                .data_dir
                .map(|d| boundary.data_dir(&d, g.data_dir_read_only.unwrap_or(false)))
                .transpose()
                .map_err(|source| JobError::Path {
                    path: path.clone(),
                    key: "grants.data_dir",
                    source: Box::new(source),
                })?,
            data_dir_read_only: g.data_dir_read_only.unwrap_or(false),
            env: reserved_env(g.env.unwrap_or_default()).map_err(|e| invalid("grants.env", e))?,
            allowed_outbound_hosts: g
                .allowed_outbound_hosts
                .unwrap_or_default()
                .iter()
                .map(|entry| entry.parse::<AllowedHost>())
                .collect::<Result<_, _>>()
                .map_err(|e| invalid("grants.allowed_outbound_hosts", e.to_string()))?,
        },
    };
    let name = toml_path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| invalid("name", "the file name is not valid UTF-8".into()))?
        .to_owned();
    let config = match &file.config {
        None => BTreeMap::new(),
        Some(table) => {
            crate::config::read(table, &boundary).map_err(|source| JobError::Config {
                path: path.clone(),
                job: name.clone(),
                source,
            })?
        }
    };
    let wasm_path = toml_path.with_extension("wasm");
    let wasm_name = Path::new(wasm_path.file_name().unwrap_or_default());
    let found = boundary
        .has_component(wasm_name)
        .map_err(|source| JobError::Path {
            path: path.clone(),
            key: "component",
            source: Box::new(source),
        })?;
    if !found {
        return Err(JobError::MissingComponent {
            path,
            wasm: wasm_path,
        });
    }
    Ok(JobSpec {
        name,
        toml_path: toml_path.to_path_buf(),
        wasm_path,
        schedule,
        options,
        limits,
        grants,
        config,
        args: file.args.unwrap_or_default(),
    })
}

/// Every job file (`*.toml`) in a directory, sorted by name, each loaded or with its error.
pub fn load_dir(
    dir: &Path,
    allowed: &AllowedDirs,
) -> std::io::Result<Vec<Result<JobSpec, JobError>>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    Ok(files.iter().map(|p| load_job(p, allowed)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, toml: &str) -> PathBuf {
        let p = dir.join(format!("{name}.toml"));
        std::fs::write(&p, toml).expect("write");
        std::fs::write(dir.join(format!("{name}.wasm")), b"\0asm").expect("write");
        p
    }

    #[test]
    fn a_minimal_job_gets_the_defaults() {
        let d = tempfile::tempdir().expect("tempdir");
        let job = load_job(
            &write(d.path(), "hello", "schedule = \"@hourly\"\n"),
            &AllowedDirs::new(),
        )
        .expect("valid");
        assert_eq!(job.name, "hello");
        assert_eq!(job.options, LeaseOptions::default());
        assert_eq!(job.limits.memory, 64 << 20);
        assert!(job.grants.data_dir.is_none() && job.grants.env.is_empty());
    }

    #[test]
    fn every_key_is_read() {
        let d = tempfile::tempdir().expect("tempdir");
        let toml = r#"
            schedule = "*/10 * * * * *"
            time_zone = "Europe/Berlin"
            lease = "600ms"
            heartbeat = "100ms"
            max_attempts = 5
            overlap = "allow"
            catch_up = "1m"
            max_late = "2s"
            history_size = 7
            [limits]
            memory = "16MiB"
            run_timeout = "30s"
            [grants]
            data_dir = "data"
            data_dir_read_only = true
            env = { A = "1" }
        "#;
        std::fs::create_dir(d.path().join("data")).expect("mkdir");
        let job = load_job(&write(d.path(), "full", toml), &AllowedDirs::new()).expect("valid");
        assert_eq!(job.options.lease, Duration::from_millis(600));
        assert_eq!(job.options.max_attempts, 5);
        assert_eq!(job.options.overlap, Overlap::Allow);
        assert_eq!(job.limits.memory, 16 << 20);
        assert_eq!(
            job.grants.data_dir.as_ref().map(|g| g.path().to_path_buf()),
            Some(d.path().join("data"))
        );
        assert!(job.grants.data_dir_read_only);
        assert_eq!(job.grants.env.get("A").map(String::as_str), Some("1"));
    }

    #[test]
    fn an_unknown_key_is_named_with_the_file() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = write(
            d.path(),
            "typo",
            "schedule = \"@hourly\"\nleese = \"30s\"\n",
        );
        let msg = load_job(&p, &AllowedDirs::new()).unwrap_err().to_string();
        assert!(msg.contains("typo.toml") && msg.contains("leese"), "{msg}");
    }

    #[test]
    fn bad_values_name_the_key_and_the_fix() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = write(d.path(), "bad", "schedule = \"@hourly\"\nlease = \"30\"\n");
        let msg = load_job(&p, &AllowedDirs::new()).unwrap_err().to_string();
        assert!(msg.contains("lease") && msg.contains("no unit"), "{msg}");
        let p = write(
            d.path(),
            "hb",
            "schedule = \"@hourly\"\nlease = \"10s\"\nheartbeat = \"5s\"\n",
        );
        let msg = load_job(&p, &AllowedDirs::new()).unwrap_err().to_string();
        assert!(
            msg.contains("hb.toml") && msg.contains("under half of lease"),
            "{msg}"
        );
        let p = write(d.path(), "cron", "schedule = \"every day\"\n");
        let msg = load_job(&p, &AllowedDirs::new()).unwrap_err().to_string();
        assert!(
            msg.contains("cron.toml") && msg.contains("invalid cron expression"),
            "{msg}"
        );
    }

    #[test]
    fn a_job_without_its_component_says_where_it_should_be() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("lonely.toml");
        std::fs::write(&p, "schedule = \"@hourly\"\n").expect("write");
        let msg = load_job(&p, &AllowedDirs::new()).unwrap_err().to_string();
        assert!(msg.contains("lonely.wasm"), "{msg}");
    }

    #[test]
    fn outbound_grants_limits_and_config_are_read() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(d.path().join("token"), "t0ken-from-file\n").expect("write");
        let toml = r#"
            schedule = "@hourly"
            [limits]
            http_requests = 3
            http_first_byte_timeout = "2s"
            http_response_size = "1KiB"
            [grants]
            allowed_outbound_hosts = ["http://127.0.0.1:8080", "https://*.example.org"]
            [config]
            url = "http://127.0.0.1:8080/hook"
            token = { file = "token" }
        "#;
        let job = load_job(&write(d.path(), "hook", toml), &AllowedDirs::new()).expect("valid");
        assert_eq!(job.limits.http.requests, 3);
        assert_eq!(job.limits.http.first_byte_timeout, Duration::from_secs(2));
        assert_eq!(job.limits.http.response_size, 1024);
        assert_eq!(
            job.limits.http.connect_timeout,
            HttpLimits::default().connect_timeout
        );
        assert_eq!(job.grants.allowed_outbound_hosts.len(), 2);
        assert_eq!(job.config["token"].expose(), "t0ken-from-file");
        assert!(!format!("{job:?}").contains("t0ken"));
    }

    #[test]
    fn a_malformed_allowed_host_names_the_file_the_key_and_the_entry() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = write(
            d.path(),
            "bad-host",
            "schedule = \"@hourly\"\n[grants]\nallowed_outbound_hosts = [\"api.example.com\"]\n",
        );
        let msg = load_job(&p, &AllowedDirs::new()).unwrap_err().to_string();
        assert!(
            msg.contains("bad-host.toml")
                && msg.contains("grants.allowed_outbound_hosts")
                && msg.contains("\"api.example.com\""),
            "{msg}"
        );
    }

    #[test]
    fn a_missing_secret_names_the_job_the_key_and_the_source() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = write(
            d.path(),
            "secretive",
            "schedule = \"@hourly\"\n[config]\ntoken = { env = \"BATON_JOBS_TEST_UNSET\" }\n",
        );
        let msg = load_job(&p, &AllowedDirs::new()).unwrap_err().to_string();
        assert!(
            msg.contains("job secretive")
                && msg.contains("config.token")
                && msg.contains("BATON_JOBS_TEST_UNSET"),
            "{msg}"
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert!(parse_size("1MB").is_err());
    }
}
