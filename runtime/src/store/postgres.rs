//! The PostgreSQL store (to come).

use std::sync::Arc;

use super::{Store, StoreError};

/// Opens a PostgreSQL store from a `postgres://` or `postgresql://` URL.
pub async fn open(_url: &str, _namespace: &str) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::UnknownScheme {
        scheme: "postgres (not built yet)".into(),
    })
}
