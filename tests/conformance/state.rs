//! The conformance cases of job state (`baton_core::state`), every one named `state_*`: writes
//! are fenced by the store itself, in the same atomic step, on every backend.

use std::sync::Arc;
use std::time::Duration;

use baton_core::lease::{
    ClaimKind, ClaimOutcome, ClaimRequest, Finish, Lease, LeaseOptions, Overlap, Token,
    TokenOutcome,
};
use baton_core::state::{StateLimits, StateOutcome, StateRefusal, StateWrite, Written};
use baton_core::store::Store;
use baton_tests::{store_now, unique, wait_past, Fixture};

/// A 300 ms lease, the spec's other defaults.
fn opts() -> LeaseOptions {
    LeaseOptions::with_lease(Duration::from_millis(300))
}

/// Wins a claim of `job` at `slot` as `runner`.
async fn win(store: &dyn Store, job: &str, slot: i64, runner: &str, kind: ClaimKind) -> Lease {
    win_with(store, job, slot, runner, kind, &opts()).await
}

async fn win_with(
    store: &dyn Store,
    job: &str,
    slot: i64,
    runner: &str,
    kind: ClaimKind,
    options: &LeaseOptions,
) -> Lease {
    let request = ClaimRequest {
        job,
        slot,
        kind,
        runner,
        token: Token::random(),
        digest: None,
        options,
    };
    match store
        .claim(&request)
        .await
        .expect("claim reaches the store")
    {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected the claim to win, got {other:?}"),
    }
}

/// A job of its own, a slot one second ago by the store's clock, and a won claim of it.
async fn running(f: &Fixture) -> (String, i64, Lease) {
    let job = unique("state");
    let slot = store_now(&*f.store).await - 1_000;
    let lease = win(&*f.store, &job, slot, "a", ClaimKind::Scheduled).await;
    (job, slot, lease)
}

async fn write(
    store: &dyn Store,
    job: &str,
    slot: i64,
    token: Token,
    w: StateWrite<'_>,
) -> StateOutcome {
    store
        .state_write(job, slot, token, &w, &StateLimits::default())
        .await
        .expect("state write reaches the store")
}

async fn set(store: &dyn Store, job: &str, slot: i64, token: Token, key: &str, value: &[u8]) {
    let outcome = write(store, job, slot, token, StateWrite::Set { key, value }).await;
    assert_eq!(outcome, StateOutcome::Written(Written::Set));
}

async fn value(store: &dyn Store, job: &str, key: &str) -> Option<Vec<u8>> {
    store
        .state_get(job, key)
        .await
        .expect("state read reaches the store")
        .map(|e| e.value)
}

fn fenced(outcome: &StateOutcome) -> bool {
    matches!(outcome, StateOutcome::Fenced(_))
}

/// Every kind of write, each one with `token`: all must be fenced, and none may change `key`.
async fn every_write_is_fenced(store: &dyn Store, job: &str, slot: i64, token: Token, key: &str) {
    let before = value(store, job, key).await;
    let writes = [
        StateWrite::Set {
            key,
            value: b"stale",
        },
        StateWrite::Delete { key },
        StateWrite::Increment { key, by: 1 },
        StateWrite::CompareAndSwap {
            key,
            expected: before.as_deref(),
            new: b"stale",
        },
        StateWrite::Set {
            key: "a-new-key",
            value: b"stale",
        },
    ];
    for w in writes {
        let outcome = write(store, job, slot, token, w).await;
        assert!(fenced(&outcome), "{} answered {outcome:?}", w.operation());
    }
    assert_eq!(
        value(store, job, key).await,
        before,
        "the value is unchanged"
    );
    assert_eq!(
        value(store, job, "a-new-key").await,
        None,
        "no key was added"
    );
}

