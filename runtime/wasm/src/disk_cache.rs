//! Compiled components on disk, so that a restart does not compile large components again.
//!
//! An entry is `<dir>/<sha256 of the component>-<engine key>.cwasm` with a sidecar `.sha256`
//! holding the digest of the compiled bytes. The engine key hashes this build of Baton and the
//! engine's compatibility hash (wasmtime's version and every setting that changes code), so an
//! entry of another build or configuration is never looked at. An entry is used only when:
//!
//! - the directory belongs to this user and nobody else may write to it (as ssh asks of its
//!   keys): compiled code is run as it is, so only this user may have written it;
//! - the compiled bytes match their sidecar digest (a torn or damaged file is ignored);
//! - wasmtime recognises them as a compiled component of a compatible engine.
//!
//! Anything else is ignored (and logged): the component is compiled again and the entry
//! rewritten. Entries are written to a temporary file and renamed, so none is ever half-written.
//!
//! The directory is opened once, as a capability, and every entry is read and written through
//! it: an entry that is a symbolic link leading out of the directory is never followed.

use cap_std::fs::MetadataExt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, Precompiled};

/// A directory of compiled components for one engine.
pub(crate) struct DiskCache {
    dir: PathBuf,
    root: Dir,
    engine_key: String,
}

/// Why an entry was not used (for the log line; the component is compiled instead).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Skipped {
    /// No entry yet.
    #[error("no entry")]
    Missing,
    /// The directory may be written by others.
    #[error("{dir} may be written by other users (or is not this user's); not trusting it")]
    Unsafe { dir: PathBuf },
    /// The bytes do not match their digest.
    #[error("{path} does not match its digest")]
    Damaged { path: PathBuf },
    /// wasmtime refused the bytes.
    #[error("{path}: {message}")]
    Refused { path: PathBuf, message: String },
}

impl DiskCache {
    /// A cache in `dir` (created if missing, mode 0700) for `engine`.
    pub(crate) fn new(dir: &Path, engine: &Engine) -> std::io::Result<DiskCache> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(DiskCache {
            dir: dir.to_path_buf(),
            root: Dir::open_ambient_dir(dir, ambient_authority())?,
            engine_key: format!("{:016x}", hasher.finish()),
        })
    }

    /// The entry's file name in the directory.
    fn entry(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        PathBuf::from(format!("{hex}-{}.cwasm", self.engine_key))
    }

    /// Whether only this user may write to the directory.
    fn is_safe(&self) -> bool {
        let Ok(meta) = self.root.dir_metadata() else {
            return false;
        };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        meta.uid() == me && meta.mode() & 0o022 == 0
    }

    /// The compiled component of `digest`, if a trustworthy entry exists.
    pub(crate) fn get(&self, engine: &Engine, digest: &str) -> Result<Component, Skipped> {
        let name = self.entry(digest);
        let path = self.dir.join(&name);
        if !self.root.exists(&name) {
            return Err(Skipped::Missing);
        }
        if !self.is_safe() {
            return Err(Skipped::Unsafe {
                dir: self.dir.clone(),
            });
        }
        let bytes = self.root.read(&name).map_err(|_| Skipped::Missing)?;
        let expected = self
            .root
            .read_to_string(name.with_extension("sha256"))
            .unwrap_or_default();
        if hex::encode(Sha256::digest(&bytes)) != expected.trim() {
            return Err(Skipped::Damaged { path });
        }
        if Engine::detect_precompiled(&bytes) != Some(Precompiled::Component) {
            return Err(Skipped::Refused {
                path,
                message: "not a compiled component".into(),
            });
        }
        // SAFETY: the bytes are wasmtime's own output for this engine's configuration: written
        // by this user into a directory only this user can write, and unchanged since (their
        // digest matches). wasmtime checks the version and settings once more.
        unsafe { Component::deserialize(engine, &bytes) }.map_err(|e| Skipped::Refused {
            path,
            message: format!("{e:#}"),
        })
    }

    /// Writes the compiled component of `digest`; a failure only costs a compile next time.
    pub(crate) fn put(&self, digest: &str, component: &Component) {
        let name = self.entry(digest);
        let root = &self.root;
        // Written under a temporary name, then renamed into place.
        let put = |to: &Path, tmp: &Path, bytes: &[u8]| -> Result<(), String> {
            root.write(tmp, bytes).map_err(|e| e.to_string())?;
            root.rename(tmp, root, to).map_err(|e| e.to_string())
        };
        let write = || -> Result<(), String> {
            let bytes = component.serialize().map_err(|e| e.to_string())?;
            let sum = hex::encode(Sha256::digest(&bytes));
            let pid = std::process::id();
            put(&name, &name.with_extension(format!("tmp{pid}")), &bytes)?;
            put(
                &name.with_extension("sha256"),
                &name.with_extension(format!("sha256.tmp{pid}")),
                sum.as_bytes(),
            )
        };
        if let Err(e) = write() {
            tracing::warn!(cache = %self.dir.display(), error = %e, "cannot write a compiled component to the cache");
        }
    }
}
