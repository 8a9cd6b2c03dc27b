//! The instance's line to the store: every call goes through it, so that it keeps the store's
//! clock as this host estimates it, and notices when the store is out of reach (the outage
//! tracker) and when it answers again.

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::outage::OutageTracker;
use crate::env::Clock;
use crate::store::{Store, StoreError};

/// The store, its clock as estimated here, and the outage going on, if any.
pub(super) struct StoreLink {
    store: Arc<dyn Store>,
    clock: StoreClock,
    outage: OutageTracker,
}

/// The store's clock as this host estimates it: its own clock plus a measured offset, so slots
/// fall due by the store's time, whatever this host's clock says.
struct StoreClock {
    clock: Arc<dyn Clock>,
    offset_ms: AtomicI64,
}

impl StoreLink {
    /// Measures the offset of the store's clock to `clock`, then gives the line to the store.
    pub(super) async fn connect(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> Result<StoreLink, StoreError> {
        let link = StoreLink {
            store,
            clock: StoreClock {
                clock,
                offset_ms: AtomicI64::new(0),
            },
            outage: OutageTracker::default(),
        };
        link.sync().await?;
        Ok(link)
    }

    /// The store.
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Now on the store's clock, as estimated here (ms since the epoch).
    pub(super) fn now(&self) -> i64 {
        self.clock.clock.wall_ms() + self.clock.offset_ms.load(Ordering::Relaxed)
    }

    /// Measures the store clock's offset again.
    pub(super) async fn sync(&self) -> Result<(), StoreError> {
        let before = self.clock.clock.wall_ms();
        let t0 = Instant::now();
        let store_now = self.store.now().await?;
        let half_trip = i64::try_from(t0.elapsed().as_millis() / 2).unwrap_or(0);
        self.clock
            .offset_ms
            .store(store_now - (before + half_trip), Ordering::Relaxed);
        Ok(())
    }

    /// Notes a store call that failed, or went unanswered, for a reason worth retrying (see
    /// [`OutageTracker`]).
    pub(super) fn failed(&self, error: &dyn std::fmt::Display) {
        self.outage.failed(self.now(), error);
    }

    /// Awaits a store call and notes its answer or its failure (see [`StoreLink::failed`]).
    pub(super) async fn observed<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = call.await;
        match &result {
            Ok(_) => self.outage.answered(self.now()),
            Err(e) if e.is_retryable() => self.failed(e),
            Err(_) => {}
        }
        result
    }

    /// Calls a store operation, retrying errors worth retrying for up to 2 s, unless `give_up`
    /// says to stop sooner (the instance stopping). A failure is noted as part of a store
    /// outage, which is logged once, not once per retry.
    pub(super) async fn retry<T, F, Fut>(
        &self,
        mut op: F,
        give_up: impl Fn() -> bool,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let until = Instant::now() + RETRY_FOR;
        loop {
            match self.observed(op()).await {
                Err(e) if e.is_retryable() && Instant::now() < until && !give_up() => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                other => return other,
            }
        }
    }
}

/// How long [`StoreLink::retry`] sends a call again: 2 s.
const RETRY_FOR: Duration = Duration::from_secs(2);

/// The pause between two sends of [`StoreLink::retry`]: 100 ms.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
