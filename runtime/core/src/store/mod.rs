//! The shared store every instance of a cluster claims runs in, and its backends.
//!
//! [`Store`] is the contract of `DESIGN.md` ([`contract`]): every operation is atomic and reads
//! the time from the store's own clock. [`open`] picks a backend by URL scheme.

use std::sync::Arc;

pub mod contract;
pub(crate) mod model;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod url;

pub use contract::{Cause, ServerTime, StepFloor, Store, StoreError};
pub use url::{redact, take_timeout, DEFAULT_TIMEOUT, TIMEOUT_PARAMETER, TIMEOUT_RANGE};

/// The namespace used when none is given: `baton`.
pub const DEFAULT_NAMESPACE: &str = "baton";

/// Opens the store a URL names, in a namespace (several clusters can share one store):
/// `sqlite://PATH` (relative, or `sqlite:///absolute/path`), `redis://…`, `valkey://…`,
/// `postgres://…`; each may end in `?timeout=DURATION` (see [`TIMEOUT_PARAMETER`]).
pub async fn open(url: &str, namespace: &str) -> Result<Arc<dyn Store>, StoreError> {
    let (scheme, _) = url
        .split_once("://")
        .ok_or_else(|| StoreError::InvalidUrl {
            url: redact(url),
            reason: "expected SCHEME://…, e.g. sqlite://baton.db".into(),
        })?;
    match scheme {
        "sqlite" => {
            #[cfg(feature = "sqlite")]
            return sqlite::open(url, namespace).await;
            #[cfg(not(feature = "sqlite"))]
            return Err(not_built(scheme, "sqlite"));
        }
        "redis" | "rediss" | "valkey" | "valkeys" | "redis+cluster" | "rediss+cluster"
        | "valkey+cluster" | "valkeys+cluster" => {
            #[cfg(feature = "redis")]
            return redis::open(url, namespace).await;
            #[cfg(not(feature = "redis"))]
            return Err(not_built(scheme, "redis"));
        }
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            return postgres::open(url, namespace).await;
            #[cfg(not(feature = "postgres"))]
            return Err(not_built(scheme, "postgres"));
        }
        other => Err(StoreError::UnknownScheme {
            scheme: other.to_owned(),
        }),
    }
}

/// The error for a URL whose backend this build left out.
#[allow(dead_code)] // unused when every backend is built
fn not_built(scheme: &str, feature: &'static str) -> StoreError {
    StoreError::NotBuilt {
        scheme: scheme.to_owned(),
        feature,
    }
}
