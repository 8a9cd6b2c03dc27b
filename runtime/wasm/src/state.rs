//! `baton:job/state` (`wit/state.wit`, in `baton:job@0.2.0`): the job's own state, fenced by
//! the store. Every call goes to the attempt's [`StateHandle`], which the lease engine gives
//! each attempt; a write the store refuses answers `fenced` and aborts the attempt's signal.

use baton_core::state::StateRefusal;
use baton_core::state_handle::{StateError, StateHandle};

use crate::attempt::AttemptState;
use crate::bindings::v0_2::baton::job::state::{Error, Host};

/// The guest's error for a state call that failed.
fn to_guest(e: StateError) -> Error {
    match e {
        StateError::Fenced => Error::Fenced,
        StateError::Refused(refusal) => match refusal {
            StateRefusal::EmptyKey => Error::EmptyKey,
            StateRefusal::KeyTooLong { limit, .. } => Error::KeyTooLong(limit),
            StateRefusal::ValueTooLarge { limit, .. } => Error::ValueTooLarge(limit),
            StateRefusal::TooManyKeys { limit } => Error::TooManyKeys(limit),
            StateRefusal::NotAnInteger => Error::NotAnInteger,
            StateRefusal::Overflow => Error::Overflow,
        },
        StateError::Store(e) => Error::Store(e.to_string()),
    }
}

impl AttemptState {
    /// The attempt's state handle; an attempt run without one (outside an instance) has no
    /// state to reach.
    fn state(&self) -> Result<StateHandle, Error> {
        self.state.clone().ok_or_else(|| {
            Error::Store("this attempt runs without a store, so it has no job state".into())
        })
    }
}

impl Host for AttemptState {
    async fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, Error> {
        self.state()?.get(&key).await.map_err(to_guest)
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), Error> {
        self.state()?.set(&key, &value).await.map_err(to_guest)
    }

    async fn delete(&mut self, key: String) -> Result<bool, Error> {
        self.state()?.delete(&key).await.map_err(to_guest)
    }

    async fn list_keys(&mut self) -> Result<Vec<String>, Error> {
        self.state()?.list_keys().await.map_err(to_guest)
    }

    async fn increment(&mut self, key: String, delta: i64) -> Result<i64, Error> {
        self.state()?.increment(&key, delta).await.map_err(to_guest)
    }

    async fn compare_and_swap(
        &mut self,
        key: String,
        expected: Option<Vec<u8>>,
        new: Vec<u8>,
    ) -> Result<bool, Error> {
        self.state()?
            .compare_and_swap(&key, expected.as_deref(), &new)
            .await
            .map_err(to_guest)
    }
}
