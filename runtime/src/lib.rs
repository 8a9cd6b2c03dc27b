//! Baton: a distributed cron runtime for WebAssembly components.
//!
//! Every node runs the same host over the same jobs; for each scheduled slot of each job the
//! hosts race an atomic claim in one shared [`store`], the winner runs the job under a lease
//! ([`lease`]), and the others stand by as backups. The protocol is `spec/leases.md`.

pub mod bench;
pub mod http;
pub mod instance;
pub mod jobs;
pub mod lease;
pub mod metrics;
pub mod report;
pub mod schedule;
pub mod store;
pub mod wasm;
