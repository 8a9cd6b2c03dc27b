//! The one engine (epoch interruption, pooling allocator), the linker, and the compile cache:
//! each component is compiled once per file content and kept pre-instantiated.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};
use wasmtime_wasi_config::WasiConfig;

use super::attempt::AttemptState;
use super::bindings::{self, JobPre};
use super::disk_cache::{DiskCache, Skipped};
use super::LoadError;

/// How many guest instances may be alive at once on one host: 256. An attempt past it waits
/// for a slot of the pool and fails if none frees up.
pub const MAX_INSTANCES: u32 = 256;

/// The largest memory cap a job may ask for: 4 GiB, the size of a 32-bit memory.
pub const MAX_MEMORY: u64 = 4 << 30;

/// A component compiled and linked, ready to instantiate once per attempt.
pub struct LoadedComponent {
    /// The file it was loaded from.
    pub path: PathBuf,
    /// `sha256:` and the hex SHA-256 of the file's bytes.
    pub digest: String,
    /// Whether the compiled code came from the on-disk compile cache rather than a compile.
    pub from_disk_cache: bool,
    /// Whether a `baton:job` component also exports `wasi:cli/run` (a `main`), which is not
    /// what runs.
    pub also_a_command: bool,
    pub(crate) pre: JobPre,
}

impl LoadedComponent {
    /// The version of the `baton:job` world the component runs as: `0.2.0`, or `0.1.0` for a
    /// component built against the older world; `None` for a command.
    pub fn world_version(&self) -> Option<&'static str> {
        self.pre.version()
    }

    /// What kind of job the component is.
    pub fn kind(&self) -> ComponentKind {
        match self.pre.version() {
            Some(version) => ComponentKind::Job(version),
            None => ComponentKind::Command,
        }
    }
}

/// What kind of job a component is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComponentKind {
    /// A component of the `baton:job` world (it exports `run`), at this version.
    Job(&'static str),
    /// A command: a plain WASI program that exports `wasi:cli/run` (a `fn main` built for
    /// `wasm32-wasip2`), run with the job's `args` and the run's facts in `BATON_*` variables.
    Command,
}

impl std::fmt::Display for ComponentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ComponentKind::Job(version) => write!(f, "baton:job@{version}"),
            ComponentKind::Command => f.write_str("command (wasi:cli/run)"),
        }
    }
}

impl std::fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedComponent")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .field("kind", &self.kind())
            .finish()
    }
}

/// The engine, its linker and the compiled components.
pub(crate) struct Compiler {
    pub(crate) engine: Engine,
    linker: Linker<AttemptState>,
    cache: Mutex<HashMap<String, Weak<LoadedComponent>>>,
    disk: Option<DiskCache>,
}

/// The engine's configuration: epoch interruption on, the pooling allocator sized for
/// [`MAX_INSTANCES`] instances of up to [`MAX_MEMORY`] each.
fn config() -> Config {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(MAX_INSTANCES)
        .total_core_instances(MAX_INSTANCES * 8)
        .total_memories(MAX_INSTANCES * 2)
        .total_tables(MAX_INSTANCES * 8)
        .total_stacks(MAX_INSTANCES)
        .max_memory_size(usize::try_from(MAX_MEMORY).unwrap_or(usize::MAX));
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .wasm_component_model(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

impl Compiler {
    pub(crate) fn new(cache_dir: Option<&Path>) -> Result<Compiler, LoadError> {
        let engine = Engine::new(&config()).map_err(|e| LoadError::Engine {
            message: format!("{e:#}"),
        })?;
        let mut linker = Linker::new(&engine);
        // WASI 0.2, then only wasi:http's own interfaces on top (its full set would add the
        // shared ones twice), then wasi:config/store.
        let linked = wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .and_then(|()| wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker))
            .and_then(|()| {
                wasmtime_wasi_config::add_to_linker(&mut linker, |s: &mut AttemptState| {
                    WasiConfig::from(&s.config)
                })
            })
            .and_then(|()| bindings::add_to_linker(&mut linker));
        linked.map_err(|e| LoadError::Engine {
            message: format!("{e:#}"),
        })?;
        let disk = cache_dir.and_then(|dir| match DiskCache::new(dir, &engine) {
            Ok(cache) => Some(cache),
            Err(e) => {
                tracing::warn!(cache = %dir.display(), error = %e, "cannot use the compile cache; compiling every component");
                None
            }
        });
        Ok(Compiler {
            engine,
            linker,
            cache: Mutex::new(HashMap::new()),
            disk,
        })
    }

    /// Loads a component file: from the cache if a component with the same bytes is loaded,
    /// else compiled, checked against the world, and pre-instantiated.
    pub(crate) fn load(&self, path: &Path) -> Result<Arc<LoadedComponent>, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.retain(|_, weak| weak.strong_count() > 0);
            if let Some(found) = cache.get(&digest).and_then(Weak::upgrade) {
                if found.path == path {
                    return Ok(found);
                }
                // Same bytes at another path: share the compiled code, keep this path.
                let loaded = Arc::new(LoadedComponent {
                    path: path.to_path_buf(),
                    digest,
                    from_disk_cache: found.from_disk_cache,
                    also_a_command: found.also_a_command,
                    pre: found.pre.clone(),
                });
                return Ok(loaded);
            }
        }
        let loaded = Arc::new(self.compile(path, &bytes, digest.clone())?);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.insert(digest, Arc::downgrade(&loaded));
        Ok(loaded)
    }

    fn compile(
        &self,
        path: &Path,
        bytes: &[u8],
        digest: String,
    ) -> Result<LoadedComponent, LoadError> {
        let path = path.to_path_buf();
        if !bytes.starts_with(b"\0asm") {
            return Err(LoadError::NotWasm { path });
        }
        // A core module's version is 1 (layer 0); a component's layer is 1.
        if bytes.get(4..8) == Some(&[1, 0, 0, 0][..]) {
            return Err(LoadError::CoreModule { path });
        }
        let cached = self.disk.as_ref().and_then(|disk| {
            match disk.get(&self.engine, &digest) {
                Ok(component) => Some(component),
                Err(Skipped::Missing) => None,
                Err(why) => {
                    tracing::warn!(component = %path.display(), "compile cache entry ignored: {why}");
                    None
                }
            }
        });
        let from_disk_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => {
                let component = Component::from_binary(&self.engine, bytes).map_err(|e| {
                    LoadError::Compile {
                        path: path.clone(),
                        message: format!("{e:#}"),
                    }
                })?;
                if let Some(disk) = &self.disk {
                    disk.put(&digest, &component);
                }
                component
            }
        };
        let exports: Vec<String> = component
            .component_type()
            .exports(&self.engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        // A component that exports both `run` and `wasi:cli/run` is of the `baton:job` world.
        let job = exports.iter().any(|name| name == "run");
        let command = exports
            .iter()
            .any(|name| name.starts_with(bindings::COMMAND_EXPORT));
        if !job && !command {
            return Err(LoadError::NotAJob { path, exports });
        }
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Imports {
                path: path.clone(),
                message: format!("{e:#}"),
            })?;
        let pre = if job {
            JobPre::new(&self.engine, &component, pre)
        } else {
            JobPre::command(pre)
        }
        .map_err(|e| LoadError::WrongExport {
            path: path.clone(),
            message: format!("{e:#}"),
        })?;
        Ok(LoadedComponent {
            path,
            digest,
            from_disk_cache,
            also_a_command: job && command,
            pre,
        })
    }
}
