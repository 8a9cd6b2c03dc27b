//! One fixture function per backend; the conformance suite runs every case against each.

use crate::Fixture;

/// A fresh SQLite file in a temporary directory.
pub async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("baton.db").display());
    Fixture::open(url, Some(Box::new(dir))).await
}

pub mod postgres;
pub mod redis;