pub async fn state_write_with_the_current_token_is_accepted_and_records_its_writer(f: &Fixture) {
    let store = &*f.store;
    let (job, slot, lease) = running(f).await;
    let before = store_now(store).await;
    set(store, &job, slot, lease.token, "cursor", b"42").await;
    let entry = store
        .state_get(&job, "cursor")
        .await
        .expect("read")
        .expect("the key has a value");
    assert_eq!(entry.value, b"42");
    assert_eq!(entry.writer.slot, slot);
    assert_eq!(entry.writer.attempt, 1);
    assert_eq!(entry.writer.fence, lease.fence);
    assert!(
        entry.writer.written_at >= before,
        "written at the store's clock"
    );
    assert!(entry.writer.written_at <= store_now(store).await);
    let keys = store.state_keys(&job).await.expect("list");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].key, "cursor");
    assert_eq!(keys[0].size, 2);
    assert_eq!(keys[0].writer, entry.writer);
    // Set again, then delete: a deleted key reads as absent and is not listed.
    set(store, &job, slot, lease.token, "cursor", b"43").await;
    assert_eq!(
        value(store, &job, "cursor").await.as_deref(),
        Some(&b"43"[..])
    );
    let deleted = write(
        store,
        &job,
        slot,
        lease.token,
        StateWrite::Delete { key: "cursor" },
    )
    .await;
    assert_eq!(deleted, StateOutcome::Written(Written::Deleted(true)));
    let again = write(
        store,
        &job,
        slot,
        lease.token,
        StateWrite::Delete { key: "cursor" },
    )
    .await;
    assert_eq!(again, StateOutcome::Written(Written::Deleted(false)));
    assert_eq!(value(store, &job, "cursor").await, None);
    assert!(store.state_keys(&job).await.expect("list").is_empty());
}

pub async fn state_write_with_the_old_token_after_a_takeover_is_fenced_and_changes_nothing(
    f: &Fixture,
) {
    let store = &*f.store;
    let (job, slot, a) = running(f).await;
    set(store, &job, slot, a.token, "cursor", b"from-a").await;
    wait_past(store, a.lease_end).await;
    let other = f.another().await;
    let b = win(&*other, &job, slot, "b", ClaimKind::Takeover).await;
    assert_eq!(b.attempt, 2);
    every_write_is_fenced(store, &job, slot, a.token, "cursor").await;
    let outcome = write(
        store,
        &job,
        slot,
        a.token,
        StateWrite::Set {
            key: "cursor",
            value: b"x",
        },
    )
    .await;
    match outcome {
        StateOutcome::Fenced(Some(state)) => assert_eq!(state.attempt, 2, "the run's attempt"),
        other => panic!("expected fenced with the run's state, got {other:?}"),
    }
    // The new attempt writes, and is recorded as the writer.
    set(&*other, &job, slot, b.token, "cursor", b"from-b").await;
    let entry = store.state_get(&job, "cursor").await.expect("read");
    let entry = entry.expect("a value");
    assert_eq!(entry.value, b"from-b");
    assert_eq!((entry.writer.attempt, entry.writer.fence), (2, b.fence));
}

pub async fn state_write_after_finish_or_release_is_fenced(f: &Fixture) {
    let store = &*f.store;
    let (job, slot, a) = running(f).await;
    set(store, &job, slot, a.token, "k", b"1").await;
    let finished = store
        .finish(&job, slot, a.token, Finish::Success)
        .await
        .expect("finish");
    assert_eq!(finished, TokenOutcome::Accepted);
    every_write_is_fenced(store, &job, slot, a.token, "k").await;

    let released_slot = slot + 1;
    let b = win(store, &job, released_slot, "b", ClaimKind::Scheduled).await;
    set(store, &job, released_slot, b.token, "k", b"2").await;
    let released = store
        .release(&job, released_slot, b.token)
        .await
        .expect("release");
    assert_eq!(released, TokenOutcome::Accepted);
    every_write_is_fenced(store, &job, released_slot, b.token, "k").await;
    assert_eq!(value(store, &job, "k").await.as_deref(), Some(&b"2"[..]));
}

pub async fn state_write_of_a_late_attempt_whose_lease_ran_out_is_fenced(f: &Fixture) {
    let store = &*f.store;
    let (job, slot, a) = running(f).await;
    set(store, &job, slot, a.token, "k", b"alive").await;
    // Nobody has taken the run over: the lease has only run out, by the store's clock.
    wait_past(store, a.lease_end).await;
    every_write_is_fenced(store, &job, slot, a.token, "k").await;
    // A write for a run that has no state at all, or with a token that never held it.
    let none = write(
        store,
        &job,
        slot - 60_000,
        a.token,
        StateWrite::Set {
            key: "k",
            value: b"x",
        },
    )
    .await;
    assert_eq!(none, StateOutcome::Fenced(None));
    let b = win(store, &job, slot + 1, "b", ClaimKind::Scheduled).await;
    let stranger = write(
        store,
        &job,
        slot + 1,
        Token::random(),
        StateWrite::Set {
            key: "k",
            value: b"x",
        },
    )
    .await;
    assert!(fenced(&stranger), "{stranger:?}");
    set(store, &job, slot + 1, b.token, "k", b"b").await;
}

