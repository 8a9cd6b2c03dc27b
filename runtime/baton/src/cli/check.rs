//! `baton jobs` and `baton check`: what a jobs directory holds and whether it would run, without
//! a store.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use baton_core::schedule::format_in;
use baton_wasm::jobs::{self, JobSpec};
use baton_wasm::{AllowedDirs, ComponentKind, HostConfig, LoadedComponent, WasmHost};

use super::config::DEFAULT_JOBS;
use super::run::AllowDirArgs;

/// How many upcoming slots `baton jobs` shows per job.
const SHOWN_SLOTS: usize = 5;

/// The options of `baton jobs`.
#[derive(clap::Args)]
pub struct JobsArgs {
    /// The jobs directory. [default: ./jobs]
    #[arg(long, env = "BATON_JOBS", default_value = DEFAULT_JOBS, hide_default_value = true)]
    jobs: PathBuf,
    /// Also show, from this store, which jobs are paused, since when, by whom and why.
    /// [default: none: the directory only]
    #[arg(long)]
    store: Option<String>,
    /// The namespace in `--store`.
    #[arg(long, env = "BATON_NAMESPACE", default_value = baton_core::store::DEFAULT_NAMESPACE)]
    namespace: String,
    #[command(flatten)]
    allow: AllowDirArgs,
}

/// The options of `baton check`.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// A component (`.wasm`), a job file (`.toml`, with its component beside it), or a jobs
    /// directory.
    path: PathBuf,
    #[command(flatten)]
    allow: AllowDirArgs,
}

/// A host with the same compile cache as `baton run` (`BATON_CACHE_DIR`, or the default).
fn host() -> anyhow::Result<WasmHost> {
    let given = std::env::var_os("BATON_CACHE_DIR").map(PathBuf::from);
    WasmHost::new(HostConfig {
        cache_dir: super::config::cache_dir(given),
        ..HostConfig::default()
    })
    .context("starting the wasm host")
}

/// Loads a job file and its component; the error names the file, the reason and the fix. The
/// text names the component: its digest and the version of the world it runs as.
fn validate(
    host: &WasmHost,
    toml: &Path,
    allowed: &AllowedDirs,
) -> anyhow::Result<(JobSpec, String)> {
    let spec = jobs::load_job(toml, allowed)?;
    let component = host.load(&spec.wasm_path)?;
    Ok((spec, describe(&component)))
}

/// `sha256:…, world baton:job@0.2.0`, or `sha256:…, command (wasi:cli/run)` for a plain
/// WASI program; a `baton:job` component that has a `main` too says which one runs.
fn describe(component: &LoadedComponent) -> String {
    match component.kind() {
        ComponentKind::Job(_) if component.also_a_command => format!(
            "{}, world {}; it exports wasi:cli/run too, but `run` is what runs",
            component.digest,
            component.kind()
        ),
        ComponentKind::Job(_) => format!("{}, world {}", component.digest, component.kind()),
        ComponentKind::Command => format!("{}, {}", component.digest, component.kind()),
    }
}

/// Every job file of a directory, sorted.
fn job_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        bail!(
            "jobs directory {} does not exist; create it (one <name>.toml beside each \
             <name>.wasm) or pass --jobs DIR",
            dir.display()
        );
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading jobs directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Lists each job of the directory, valid or not, with its schedule, zone and next slots.
pub async fn jobs(args: JobsArgs) -> anyhow::Result<()> {
    let paused = match &args.store {
        Some(url) => {
            let store = baton_core::store::open(url, &args.namespace)
                .await
                .with_context(|| format!("opening store {}", baton_core::store::redact(url)))?;
            store.paused().await.context("listing the paused jobs")?
        }
        None => Vec::new(),
    };
    let files = job_files(&args.jobs)?;
    if files.is_empty() {
        println!(
            "{} holds no job files (<name>.toml beside <name>.wasm)",
            args.jobs.display()
        );
        return Ok(());
    }
    let host = host()?;
    let allowed = args.allow.to_allowed()?;
    let now = chrono::Utc::now().timestamp_millis();
    for file in files {
        let name = file.file_stem().map(|s| s.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        match validate(&host, &file, &allowed) {
            Ok((spec, digest)) => {
                let zone = spec.schedule.time_zone();
                println!(
                    "{name}: valid; schedule {:?} in {zone}; component {digest}",
                    spec.schedule.expr()
                );
                if let Some(pause) = paused.iter().find(|p| p.job == name) {
                    println!("  {}", super::operate::describe(pause));
                }
                for slot in spec.schedule.upcoming(now, SHOWN_SLOTS) {
                    println!("  next {}", format_in(slot, zone));
                }
            }
            Err(e) => println!("{name}: invalid: {e:#}"),
        }
    }
    Ok(())
}

/// Checks a component, a job file, or every job of a directory; fails if any is invalid.
pub fn check(args: CheckArgs) -> anyhow::Result<()> {
    let path = &args.path;
    let host = host()?;
    let allowed = args.allow.to_allowed()?;
    let is = |ext: &str| path.extension().is_some_and(|x| x == ext);
    if is("wasm") {
        let component = host.load(path)?;
        println!("{}: ok ({})", path.display(), describe(&component));
        return Ok(());
    }
    if is("toml") {
        let (spec, digest) = validate(&host, path, &allowed)?;
        println!(
            "{}: ok; job {} runs {} ({digest})",
            path.display(),
            spec.name,
            spec.wasm_path.display()
        );
        return Ok(());
    }
    if !path.is_dir() {
        bail!(
            "{} is neither a .wasm component, a .toml job file nor a directory",
            path.display()
        );
    }
    let files = job_files(path)?;
    let mut invalid = 0;
    for file in &files {
        match validate(&host, file, &allowed) {
            Ok((_, digest)) => println!("{}: ok ({digest})", file.display()),
            Err(e) => {
                invalid += 1;
                println!("{e:#}");
            }
        }
    }
    if invalid > 0 {
        bail!("{invalid} of {} job files are invalid", files.len());
    }
    println!("{} job files, all valid", files.len());
    Ok(())
}
