//! The host side of the guest worlds: one module of generated bindings per version of
//! `baton:job` the host runs, and the choice between them for each component.
//!
//! - [`v0_2`]: `wit/baton-job.wit`, the current world (`claim-reason` has `manual`).
//! - [`v0_1`]: `wit/v0.1.0/baton-job.wit`, frozen: its components load and run unchanged.
//!
//! A component is run as the version of `baton:job` it imports; one that imports no Baton
//! interface at all is run as the current version (`run` is the same in every version).

use wasmtime::component::{Component, HasSelf, InstancePre, Linker};
use wasmtime::{Engine, Store};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::I32Exit;

use super::attempt::AttemptState;
use baton_core::lease::ClaimKind;

pub(crate) mod v0_1;
pub(crate) mod v0_2;

/// The versions of the `baton:job` package this host runs, newest first.
pub const WORLD_VERSIONS: [&str; 2] = ["0.2.0", "0.1.0"];

/// What the guest's `info()` answers, whatever version of the world it was built against.
#[derive(Clone, Debug)]
pub(crate) struct AttemptInfo {
    pub(crate) job: String,
    pub(crate) slot: i64,
    pub(crate) attempt: u32,
    pub(crate) kind: ClaimKind,
    pub(crate) runner: String,
    pub(crate) fence: u64,
}

/// A component pre-instantiated against the version of the world it was built for, or as a
/// plain WASI program.
#[derive(Clone)]
pub(crate) enum JobPre {
    /// Built against `baton:job@0.2.0`, or importing nothing of Baton.
    V0_2(v0_2::JobPre<AttemptState>),
    /// Built against `baton:job@0.1.0`.
    V0_1(v0_1::JobPre<AttemptState>),
    /// A command: a program that exports `wasi:cli/run` (a `fn main` built for
    /// `wasm32-wasip2`), run with the job's arguments and the run's facts in its environment.
    Command(CommandPre<AttemptState>),
}

/// The export that makes a component a command: `wasi:cli/run`, at a WASI 0.2 version.
pub(crate) const COMMAND_EXPORT: &str = "wasi:cli/run@0.2";

impl JobPre {
    /// Checks the component's `run` export against the version it imports.
    pub(crate) fn new(
        engine: &Engine,
        component: &Component,
        pre: InstancePre<AttemptState>,
    ) -> wasmtime::Result<JobPre> {
        if world_version(engine, component) == Some("0.1.0") {
            Ok(JobPre::V0_1(v0_1::JobPre::new(pre)?))
        } else {
            Ok(JobPre::V0_2(v0_2::JobPre::new(pre)?))
        }
    }

    /// Checks a command's `wasi:cli/run` export.
    pub(crate) fn command(pre: InstancePre<AttemptState>) -> wasmtime::Result<JobPre> {
        Ok(JobPre::Command(CommandPre::new(pre)?))
    }

    /// The version of `baton:job` the component runs as, e.g. `0.2.0`; a command runs as none.
    pub(crate) fn version(&self) -> Option<&'static str> {
        match self {
            JobPre::V0_2(_) => Some("0.2.0"),
            JobPre::V0_1(_) => Some("0.1.0"),
            JobPre::Command(_) => None,
        }
    }

    /// Instantiates the component in `store`, tells `started`, and calls `run`.
    pub(crate) async fn run(
        &self,
        store: &mut Store<AttemptState>,
        started: impl FnOnce(),
    ) -> wasmtime::Result<Result<(), String>> {
        match self {
            JobPre::V0_2(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                started();
                job.call_run(store).await
            }
            JobPre::V0_1(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                started();
                job.call_run(store).await
            }
            JobPre::Command(pre) => {
                let command = pre.instantiate_async(&mut *store).await?;
                started();
                let status = match command.wasi_cli_run().call_run(&mut *store).await {
                    Ok(Ok(())) => 0,
                    Ok(Err(())) => 1,
                    Err(e) => match e.downcast_ref::<I32Exit>() {
                        Some(I32Exit(status)) => *status,
                        None => return Err(e),
                    },
                };
                if status == 0 {
                    return Ok(Ok(()));
                }
                let mut reason = format!("exited with status {status}");
                if let Some(tail) = store.data().log.stderr_tail() {
                    reason.push_str(": ");
                    reason.push_str(&tail);
                }
                Ok(Err(reason))
            }
        }
    }
}

/// The version of `baton:job` whose interfaces the component imports, if it imports any.
fn world_version(engine: &Engine, component: &Component) -> Option<&'static str> {
    component
        .component_type()
        .imports(engine)
        .find_map(|(name, _)| {
            let version = name.strip_prefix("baton:job/")?.split_once('@')?.1;
            WORLD_VERSIONS.into_iter().find(|v| *v == version)
        })
}

/// Adds every version's host interfaces to the linker.
pub(crate) fn add_to_linker(linker: &mut Linker<AttemptState>) -> wasmtime::Result<()> {
    v0_2::Job::add_to_linker::<_, HasSelf<AttemptState>>(linker, |s| s)?;
    v0_1::Job::add_to_linker::<_, HasSelf<AttemptState>>(linker, |s| s)
}

/// Implements a version's `host` interface for [`AttemptState`], inside the module that holds
/// that version's generated bindings: every version answers alike, but for a manual run, which
/// a version answers with the `ClaimReason` it is given (`Manual` from 0.2.0 on; 0.1.0 has none,
/// and tells its guests `Scheduled`).
macro_rules! impl_host {
    (manual = $manual:ident) => {
        use self::baton::job::host::{ClaimReason, Host, Level, RunInfo};
        use super::AttemptInfo;
        use crate::attempt::AttemptState;
        use baton_core::lease::ClaimKind;

        impl From<&AttemptInfo> for RunInfo {
            fn from(info: &AttemptInfo) -> RunInfo {
                RunInfo {
                    job: info.job.clone(),
                    slot: info.slot,
                    attempt: info.attempt,
                    reason: match info.kind {
                        ClaimKind::Scheduled => ClaimReason::Scheduled,
                        ClaimKind::CatchUp => ClaimReason::CatchUp,
                        ClaimKind::Takeover => ClaimReason::Takeover,
                        ClaimKind::Manual => ClaimReason::$manual,
                    },
                    runner: info.runner.clone(),
                    fence: info.fence,
                }
            }
        }

        impl Host for AttemptState {
            fn info(&mut self) -> RunInfo {
                RunInfo::from(&self.info)
            }

            fn signal_aborted(&mut self) -> bool {
                self.signal.is_aborted()
            }

            fn log(&mut self, level: Level, message: String) {
                let level = match level {
                    Level::Trace => crate::log::Level::Trace,
                    Level::Debug => crate::log::Level::Debug,
                    Level::Info => crate::log::Level::Info,
                    Level::Warn => crate::log::Level::Warn,
                    Level::Error => crate::log::Level::Error,
                };
                self.log.log(level, &message);
            }
        }
    };
}
use impl_host;
