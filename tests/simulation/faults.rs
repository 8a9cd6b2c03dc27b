//! The store as each simulated node reaches it: the simulated store behind a fault layer the
//! seed drives. A call may be answered after a little latency, answered late, lost on the way
//! (not applied), applied with its answer lost, or delayed past the lease and applied after its
//! caller gave up; while the store is out of reach, every call fails after the timeout.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::lease::{
    ClaimOutcome, ClaimRequest, Finish, HeartbeatOutcome, LeaseOptions, Run, Token, TokenOutcome,
};
use baton_core::operate::{OperateOutcome, Operation, Operator, Request};
use baton_core::state::{StateEntry, StateKey, StateLimits, StateOutcome, StateWrite};
use baton_core::store::{Store, StoreError};
use rand::Rng;

use crate::world::{Faults, History};

/// How long a call waits for its answer before it fails as unanswered (a store URL's
/// `?timeout=2s`).
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Applied, answered after this latency.
    Answered(Duration),
    /// Lost on the way: not applied; the caller hears nothing until the timeout.
    Lost,
    /// Applied, but its answer lost: the caller hears nothing until the timeout.
    AnswerLost(Duration),
    /// Held on the way past the caller's timeout, applied this long after it was sent.
    Delayed(Duration),
}

/// The fault layer of one node.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    node: String,
    /// The faults; their rates are parts per thousand: lost, answer lost, delayed, slow.
    faults: Faults,
    history: History,
}

impl FaultyStore {
    /// The store as `node` reaches it.
    pub fn new(inner: Arc<dyn Store>, node: &str, faults: Faults, history: History) -> Self {
        FaultyStore {
            inner,
            node: node.to_owned(),
            faults,
            history,
        }
    }

    fn fate(&self, what: &str) -> Fate {
        let mut rng = self.faults.rng.lock().unwrap_or_else(|p| p.into_inner());
        let roll = rng.random_range(0..1000u32);
        let [lost, answer_lost, delayed, slow] = self.faults.rates;
        let latency = Duration::from_millis(rng.random_range(1..=20));
        let fate = if roll < lost {
            Fate::Lost
        } else if roll < lost + answer_lost {
            Fate::AnswerLost(latency)
        } else if roll < lost + answer_lost + delayed {
            Fate::Delayed(TIMEOUT + Duration::from_millis(rng.random_range(1..=12_000)))
        } else if roll < lost + answer_lost + delayed + slow {
            Fate::Answered(Duration::from_millis(rng.random_range(100..2_000)))
        } else {
            Fate::Answered(latency)
        };
        if !matches!(fate, Fate::Answered(_)) {
            self.history.note(format!("{} {what}: {fate:?}", self.node));
        }
        fate
    }

    fn unanswered(&self) -> StoreError {
        StoreError::Unreachable {
            store: "sim".into(),
            source: "no answer within the timeout".into(),
        }
    }

    /// Runs `call` as its fate says. `call` is applied at most once.
    async fn faulty<T: Send + 'static>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.fated(what, None, call).await
    }

    /// [`FaultyStore::faulty`] for a write of (`job`, `slot`): a failover may lose it, and
    /// where writes wait for the replica, one applied in the failover's lag is answered as not
    /// acknowledged.
    async fn write<T: Send + 'static>(
        &self,
        what: &str,
        write: (&'static str, &str, i64),
        call: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.fated(what, Some(write), call).await
    }

    /// The answer to a write applied now: as the store gave it, or not acknowledged.
    fn replicated<T>(
        &self,
        write: Option<(&'static str, &str, i64)>,
        answer: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some((operation, job, slot)) = write else {
            return answer;
        };
        let now = self.history.now_ms();
        let Some(failover) = self.faults.failovers.iter().find(|f| f.loses(now)) else {
            return answer;
        };
        if failover.acknowledged {
            return Err(StoreError::NotAcknowledged {
                store: "sim".into(),
                operation,
                acknowledged: 0,
                required: 1,
                timeout: Duration::from_millis(failover.lag_ms as u64),
            });
        }
        if answer.is_ok() {
            self.faults
                .lost_writes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((job.to_owned(), slot, self.node.clone()));
        }
        answer
    }

    async fn fated<T: Send + 'static>(
        &self,
        what: &str,
        write: Option<(&'static str, &str, i64)>,
        call: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        if self.faults.outages.contains(self.history.now_ms()) {
            tokio::time::sleep(TIMEOUT).await;
            return Err(self.unanswered());
        }
        match self.fate(what) {
            Fate::Answered(latency) => {
                tokio::time::sleep(latency / 2).await;
                let answer = self.replicated(write, call.await);
                tokio::time::sleep(latency / 2).await;
                answer
            }
            Fate::Lost => {
                tokio::time::sleep(TIMEOUT).await;
                Err(self.unanswered())
            }
            Fate::AnswerLost(latency) => {
                tokio::time::sleep(latency).await;
                let _ = call.await;
                tokio::time::sleep(TIMEOUT.saturating_sub(latency)).await;
                Err(self.unanswered())
            }
            Fate::Delayed(after) => {
                let outages = self.faults.outages.clone();
                let history = self.history.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    // A request held on the way still needs the store up when it arrives.
                    if !outages.contains(history.now_ms()) {
                        let _ = call.await;
                    }
                });
                tokio::time::sleep(TIMEOUT).await;
                Err(self.unanswered())
            }
        }
    }
}

