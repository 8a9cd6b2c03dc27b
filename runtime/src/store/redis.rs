//! The Redis and Valkey store (to come).

use std::sync::Arc;

use super::{Store, StoreError};

/// Opens a Redis or Valkey store from a `redis://`, `rediss://`, `valkey://` or `valkeys://` URL.
pub async fn open(_url: &str, _namespace: &str) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::UnknownScheme {
        scheme: "redis (not built yet)".into(),
    })
}
