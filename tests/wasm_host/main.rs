//! The Wasm host's tests: the guest components of `guests/`, run through their handlers, an
//! instance with a jobs directory, and the real `baton` binary.

mod boundary;
mod cli;
mod command;
mod guests;
mod jobs_dir;
mod latency;
mod state;
mod stopping;
mod support;