pub async fn state_increments_from_sixteen_concurrent_attempts_sum_exactly(f: &Fixture) {
    const JOBS: usize = 4;
    const SLOTS: usize = 4;
    const EACH: i64 = 25;
    let options = LeaseOptions {
        overlap: Overlap::Allow,
        ..LeaseOptions::with_lease(Duration::from_secs(30))
    };
    let now = store_now(&*f.store).await;
    let jobs: Vec<String> = (0..JOBS).map(|_| unique("count")).collect();
    let mut tasks = Vec::new();
    for job in &jobs {
        // A client of its own for each job, shared by the job's attempts.
        let client: Arc<dyn Store> = f.another().await;
        for s in 0..SLOTS {
            let store = client.clone();
            let slot = now - 1_000 + s as i64;
            let lease = win_with(&*store, job, slot, "r", ClaimKind::Scheduled, &options).await;
            let job = job.clone();
            tasks.push(tokio::spawn(async move {
                let mut sums = Vec::new();
                for _ in 0..EACH {
                    let w = StateWrite::Increment {
                        key: "count",
                        by: 1,
                    };
                    match write(&*store, &job, slot, lease.token, w).await {
                        StateOutcome::Written(Written::Incremented(sum)) => sums.push(sum),
                        other => panic!("expected an increment, got {other:?}"),
                    }
                }
                (job, sums)
            }));
        }
    }
    let mut seen: std::collections::HashMap<String, Vec<i64>> = Default::default();
    for t in tasks {
        let (job, sums) = t.await.expect("an attempt's task");
        seen.entry(job).or_default().extend(sums);
    }
    let total = SLOTS as i64 * EACH;
    for job in &jobs {
        let got = value(&*f.store, job, "count").await;
        assert_eq!(got, Some(total.to_string().into_bytes()), "job {job}");
        // Every increment saw a sum of its own: none was lost or applied twice.
        let mut sums = seen.remove(job).unwrap_or_default();
        sums.sort_unstable();
        assert_eq!(sums, (1..=total).collect::<Vec<_>>(), "job {job}");
    }
}

pub async fn state_increment_is_exact_for_sixty_four_bit_integers_and_refuses_other_values(
    f: &Fixture,
) {
    let store = &*f.store;
    let (job, slot, a) = running(f).await;
    let inc = |key, by| StateWrite::Increment { key, by };
    assert_eq!(
        write(store, &job, slot, a.token, inc("n", -5)).await,
        StateOutcome::Written(Written::Incremented(-5))
    );
    let big = (1i64 << 62) + 1;
    assert_eq!(
        write(store, &job, slot, a.token, inc("n", big)).await,
        StateOutcome::Written(Written::Incremented(big - 5))
    );
    assert_eq!(
        value(store, &job, "n").await,
        Some((big - 5).to_string().into_bytes()),
        "the value is the sum's decimal text"
    );
    set(
        store,
        &job,
        slot,
        a.token,
        "max",
        i64::MAX.to_string().as_bytes(),
    )
    .await;
    assert_eq!(
        write(store, &job, slot, a.token, inc("max", 1)).await,
        StateOutcome::Refused(StateRefusal::Overflow)
    );
    for bad in [&b"abc"[..], b"01", b"1.5", b" 1", &[0xffu8, 0x31][..]] {
        set(store, &job, slot, a.token, "bad", bad).await;
        assert_eq!(
            write(store, &job, slot, a.token, inc("bad", 1)).await,
            StateOutcome::Refused(StateRefusal::NotAnInteger),
            "{bad:?}"
        );
        assert_eq!(value(store, &job, "bad").await.as_deref(), Some(bad));
    }
}

