//! The job's configuration: the `[config]` table of its job file, read through
//! `wasi:config/store`. Values the host read from an environment variable or a file are
//! secrets: the host redacts them from log lines, and a job should not print them either.

mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "baton:sdk/config",
        generate_all,
    });
}

use bindings::wasi::config::store;

fn message(e: store::Error) -> String {
    match e {
        store::Error::Upstream(m) | store::Error::Io(m) => m,
    }
}

/// The value of `key`, or `None` if the job file's `[config]` has no such key.
pub fn get(key: &str) -> Result<Option<String>, String> {
    store::get(key).map_err(|e| format!("cannot read config.{key}: {}", message(e)))
}

/// The value of `key`; an error that names the key and the job file's table if it is missing.
pub fn require(key: &str) -> Result<String, String> {
    get(key)?.ok_or_else(|| format!("config.{key} is not set; add it to [config] in the job file"))
}

/// Every key and value of the job's configuration.
pub fn all() -> Result<Vec<(String, String)>, String> {
    store::get_all().map_err(|e| format!("cannot read the config: {}", message(e)))
}
