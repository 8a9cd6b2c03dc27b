//! The Wasm host's figures: the per-run overhead of a job that does nothing, against starting
//! a native process that does nothing, and the zombie stop.
//!
//! Per-run overhead: a fresh store, instantiation and the call of the `empty` guest's `run`,
//! through the job's [`Handler`] exactly as an instance runs an attempt (the guest runs on the
//! host's guest runtime, with its log and its watch by the epoch watchdog), sent to returned.
//! The native side spawns `/bin/true` and waits for it. The two alternate in blocks of 50 runs.
//!
//! Zombie stop: the `busy-loop` guest never asks `signal-aborted()`; once it runs, the
//! attempt's signal aborts (as on a lost lease), and the time until the handler's future ends
//! is measured.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{ratio, BenchError, Stats};
use baton_core::instance::{AbortReason, Handler, LeaseDeadline, RunContext, Signal};
use baton_core::lease::ClaimKind;
use baton_wasm::{HostConfig, LogSink, Sandbox, WasmHost, WasmJob};

/// The native program the per-run overhead is compared with: `/bin/true`.
pub const NATIVE_PROGRAM: &str = "/bin/true";

/// How the Wasm figures are measured.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The directory holding `empty.wasm` and `busy-loop.wasm` (see
    /// `bench/build-components.sh`).
    pub components: PathBuf,
    /// How many runs of each side of the per-run overhead. Defaults to 300.
    pub runs: usize,
    /// How many zombie stops. Defaults to 50.
    pub stops: usize,
}

/// The per-run overhead, Wasm against native.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Overhead {
    /// Fresh store, instantiate and call of the empty job, through its handler.
    pub wasm: Stats,
    /// Spawn `/bin/true` and wait for it.
    pub native: Stats,
    /// Native median over Wasm median: how many times cheaper a Wasm run is.
    pub native_over_wasm: f64,
}

/// The zombie stop: abort to guest stopped.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ZombieStop {
    /// From the signal's abort to the attempt's end.
    pub latency: Stats,
}

/// The Wasm section of a report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WasmFigures {
    /// The per-run overhead.
    pub overhead: Overhead,
    /// The zombie stop.
    pub zombie_stop: ZombieStop,
}

/// Whether `dir` holds both components the Wasm figures need; the error names what is missing.
pub fn check_components(dir: &Path) -> Result<(), String> {
    let missing: Vec<String> = ["empty.wasm", "busy-loop.wasm"]
        .iter()
        .filter(|f| !dir.join(f).is_file())
        .map(|f| dir.join(f).display().to_string())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "missing {}; build them with bench/build-components.sh {}",
            missing.join(" and "),
            dir.display()
        ))
    }
}

fn sandbox(dir: &Path) -> Sandbox {
    Sandbox {
        job_file: dir.join("bench.toml"),
        memory: 64 << 20,
        run_timeout: Duration::from_secs(60),
        data_dir: None,
        env: Vec::new(),
        ..Sandbox::default()
    }
}

fn context(job: &str, signal: Signal) -> RunContext {
    RunContext {
        job: job.to_owned(),
        slot: 0,
        attempt: 1,
        reason: ClaimKind::Scheduled,
        runner: "bench".to_owned(),
        fence: 1,
        signal,
        deadline: LeaseDeadline::new(Instant::now() + Duration::from_secs(3600)),
        state: None,
    }
}

fn load(host: &WasmHost, dir: &Path, file: &str) -> Result<WasmJob, BenchError> {
    let loaded = host
        .load(dir.join(file))
        .map_err(|e| BenchError::Wasm(e.to_string()))?;
    Ok(host.job_from(loaded, sandbox(dir)))
}

/// Measures the per-run overhead and the zombie stop with the components in
/// `settings.components`.
pub async fn measure(settings: &Settings) -> Result<WasmFigures, BenchError> {
    check_components(&settings.components).map_err(BenchError::Wasm)?;
    let quiet: LogSink = Arc::new(|_| {});
    let host = WasmHost::new(HostConfig {
        log_sink: quiet,
        ..HostConfig::default()
    })
    .map_err(|e| BenchError::Wasm(e.to_string()))?;
    let empty = load(&host, &settings.components, "empty.wasm")?;
    let busy = load(&host, &settings.components, "busy-loop.wasm")?;
    let overhead = overhead(&empty, settings.runs).await?;
    let zombie_stop = zombie_stop(&busy, settings.stops).await?;
    Ok(WasmFigures {
        overhead,
        zombie_stop,
    })
}