pub async fn state_compare_and_swap_writes_only_over_the_expected_value(f: &Fixture) {
    let store = &*f.store;
    let (job, slot, a) = running(f).await;
    let cas = |expected, new| StateWrite::CompareAndSwap {
        key: "leader",
        expected,
        new,
    };
    let swapped = |yes| StateOutcome::Written(Written::Swapped(yes));
    // Absent expected, absent found: swaps.
    assert_eq!(
        write(store, &job, slot, a.token, cas(None, b"one")).await,
        swapped(true)
    );
    // Absent expected, but present: no swap.
    assert_eq!(
        write(store, &job, slot, a.token, cas(None, b"two")).await,
        swapped(false)
    );
    // A wrong value expected: no swap.
    assert_eq!(
        write(store, &job, slot, a.token, cas(Some(b"two"), b"three")).await,
        swapped(false)
    );
    assert_eq!(
        value(store, &job, "leader").await.as_deref(),
        Some(&b"one"[..])
    );
    // The right value expected: swaps.
    assert_eq!(
        write(store, &job, slot, a.token, cas(Some(b"one"), b"two")).await,
        swapped(true)
    );
    assert_eq!(
        value(store, &job, "leader").await.as_deref(),
        Some(&b"two"[..])
    );
    // A value expected of an absent key: no swap, no key.
    let other = StateWrite::CompareAndSwap {
        key: "absent",
        expected: Some(b""),
        new: b"x",
    };
    assert_eq!(
        write(store, &job, slot, a.token, other).await,
        swapped(false)
    );
    assert_eq!(value(store, &job, "absent").await, None);
}

pub async fn state_of_one_job_or_namespace_is_invisible_to_another(f: &Fixture) {
    let store = &*f.store;
    let (job, slot, a) = running(f).await;
    set(store, &job, slot, a.token, "shared-name", b"mine").await;
    // Another job of the namespace: its own keys, and its token cannot write into this job.
    let (other_job, other_slot, b) = running(f).await;
    assert_eq!(value(store, &other_job, "shared-name").await, None);
    assert!(store.state_keys(&other_job).await.expect("list").is_empty());
    set(
        store,
        &other_job,
        other_slot,
        b.token,
        "shared-name",
        b"theirs",
    )
    .await;
    assert_eq!(
        value(store, &job, "shared-name").await.as_deref(),
        Some(&b"mine"[..])
    );
    let cross = write(
        store,
        &job,
        slot,
        b.token,
        StateWrite::Set {
            key: "shared-name",
            value: b"intruder",
        },
    )
    .await;
    assert!(fenced(&cross), "another job's token: {cross:?}");
    // The same job name in another namespace of the same store.
    let elsewhere = f.in_namespace(&unique("ns")).await;
    assert_eq!(value(&*elsewhere, &job, "shared-name").await, None);
    assert!(elsewhere.state_keys(&job).await.expect("list").is_empty());
    let foreign = write(
        &*elsewhere,
        &job,
        slot,
        a.token,
        StateWrite::Set {
            key: "shared-name",
            value: b"x",
        },
    )
    .await;
    assert_eq!(foreign, StateOutcome::Fenced(None));
    assert_eq!(
        value(store, &job, "shared-name").await.as_deref(),
        Some(&b"mine"[..])
    );
}

