//! The guest side of Baton: write a job as one function.
//!
//! ```ignore
//! baton_guest::job!(|info| {
//!     baton_guest::log::info!("hello from {} attempt {}", info.job, info.attempt);
//!     Ok(())
//! });
//! ```
//!
//! The crate is a `cdylib` built for `wasm32-wasip2`; the result is a component of the
//! `baton:job` world (`wit/baton-job.wit`). Return `Ok(())` for success and `Err(message)` for
//! failure. Check [`signal_aborted`] before side effects: the host stops a guest whose attempt
//! is lost or stopping by itself, but a job that checks can stop at a clean point.

/// The bindings generated from `wit/baton-job.wit`. [`job!`] uses them; a job rarely needs to.
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "job",
        pub_export_macro: true,
        export_macro_name: "__export_job",
        default_bindings_module: "baton_guest::bindings",
    });
}

pub use bindings::baton::job::host::{ClaimReason, Level, RunInfo};

/// What the attempt is: the job, the slot, the attempt number, the reason, the runner and the
/// fence value. The same on every call.
pub fn info() -> RunInfo {
    bindings::baton::job::host::info()
}

/// Whether the attempt must stop (lost, fenced, or the host is stopping).
pub fn signal_aborted() -> bool {
    bindings::baton::job::host::signal_aborted()
}

/// Writes one log line at `level`; the host tags it with job, slot and attempt.
pub fn log_line(level: Level, message: &str) {
    bindings::baton::job::host::log(level, message)
}

/// Structured logging through the host: `log::info!("{} rows", n)` and its siblings.
pub mod log {
    pub use crate::__baton_debug as debug;
    pub use crate::__baton_error as error;
    pub use crate::__baton_info as info;
    pub use crate::__baton_trace as trace;
    pub use crate::__baton_warn as warn;
}

#[doc(hidden)]
#[macro_export]
macro_rules! __baton_trace {
    ($($arg:tt)*) => { $crate::log_line($crate::Level::Trace, &::std::format!($($arg)*)) };
}
#[doc(hidden)]
#[macro_export]
macro_rules! __baton_debug {
    ($($arg:tt)*) => { $crate::log_line($crate::Level::Debug, &::std::format!($($arg)*)) };
}
#[doc(hidden)]
#[macro_export]
macro_rules! __baton_info {
    ($($arg:tt)*) => { $crate::log_line($crate::Level::Info, &::std::format!($($arg)*)) };
}
#[doc(hidden)]
#[macro_export]
macro_rules! __baton_warn {
    ($($arg:tt)*) => { $crate::log_line($crate::Level::Warn, &::std::format!($($arg)*)) };
}
#[doc(hidden)]
#[macro_export]
macro_rules! __baton_error {
    ($($arg:tt)*) => { $crate::log_line($crate::Level::Error, &::std::format!($($arg)*)) };
}

/// Makes this crate a Baton job: `job!(|info| { ...; Ok(()) })`. The closure gets the
/// attempt's [`RunInfo`] and returns `Result<(), String>`; it must not capture anything.
#[macro_export]
macro_rules! job {
    ($run:expr) => {
        struct __BatonJob;

        impl $crate::bindings::Guest for __BatonJob {
            fn run() -> ::std::result::Result<(), ::std::string::String> {
                let run: fn($crate::RunInfo) -> ::std::result::Result<(), ::std::string::String> =
                    $run;
                run($crate::info())
            }
        }

        $crate::bindings::__export_job!(__BatonJob);
    };
}
