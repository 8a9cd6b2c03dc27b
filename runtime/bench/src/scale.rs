//! The scale run: several host processes on one store, each running the same many jobs every
//! second, for a while; then the slots run against the slots due, duplicate runs, and each
//! host's CPU time and peak memory.
//!
//! Each host is a child process (`baton bench scale-host`, hidden) running one [`Instance`]
//! with native jobs that do nothing but note their run, so the lease engine and the store are
//! what is measured, not Wasm. Jobs use the default lease options (lease 30 s, heartbeat 5 s).
//! The measured window starts at a whole second on the store's clock, after a warm-up in which
//! the hosts start their jobs, and lasts `seconds`: every job is due once a second in it. A
//! slot is run when some host's handler ran it; a duplicate is a second execution of one slot
//! (on any host). Two `won` answers for one slot are impossible by the store's construction, so
//! the handlers' executions are what is counted. Each host reads its own CPU time
//! (`/proc/self/stat`) and peak resident memory (`VmHWM` in `/proc/self/status`) as it ends.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use super::{ratio, BenchError, Machine};
use baton_core::instance::{handler_fn, Instance, InstanceConfig, Job};
use baton_core::lease::LeaseOptions;
use baton_core::schedule::Schedule;
use baton_core::store::{self, Store};

/// The clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`): 100 on every Linux
/// architecture Baton builds for.
pub const USER_HZ: f64 = 100.0;

/// What the scale run does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The store's URL.
    pub store_url: String,
    /// How many host processes. Defaults to 3.
    pub hosts: usize,
    /// How many jobs each host runs (the same jobs on every host). Defaults to 10 000.
    pub jobs: usize,
    /// How long the measured window is. Defaults to 60 s.
    pub seconds: u64,
    /// How long the hosts get to start their jobs before the window. Defaults to 10 s.
    pub warm_up: Duration,
    /// The `baton` executable the hosts run.
    pub exe: PathBuf,
}

/// What one host is told.
#[derive(Clone, Debug)]
pub struct HostSettings {
    /// The store's URL.
    pub store_url: String,
    /// The namespace the run uses.
    pub namespace: String,
    /// How many jobs.
    pub jobs: usize,
    /// The window's first slot, store clock, ms (a whole second).
    pub start_ms: i64,
    /// The window's length.
    pub seconds: u64,
    /// This host's index.
    pub host: usize,
}

/// What one host reports, as one JSON object on its stdout.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HostReport {
    /// The host's index.
    pub host: usize,
    /// Executions of slots in the window, as (job index, second of the window).
    pub executions: Vec<(u32, u32)>,
    /// Executions of slots outside the window (warm-up and tail).
    pub outside_window: u64,
    /// Events by kind, over the whole life of the host.
    pub events: BTreeMap<String, u64>,
    /// Events the counter missed because it fell behind.
    pub events_missed: u64,
    /// Requests the host's store client sent.
    pub round_trips: u64,
    /// CPU time in user mode, s.
    pub cpu_user_s: f64,
    /// CPU time in kernel mode, s.
    pub cpu_system_s: f64,
    /// Peak resident memory, KiB.
    pub peak_rss_kib: u64,
    /// From the start of the host to its report, s.
    pub wall_s: f64,
}

/// One host's figures in the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostFigures {
    /// The host's index.
    pub host: usize,
    /// Executions of slots in the window.
    pub executions: u64,
    /// CPU time, user and kernel, s.
    pub cpu_s: f64,
    /// CPU time over the host's wall time, in percent of one core.
    pub cpu_percent_of_one_core: f64,
    /// Peak resident memory, MiB.
    pub peak_rss_mib: f64,
    /// Requests the host's store client sent, a second of its life.
    pub round_trips_per_s: f64,
    /// Events by kind.
    pub events: BTreeMap<String, u64>,
}

