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

/// The instant until which an attempt's lease is certainly alive, on the monotonic clock: the
/// send time of the last renewed heartbeat (or of the winning claim) plus the lease.
#[derive(Clone)]
pub struct LeaseDeadline {
    nanos: Arc<AtomicU64>,
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl LeaseDeadline {
    /// A deadline at `at`. The instance makes one per attempt; hosts and tests that run a
    /// handler on their own make their own.
    pub fn new(at: Instant) -> Self {
        let d = LeaseDeadline {
            nanos: Arc::new(AtomicU64::new(0)),
        };
        d.extend(at);
        d
    }

    /// The deadline.
    pub fn get(&self) -> Instant {
        base() + Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }

    /// Whether the deadline has passed.
    pub fn has_passed(&self) -> bool {
        Instant::now() >= self.get()
    }

    /// Moves the deadline to `at` if that is later.
    pub(crate) fn extend(&self, at: Instant) {
        let n = u64::try_from(at.saturating_duration_since(base()).as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_max(n, Ordering::AcqRel);
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
