//! The jobs directory run by an instance: changes picked up while running, the digest recorded
//! with each attempt, broken files reported while the other jobs keep running.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton_core::instance::{Event, EventKind, Instance, InstanceConfig};
use baton_wasm::jobs::directory::{Change, JobsDirectory};
use tokio::sync::broadcast;

use crate::support::{copy_guest, host};

const EVERY_SECOND: &str =
    "schedule = \"* * * * * *\"\nlease = \"3s\"\nheartbeat = \"300ms\"\ncatch_up = \"0s\"\n";

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write a job file");
}

async fn start(
    f: &baton_tests::Fixture,
    runner: &str,
) -> (Arc<Instance>, broadcast::Receiver<Event>) {
    let config = InstanceConfig {
        store_url: f.url.clone(),
        namespace: f.namespace.clone(),
        runner: runner.to_owned(),
    };
    let instance = Instance::start(config, Vec::new())
        .await
        .expect("instance starts");
    let events = instance.subscribe();
    (Arc::new(instance), events)
}

pub async fn wait_event(
    events: &mut broadcast::Receiver<Event>,
    within: Duration,
    what: &str,
    pred: impl Fn(&Event) -> bool,
) -> Event {
    tokio::time::timeout(within, async {
        loop {
            match events.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    panic!("events closed waiting for {what}")
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {what} within {within:?}"))
}

fn digest_of(path: &Path) -> String {
    host().load(path).expect("the guest loads").digest.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_component_is_picked_up_while_running_and_an_attempt_in_flight_keeps_its_version()
{
    let f = baton_tests::backends::sqlite().await;
    let jobs = tempfile::tempdir().expect("tempdir");
    write(
        jobs.path(),
        "swap.toml",
        &format!("{EVERY_SECOND}overlap = \"allow\"\n"),
    );
    let wasm = copy_guest(env!("GUEST_LONG"), jobs.path(), "swap");
    let long_digest = digest_of(&wasm);
    let (instance, mut events) = start(&f, "swapper").await;
    let mut dir = JobsDirectory::new(jobs.path(), host().clone());
    let changes = dir.sync(&instance).expect("scan");
    assert!(
        matches!(&changes[..], [Change::Added { name, digest }] if name == "swap" && *digest == long_digest),
        "{changes:?}"
    );
    let first = wait_event(
        &mut events,
        Duration::from_secs(10),
        "the long attempt",
        |e| e.kind == EventKind::Started && e.job == "swap",
    )
    .await;

    // Swap in hello (copy then rename, as a deploy would).
    let staged = copy_guest(env!("GUEST_HELLO"), jobs.path(), "staged");
    std::fs::rename(&staged, &wasm).expect("swap the component");
    let hello_digest = digest_of(&wasm);
    let changes = dir.sync(&instance).expect("scan");
    assert!(
        matches!(&changes[..], [Change::Changed { name, digest }] if name == "swap" && *digest == hello_digest),
        "{changes:?}"
    );
    let next = wait_event(
        &mut events,
        Duration::from_secs(10),
        "a run of the new version",
        |e| e.kind == EventKind::Success && e.job == "swap" && e.slot > first.slot,
    )
    .await;

    let new_run = f
        .store
        .get("swap", next.slot)
        .await
        .expect("get")
        .expect("the run");
    assert_eq!(
        new_run.attempts[0].digest.as_deref(),
        Some(hello_digest.as_str())
    );
    let old_run = f
        .store
        .get("swap", first.slot)
        .await
        .expect("get")
        .expect("the run");
    assert_eq!(
        old_run.status,
        baton_core::lease::Status::Running,
        "the attempt in flight still runs the long job"
    );
    assert_eq!(
        old_run.attempts[0].digest.as_deref(),
        Some(long_digest.as_str())
    );
    instance.stop(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_job_files_are_reported_with_their_file_and_the_other_jobs_keep_running() {
    let f = baton_tests::backends::sqlite().await;
    let jobs = tempfile::tempdir().expect("tempdir");
    write(jobs.path(), "good.toml", EVERY_SECOND);
    copy_guest(env!("GUEST_HELLO"), jobs.path(), "good");
    write(jobs.path(), "malformed.toml", "schedule = [\n");
    copy_guest(env!("GUEST_HELLO"), jobs.path(), "malformed");
    write(
        jobs.path(),
        "typo.toml",
        &format!("{EVERY_SECOND}leese = \"30s\"\n"),
    );
    copy_guest(env!("GUEST_HELLO"), jobs.path(), "typo");
    write(jobs.path(), "world.toml", EVERY_SECOND);
    copy_guest(env!("GUEST_OTHER_WORLD"), jobs.path(), "world");

    let (instance, mut events) = start(&f, "reporter").await;
    let mut dir = JobsDirectory::new(jobs.path(), host().clone());
    let changes = dir.sync(&instance).expect("scan");
    let failed = |job: &str| -> String {
        changes
            .iter()
            .find_map(|c| match c {
                Change::Failed { name, error } if name == job => Some(error.to_string()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{job} not reported in {changes:?}"))
    };
    let malformed = failed("malformed");
    assert!(
        malformed.starts_with(&format!(
            "{}: ",
            jobs.path().join("malformed.toml").display()
        )),
        "{malformed}"
    );
    let typo = failed("typo");
    assert!(
        typo.starts_with(&format!("{}: ", jobs.path().join("typo.toml").display()))
            && typo.contains("unknown field `leese`"),
        "{typo}"
    );
    let world = failed("world");
    assert!(
        world.starts_with(&format!("{}: ", jobs.path().join("world.wasm").display()))
            && world.contains("it exports `start`, but neither `wasi:cli/run`")
            && world.contains("baton_guest::job!"),
        "{world}"
    );
    assert_eq!(instance.job_names(), ["good"]);
    wait_event(
        &mut events,
        Duration::from_secs(10),
        "a success of the good job",
        |e| e.kind == EventKind::Success && e.job == "good",
    )
    .await;

    // Fixing the typo adds the job; removing a file removes it.
    write(jobs.path(), "typo.toml", EVERY_SECOND);
    std::fs::remove_file(jobs.path().join("good.toml")).expect("remove");
    let changes = dir.sync(&instance).expect("scan");
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, Change::Added { name, .. } if name == "typo")),
        "{changes:?}"
    );
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, Change::Removed { name } if name == "good")),
        "{changes:?}"
    );
    assert_eq!(instance.job_names(), ["typo"]);
    wait_event(
        &mut events,
        Duration::from_secs(10),
        "a success of the fixed job",
        |e| e.kind == EventKind::Success && e.job == "typo",
    )
    .await;
    instance.stop(Duration::from_secs(2)).await;
}
