//! The Wasm host's tests: the guest components of `guests/`, run through their handlers, the
//! instance, the jobs directory and the real `baton` binary.

mod guests;
mod latency;
mod support;
