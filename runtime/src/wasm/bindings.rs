//! The host side of `wit/baton-job.wit`: the generated bindings and the `host` interface.

use super::attempt::AttemptState;
use super::log::Level;

wasmtime::component::bindgen!({
    path: "../wit",
    world: "job",
    exports: { default: async },
});

pub(crate) use baton::job::host::{ClaimReason, RunInfo};

impl baton::job::host::Host for AttemptState {
    fn info(&mut self) -> RunInfo {
        self.info.clone()
    }

    fn signal_aborted(&mut self) -> bool {
        self.signal.is_aborted()
    }

    fn log(&mut self, level: baton::job::host::Level, message: String) {
        let level = match level {
            baton::job::host::Level::Trace => Level::Trace,
            baton::job::host::Level::Debug => Level::Debug,
            baton::job::host::Level::Info => Level::Info,
            baton::job::host::Level::Warn => Level::Warn,
            baton::job::host::Level::Error => Level::Error,
        };
        self.log.log(level, &message);
    }
}
