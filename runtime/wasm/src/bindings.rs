//! The host side of `wit/baton-job.wit`: the generated bindings and the `host` interface.

use super::attempt::AttemptState;
use super::log::Level;

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "job",
    exports: { default: async },
});

pub(crate) use self::baton::job::host::{ClaimReason, RunInfo};

impl self::baton::job::host::Host for AttemptState {
    fn info(&mut self) -> RunInfo {
        self.info.clone()
    }

    fn signal_aborted(&mut self) -> bool {
        self.signal.is_aborted()
    }

    fn log(&mut self, level: self::baton::job::host::Level, message: String) {
        let level = match level {
            self::baton::job::host::Level::Trace => Level::Trace,
            self::baton::job::host::Level::Debug => Level::Debug,
            self::baton::job::host::Level::Info => Level::Info,
            self::baton::job::host::Level::Warn => Level::Warn,
            self::baton::job::host::Level::Error => Level::Error,
        };
        self.log.log(level, &message);
    }
}