/// How many runs of one side go before the other side's: the two alternate in blocks, so that
/// a change of load hits both, and each side runs as it would in a host that does only that.
/// Run by run, the Wasm run right after each `/bin/true` spawn was about 50 µs slower than in
/// blocks (docs/BENCHMARKS.md): a cost of the comparison, not of a host that runs Wasm jobs.
const BLOCK: usize = 50;

async fn overhead(empty: &WasmJob, runs: usize) -> Result<Overhead, BenchError> {
    // Warm up both sides: the first instantiations fill the pooling allocator's slots, the
    // first spawns the page cache.
    for _ in 0..10 {
        run_empty(empty).await?;
        spawn_native().await?;
    }
    let mut wasm = Vec::with_capacity(runs);
    let mut native = Vec::with_capacity(runs);
    let mut left = runs;
    while left > 0 {
        let block = left.min(BLOCK);
        for _ in 0..block {
            wasm.push(run_empty(empty).await?);
        }
        for _ in 0..block {
            native.push(spawn_native().await?);
        }
        left -= block;
    }
    let (wasm, native) = (Stats::of(wasm), Stats::of(native));
    Ok(Overhead {
        native_over_wasm: ratio(native.median_us, wasm.median_us),
        wasm,
        native,
    })
}

async fn run_empty(empty: &WasmJob) -> Result<Duration, BenchError> {
    let ctx = context("bench-empty", Signal::new());
    let began = Instant::now();
    let result = empty.run(ctx).await;
    let took = began.elapsed();
    result.map_err(|message| BenchError::Unexpected {
        what: "a run of the empty job".into(),
        expected: "ok".into(),
        got: message,
    })?;
    Ok(took)
}

/// Spawns `/bin/true` and waits for it, timed on a blocking thread.
async fn spawn_native() -> Result<Duration, BenchError> {
    let timed = tokio::task::spawn_blocking(|| {
        let began = Instant::now();
        let status = std::process::Command::new(NATIVE_PROGRAM)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        (began.elapsed(), status)
    })
    .await
    .map_err(|e| BenchError::Unexpected {
        what: format!("spawning {NATIVE_PROGRAM}"),
        expected: "to end".into(),
        got: e.to_string(),
    })?;
    match timed {
        (took, Ok(status)) if status.success() => Ok(took),
        (_, Ok(status)) => Err(BenchError::Unexpected {
            what: format!("running {NATIVE_PROGRAM}"),
            expected: "exit code 0".into(),
            got: status.to_string(),
        }),
        (_, Err(source)) => Err(BenchError::Process {
            program: NATIVE_PROGRAM.into(),
            source,
        }),
    }
}

async fn zombie_stop(busy: &WasmJob, stops: usize) -> Result<ZombieStop, BenchError> {
    let mut latencies = Vec::with_capacity(stops);
    for _ in 0..stops {
        let signal = Signal::new();
        let ctx = context("bench-zombie", signal.clone());
        let task = tokio::spawn({
            let busy = busy.clone();
            async move {
                let result = busy.run(ctx).await;
                (result, Instant::now())
            }
        });
        let within = Duration::from_secs(30);
        let until = Instant::now() + within;
        while busy.running_guests() < 1 {
            if Instant::now() > until {
                task.abort();
                return Err(BenchError::Timeout {
                    what: "the busy-loop guest to run".into(),
                    within,
                });
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        // Let the guest spin inside its loop, past its start.
        tokio::time::sleep(Duration::from_millis(3)).await;
        let aborted = Instant::now();
        signal.abort(AbortReason::Lost);
        let (result, stopped) = task.await.map_err(|e| BenchError::Unexpected {
            what: "the busy-loop attempt".into(),
            expected: "to end".into(),
            got: e.to_string(),
        })?;
        if result.is_ok() {
            return Err(BenchError::Unexpected {
                what: "the busy-loop attempt after the abort".into(),
                expected: "an interruption".into(),
                got: "ok".into(),
            });
        }
        latencies.push(stopped.saturating_duration_since(aborted));
    }
    Ok(ZombieStop {
        latency: Stats::of(latencies),
    })
}
