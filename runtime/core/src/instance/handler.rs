//! What a job is to the lease engine: anything that implements [`Handler`].
//!
//! The engine knows nothing of Wasm; the component host is one handler, native Rust closures
//! ([`handler_fn`]) another.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::fence::{LeaseDeadline, Signal};
use crate::lease::ClaimKind;

/// What a handler is told about the attempt it runs.
#[derive(Clone)]
pub struct RunContext {
    /// The job's name.
    pub job: String,
    /// The slot, UTC ms.
    pub slot: i64,
    /// Which try this is (1 for the first).
    pub attempt: u32,
    /// Why the claim was sent.
    pub reason: ClaimKind,
    /// Who runs it (this instance).
    pub runner: String,
    /// The job's fence value for this attempt: strictly greater than every earlier attempt's.
    pub fence: u64,
    /// Aborted once the attempt must stop.
    pub signal: Signal,
    /// Until when the lease is certainly held.
    pub deadline: LeaseDeadline,
    /// The job's state, with writes fenced by this attempt's token (see [`crate::state_handle`]).
    /// `None` for an attempt run outside an instance (a test or a benchmark that gives none).
    pub state: Option<crate::state_handle::StateHandle>,
}

/// A job's work. Return `Ok` for success and `Err` with a message for failure (which is not
/// retried); on an aborted signal, returning `Err` hands the run over to a backup.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Runs one attempt.
    async fn run(&self, ctx: RunContext) -> Result<(), String>;

    /// The digest of what runs (e.g. a component's SHA-256), recorded with every attempt.
    fn digest(&self) -> Option<String> {
        None
    }
}

struct FnHandler<F>(F);

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    async fn run(&self, ctx: RunContext) -> Result<(), String> {
        (self.0)(ctx).await
    }
}

/// A handler from an async closure.
pub fn handler_fn<F, Fut>(f: F) -> Arc<dyn Handler>
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    Arc::new(FnHandler(f))
}