/// The scale run's result.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScaleReport {
    /// The store, password removed.
    pub store: String,
    /// Host processes.
    pub hosts: usize,
    /// Jobs per host (the same jobs on every host).
    pub jobs: usize,
    /// The window, s.
    pub seconds: u64,
    /// Slots due in the window: jobs × seconds.
    pub due: u64,
    /// Slots run at least once.
    pub run: u64,
    /// Slots run / slots due, percent.
    pub run_percent: f64,
    /// Executions beyond the first of a slot.
    pub duplicates: u64,
    /// Per host.
    pub per_host: Vec<HostFigures>,
    /// The machine before the run.
    pub machine_before: Machine,
    /// The machine after the run.
    pub machine_after: Machine,
}

/// Runs the scale run: starts the hosts, waits for their reports, and counts.
pub async fn run(settings: &Settings) -> Result<ScaleReport, BenchError> {
    let machine_before = Machine::now();
    let namespace = super::unique_name("bench-scale");
    let store = store::open(&settings.store_url, &namespace).await?;
    let start_ms = (store.now().await? + settings.warm_up.as_millis() as i64) / 1000 * 1000 + 1000;
    let mut children = Vec::with_capacity(settings.hosts);
    for host in 0..settings.hosts {
        let mut cmd = tokio::process::Command::new(&settings.exe);
        cmd.args(["bench", "scale-host", "--store", &settings.store_url])
            .args(["--namespace", &namespace])
            .args(["--jobs", &settings.jobs.to_string()])
            .args(["--start-ms", &start_ms.to_string()])
            .args(["--seconds", &settings.seconds.to_string()])
            .args(["--host", &host.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| BenchError::Process {
            program: settings.exe.clone(),
            source,
        })?;
        let stdout = child.stdout.take();
        children.push(tokio::spawn(async move {
            let mut out = Vec::new();
            if let Some(mut stdout) = stdout {
                stdout.read_to_end(&mut out).await?;
            }
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, out))
        }));
    }
    let mut reports = Vec::with_capacity(settings.hosts);
    for (host, child) in children.into_iter().enumerate() {
        let failed = |reason: String| BenchError::ScaleHost { host, reason };
        let (status, out) = child
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(|e| failed(e.to_string()))?;
        if !status.success() {
            return Err(failed(format!("exited with {status}")));
        }
        let report: HostReport =
            serde_json::from_slice(&out).map_err(|e| failed(format!("unreadable report: {e}")))?;
        reports.push(report);
    }
    let machine_after = Machine::now();
    forget_jobs(&store, settings.jobs).await?;
    Ok(count(settings, reports, machine_before, machine_after))
}

/// The name of job `i` of the scale run.
fn job_name(i: usize) -> String {
    format!("scale-{i}")
}

async fn forget_jobs(store: &Arc<dyn Store>, jobs: usize) -> Result<(), BenchError> {
    let mut forgets = futures::stream::iter(0..jobs)
        .map(|i| {
            let store = store.clone();
            async move { store.forget_job(&job_name(i)).await }
        })
        .buffer_unordered(32);
    while let Some(done) = forgets.next().await {
        done?;
    }
    Ok(())
}

fn count(
    settings: &Settings,
    reports: Vec<HostReport>,
    machine_before: Machine,
    machine_after: Machine,
) -> ScaleReport {
    let seconds = settings.seconds as usize;
    let mut runs = vec![0u32; settings.jobs * seconds];
    let mut per_host = Vec::with_capacity(reports.len());
    for report in reports {
        for &(job, second) in &report.executions {
            let (job, second) = (job as usize, second as usize);
            if job < settings.jobs && second < seconds {
                runs[job * seconds + second] += 1;
            }
        }
        let cpu_s = report.cpu_user_s + report.cpu_system_s;
        per_host.push(HostFigures {
            host: report.host,
            executions: report.executions.len() as u64,
            cpu_s,
            cpu_percent_of_one_core: 100.0 * ratio(cpu_s, report.wall_s),
            peak_rss_mib: report.peak_rss_kib as f64 / 1024.0,
            round_trips_per_s: ratio(report.round_trips as f64, report.wall_s),
            events: report.events,
        });
    }
    let due = runs.len() as u64;
    let run = runs.iter().filter(|n| **n > 0).count() as u64;
    let duplicates = runs
        .iter()
        .map(|n| u64::from(n.saturating_sub(1)))
        .sum::<u64>();
    ScaleReport {
        store: store::redact(&settings.store_url),
        hosts: settings.hosts,
        jobs: settings.jobs,
        seconds: settings.seconds,
        due,
        run,
        run_percent: 100.0 * ratio(run as f64, due as f64),
        duplicates,
        per_host,
        machine_before,
        machine_after,
    }
}

