//! `baton state`: a job's keys with their writers, one value, `--json`, and the operator's
//! delete, read from a SQLite store that an attempt wrote through the store contract.

use std::time::Duration;

use baton_core::lease::{ClaimKind, ClaimOutcome, ClaimRequest, LeaseOptions, Token};
use baton_core::state::{StateLimits, StateOutcome, StateWrite, Written};
use baton_tests::process::baton;
use serde_json::Value;

/// Wins a run of `job` in `url` and writes `writes` with its token; returns the lease's fence.
fn write_as_an_attempt(url: &str, job: &str, writes: &[(&str, &[u8])]) -> u64 {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(async {
        let store = baton_core::store::open(url, "baton").await.expect("open");
        let options = LeaseOptions::with_lease(Duration::from_secs(30));
        let slot = store.now().await.expect("clock");
        let request = ClaimRequest {
            job,
            slot,
            kind: ClaimKind::Scheduled,
            runner: "cli-test",
            token: Token::random(),
            digest: None,
            options: &options,
        };
        let ClaimOutcome::Won(lease) = store.claim(&request).await.expect("claim") else {
            panic!("the claim of a new job wins");
        };
        for (key, value) in writes {
            let outcome = store
                .state_write(
                    job,
                    slot,
                    lease.token,
                    &StateWrite::Set { key, value },
                    &StateLimits::default(),
                )
                .await
                .expect("state write");
            assert_eq!(outcome, StateOutcome::Written(Written::Set));
        }
        lease.fence
    })
}

#[test]
fn state_lists_keys_with_their_writer_prints_a_value_and_deletes_a_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("baton.db").display());
    let fence = write_as_an_attempt(&url, "counter", &[("count", b"3"), ("raw", &[0xff, 0])]);

    let table = baton(&["state", "counter", "--store", &url], &[]);
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(lines[0].starts_with("KEY"), "{}", table.stdout);
    assert!(lines[0].contains("ATTEMPT") && lines[0].contains("FENCE"));
    assert!(lines[1].starts_with("count"), "{}", table.stdout);
    assert!(lines[1].contains(&fence.to_string()), "{}", table.stdout);

    let json = baton(&["state", "counter", "--store", &url, "--json"], &[]);
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    let keys: Vec<Value> = json
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0]["key"], "count");
    assert_eq!(keys[0]["attempt"], 1);
    assert_eq!(keys[0]["fence"], fence);
    assert_eq!(keys[0]["size"], 1);

    let value = baton(&["state", "counter", "count", "--store", &url], &[]);
    assert_eq!((value.code, value.stdout.as_str()), (Some(0), "3\n"));
    let value = baton(&["state", "counter", "raw", "--store", &url, "--json"], &[]);
    let value: Value = serde_json::from_str(value.stdout.trim()).expect("JSON");
    assert_eq!(value["value_hex"], "ff00");

    let deleted = baton(
        &["state", "counter", "--delete", "count", "--store", &url],
        &[],
    );
    assert_eq!(deleted.code, Some(0), "{}", deleted.stderr);
    let gone = baton(&["state", "counter", "count", "--store", &url], &[]);
    assert_eq!(gone.code, Some(1));
    assert!(
        gone.stderr.contains("has no state key \"count\"")
            && gone.stderr.contains("`baton state counter` lists its keys"),
        "{}",
        gone.stderr
    );
    let again = baton(
        &["state", "counter", "--delete", "count", "--store", &url],
        &[],
    );
    assert_eq!(again.code, Some(1), "deleting a missing key names it");
}
