//! The fence at the call: every side effect of a guest — an outbound request, a write in its
//! data directory — asks [`Gate::check`] first, synchronously, inside the host call.
//!
//! The gate closes once the attempt's lease is lost: a heartbeat was refused, the local lease
//! deadline passed (on the clock that runs through suspends, so a runner woken from a freeze or
//! a suspend finds it closed before it does anything), or the stop timeout gave the lease up.
//! A plain stop request (the host stopping, or a pause with `--stop`) does not close it: a handing-over attempt still holds its lease and may
//! finish its work. The epoch watchdog stops the guest as well, but a tick can come a
//! millisecond late; the gate does not wait for it.

use baton_core::instance::{AbortReason, LeaseDeadline, Signal};

use crate::attempt::StopCause;

/// One attempt's gate: its signal and its lease deadline. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Gate {
    signal: Signal,
    deadline: LeaseDeadline,
}

impl Gate {
    /// The gate of the attempt with this signal and deadline.
    pub(crate) fn new(signal: Signal, deadline: LeaseDeadline) -> Self {
        Gate { signal, deadline }
    }

    /// `Ok` while the attempt holds its lease; else why not. A deadline found passed here
    /// fences the attempt at once (its signal aborts, and the guest is stopped).
    pub(crate) fn check(&self) -> Result<(), StopCause> {
        match self.signal.reason() {
            Some(AbortReason::Lost) => return Err(StopCause::Lost),
            Some(AbortReason::Fenced) => return Err(StopCause::Fenced),
            Some(AbortReason::StopTimeout) => return Err(StopCause::StopTimeout),
            // Told to stop (the host stops, or the job was paused with `--stop`): the lease
            // is still held, so the guest may still finish what it does.
            Some(AbortReason::Stopping | AbortReason::Paused) | None => {}
        }
        if self.deadline.has_passed() {
            self.signal.abort(AbortReason::Fenced);
            return Err(StopCause::Fenced);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn gate(lease: Duration) -> (Gate, Signal) {
        let signal = Signal::new();
        let deadline = LeaseDeadline::new(Instant::now() + lease);
        (Gate::new(signal.clone(), deadline), signal)
    }

    #[test]
    fn a_stop_request_leaves_the_gate_open_and_a_lost_lease_closes_it() {
        let (g, signal) = gate(Duration::from_secs(60));
        assert_eq!(g.check(), Ok(()));
        signal.abort(AbortReason::Stopping);
        assert_eq!(g.check(), Ok(()));
        signal.abort(AbortReason::StopTimeout);
        assert_eq!(g.check(), Err(StopCause::StopTimeout));
        let (g, signal) = gate(Duration::from_secs(60));
        signal.abort(AbortReason::Lost);
        assert_eq!(g.check(), Err(StopCause::Lost));
    }

    #[test]
    fn a_passed_deadline_closes_the_gate_and_fences_the_attempt() {
        let (g, signal) = gate(Duration::ZERO);
        assert_eq!(g.check(), Err(StopCause::Fenced));
        assert_eq!(signal.reason(), Some(AbortReason::Fenced));
    }
}
