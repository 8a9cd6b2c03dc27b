//! Fencing, as a running attempt sees it: its abort signal (the spec's `ctx.signal`) and its
//! local lease deadline, past which nothing it does may change the run (rule 4).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::env::{BootTime, Clock};

/// Why an attempt's signal was aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// A heartbeat was refused: another attempt holds the run now (fencing).
    Lost,
    /// The locally known lease deadline passed without a renewal: the attempt fenced itself.
    Fenced,
    /// The instance is stopping; a handler that stops now is handed over.
    Stopping,
    /// The stop timeout passed while the handler still ran.
    StopTimeout,
    /// An operator paused the job with `--stop`: a handler that stops now is recorded as
    /// failed, not handed over.
    Paused,
}

impl AbortReason {
    /// The reason's name, as events and logs say it.
    pub fn as_str(self) -> &'static str {
        match self {
            AbortReason::Lost => "lost",
            AbortReason::Fenced => "self-fenced",
            AbortReason::Stopping => "stopping",
            AbortReason::StopTimeout => "stop-timeout",
            AbortReason::Paused => "paused",
        }
    }

    fn code(self) -> u8 {
        match self {
            AbortReason::Lost => 1,
            AbortReason::Fenced => 2,
            AbortReason::Stopping => 3,
            AbortReason::StopTimeout => 4,
            AbortReason::Paused => 5,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => AbortReason::Lost,
            2 => AbortReason::Fenced,
            3 => AbortReason::Stopping,
            4 => AbortReason::StopTimeout,
            5 => AbortReason::Paused,
            _ => return None,
        })
    }
}

type AbortHook = Arc<dyn Fn(AbortReason) + Send + Sync>;

#[derive(Default)]
struct SignalInner {
    reason: AtomicU8,
    notify: Notify,
    hooks: Mutex<Vec<AbortHook>>,
}

/// The attempt's abort signal (the spec's `ctx.signal`): aborted once the attempt is lost,
/// fenced, or its instance is stopping. The first abort's reason sticks, except that a stop
/// timeout escalates a stopping signal to [`AbortReason::StopTimeout`].
#[derive(Clone, Default)]
pub struct Signal {
    inner: Arc<SignalInner>,
}

impl Signal {
    /// A signal that is not aborted.
    pub fn new() -> Self {
        Signal::default()
    }

    /// Whether the signal is aborted. Check it before side effects.
    pub fn is_aborted(&self) -> bool {
        self.inner.reason.load(Ordering::Acquire) != 0
    }

    /// Why the signal was aborted, if it was.
    pub fn reason(&self) -> Option<AbortReason> {
        AbortReason::from_code(self.inner.reason.load(Ordering::Acquire))
    }

