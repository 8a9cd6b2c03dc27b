//! One Wasm host for the whole test binary, with its guest lines captured, and ways to run a
//! guest's attempt directly through its handler.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use baton_core::instance::{Handler, RunContext};
use baton_wasm::{HostConfig, Sandbox, WasmHost, WasmJob};

/// The host every test shares (one engine, one compile cache, one watchdog).
pub fn host() -> &'static WasmHost {
    static HOST: OnceLock<WasmHost> = OnceLock::new();
    HOST.get_or_init(|| {
        WasmHost::new(HostConfig {
            log_sink: baton_tests::captured::sink(),
            ..HostConfig::default()
        })
        .expect("the wasm host starts")
    })
}

pub use baton_tests::captured::lines_of;

/// The default sandbox: nothing granted, 64 MiB, a 60 s run timeout.
pub fn sandbox() -> Sandbox {
    Sandbox {
        job_file: PathBuf::from("test.toml"),
        memory: 64 << 20,
        run_timeout: Duration::from_secs(60),
        data_dir: None,
        env: Vec::new(),
        ..Sandbox::default()
    }
}

/// A job of a built guest (`env!("GUEST_…")`) in a sandbox.
pub fn job(component: &str, sandbox: Sandbox) -> WasmJob {
    let loaded = host().load(component).expect("the guest loads");
    host().job_from(loaded, sandbox)
}

/// A name no other test uses.
pub fn unique(prefix: &str) -> String {
    baton_tests::unique(prefix)
}

/// Runs one attempt to its end, or panics after `within`.
pub async fn run(job: &WasmJob, ctx: RunContext, within: Duration) -> Result<(), String> {
    tokio::time::timeout(within, job.run(ctx))
        .await
        .unwrap_or_else(|_| panic!("the attempt did not end within {within:?}"))
}

/// Waits until at least `n` guests of `job` run (instantiated and called).
pub async fn wait_running(job: &WasmJob, n: usize, within: Duration) {
    let until = Instant::now() + within;
    while job.running_guests() < n {
        assert!(Instant::now() < until, "no guest running within {within:?}");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// Runs an attempt of `job` (one that never ends on its own) as `name`, aborts its signal as
/// lost once its guest runs, and answers what the attempt ended with, which must be within a
/// second.
pub async fn run_until_lost(job: &WasmJob, name: &str) -> Result<(), String> {
    let ctx = context(name);
    let signal = ctx.signal.clone();
    let task = tokio::spawn({
        let job = job.clone();
        async move { job.run(ctx).await }
    });
    wait_running(job, 1, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!task.is_finished(), "the guest ended on its own");
    signal.abort(baton_core::instance::AbortReason::Lost);
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("stopped within a second")
        .expect("the task ends")
}

/// A copy of a built guest in `dir` as `<name>.wasm`.
pub fn copy_guest(component: &str, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(format!("{name}.wasm"));
    std::fs::copy(component, &to).expect("copy the guest");
    to
}

pub use baton_tests::attempt::{context, summary};
