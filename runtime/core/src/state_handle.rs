//! The job's state as an attempt reaches it: [`StateHandle`] knows the store, the job, the slot
//! and the attempt's token, and gives it to every write, so the store fences a write from an
//! attempt that is no longer current (see [`crate::state`]).

use std::sync::Arc;

use crate::fence::{AbortReason, LeaseDeadline, Signal};
use crate::lease::Token;
use crate::state::{StateLimits, StateOutcome, StateRefusal, StateWrite, Written};
use crate::store::{Store, StoreError};

/// What can go wrong with a state call made through a [`StateHandle`].
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The attempt is no longer the current attempt of a live run: the store refused the write
    /// (or the host knew already that the attempt's lease was lost). The attempt's signal is
    /// aborted.
    #[error(
        "fenced: this attempt no longer holds the run's lease, so its state write was refused"
    )]
    Fenced,
    /// The write was refused for what it asked.
    #[error(transparent)]
    Refused(#[from] StateRefusal),
    /// The store could not be asked, or failed. A write may or may not have been applied.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An attempt's way to its job's state: the store, the job, and the attempt's run and token.
/// Reads go to the store as they are; writes carry the token, and a refused write aborts the
/// attempt's signal ([`AbortReason::Lost`]).
#[derive(Clone)]
pub struct StateHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    store: Arc<dyn Store>,
    job: String,
    slot: i64,
    token: Token,
    limits: StateLimits,
    signal: Signal,
    deadline: LeaseDeadline,
}

impl StateHandle {
    /// A handle for the attempt of `job`'s run at `slot` that holds `token`, with its signal
    /// and its local lease deadline.
    pub fn new(
        store: Arc<dyn Store>,
        job: &str,
        slot: i64,
        token: Token,
        signal: Signal,
        deadline: LeaseDeadline,
    ) -> Self {
        StateHandle {
            inner: Arc::new(HandleInner {
                store,
                job: job.to_owned(),
                slot,
                token,
                limits: StateLimits::default(),
                signal,
                deadline,
            }),
        }
    }

    /// The same handle with other limits.
    pub fn with_limits(self, limits: StateLimits) -> Self {
        let i = &self.inner;
        StateHandle {
            inner: Arc::new(HandleInner {
                store: i.store.clone(),
                job: i.job.clone(),
                slot: i.slot,
                token: i.token,
                limits,
                signal: i.signal.clone(),
                deadline: i.deadline.clone(),
            }),
        }
    }

    /// The job whose state this is.
    pub fn job(&self) -> &str {
        &self.inner.job
    }

    /// The limits writes are held to.
    pub fn limits(&self) -> StateLimits {
        self.inner.limits
    }

    /// A key's value, if it has one.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        let i = &self.inner;
        Ok(i.store.state_get(&i.job, key).await?.map(|e| e.value))
    }

    /// Every key of the job, sorted.
    pub async fn list_keys(&self) -> Result<Vec<String>, StateError> {
        let i = &self.inner;
        let keys = i.store.state_keys(&i.job).await?;
        Ok(keys.into_iter().map(|k| k.key).collect())
    }

    /// Sets a key.
    pub async fn set(&self, key: &str, value: &[u8]) -> Result<(), StateError> {
        self.write(StateWrite::Set { key, value }).await.map(|_| ())
    }

    /// Deletes a key; answers whether it existed.
    pub async fn delete(&self, key: &str) -> Result<bool, StateError> {
        match self.write(StateWrite::Delete { key }).await? {
            Written::Deleted(existed) => Ok(existed),
            other => Err(self.unexpected(other)),
        }
    }

    /// Adds `by` to a key's integer (0 when absent); answers the sum.
    pub async fn increment(&self, key: &str, by: i64) -> Result<i64, StateError> {
        match self.write(StateWrite::Increment { key, by }).await? {
            Written::Incremented(sum) => Ok(sum),
            other => Err(self.unexpected(other)),
        }
    }

    /// Sets a key to `new` only if it holds `expected` now (`None`: absent); answers whether
    /// it did.
    pub async fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<bool, StateError> {
        match self
            .write(StateWrite::CompareAndSwap { key, expected, new })
            .await?
        {
            Written::Swapped(swapped) => Ok(swapped),
            other => Err(self.unexpected(other)),
        }
    }

    /// Sends one write. An attempt whose lease this host knows to be lost (a refused heartbeat,
    /// or its local deadline passed) is fenced without asking the store; any other is decided
    /// by the store.
    pub async fn write(&self, write: StateWrite<'_>) -> Result<Written, StateError> {
        let i = &self.inner;
        let lost = matches!(
            i.signal.reason(),
            Some(AbortReason::Lost | AbortReason::Fenced)
        );
        if lost || i.deadline.has_passed() {
            return Err(StateError::Fenced);
        }
        match i
            .store
            .state_write(&i.job, i.slot, i.token, &write, &i.limits)
            .await?
        {
            StateOutcome::Written(written) => Ok(written),
            StateOutcome::Fenced(_) => {
                i.signal.abort(AbortReason::Lost);
                Err(StateError::Fenced)
            }
            StateOutcome::Refused(refusal) => Err(StateError::Refused(refusal)),
        }
    }

    fn unexpected(&self, written: Written) -> StateError {
        StateError::Store(StoreError::Malformed {
            store: self.inner.store.backend().to_owned(),
            job: self.inner.job.clone(),
            reason: format!("unexpected answer to a state write: {written:?}"),
        })
    }
}
