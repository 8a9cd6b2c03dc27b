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

pub mod config;
pub mod http;

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

/// The job's own state, fenced by the store: typed helpers over `baton:job/state`.
///
/// ```ignore
/// use baton_guest::state;
/// let cursor: u64 = state::get_as("cursor")?.unwrap_or(0);
/// state::set_as("cursor", cursor + 100)?;
/// let runs = state::increment("runs", 1)?;
/// ```
///
/// Reads are plain. Every write carries this attempt's token, and the store refuses it with
/// [`Error::Fenced`] once the attempt no longer holds the run's lease: stop then, and return.
pub mod state {
    use std::fmt;
    use std::str::FromStr;

    use crate::bindings::baton::job::state as host;

    /// Why a state call failed; `Error::Fenced` when the store refused a write because this
    /// attempt no longer holds the run's lease. It implements `Display` and `std::error::Error`.
    pub use host::Error;


    /// A key's value as bytes, `None` when it has none.
    pub fn get(key: &str) -> Result<Option<Vec<u8>>, Error> {
        host::get(key)
    }

    /// Sets a key to bytes.
    pub fn set(key: &str, value: &[u8]) -> Result<(), Error> {
        host::set(key, value)
    }

    /// A key's value as UTF-8 text (invalid bytes replaced), `None` when it has none.
    pub fn get_string(key: &str) -> Result<Option<String>, Error> {
        Ok(get(key)?.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// A key's value parsed from its text (`u64`, `i64`, `bool`, …), `None` when it has none
    /// or its text does not parse as `T`.
    pub fn get_as<T: FromStr>(key: &str) -> Result<Option<T>, Error> {
        Ok(get_string(key)?.and_then(|s| s.parse().ok()))
    }

    /// Sets a key to a value's text (`to_string()`), which [`get_as`] parses back.
    pub fn set_as<T: fmt::Display>(key: &str, value: T) -> Result<(), Error> {
        set(key, value.to_string().as_bytes())
    }

    /// Deletes a key; answers whether it existed.
    pub fn delete(key: &str) -> Result<bool, Error> {
        host::delete(key)
    }

    /// Every key of the job, sorted.
    pub fn list_keys() -> Result<Vec<String>, Error> {
        host::list_keys()
    }

    /// Adds `delta` to a key's integer (0 when absent) and answers the sum.
    pub fn increment(key: &str, delta: i64) -> Result<i64, Error> {
        host::increment(key, delta)
    }

    /// Sets a key to `new` only if it holds `expected` now (`None`: only if absent); answers
    /// whether it did.
    pub fn compare_and_swap(key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool, Error> {
        host::compare_and_swap(key, expected, new)
    }
}
