//! The jobs directory is a boundary: every path a job file names (`[grants] data_dir`, a
//! `[config]` value's `file`) resolves beneath the jobs directory, or beneath a directory the
//! node's operator grants by name.
//!
//! A job file travels with its component: it is what a job's author ships. What of the host a
//! job may touch is the node's operator's choice, so the two are kept apart:
//!
//! - a job file names paths relative to its jobs directory: `data_dir = "data/report"`. An
//!   absolute path, a `..` that leaves the directory, or a symbolic link (at any depth) that
//!   leads out of it is refused when the job loads, with the file, the key, the path and the fix;
//! - the operator grants a directory elsewhere by name, `baton run --allow-dir exports=/srv/exports`
//!   (or `allow_dirs = { exports = "/srv/exports" }` in the config file), and a job file names it
//!   as `data_dir = "@exports"` or a directory beneath it, `"@exports/report"`.
//!
//! Paths are resolved by capability-based opens (`cap-std`, on which WASI's own sandbox is
//! built), not by looking at their text. A granted data directory is opened once, when the job
//! loads, and every attempt is given that very directory: a rename or a symbolic link swapped in
//! at its path afterwards does not redirect the guest's writes.

use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;

/// The text of cap-std's error for a path that would leave the directory it is resolved in.
const ESCAPE: &str = "a path led outside of the filesystem";

/// Directories outside the jobs directory that the node's operator grants, each by a name a job
/// file uses as `@NAME`. Defaults to none: a job may use nothing outside the jobs directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedDirs {
    dirs: BTreeMap<String, PathBuf>,
}

impl AllowedDirs {
    /// No directory granted.
    pub fn new() -> Self {
        AllowedDirs::default()
    }

    /// Grants `path` under `name`. A name is letters, digits, `-` and `_`; each is granted once.
    pub fn insert(&mut self, name: &str, path: impl Into<PathBuf>) -> Result<(), String> {
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(format!(
                "{name:?} is not a name for an allowed directory; use letters, digits, - and _"
            ));
        }
        if self.dirs.contains_key(name) {
            return Err(format!("the directory name {name:?} is granted twice"));
        }
        self.dirs.insert(name.to_owned(), path.into());
        Ok(())
    }

    /// Reads one `NAME=PATH` entry, as `--allow-dir` takes it.
    pub fn parse_entry(entry: &str) -> Result<(String, PathBuf), String> {
        match entry.split_once('=') {
            Some((name, path)) if !name.is_empty() && !path.is_empty() => {
                Ok((name.to_owned(), PathBuf::from(path)))
            }
            _ => Err(format!(
                "{entry:?} is not NAME=PATH, e.g. exports=/srv/exports"
            )),
        }
    }

    /// The granted directory of `name`.
    pub fn get(&self, name: &str) -> Option<&Path> {
        self.dirs.get(name).map(PathBuf::as_path)
    }

    /// Every grant, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.dirs.iter().map(|(n, p)| (n.as_str(), p.as_path()))
    }

    /// Whether nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }
}

/// A directory a job is granted, opened once: every attempt sees this very directory, whatever
/// is renamed or swapped in at its path later.
#[derive(Clone, Debug)]
pub struct GrantedDir {
    path: PathBuf,
    dir: Arc<Dir>,
}

impl GrantedDir {
    /// Opens a directory the caller itself chose (a library user, a test): no boundary applies.
    pub fn open(path: impl Into<PathBuf>) -> io::Result<GrantedDir> {
        let path = path.into();
        let dir = Dir::open_ambient_dir(&path, ambient_authority())?;
        Ok(GrantedDir {
            path,
            dir: Arc::new(dir),
        })
    }

    /// Where the directory was when it was opened (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path that opens this very directory through its open handle, wherever it is now.
    pub(crate) fn handle_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd()))
    }
}

