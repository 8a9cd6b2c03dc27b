//! Locks of the instance's parts: a lock whose holder panicked is taken as it is, since every
//! value behind one stays whole between two statements.

use std::sync::{Mutex, MutexGuard};

/// Takes `m`'s lock, poisoned or not.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
