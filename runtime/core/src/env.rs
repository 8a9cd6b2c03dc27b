//! The seams between the lease engine and the world: the wall clock, the lease clock, the
//! randomness it draws, and where its tasks run.
//!
//! In production an instance reads the machine's clocks, draws from the operating system's
//! random source, and runs its lease engine on a runtime of its own ([`Env::default`]). The
//! deterministic simulation gives it clocks that follow tokio's paused time, a seeded random
//! source, and the runtime it was started on ([`Env::simulated`]), so that one seed decides
//! every choice of a run and the run replays exactly. Sleeping needs no seam of its own: the
//! instance sleeps on tokio's timer, which a simulation pauses and advances.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};

use crate::lease::Token;

/// Where an instance reads the time.
pub trait Clock: Send + Sync + 'static {
    /// The wall clock: ms since the Unix epoch. Slots fall due by it, corrected by the offset to
    /// the store's clock the instance measures.
    fn wall_ms(&self) -> i64;
    /// The clock lease deadlines are kept on: one that keeps running while the machine is
    /// suspended.
    fn lease_now(&self) -> BootTime;
}

/// Where an instance draws its random choices: backup delays, catch-up jitter, tokens.
pub trait Entropy: Send + Sync + 'static {
    /// A number in [0, 1).
    fn unit(&self) -> f64;
    /// A fresh claim token.
    fn token(&self) -> Token;
}

/// The machine's clocks: `SystemTime` and `CLOCK_BOOTTIME`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    fn lease_now(&self) -> BootTime {
        BootTime::now()
    }
}

/// The operating system's random source.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn unit(&self) -> f64 {
        rand::rng().random_range(0.0..1.0)
    }

    fn token(&self) -> Token {
        Token::random()
    }
}

/// A random source that one seed decides.
#[derive(Debug)]
pub struct SeededEntropy {
    rng: Mutex<rand::rngs::StdRng>,
}

impl SeededEntropy {
    /// The source of `seed`.
    pub fn new(seed: u64) -> Self {
        SeededEntropy {
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
        }
    }
}

impl Entropy for SeededEntropy {
    fn unit(&self) -> f64 {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        rng.random_range(0.0..1.0)
    }

    fn token(&self) -> Token {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        Token::from_bytes(rng.random())
    }
}

/// A clock that follows tokio's time (paused and advanced by a simulation), started at a given
/// wall-clock instant, with an offset a simulation may change (a node's clock off by minutes).
#[derive(Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
    start_wall_ms: i64,
    offset_ms: std::sync::atomic::AtomicI64,
}

impl TokioClock {
    /// A clock that reads `start_wall_ms` now. Call it inside the runtime whose time it follows.
    pub fn new(start_wall_ms: i64) -> Self {
        TokioClock {
            start: tokio::time::Instant::now(),
            start_wall_ms,
            offset_ms: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// Sets how far this clock's wall time is ahead of true time (negative: behind).
    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms
            .store(offset_ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX)
    }
}

impl Clock for TokioClock {
    fn wall_ms(&self) -> i64 {
        self.start_wall_ms
            + self.elapsed_ms()
            + self.offset_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lease_now(&self) -> BootTime {
        BootTime::from_nanos(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

/// A flag tasks wait on, woken in the order they began to wait, so that a simulation's run
/// depends on its seed alone (tokio's `watch` wakes its receivers in an order of its own
/// random choice).
#[derive(Debug, Default)]
pub struct Switch {
    on: std::sync::atomic::AtomicBool,
    changed: tokio::sync::Notify,
}

impl Switch {
    /// A switch that is off.
    pub fn new() -> Self {
        Switch::default()
    }

    /// Turns it on or off, waking every task that waits for a change.
    pub fn set(&self, on: bool) {
        self.on.store(on, std::sync::atomic::Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Whether it is on.
    pub fn is_on(&self) -> bool {
        self.on.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until it is `on` (at once if it is).
    pub async fn wait_for(&self, on: bool) {
        loop {
            let changed = self.changed.notified();
            if self.is_on() == on {
                return;
            }
            changed.await;
        }
    }
}

/// An instance's seams. Defaults to production: the machine's clocks, the operating system's
/// randomness, and a runtime of the instance's own for the lease engine.
#[derive(Clone)]
pub struct Env {
    /// The clocks.
    pub clock: Arc<dyn Clock>,
    /// The randomness.
    pub entropy: Arc<dyn Entropy>,
    /// Whether the lease engine runs on a runtime of its own (so a busy handler can never delay
    /// a heartbeat). When false, it runs on the runtime that started the instance, and stopping
    /// or dropping the instance cancels its tasks there.
    pub own_runtime: bool,
    /// A simulated freeze, on a shared runtime: while it is on none of the instance's tasks is
    /// polled, as in a process stopped by `SIGSTOP`; time goes on, and when it is off again
    /// every task resumes where it stood. Defaults to none.
    pub frozen: Option<Arc<Switch>>,
}

impl Default for Env {
    fn default() -> Self {
        Env {
            clock: Arc::new(SystemClock),
            entropy: Arc::new(OsEntropy),
            own_runtime: true,
            frozen: None,
        }
    }
}

impl Env {
    /// The seams of a simulated node: `clock`, randomness from `seed`, and the runtime that
    /// starts the instance.
    pub fn simulated(clock: Arc<dyn Clock>, seed: u64) -> Self {
        Env {
            clock,
            entropy: Arc::new(SeededEntropy::new(seed)),
            own_runtime: false,
            frozen: None,
        }
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("own_runtime", &self.own_runtime)
            .finish_non_exhaustive()
    }
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

    /// Nanoseconds since the clock's start.
    pub fn as_nanos(self) -> u64 {
        self.0
    }

    /// The reading `d` later.
    pub fn after(self, d: Duration) -> BootTime {
        BootTime(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// The reading at `at`, converted through the two clocks' readings now.
    pub(crate) fn of(at: Instant) -> BootTime {
        let (boot, mono) = (BootTime::now(), Instant::now());
        match at.checked_duration_since(mono) {
            Some(ahead) => boot.after(ahead),
            None => BootTime(boot.0.saturating_sub(
                u64::try_from(mono.duration_since(at).as_nanos()).unwrap_or(u64::MAX),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn the_boot_clock_runs_at_least_as_far_as_the_monotonic_one() {
        let (b0, m0) = (BootTime::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (b1, m1) = (BootTime::now(), Instant::now());
        let boot = Duration::from_nanos(b1.as_nanos() - b0.as_nanos());
        assert!(boot + Duration::from_millis(1) >= m1 - m0, "{boot:?}");
    }
}