/// Why a path of a job file is refused. Each message says what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The path is absolute.
    #[error("{path:?} is absolute; a job file may only name paths beneath its jobs directory {jobs}; to grant a directory elsewhere, the node's operator starts `baton run --allow-dir NAME={path}` and the job file names \"@NAME\"", path = .path.display(), jobs = .jobs.display())]
    Absolute {
        /// The path as written.
        path: PathBuf,
        /// The jobs directory.
        jobs: PathBuf,
    },
    /// The path leaves the directory it is resolved in, through `..` or a symbolic link.
    #[error("{path:?} leads outside {base} (through `..` or a symbolic link); name a path beneath it, or have the node's operator grant the other directory with `baton run --allow-dir NAME=PATH` and name \"@NAME\"", path = .path.display(), base = .base.display())]
    Outside {
        /// The path as written.
        path: PathBuf,
        /// The directory it must stay beneath.
        base: PathBuf,
    },
    /// The path names a directory the node does not grant.
    #[error("{path:?} names @{name}, which this node does not grant ({granted}); the node's operator grants it with `baton run --allow-dir {name}=PATH` (or allow_dirs in the config file)", path = .path.display())]
    NotGranted {
        /// The path as written.
        path: PathBuf,
        /// The name after `@`.
        name: String,
        /// What the node grants, for the message.
        granted: String,
    },
    /// The job's component is a symbolic link that leads outside the jobs directory.
    #[error("{path} is a symbolic link that leads outside the jobs directory; copy the component into the jobs directory instead", path = .path.display())]
    ComponentOutside {
        /// The component's path in the jobs directory.
        path: PathBuf,
    },
    /// A read-only data directory does not exist.
    #[error("{path} does not exist; create it, or grant it read-write so Baton creates it", path = .path.display())]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The path cannot be opened, read or created.
    #[error("{path}: {source}; create it or fix the path", path = .path.display())]
    Io {
        /// Where it was looked for.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Where a job file's paths may lead: its jobs directory, opened as a capability, and the
/// directories the node grants.
pub(crate) struct Boundary<'a> {
    jobs_path: PathBuf,
    jobs: Dir,
    allowed: &'a AllowedDirs,
}

/// A path of a job file resolved to a base directory and a path beneath it.
struct Resolved {
    base: Dir,
    base_path: PathBuf,
    rel: PathBuf,
}

impl Resolved {
    fn shown(&self) -> PathBuf {
        if self.rel.as_os_str().is_empty() {
            self.base_path.clone()
        } else {
            self.base_path.join(&self.rel)
        }
    }

    fn error(&self, written: &Path, source: io::Error) -> PathError {
        if source.to_string() == ESCAPE {
            PathError::Outside {
                path: written.to_path_buf(),
                base: self.base_path.clone(),
            }
        } else {
            PathError::Io {
                path: self.shown(),
                source,
            }
        }
    }
}