    /// Resolves once the signal is aborted.
    pub async fn aborted(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.is_aborted() {
                return;
            }
            notified.await;
        }
    }

    /// Runs `hook` on the aborting thread when the signal is aborted (at once if it is already)
    /// and again when a stop timeout escalates it. Meant for hosts that must stop a guest the
    /// instant its attempt ends. A hook may see the same reason twice, so it must be idempotent.
    pub fn on_abort(&self, hook: impl Fn(AbortReason) + Send + Sync + 'static) {
        let hook: AbortHook = Arc::new(hook);
        self.inner
            .hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook.clone());
        if let Some(reason) = self.reason() {
            hook(reason);
        }
    }

    /// Aborts the signal; returns whether this call was the first. A stop timeout after a
    /// stop escalates the reason (and runs the hooks again); any other later abort is ignored.
    pub fn abort(&self, reason: AbortReason) -> bool {
        let first = self
            .inner
            .reason
            .compare_exchange(0, reason.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        let escalated = !first
            && reason == AbortReason::StopTimeout
            && self
                .inner
                .reason
                .compare_exchange(
                    AbortReason::Stopping.code(),
                    reason.code(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok();
        if first || escalated {
            let hooks = self
                .inner
                .hooks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            for hook in hooks {
                hook(reason);
            }
        }
        if first {
            self.inner.notify.notify_waiters();
        }
        first
    }
}

/// The instant until which an attempt's lease is certainly alive: the send time of the last
/// renewed heartbeat (or of the winning claim) plus the lease.
///
/// It is kept on a clock that keeps running while the machine is suspended or its VM paused
/// (`CLOCK_BOOTTIME` on Linux; the monotonic clock elsewhere), so a runner woken from a suspend
/// sees its lease passed at once, where the monotonic clock, which stood still, would not. The
/// API takes and gives [`Instant`]s, converted at the moment of the call.
#[derive(Clone)]
pub struct LeaseDeadline {
    nanos: Arc<AtomicU64>,
    /// The clock it is kept on: the machine's lease clock unless an instance's seams give
    /// another (a simulation's).
    clock: Option<Arc<dyn Clock>>,
}

impl LeaseDeadline {
    /// A deadline at `at`. The instance makes one per attempt; hosts and tests that run a
    /// handler on their own make their own.
    pub fn new(at: Instant) -> Self {
        LeaseDeadline::at(BootTime::of(at))
    }

    /// A deadline at a reading of the lease clock.
    pub fn at(at: BootTime) -> Self {
        LeaseDeadline {
            nanos: Arc::new(AtomicU64::new(at.as_nanos())),
            clock: None,
        }
    }

    /// A deadline at a reading of `clock`'s lease clock, kept on that clock.
    pub fn on_clock(at: BootTime, clock: Arc<dyn Clock>) -> Self {
        LeaseDeadline {
            nanos: Arc::new(AtomicU64::new(at.as_nanos())),
            clock: Some(clock),
        }
    }

    /// Now, on the clock this deadline is kept on.
    fn now(&self) -> BootTime {
        match &self.clock {
            Some(clock) => clock.lease_now(),
            None => BootTime::now(),
        }
    }

    /// How long until the deadline passes (zero once it has).
    pub fn remaining(&self) -> Duration {
        let at = self.nanos.load(Ordering::Acquire);
        Duration::from_nanos(at.saturating_sub(self.now().as_nanos()))
    }

    /// The deadline, as an instant of the monotonic clock (at or before now once it passed).
    pub fn get(&self) -> Instant {
        let at = self.nanos.load(Ordering::Acquire);
        let (boot, mono) = (self.now(), Instant::now());
        if at >= boot.as_nanos() {
            mono + Duration::from_nanos(at - boot.as_nanos())
        } else {
            mono.checked_sub(Duration::from_nanos(boot.as_nanos() - at))
                .unwrap_or(mono)
        }
    }

    /// Whether the deadline has passed, on the clock that runs through suspends.
    pub fn has_passed(&self) -> bool {
        self.now().as_nanos() >= self.nanos.load(Ordering::Acquire)
    }

    /// Moves the deadline to `at` if that is later. A renewal measured from a [`BootTime`]
    /// read when the heartbeat was sent stays right even if the machine was suspended while
    /// the heartbeat was on its way.
    pub(crate) fn extend_to(&self, at: BootTime) {
        self.nanos.fetch_max(at.as_nanos(), Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_deadline_is_kept_on_the_boot_clock_and_only_moves_forward() {
        let d = LeaseDeadline::new(Instant::now() + Duration::from_secs(10));
        assert!(!d.has_passed());
        let left = d.get().saturating_duration_since(Instant::now());
        assert!(
            left > Duration::from_secs(9) && left <= Duration::from_secs(10),
            "{left:?}"
        );
        d.extend_to(BootTime::now());
        assert!(!d.has_passed(), "an earlier renewal does not move it back");
        d.extend_to(BootTime::now().after(Duration::from_secs(20)));
        assert!(d.get() > Instant::now() + Duration::from_secs(19));
        let passed = LeaseDeadline::at(BootTime::now());
        assert!(passed.has_passed());
        assert!(passed.get() <= Instant::now());
    }
}
