//! What the SQLite store says about files it cannot use (each message names the path), and how
//! long it waits for another process's write lock (`?timeout=`).

use std::os::unix::fs::PermissionsExt;

use baton_core::store::{self, StoreError};

#[tokio::test]
async fn corrupt_file_is_refused_with_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("not-a-db.db");
    std::fs::write(&path, vec![b'x'; 8192]).expect("write");
    let url = format!("sqlite://{}", path.display());
    let err = store::open(&url, "ns").await.err().expect("refused");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("corrupt"), "{msg}");
}

#[tokio::test]
async fn read_only_file_is_refused_with_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ro.db");
    let url = format!("sqlite://{}", path.display());
    drop(store::open(&url, "ns").await.expect("create"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    let err = store::open(&url, "ns").await.err().expect("refused");
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("read-only"),
        "{msg}"
    );
}

#[tokio::test]
async fn file_of_a_newer_schema_is_refused_with_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("future.db");
    let url = format!("sqlite://{}", path.display());
    drop(store::open(&url, "ns").await.expect("create"));
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.pragma_update(None, "user_version", 99)
        .expect("set version");
    drop(conn);
    let err = store::open(&url, "ns").await.err().expect("refused");
    let msg = err.to_string();
    assert!(
        matches!(err, StoreError::NewerSchema { found: 99, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("upgrade Baton"),
        "{msg}"
    );
}

#[tokio::test]
async fn reopening_a_file_keeps_its_runs() {
    use baton_core::lease::{ClaimKind, ClaimOutcome, ClaimRequest, LeaseOptions, Token};
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("keep.db").display());
    let s = store::open(&url, "ns").await.expect("open");
    let slot = s.now().await.expect("now");
    let options = LeaseOptions::default();
    let req = ClaimRequest {
        job: "j",
        slot,
        kind: ClaimKind::Scheduled,
        runner: "r",
        token: Token::random(),
        digest: None,
        options: &options,
    };
    assert!(matches!(
        s.claim(&req).await.expect("claim"),
        ClaimOutcome::Won(_)
    ));
    drop(s);
    let again = store::open(&url, "ns").await.expect("reopen");
    assert!(
        again.get("j", slot).await.expect("get").is_some(),
        "nothing lost across a reopen"
    );
}

#[tokio::test]
async fn unknown_scheme_names_the_schemes_that_exist() {
    let err = store::open("mongodb://x", "ns")
        .await
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("\"mongodb\"") && msg.contains("sqlite://"),
        "{msg}"
    );
}

/// `?timeout=` is the busy timeout: a call waits that long for another process's write lock on
/// the file, and fails (retryably) after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_parameter_sets_how_long_a_call_waits_for_the_write_lock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("busy.db");
    let url = |timeout: &str| format!("sqlite://{}?timeout={timeout}", path.display());
    let impatient = store::open(&url("50ms"), "ns").await.expect("open");
    let patient = store::open(&url("10s"), "ns").await.expect("open");
    let release = baton_tests::lock_sqlite_file(&path);
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        drop(release);
    });
    let err = impatient
        .release("job", 0, baton_core::lease::Token::random())
        .await
        .expect_err("the write lock is held for 500 ms");
    assert!(err.is_retryable(), "{err}");
    patient
        .release("job", 0, baton_core::lease::Token::random())
        .await
        .expect("waits for the lock");
    holder.join().expect("the lock holder");
    let err = store::open(&url("later"), "ns")
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err:?}");
    assert!(err.to_string().contains("timeout parameter"), "{err}");
}
