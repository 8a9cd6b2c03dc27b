//! What a job is to the lease engine: anything that implements [`Handler`].
//!
//! The engine knows nothing of Wasm; the component host is one handler, native Rust closures
//! ([`handler_fn`]) another.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::lease::ClaimKind;

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
    clock: Option<Arc<dyn crate::env::Clock>>,
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// A reading of the clock that lease deadlines are kept on: nanoseconds since an arbitrary
/// start, counting the time the machine was suspended (`CLOCK_BOOTTIME` on Linux).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootTime(u64);

impl BootTime {
    /// Now.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub fn now() -> BootTime {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists since Linux 2.6.39.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        if rc != 0 {
            return BootTime::monotonic();
        }
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
        BootTime(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
    }

    /// Now.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub fn now() -> BootTime {
        BootTime::monotonic()
    }

    /// The reading `nanos` after the clock's start (a simulated lease clock's).
    pub fn from_nanos(nanos: u64) -> BootTime {
        BootTime(nanos)
    }

    fn monotonic() -> BootTime {
        BootTime(u64::try_from(base().elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The reading `d` later.
    pub fn after(self, d: Duration) -> BootTime {
        BootTime(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// The reading at `at`, converted through the two clocks' readings now.
    fn of(at: Instant) -> BootTime {
        let (boot, mono) = (BootTime::now(), Instant::now());
        match at.checked_duration_since(mono) {
            Some(ahead) => boot.after(ahead),
            None => BootTime(boot.0.saturating_sub(
                u64::try_from(mono.duration_since(at).as_nanos()).unwrap_or(u64::MAX),
            )),
        }
    }
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
            nanos: Arc::new(AtomicU64::new(at.0)),
            clock: None,
        }
    }

    /// A deadline at a reading of `clock`'s lease clock, kept on that clock.
    pub fn on_clock(at: BootTime, clock: Arc<dyn crate::env::Clock>) -> Self {
        LeaseDeadline {
            nanos: Arc::new(AtomicU64::new(at.0)),
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
        Duration::from_nanos(at.saturating_sub(self.now().0))
    }

    /// The deadline, as an instant of the monotonic clock (at or before now once it passed).
    pub fn get(&self) -> Instant {
        let at = self.nanos.load(Ordering::Acquire);
        let (boot, mono) = (self.now(), Instant::now());
        if at >= boot.0 {
            mono + Duration::from_nanos(at - boot.0)
        } else {
            mono.checked_sub(Duration::from_nanos(boot.0 - at))
                .unwrap_or(mono)
        }
    }

    /// Whether the deadline has passed, on the clock that runs through suspends.
    pub fn has_passed(&self) -> bool {
        self.now().0 >= self.nanos.load(Ordering::Acquire)
    }

    /// Moves the deadline to `at` if that is later. A renewal measured from a [`BootTime`]
    /// read when the heartbeat was sent stays right even if the machine was suspended while
    /// the heartbeat was on its way.
    pub(crate) fn extend_to(&self, at: BootTime) {
        self.nanos.fetch_max(at.0, Ordering::AcqRel);
    }
}

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
    /// The job's state, with writes fenced by this attempt's token (see [`crate::state`]).
    /// `None` for an attempt run outside an instance (a test or a benchmark that gives none).
    pub state: Option<crate::state::StateHandle>,
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

    #[cfg(target_os = "linux")]
    #[test]
    fn the_boot_clock_runs_at_least_as_far_as_the_monotonic_one() {
        let (b0, m0) = (BootTime::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (b1, m1) = (BootTime::now(), Instant::now());
        let boot = Duration::from_nanos(b1.0 - b0.0);
        assert!(boot + Duration::from_millis(1) >= m1 - m0, "{boot:?}");
    }
}