pub async fn state_limits_refuse_long_keys_large_values_and_one_key_too_many(f: &Fixture) {
    let store = &*f.store;
    let (job, slot, a) = running(f).await;
    let limits = StateLimits {
        max_key_bytes: 8,
        max_value_bytes: 16,
        max_keys: 3,
    };
    let send = |w: StateWrite<'static>| {
        let job = job.clone();
        async move {
            store
                .state_write(&job, slot, a.token, &w, &limits)
                .await
                .expect("state write")
        }
    };
    let before = store.round_trips();
    assert_eq!(
        send(StateWrite::Set {
            key: "123456789",
            value: b"v"
        })
        .await,
        StateOutcome::Refused(StateRefusal::KeyTooLong { bytes: 9, limit: 8 })
    );
    assert_eq!(
        send(StateWrite::Set {
            key: "k",
            value: &[7; 17]
        })
        .await,
        StateOutcome::Refused(StateRefusal::ValueTooLarge {
            bytes: 17,
            limit: 16
        })
    );
    assert_eq!(
        send(StateWrite::Set {
            key: "",
            value: b""
        })
        .await,
        StateOutcome::Refused(StateRefusal::EmptyKey)
    );
    assert_eq!(
        store.round_trips(),
        before,
        "refused without asking the store"
    );
    for key in ["k1", "k2", "k3"] {
        assert_eq!(
            send(StateWrite::Set {
                key,
                value: &[1; 16]
            })
            .await,
            StateOutcome::Written(Written::Set)
        );
    }
    let full = StateOutcome::Refused(StateRefusal::TooManyKeys { limit: 3 });
    assert_eq!(
        send(StateWrite::Set {
            key: "k4",
            value: b""
        })
        .await,
        full
    );
    assert_eq!(send(StateWrite::Increment { key: "k4", by: 1 }).await, full);
    assert_eq!(
        send(StateWrite::CompareAndSwap {
            key: "k4",
            expected: None,
            new: b""
        })
        .await,
        full
    );
    assert_eq!(value(store, &job, "k4").await, None);
    // An existing key may still be written; a deleted one makes room.
    assert_eq!(
        send(StateWrite::Set {
            key: "k1",
            value: b"again"
        })
        .await,
        StateOutcome::Written(Written::Set)
    );
    assert_eq!(
        send(StateWrite::Delete { key: "k2" }).await,
        StateOutcome::Written(Written::Deleted(true))
    );
    assert_eq!(
        send(StateWrite::Set {
            key: "k4",
            value: b""
        })
        .await,
        StateOutcome::Written(Written::Set)
    );
    let names: Vec<String> = store
        .state_keys(&job)
        .await
        .expect("list")
        .into_iter()
        .map(|k| k.key)
        .collect();
    assert_eq!(names, ["k1", "k3", "k4"]);
}

pub async fn state_write_costs_one_round_trip_and_a_read_one(f: &Fixture) {
    // Counted at a TCP proxy between the client and the server where there is a wire.
    let counted = f.counted().await;
    let store = &*counted.store;
    let (job, slot, a) = running(f).await;
    let writes = [
        StateWrite::Set {
            key: "k",
            value: b"1",
        },
        StateWrite::Increment { key: "k", by: 2 },
        StateWrite::CompareAndSwap {
            key: "k",
            expected: Some(b"3"),
            new: b"4",
        },
        StateWrite::Delete { key: "k" },
    ];
    // A first write loads the script on a server that has not seen it yet (Redis, Valkey), and
    // each connection of a pool prepares a statement the first time it runs it (PostgreSQL
    // keeps two warm): every kind of write, read and listing runs a few times first.
    for _ in 0..3 {
        for w in writes {
            write(store, &job, slot, a.token, w).await;
        }
        store.state_get(&job, "k").await.expect("read");
        store.state_keys(&job).await.expect("list");
    }
    for w in writes {
        let before = counted.round_trips();
        let outcome = write(store, &job, slot, a.token, w).await;
        assert!(matches!(outcome, StateOutcome::Written(_)), "{outcome:?}");
        assert_eq!(
            counted.round_trips() - before,
            1,
            "{} sent (counted at the {})",
            w.operation(),
            counted.counted_where()
        );
    }
    wait_past(store, a.lease_end).await;
    let before = counted.round_trips();
    let refused = write(
        store,
        &job,
        slot,
        a.token,
        StateWrite::Set {
            key: "k",
            value: b"late",
        },
    )
    .await;
    assert!(fenced(&refused));
    assert_eq!(counted.round_trips() - before, 1, "a fenced write sent");
    let before = counted.round_trips();
    store.state_get(&job, "k").await.expect("read");
    store.state_keys(&job).await.expect("list");
    assert_eq!(
        counted.round_trips() - before,
        2,
        "a read and a listing sent"
    );
}

pub async fn state_remove_by_an_operator_and_forget_job_delete_the_state(f: &Fixture) {
    let store = &*f.store;
    let (job, slot, a) = running(f).await;
    set(store, &job, slot, a.token, "one", b"1").await;
    set(store, &job, slot, a.token, "two", b"2").await;
    assert!(store.state_remove(&job, "one").await.expect("remove"));
    assert!(!store.state_remove(&job, "one").await.expect("remove"));
    assert_eq!(value(store, &job, "one").await, None);
    assert_eq!(value(store, &job, "two").await.as_deref(), Some(&b"2"[..]));
    store
        .finish(&job, slot, a.token, Finish::Success)
        .await
        .expect("finish");
    store.forget_job(&job).await.expect("forget");
    assert_eq!(value(store, &job, "two").await, None);
    assert!(store.state_keys(&job).await.expect("list").is_empty());
}
