//! Baton's lease engine: the protocol of `spec/leases.md` with no WebAssembly in it.
//!
//! Every node runs the same jobs over one shared [`store`]; for each scheduled slot
//! ([`schedule`]) of each job the nodes race an atomic claim, the winner runs the job under a
//! lease ([`lease`]), and the others stand by as backups. An [`instance::Instance`] runs the
//! per-job loops for any [`instance::Handler`]: a native closure ([`instance::handler_fn`]) or
//! the component host of the `baton-wasm` crate.
//!
//! The store backends are cargo features, all on by default: `sqlite`, `redis` (Redis and
//! Valkey, also as a cluster) and `postgres`. A build without one refuses its URLs with
//! [`store::StoreError::NotBuilt`].

pub mod duration;
pub mod env;
pub mod event;
pub mod fence;
pub mod instance;
pub mod lease;
pub mod metrics;
pub mod operate;
pub mod report;
pub mod schedule;
pub mod state;
pub mod state_handle;
pub mod store;
