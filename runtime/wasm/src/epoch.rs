//! The epoch watchdog: one thread that ticks the engine's epoch while guests run, and checks
//! every running attempt's local lease deadline on each tick.
//!
//! Each tick makes every running guest call its epoch callback, which yields to the async
//! executor (so a CPU-bound guest cannot starve others) or traps if its attempt must stop. The
//! deadline check on this thread is what stops a zombie after a freeze: when the process wakes
//! from `SIGSTOP`, the first tick sees the passed deadline and aborts the attempt's signal,
//! before the guest's next heartbeat could even be sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use wasmtime::Engine;

use baton_core::instance::{AbortReason, LeaseDeadline, Signal};

/// How often the epoch ticks while any guest runs: 1 ms. A guest yields to the executor at
/// least this often, and a passed lease deadline is noticed within one tick.
pub const TICK: Duration = Duration::from_millis(1);

struct Watched {
    deadline: LeaseDeadline,
    signal: Signal,
}

struct Shared {
    engine: Engine,
    watched: Mutex<HashMap<u64, Watched>>,
    wake: Condvar,
    next_id: AtomicU64,
    shutdown: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The watchdog thread; it ends when the last handle is dropped.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

/// A running attempt under watch; dropping it ends the watch.
pub(crate) struct Watch {
    shared: Arc<Shared>,
    id: u64,
}

impl Watchdog {
    /// Starts the thread.
    pub(crate) fn start(engine: Engine) -> std::io::Result<Watchdog> {
        let shared = Arc::new(Shared {
            engine,
            watched: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
            next_id: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
        });
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("baton-epoch".into())
            .spawn(move || tick_loop(&thread_shared))?;
        Ok(Watchdog { shared })
    }

    /// Watches an attempt until the returned guard is dropped.
    pub(crate) fn watch(&self, deadline: LeaseDeadline, signal: Signal) -> Watch {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared.watched).insert(id, Watched { deadline, signal });
        self.shared.wake.notify_one();
        Watch {
            shared: self.shared.clone(),
            id,
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        lock(&self.shared.watched).remove(&self.id);
    }
}

fn tick_loop(shared: &Shared) {
    loop {
        let mut fenced = Vec::new();
        {
            let mut watched = lock(&shared.watched);
            while watched.is_empty() {
                if shared.shutdown.load(Ordering::Acquire) {
                    return;
                }
                watched = shared.wake.wait(watched).unwrap_or_else(|p| p.into_inner());
            }
            for w in watched.values() {
                if !w.signal.is_aborted() && w.deadline.has_passed() {
                    fenced.push(w.signal.clone());
                }
            }
        }
        // Aborting runs the host's hook, which flags the guest and bumps the epoch at once.
        for signal in fenced {
            signal.abort(AbortReason::Fenced);
        }
        shared.engine.increment_epoch();
        std::thread::sleep(TICK);
    }
}