impl<'a> Boundary<'a> {
    /// The boundary of the jobs directory `jobs_path`, with the node's grants.
    pub(crate) fn open(jobs_path: &Path, allowed: &'a AllowedDirs) -> io::Result<Boundary<'a>> {
        let jobs = Dir::open_ambient_dir(jobs_path, ambient_authority())?;
        Ok(Boundary {
            jobs_path: jobs_path.to_path_buf(),
            jobs,
            allowed,
        })
    }

    /// Splits a path as written into the directory it is resolved in and the rest.
    fn resolve(&self, written: &Path) -> Result<Resolved, PathError> {
        let mut parts = written.components();
        let granted = match parts.clone().next() {
            Some(Component::Normal(first)) => first.to_str().and_then(|f| f.strip_prefix('@')),
            _ => None,
        };
        if let Some(name) = granted {
            parts.next();
            let Some(base_path) = self.allowed.get(name) else {
                let names: Vec<String> =
                    self.allowed.iter().map(|(n, _)| format!("@{n}")).collect();
                return Err(PathError::NotGranted {
                    path: written.to_path_buf(),
                    name: name.to_owned(),
                    granted: if names.is_empty() {
                        "it grants none".to_owned()
                    } else {
                        format!("it grants {}", names.join(", "))
                    },
                });
            };
            let base = Dir::open_ambient_dir(base_path, ambient_authority()).map_err(|source| {
                PathError::Io {
                    path: base_path.to_path_buf(),
                    source,
                }
            })?;
            return Ok(Resolved {
                base,
                base_path: base_path.to_path_buf(),
                rel: parts.as_path().to_path_buf(),
            });
        }
        if written.has_root() {
            return Err(PathError::Absolute {
                path: written.to_path_buf(),
                jobs: self.jobs_path.clone(),
            });
        }
        let base = self.jobs.try_clone().map_err(|source| PathError::Io {
            path: self.jobs_path.clone(),
            source,
        })?;
        Ok(Resolved {
            base,
            base_path: self.jobs_path.clone(),
            rel: written.to_path_buf(),
        })
    }

    /// Opens the data directory `written`; a read-write one is created if missing.
    pub(crate) fn data_dir(
        &self,
        written: &Path,
        read_only: bool,
    ) -> Result<GrantedDir, PathError> {
        let resolved = self.resolve(written)?;
        let rel = if resolved.rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            resolved.rel.as_path()
        };
        let dir = match resolved.base.open_dir(rel) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if read_only {
                    return Err(PathError::Missing {
                        path: resolved.shown(),
                    });
                }
                resolved
                    .base
                    .create_dir_all(rel)
                    .map_err(|e| resolved.error(written, e))?;
                resolved
                    .base
                    .open_dir(rel)
                    .map_err(|e| resolved.error(written, e))?
            }
            Err(e) => return Err(resolved.error(written, e)),
        };
        Ok(GrantedDir {
            path: resolved.shown(),
            dir: Arc::new(dir),
        })
    }

    /// Whether the job's component `file_name` is a file of the jobs directory (a link to it
    /// must stay inside too).
    pub(crate) fn has_component(&self, file_name: &Path) -> Result<bool, PathError> {
        match self.jobs.metadata(file_name) {
            Ok(meta) => Ok(meta.is_file()),
            Err(e) if e.to_string() == ESCAPE => Err(PathError::ComponentOutside {
                path: self.jobs_path.join(file_name),
            }),
            Err(_) => Ok(false),
        }
    }

    /// Reads the file `written`: where it is, and its text.
    pub(crate) fn read_file(&self, written: &Path) -> Result<(PathBuf, String), PathError> {
        let resolved = self.resolve(written)?;
        let text = resolved
            .base
            .read_to_string(&resolved.rel)
            .map_err(|e| resolved.error(written, e))?;
        Ok((resolved.shown(), text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowed_dir_entry_is_name_equals_path() {
        assert_eq!(
            AllowedDirs::parse_entry("exports=/srv/exports"),
            Ok(("exports".to_owned(), PathBuf::from("/srv/exports")))
        );
        for bad in ["exports", "=/srv", "exports="] {
            let message = AllowedDirs::parse_entry(bad).unwrap_err();
            assert!(message.contains("is not NAME=PATH"), "{message}");
        }
        let mut dirs = AllowedDirs::new();
        assert!(dirs.insert("a b", "/x").unwrap_err().contains("not a name"));
        dirs.insert("exports", "/srv/exports")
            .expect("a first grant");
        assert!(dirs
            .insert("exports", "/x")
            .unwrap_err()
            .contains("granted twice"));
    }

    #[test]
    fn paths_beneath_the_jobs_directory_resolve_and_others_are_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let jobs = root.path().join("jobs");
        std::fs::create_dir_all(jobs.join("data")).expect("mkdir");
        std::fs::create_dir_all(root.path().join("outside")).expect("mkdir");
        std::fs::write(root.path().join("outside/secret.txt"), "s").expect("write");
        std::os::unix::fs::symlink(root.path().join("outside"), jobs.join("link"))
            .expect("symlink");
        std::os::unix::fs::symlink("data", jobs.join("inner")).expect("symlink");
        let none = AllowedDirs::new();
        let b = Boundary::open(&jobs, &none).expect("open");
        assert_eq!(
            b.data_dir(Path::new("data"), true).expect("data").path(),
            jobs.join("data")
        );
        b.data_dir(Path::new("inner"), true)
            .expect("a link that stays inside");
        b.data_dir(Path::new("new/deep"), false)
            .expect("created beneath");
        assert!(jobs.join("new/deep").is_dir());
        for (written, outside) in [
            ("../outside", true),
            ("link", true),
            ("data/../../outside", true),
            ("/tmp", false),
        ] {
            let e = b.data_dir(Path::new(written), false).unwrap_err();
            match e {
                PathError::Outside { .. } if outside => {}
                PathError::Absolute { .. } if !outside => {}
                other => panic!("{written}: {other}"),
            }
        }
        assert!(matches!(
            b.read_file(Path::new("link/secret.txt")),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            b.data_dir(Path::new("@exports"), false),
            Err(PathError::NotGranted { .. })
        ));
        // A component that is a link leading out is refused; one that stays inside is found.
        std::fs::write(root.path().join("outside/job.wasm"), b"\0asm").expect("write");
        std::os::unix::fs::symlink(root.path().join("outside/job.wasm"), jobs.join("out.wasm"))
            .expect("symlink");
        std::fs::write(jobs.join("data/job.wasm"), b"\0asm").expect("write");
        std::os::unix::fs::symlink("data/job.wasm", jobs.join("in.wasm")).expect("symlink");
        assert!(matches!(
            b.has_component(Path::new("out.wasm")),
            Err(PathError::ComponentOutside { .. })
        ));
        assert!(b.has_component(Path::new("in.wasm")).expect("inside"));
        assert!(!b.has_component(Path::new("none.wasm")).expect("missing"));
    }

    #[test]
    fn a_granted_name_resolves_beneath_the_operators_directory() {
        let root = tempfile::tempdir().expect("tempdir");
        let jobs = root.path().join("jobs");
        std::fs::create_dir_all(&jobs).expect("mkdir");
        let exports = root.path().join("exports");
        std::fs::create_dir_all(&exports).expect("mkdir");
        let mut allowed = AllowedDirs::new();
        allowed.insert("exports", &exports).expect("grant");
        let b = Boundary::open(&jobs, &allowed).expect("open");
        assert_eq!(
            b.data_dir(Path::new("@exports"), true)
                .expect("granted")
                .path(),
            exports
        );
        assert_eq!(
            b.data_dir(Path::new("@exports/report"), false)
                .expect("beneath the grant")
                .path(),
            exports.join("report")
        );
        assert!(matches!(
            b.data_dir(Path::new("@exports/../jobs"), false),
            Err(PathError::Outside { .. })
        ));
    }
}