/// A claim request with what it borrows owned, so a delayed claim can be applied later.
struct OwnedClaim {
    job: String,
    slot: i64,
    kind: baton_core::lease::ClaimKind,
    runner: String,
    token: Token,
    digest: Option<String>,
    options: LeaseOptions,
}

#[async_trait]
impl Store for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn now(&self) -> Result<i64, StoreError> {
        let inner = self.inner.clone();
        self.faulty("now", async move { inner.now().await }).await
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let owned = OwnedClaim {
            job: request.job.to_owned(),
            slot: request.slot,
            kind: request.kind,
            runner: request.runner.to_owned(),
            token: request.token,
            digest: request.digest.map(str::to_owned),
            options: *request.options,
        };
        let inner = self.inner.clone();
        let what = format!(
            "claim {} {} {}",
            request.job,
            request.slot,
            request.kind.as_str()
        );
        let write = ("claim", request.job, request.slot);
        self.write(&what, write, async move {
            inner
                .claim(&ClaimRequest {
                    job: &owned.job,
                    slot: owned.slot,
                    kind: owned.kind,
                    runner: &owned.runner,
                    token: owned.token,
                    digest: owned.digest.as_deref(),
                    options: &owned.options,
                })
                .await
        })
        .await
    }

    async fn heartbeat(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        lease: Duration,
    ) -> Result<HeartbeatOutcome, StoreError> {
        let (inner, owned) = (self.inner.clone(), job.to_owned());
        let what = format!("heartbeat {job} {slot}");
        self.write(&what, ("heartbeat", job, slot), async move {
            inner.heartbeat(&owned, slot, token, lease).await
        })
        .await
    }

    async fn finish(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        result: Finish,
    ) -> Result<TokenOutcome, StoreError> {
        let (inner, owned) = (self.inner.clone(), job.to_owned());
        let what = format!("finish {job} {slot}");
        self.write(&what, ("finish", job, slot), async move {
            inner.finish(&owned, slot, token, result).await
        })
        .await
    }

    async fn release(
        &self,
        job: &str,
        slot: i64,
        token: Token,
    ) -> Result<TokenOutcome, StoreError> {
        let (inner, owned) = (self.inner.clone(), job.to_owned());
        let what = format!("release {job} {slot}");
        self.write(&what, ("release", job, slot), async move {
            inner.release(&owned, slot, token).await
        })
        .await
    }

    async fn get(&self, job: &str, slot: i64) -> Result<Option<Run>, StoreError> {
        let (inner, owned) = (self.inner.clone(), job.to_owned());
        let what = format!("get {job} {slot}");
        self.faulty(&what, async move { inner.get(&owned, slot).await })
            .await
    }

    async fn unfinished(&self, job: &str) -> Result<Vec<Run>, StoreError> {
        let (inner, owned) = (self.inner.clone(), job.to_owned());
        let what = format!("unfinished {job}");
        self.faulty(&what, async move { inner.unfinished(&owned).await })
            .await
    }

    async fn history(&self, job: &str, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.inner.history(job, limit).await
    }

    async fn jobs(&self) -> Result<Vec<String>, StoreError> {
        self.inner.jobs().await
    }

    async fn forget_job(&self, job: &str) -> Result<(), StoreError> {
        self.inner.forget_job(job).await
    }

    async fn raw_primitive(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.raw_primitive(key).await
    }

    async fn clear_raw_primitive(&self, prefix: &str) -> Result<(), StoreError> {
        self.inner.clear_raw_primitive(prefix).await
    }

    async fn raw_release(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.raw_release(key).await
    }

    async fn state_get(&self, job: &str, key: &str) -> Result<Option<StateEntry>, StoreError> {
        self.inner.state_get(job, key).await
    }

    async fn state_keys(&self, job: &str) -> Result<Vec<StateKey>, StoreError> {
        self.inner.state_keys(job).await
    }

    async fn state_write(
        &self,
        job: &str,
        slot: i64,
        token: Token,
        write: &StateWrite<'_>,
        limits: &StateLimits,
    ) -> Result<StateOutcome, StoreError> {
        self.inner
            .state_write(job, slot, token, write, limits)
            .await
    }

    async fn state_remove(&self, job: &str, key: &str) -> Result<bool, StoreError> {
        self.inner.state_remove(job, key).await
    }

    fn round_trips(&self) -> u64 {
        self.inner.round_trips()
    }

    async fn operate(
        &self,
        job: &str,
        request: Request,
        by: &Operator,
    ) -> Result<OperateOutcome, StoreError> {
        self.inner.operate(job, request, by).await
    }

    async fn paused(&self) -> Result<Vec<Operation>, StoreError> {
        self.inner.paused().await
    }

    async fn operations(
        &self,
        job: Option<&str>,
        since: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, StoreError> {
        self.inner.operations(job, since, limit).await
    }
}
