//! Where the lease engine's tasks run and when they end: the engine's runtime, the runtime
//! handlers run on, the stop that begins (no new claims, every sleep cut short) and the kill
//! that ends every task of an instance sharing its runtime with others.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;

use crate::env::Switch;

/// The instance's tasks, from spawn to stop.
pub(super) struct Lifecycle {
    /// Where the lease engine's tasks run.
    engine: Handle,
    /// Where handlers run: the runtime that started the instance.
    work: Handle,
    /// Whether the engine has a runtime of its own (see [`crate::env::Env::own_runtime`]).
    own_runtime: bool,
    /// A simulated freeze (see [`crate::env::Env::frozen`]).
    frozen: Option<Arc<Switch>>,
    stopping: AtomicBool,
    stop_notify: Notify,
    /// Set once the instance stops or is dropped, when its tasks share a runtime with others:
    /// every task it spawned ends at its next await.
    kill: Arc<Switch>,
}

impl Lifecycle {
    /// The tasks of an instance whose engine runs on `engine` and handlers on `work`.
    pub(super) fn new(
        engine: Handle,
        work: Handle,
        own_runtime: bool,
        frozen: Option<Arc<Switch>>,
    ) -> Self {
        Lifecycle {
            engine,
            work,
            own_runtime,
            frozen,
            stopping: AtomicBool::new(false),
            stop_notify: Notify::new(),
            kill: Arc::new(Switch::new()),
        }
    }

    /// Spawns one of the lease engine's tasks (see [`crate::env::Env::own_runtime`]).
    pub(super) fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.own_runtime {
            return self.engine.spawn(task);
        }
        let killed = self.kill.clone();
        let frozen = self.frozen.clone();
        self.engine.spawn(async move {
            tokio::select! {
                biased;
                () = killed.wait_for(true) => {}
                _ = unless_frozen(task, frozen) => {}
            }
        })
    }

    /// Spawns a handler's run on the runtime that started the instance.
    pub(super) fn spawn_work<F>(&self, run: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.work.spawn(run)
    }

    /// Whether stop has begun.
    pub(super) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Begins the stop: every sleep of the engine's ends now.
    pub(super) fn begin_stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.stop_notify.notify_waiters();
    }

    /// Ends every task spawned on a shared runtime at its next await.
    pub(super) fn kill(&self) {
        self.kill.set(true);
    }

    /// Sleeps for `d`, or until stop begins; returns whether the instance is stopping.
    pub(super) async fn sleep_or_stop(&self, d: Duration) -> bool {
        let stopped = self.stop_notify.notified();
        if self.is_stopping() {
            return true;
        }
        tokio::select! {
            biased;
            _ = stopped => true,
            _ = tokio::time::sleep(d) => self.is_stopping(),
        }
    }
}

/// Runs `task`, not polling it while `frozen` is on (see [`crate::env::Env::frozen`]).
async fn unless_frozen<F: Future<Output = ()>>(task: F, frozen: Option<Arc<Switch>>) {
    let Some(frozen) = frozen else {
        return task.await;
    };
    let mut task = std::pin::pin!(task);
    loop {
        frozen.wait_for(false).await;
        tokio::select! {
            biased;
            () = frozen.wait_for(true) => {}
            () = &mut task => return,
        }
    }
}
