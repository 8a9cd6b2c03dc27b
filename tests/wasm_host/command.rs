//! Any WASI program is a job: a command component (`wasi:cli/run`, a `fn main` built for
//! `wasm32-wasip2` with no Baton SDK) runs under the same lease, fence and sandbox, with the
//! job's arguments and the run's facts in its environment. The program is `guests/cli`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_tests::process::baton;
use baton_wasm::jobs::load_job;
use baton_wasm::{AllowedDirs, ComponentKind};

use crate::support::{context, copy_guest, host, lines_of, run, run_until_lost, unique};

const WITHIN: Duration = Duration::from_secs(60);

/// A jobs directory with the program as `<name>.wasm` beside a job file of `body`.
fn command_job(dir: &Path, name: &str, body: &str) -> PathBuf {
    copy_guest(env!("GUEST_CLI"), dir, name);
    let toml = dir.join(format!("{name}.toml"));
    std::fs::write(&toml, format!("schedule = \"@hourly\"\n{body}")).expect("write the job file");
    toml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_program_runs_as_a_job_with_its_args_and_the_runs_facts_in_its_environment() {
    let dir = tempfile::tempdir().expect("jobs directory");
    let name = unique("report");
    let toml = command_job(
        dir.path(),
        &name,
        "args = [\"--write\", \"out.txt\", \"--since\", \"1h\"]\n[grants]\ndata_dir = \"data\"\nenv = { COLOR = \"blue\" }\n",
    );
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    assert_eq!(job.component().kind(), ComponentKind::Command);
    assert_eq!(job.component().world_version(), None);
    assert_eq!(run(&job, context(&name), WITHIN).await, Ok(()));
    let written = std::fs::read_to_string(dir.path().join("data/out.txt"))
        .expect("the program wrote into its data directory");
    assert!(
        written.starts_with(&format!("{name} --write out.txt --since 1h ")),
        "argv[0] is the job's name, then its args: {written}"
    );
    for fact in [
        format!("BATON_JOB={name}"),
        "BATON_SLOT=2026-01-01T00:00:00.000Z".to_owned(),
        "BATON_SLOT_MS=1767225600000".to_owned(),
        "BATON_ATTEMPT=1".to_owned(),
        "BATON_REASON=scheduled".to_owned(),
        "BATON_RUNNER=test-runner".to_owned(),
        "BATON_FENCE=7".to_owned(),
    ] {
        assert!(written.contains(&fact), "{fact} missing from {written}");
    }
    let stdout = lines_of(&name);
    assert!(
        stdout
            .iter()
            .any(|l| l.message == format!("argv {name} --write out.txt --since 1h")),
        "its stdout is the attempt's log: {stdout:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_zero_exit_fails_the_run_with_the_status_and_the_end_of_stderr() {
    let dir = tempfile::tempdir().expect("jobs directory");
    let name = unique("failing");
    let toml = command_job(
        dir.path(),
        &name,
        "args = [\"--stderr\", \"no data for the last hour\", \"--exit\", \"3\"]\n",
    );
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    let failed = run(&job, context(&name), WITHIN)
        .await
        .expect_err("a non-zero exit fails the run");
    // Rust's `std::process::exit` reaches WASI 0.2's `exit` as a failure without its status.
    assert_eq!(failed, "exited with status 1: no data for the last hour");
    // `exit-with-code` carries it.
    let toml = command_job(dir.path(), &name, "args = [\"--exit-code\", \"3\"]\n");
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    assert_eq!(
        run(&job, context(&name), WITHIN).await,
        Err("exited with status 3".to_owned())
    );
    let toml = command_job(dir.path(), &name, "args = [\"--exit\", \"0\"]\n");
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    assert_eq!(
        run(&job, context(&name), WITHIN).await,
        Ok(()),
        "exit 0 is success"
    );
}

#[test]
fn a_job_file_cannot_set_a_variable_that_carries_the_runs_facts() {
    let dir = tempfile::tempdir().expect("jobs directory");
    let toml = command_job(
        dir.path(),
        "sneaky",
        "[grants]\nenv = { BATON_ATTEMPT = \"1\" }\n",
    );
    let message = load_job(&toml, &AllowedDirs::new())
        .expect_err("a BATON_ name is refused")
        .to_string();
    assert!(
        message.starts_with(&format!("{}: ", toml.display()))
            && message.contains("grants.env")
            && message.contains("BATON_ATTEMPT is reserved")
            && message.contains("choose another name"),
        "{message}"
    );
}

#[test]
fn a_core_module_is_refused_with_the_way_to_make_it_a_component() {
    let dir = tempfile::tempdir().expect("jobs directory");
    // The smallest core module: the magic number and version 1.
    let module = dir.path().join("legacy.wasm");
    std::fs::write(&module, b"\0asm\x01\0\0\0").expect("write the module");
    let message = host().load(&module).unwrap_err().to_string();
    assert!(
        message.starts_with(&format!("{}: a core WebAssembly module", module.display()))
            && message.contains("rebuild it for wasm32-wasip2"),
        "{message}"
    );
}

#[test]
fn baton_check_says_which_kind_each_job_is() {
    let dir = tempfile::tempdir().expect("jobs directory");
    command_job(dir.path(), "plain", "args = [\"--exit\", \"0\"]\n");
    copy_guest(env!("GUEST_HELLO"), dir.path(), "hello");
    std::fs::write(dir.path().join("hello.toml"), "schedule = \"@hourly\"\n").expect("job file");
    let jobs = dir.path().display().to_string();
    let out = baton(&["check", &jobs], &[]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("plain.toml: ok (sha256:")
            && out.stdout.contains(", command (wasi:cli/run))")
            && out.stdout.contains(", world baton:job@0.2.0)"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_spins_without_a_host_call_is_stopped_by_the_host_when_its_lease_is_lost() {
    let dir = tempfile::tempdir().expect("jobs directory");
    let name = unique("spinner");
    let toml = command_job(dir.path(), &name, "args = [\"--spin\"]\n");
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let spinner = host().job(&spec).expect("the sandbox is set up");
    let result = run_until_lost(&spinner, &name).await;
    assert_eq!(
        result,
        Err("interrupted by the host: the attempt lost its lease (the store refused a heartbeat or a state write)".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_calling_wasi_http_goes_through_the_allow_list_with_the_fence_headers() {
    let allowed = baton_tests::http_server::Server::start().await;
    let other = baton_tests::http_server::Server::start().await;
    let dir = tempfile::tempdir().expect("jobs directory");
    let name = unique("fetcher");
    let toml = command_job(
        dir.path(),
        &name,
        &format!(
            "args = [\"--get\", \"{}/report\"]\n[grants]\nallowed_outbound_hosts = [\"{}\"]\n",
            allowed.origin, allowed.origin
        ),
    );
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    assert_eq!(run(&job, context(&name), WITHIN).await, Ok(()));
    let seen = allowed.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/report");
    assert_eq!(seen[0].all("baton-fence"), ["7"]);
    assert_eq!(seen[0].all("baton-job"), [name.as_str()]);
    let stdout = lines_of(&name);
    assert!(
        stdout.iter().any(|l| l.message.starts_with("got 200 ")),
        "{stdout:?}"
    );
    // A host the job file does not allow is never reached; the program sees the refusal.
    let denied = unique("denied");
    let toml = command_job(
        dir.path(),
        &denied,
        &format!(
            "args = [\"--get\", \"{}/secret\"]\n[grants]\nallowed_outbound_hosts = [\"{}\"]\n",
            other.origin, allowed.origin
        ),
    );
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    let failed = run(&job, context(&denied), WITHIN)
        .await
        .expect_err("the refused request fails the program");
    assert!(
        failed.contains("exited with status") && failed.contains("HttpRequestDenied"),
        "{failed}"
    );
    assert!(other.seen().is_empty(), "{:?}", other.seen());
}

/// `hexyl`, a hex viewer from crates.io that nobody here wrote, built for `wasm32-wasip2` as it
/// is published, once per target directory (`$CARGO_TARGET_DIR/crates-io`). Its own lock file
/// pins a `rustix` that does not build for `wasm32-wasip2` on stable Rust, so its dependencies
/// are resolved afresh (no `--locked`).
fn hexyl() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(".."))
                .join("crates-io");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["install", "--quiet", "hexyl@0.17.0"])
                .args(["--target", "wasm32-wasip2", "--root"])
                .arg(target.join("root"))
                .arg("--target-dir")
                .arg(target.join("build"))
                .status()
                .expect("run cargo install");
            assert!(
                status.success(),
                "cargo install hexyl@0.17.0 --target wasm32-wasip2 failed ({status}): is crates.io reachable?"
            );
            target.join("root/bin/hexyl.wasm")
        })
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_from_crates_io_runs_as_a_job_unchanged() {
    let program = tokio::task::spawn_blocking(hexyl)
        .await
        .expect("the build of hexyl");
    let dir = tempfile::tempdir().expect("jobs directory");
    let name = unique("hexdump");
    std::fs::create_dir(dir.path().join("data")).expect("data directory");
    std::fs::write(dir.path().join("data/input.bin"), b"Baton\n").expect("its input");
    std::fs::copy(&program, dir.path().join(format!("{name}.wasm"))).expect("copy hexyl");
    let toml = dir.path().join(format!("{name}.toml"));
    std::fs::write(
        &toml,
        "schedule = \"@hourly\"\nargs = [\"--plain\", \"/data/input.bin\"]\n[grants]\ndata_dir = \"data\"\ndata_dir_read_only = true\n",
    )
    .expect("write the job file");
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    assert_eq!(job.component().kind(), ComponentKind::Command);
    assert_eq!(run(&job, context(&name), WITHIN).await, Ok(()));
    let stdout = lines_of(&name);
    assert!(
        stdout
            .iter()
            .any(|l| l.message.contains("42 61 74 6f 6e 0a")),
        "hexyl's dump of \"Baton\\n\" in the attempt's log: {stdout:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_imports_the_host_interface_reads_its_run_info_and_asks_the_signal() {
    let asker = host().load(env!("GUEST_ASKER")).expect("the command loads");
    assert_eq!(
        asker.kind(),
        ComponentKind::Command,
        "it exports wasi:cli/run, not run"
    );
    let job = host().job_from(asker, crate::support::sandbox());
    let name = unique("asker");
    assert_eq!(run(&job, context(&name), WITHIN).await, Ok(()));
    let stdout = lines_of(&name);
    assert!(
        stdout.iter().any(|l| l.message
            == format!("job={name} attempt=1 reason=ClaimReason::Scheduled aborted=false")),
        "{stdout:?}"
    );
    // Told to stop (not stopped: a stopping host only sets the signal), it sees the signal
    // and ends on its own, as a failure that hands the run over.
    let mut sandbox = crate::support::sandbox();
    sandbox.args = vec!["--wait-abort".to_owned()];
    let job = host().job_from(
        host().load(env!("GUEST_ASKER")).expect("the command loads"),
        sandbox,
    );
    let name = unique("asker-stop");
    let ctx = context(&name);
    let signal = ctx.signal.clone();
    let task = tokio::spawn({
        let job = job.clone();
        async move { baton_core::instance::Handler::run(&job, ctx).await }
    });
    crate::support::wait_running(&job, 1, WITHIN).await;
    signal.abort(baton_core::instance::AbortReason::Stopping);
    let ended = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("it ends on its own")
        .expect("the task ends");
    assert_eq!(ended, Err("exited with status 1: stopping".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_exporting_both_run_and_a_main_is_a_baton_job_whose_run_runs() {
    let both = host().load(env!("GUEST_BOTH")).expect("it loads");
    assert_eq!(both.kind(), ComponentKind::Job("0.2.0"));
    assert!(both.also_a_command);
    let job = host().job_from(both, crate::support::sandbox());
    let name = unique("both");
    assert_eq!(run(&job, context(&name), WITHIN).await, Ok(()));
    let said: Vec<String> = lines_of(&name).into_iter().map(|l| l.message).collect();
    assert_eq!(said, [format!("run ran for {name}")]);
    let out = baton(&["check", env!("GUEST_BOTH")], &[]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("world baton:job@0.2.0; it exports wasi:cli/run too, but `run` is what runs"),
        "{}",
        out.stdout
    );
}
