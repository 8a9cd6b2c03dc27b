//! A jobs directory kept in step with an instance: every `<name>.toml` with its `<name>.wasm`
//! becomes a job; new, changed and removed files are picked up by polling (size and
//! modification time, then content). A file that cannot be used is reported with its path, the
//! reason and the fix, and every other job keeps running. An attempt in flight keeps the
//! version it started with.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::boundary::AllowedDirs;
use super::{load_job, JobError};
use crate::{LoadError, WasmHost};
use baton_core::instance::{Instance, InstanceError, Job};

/// How often a watched jobs directory is polled: every second.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Why a job of the directory is not running.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// The job file is malformed, names an unknown key, or has no component beside it.
    #[error(transparent)]
    Job(#[from] JobError),
    /// The component does not load, or the sandbox it is granted cannot be set up.
    #[error(transparent)]
    Component(#[from] LoadError),
    /// The instance refused the job.
    #[error("{path}: {source}", path = .path.display())]
    Instance {
        /// The job file.
        path: PathBuf,
        /// Why.
        #[source]
        source: InstanceError,
    },
}

/// What a scan changed.
#[derive(Debug)]
pub enum Change {
    /// A job was added, running the component with this digest.
    Added {
        /// The job.
        name: String,
        /// `sha256:…` of its component.
        digest: String,
    },
    /// A job's file or component changed; new attempts run the new version.
    Changed {
        /// The job.
        name: String,
        /// `sha256:…` of its component now.
        digest: String,
    },
    /// A job's file was removed (or became unusable after it ran): no more claims.
    Removed {
        /// The job.
        name: String,
    },
    /// A job cannot run; the error names the file, the reason and the fix.
    Failed {
        /// The job.
        name: String,
        /// Why.
        error: DirError,
    },
}

/// Size and modification time of a job's two files: a cheap test for "maybe changed".
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    toml: Option<(u64, SystemTime)>,
    wasm: Option<(u64, SystemTime)>,
}

fn stat(path: &Path) -> Option<(u64, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((
        meta.len(),
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
    ))
}

/// The job's content: the job file's text and the component's digest.
fn content(toml: &Path, wasm: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(toml).ok()?;
    let bytes = std::fs::read(wasm).ok()?;
    Some((
        text,
        format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
    ))
}

struct Entry {
    fingerprint: Fingerprint,
    content: Option<(String, String)>,
    running: bool,
}

/// A jobs directory and what of it runs in an instance.
pub struct JobsDirectory {
    dir: PathBuf,
    host: WasmHost,
    allowed: AllowedDirs,
    entries: HashMap<String, Entry>,
}

impl JobsDirectory {
    /// A directory whose jobs run on `host`, with no directory outside it granted; nothing is
    /// loaded until [`JobsDirectory::sync`].
    pub fn new(dir: impl Into<PathBuf>, host: WasmHost) -> Self {
        JobsDirectory {
            dir: dir.into(),
            host,
            allowed: AllowedDirs::new(),
            entries: HashMap::new(),
        }
    }

    /// The directories outside the jobs directory that its job files may name as `@NAME`.
    pub fn with_allowed_dirs(mut self, allowed: AllowedDirs) -> Self {
        self.allowed = allowed;
        self
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Scans the directory once and brings the instance in step: adds new jobs, replaces
    /// changed ones, removes deleted ones. Each change is logged and returned.
    pub fn sync(&mut self, instance: &Instance) -> std::io::Result<Vec<Change>> {
        let mut found = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|x| x == "toml") {
                if let Some(name) = path.file_stem().and_then(|s| s.to_str()) {
                    found.insert(name.to_owned(), path.clone());
                }
            }
        }
        let mut changes = Vec::new();
        let gone: Vec<String> = self
            .entries
            .keys()
            .filter(|name| !found.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            if let Some(entry) = self.entries.remove(&name) {
                if entry.running {
                    instance.remove_job(&name);
                    changes.push(Change::Removed { name });
                }
            }
        }
        for (name, toml) in found {
            let wasm = toml.with_extension("wasm");
            let fingerprint = Fingerprint {
                toml: stat(&toml),
                wasm: stat(&wasm),
            };
            let known = self.entries.get(&name);
            if known.is_some_and(|e| e.fingerprint == fingerprint) {
                continue;
            }
            let was_running = known.is_some_and(|e| e.running);
            let now = content(&toml, &wasm);
            if let Some(entry) = self.entries.get_mut(&name) {
                // Touched, not changed: nothing to reload.
                if now.is_some() && entry.content == now {
                    entry.fingerprint = fingerprint;
                    continue;
                }
            }
            let change = match self.load(&toml) {
                Ok(job) => {
                    let digest = job.handler.digest().unwrap_or_default();
                    match instance.upsert_job(job) {
                        Ok(()) if was_running => Change::Changed {
                            name: name.clone(),
                            digest,
                        },
                        Ok(()) => Change::Added {
                            name: name.clone(),
                            digest,
                        },
                        Err(source) => Change::Failed {
                            name: name.clone(),
                            error: DirError::Instance {
                                path: toml.clone(),
                                source,
                            },
                        },
                    }
                }
                Err(error) => Change::Failed {
                    name: name.clone(),
                    error,
                },
            };
            let running = match &change {
                Change::Failed { .. } => {
                    if was_running {
                        instance.remove_job(&name);
                    }
                    false
                }
                _ => true,
            };
            self.entries.insert(
                name,
                Entry {
                    fingerprint,
                    content: now,
                    running,
                },
            );
            changes.push(change);
        }
        for change in &changes {
            log_change(change);
        }
        Ok(changes)
    }

    fn load(&self, toml: &Path) -> Result<Job, DirError> {
        let spec = load_job(toml, &self.allowed)?;
        let handler = self.host.job(&spec)?;
        Ok(Job {
            name: spec.name,
            schedule: spec.schedule,
            options: spec.options,
            handler: Arc::new(handler),
        })
    }

    /// Polls the directory every `every` and syncs the instance, on a thread of its own, until
    /// the returned [`Watcher`] is dropped.
    pub fn watch(mut self, instance: Arc<Instance>, every: Duration) -> std::io::Result<Watcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("baton-jobs-watch".into())
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) {
                    std::thread::sleep(every);
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    if let Err(e) = self.sync(&instance) {
                        tracing::error!(dir = %self.dir.display(), error = %e, "cannot read the jobs directory");
                    }
                }
            })?;
        Ok(Watcher { stop })
    }
}

/// A running watch of a jobs directory; dropping it ends the watch.
pub struct Watcher {
    stop: Arc<AtomicBool>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn log_change(change: &Change) {
    match change {
        Change::Added { name, digest } => {
            tracing::info!(job = %name, %digest, "job added");
        }
        Change::Changed { name, digest } => {
            tracing::info!(job = %name, %digest, "job changed; new attempts run the new version");
        }
        Change::Removed { name } => tracing::info!(job = %name, "job removed"),
        Change::Failed { name, error } => {
            tracing::error!(job = %name, "job not running: {error}");
        }
    }
}
