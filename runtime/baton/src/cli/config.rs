//! The settings of `baton run`, from flags, `BATON_*` environment variables, a TOML file and
//! the defaults, in that order of precedence: a flag wins over the environment, the environment
//! over the file, the file over the default.
//!
//! The file (`--config FILE`, or `BATON_CONFIG`) takes the long names of the flags, with `_` for
//! `-`; a relative `jobs` path in it is taken from the file's own directory:
//!
//! ```toml
//! jobs = "jobs"                    # Defaults to ./jobs
//! store = "redis://cache:6379"     # Defaults to sqlite://baton.db
//! runner = "api-2"                 # Defaults to HOSTNAME-PID
//! namespace = "baton"              # Defaults to baton
//! stop_timeout = "30s"             # Defaults to 30 s
//! http = "127.0.0.1:9464"          # Defaults to off; a bare port is on 127.0.0.1
//! http_token = "…"                 # Defaults to none: the API's pause, resume, trigger refused
//! log_format = "json"              # Defaults to pretty
//! cache_dir = "/var/cache/baton"   # Defaults to $XDG_CACHE_HOME/baton or ~/.cache/baton; "off"
//! allow_dirs = { exports = "/srv/exports" }  # directories jobs may name as "@exports". Defaults to none
//! ```
//!
//! A relative `allow_dirs` path is taken from the file's directory too. `--allow-dir` flags (or
//! `BATON_ALLOW_DIR`), when given, replace the file's `allow_dirs` as a whole.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

use baton_wasm::AllowedDirs;

use super::run::RunArgs;
use super::LogFormat;

/// The jobs directory when none is given: `./jobs`.
pub const DEFAULT_JOBS: &str = "./jobs";
/// The store when none is given: `sqlite://baton.db`.
pub const DEFAULT_STORE: &str = "sqlite://baton.db";
/// How long running jobs get to stop when none is given: 30 s.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// What a config file may say; every key is optional and unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    jobs: Option<PathBuf>,
    store: Option<String>,
    runner: Option<String>,
    namespace: Option<String>,
    stop_timeout: Option<String>,
    http: Option<String>,
    http_token: Option<String>,
    log_format: Option<LogFormat>,
    cache_dir: Option<PathBuf>,
    allow_dirs: Option<std::collections::BTreeMap<String, PathBuf>>,
}

/// The settings `baton run` runs with, every one resolved.
#[derive(Debug)]
pub struct Settings {
    /// The jobs directory.
    pub jobs: PathBuf,
    /// The store URL (may hold a password: print it only through `store::redact`).
    pub store: String,
    /// This host's runner id.
    pub runner: String,
    /// The namespace in the store.
    pub namespace: String,
    /// How long running jobs get to stop on the first signal.
    pub stop_timeout: Duration,
    /// Where to serve `/metrics`, `/healthz`, `/readyz` and `/runs`, if anywhere.
    pub http: Option<String>,
    /// The bearer token the HTTP API's pause, resume and trigger need; without one they are
    /// refused.
    pub http_token: Option<String>,
    /// How log lines look.
    pub log_format: LogFormat,
    /// Where compiled components are kept across restarts; `None` when off.
    pub cache_dir: Option<PathBuf>,
    /// The directories outside the jobs directory that jobs may name as `@NAME`.
    pub allow_dirs: AllowedDirs,
}

impl Settings {
    /// Resolves the flags and environment (already merged by the parser: a flag wins) over the
    /// config file, over the defaults.
    pub fn resolve(args: RunArgs, log_format: Option<LogFormat>) -> anyhow::Result<Settings> {
        let file = match &args.config {
            Some(path) => read(path)?,
            None => FileConfig::default(),
        };
        let base = args
            .config
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let stop_timeout = match (args.stop_timeout, &file.stop_timeout) {
            (Some(d), _) => d,
            (None, Some(text)) => baton_core::duration::parse_duration(text).map_err(|e| {
                anyhow::anyhow!(
                    "{}: stop_timeout: {e}",
                    args.config.as_deref().unwrap_or(Path::new("")).display()
                )
            })?,
            (None, None) => DEFAULT_STOP_TIMEOUT,
        };
        let allow_dirs = if !args.allow.allow_dir.is_empty() {
            args.allow.to_allowed()?
        } else {
            let mut allowed = AllowedDirs::new();
            for (name, path) in file.allow_dirs.unwrap_or_default() {
                allowed.insert(&name, base.join(path)).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: allow_dirs: {e}",
                        args.config.as_deref().unwrap_or(Path::new("")).display()
                    )
                })?;
            }
            allowed
        };
        Ok(Settings {
            jobs: args
                .jobs
                .or_else(|| file.jobs.map(|j| base.join(j)))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_JOBS)),
            store: args
                .store
                .or(file.store)
                .unwrap_or_else(|| DEFAULT_STORE.to_owned()),
            runner: args.runner.or(file.runner).unwrap_or_else(default_runner),
            namespace: args
                .namespace
                .or(file.namespace)
                .unwrap_or_else(|| baton_core::store::DEFAULT_NAMESPACE.to_owned()),
            stop_timeout,
            http: args.http.or(file.http).map(|a| loopback_unless_told(&a)),
            http_token: args
                .http_token
                .or(file.http_token)
                .filter(|t| !t.is_empty()),
            log_format: log_format.or(file.log_format).unwrap_or_default(),
            cache_dir: cache_dir(args.cache_dir.or(file.cache_dir)),
            allow_dirs,
        })
    }
}

/// An HTTP address without a host (`9464` or `:9464`) is on the loopback interface:
/// `127.0.0.1:9464`. Any other address is taken as given.
fn loopback_unless_told(addr: &str) -> String {
    let port = addr.strip_prefix(':').unwrap_or(addr);
    if port.parse::<u16>().is_ok() {
        format!("127.0.0.1:{port}")
    } else {
        addr.to_owned()
    }
}

/// The compile cache: as given (`off` for none), else the default.
pub fn cache_dir(given: Option<PathBuf>) -> Option<PathBuf> {
    match given {
        Some(dir) if dir.as_os_str() == "off" => None,
        Some(dir) => Some(dir),
        None => baton_wasm::default_cache_dir(),
    }
}

fn read(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    match toml::from_str(&text) {
        Ok(file) => Ok(file),
        Err(e) => bail!(
            "config file {}: {}; the keys are jobs, store, runner, namespace, stop_timeout, \
             http, http_token, log_format, cache_dir and allow_dirs",
            path.display(),
            e.to_string().trim_end()
        ),
    }
}

/// This host's name and process id.
fn default_runner() -> String {
    format!("{}-{}", hostname(), std::process::id())
}

/// This machine's name: `$HOSTNAME`, else the kernel's, else `baton`.
pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .or_else(|_| std::fs::read_to_string("/etc/hostname"))
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "baton".to_owned())
}