/// Runs one host of the scale run until the window's end plus a tail, and returns its report.
pub async fn host(settings: &HostSettings) -> Result<HostReport, BenchError> {
    let began = Instant::now();
    let every_second =
        Schedule::parse("* * * * * *", "UTC").map_err(|e| BenchError::Unexpected {
            what: "the every-second schedule".into(),
            expected: "a valid cron expression".into(),
            got: e.to_string(),
        })?;
    let window_end = settings.start_ms + settings.seconds as i64 * 1000;
    let executions: Arc<Mutex<Vec<(u32, u32)>>> = Arc::new(Mutex::new(Vec::new()));
    let outside = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let jobs = (0..settings.jobs)
        .map(|i| {
            let executions = executions.clone();
            let outside = outside.clone();
            let (start, index) = (settings.start_ms, i as u32);
            Job {
                name: job_name(i),
                schedule: every_second.clone(),
                options: LeaseOptions::default(),
                handler: handler_fn(move |ctx| {
                    if ctx.slot >= start && ctx.slot < window_end {
                        let second = ((ctx.slot - start) / 1000) as u32;
                        executions
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((index, second));
                    } else {
                        outside.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    async { Ok(()) }
                }),
            }
        })
        .collect();
    let config = InstanceConfig {
        store_url: settings.store_url.clone(),
        namespace: settings.namespace.clone(),
        runner: format!("scale-host-{}", settings.host),
    };
    let instance = Instance::start(config, jobs).await?;
    let mut events = instance.subscribe();
    let counter = tokio::spawn(async move {
        let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
        let mut missed = 0u64;
        loop {
            match events.recv().await {
                Ok(e) => *kinds.entry(e.kind.as_str().to_owned()).or_default() += 1,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => missed += n,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
        (kinds, missed)
    });
    // Until the window's end and a tail of 3 s for the last slots' claims, by the store's
    // clock.
    let store = instance.store();
    let now = store.now().await?;
    let wait = (window_end + 3000 - now).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    instance.stop(Duration::from_secs(5)).await;
    let round_trips = store.round_trips();
    drop(store);
    drop(instance);
    let (events, events_missed) = match tokio::time::timeout(Duration::from_secs(5), counter).await
    {
        Ok(Ok(counted)) => counted,
        _ => (BTreeMap::new(), 0),
    };
    let (cpu_user_s, cpu_system_s) = own_cpu();
    let executions = std::mem::take(&mut *executions.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(HostReport {
        host: settings.host,
        executions,
        outside_window: outside.load(std::sync::atomic::Ordering::Relaxed),
        events,
        events_missed,
        round_trips,
        cpu_user_s,
        cpu_system_s,
        peak_rss_kib: own_peak_rss_kib(),
        wall_s: began.elapsed().as_secs_f64(),
    })
}

/// This process's user and system CPU time, s, from `/proc/self/stat` (0 where unreadable).
fn own_cpu() -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (0.0, 0.0);
    };
    // The command name (field 2) may hold spaces; the fields after its ')' are plain.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) / USER_HZ, ticks(12) / USER_HZ)
}

/// This process's peak resident memory, KiB, from `VmHWM` in `/proc/self/status`.
fn own_peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
