//! One attempt: a fresh store with its sandbox (WASI context), memory cap, run timeout and
//! abort flag; the guest call; and what a user reads when it ends badly.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use wasmtime::component::ResourceTable;
use wasmtime::{CallHook, ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_config::WasiConfigVariables;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::AttemptInfo;
use super::engine::LoadedComponent;
use super::log::{AttemptLog, LineSource};
use crate::config::ConfigValue;
use crate::fence::Gate;
use crate::jobs::boundary::GrantedDir;
use crate::jobs::{format_size, DEFAULT_MEMORY, DEFAULT_RUN_TIMEOUT};
use crate::outbound::{fence_headers, Hooks, Outbound};
use baton_core::instance::{AbortReason, LeaseDeadline, RunContext, Signal};

/// Where a granted data directory appears inside the guest: `/data`.
pub const DATA_DIR_IN_GUEST: &str = "/data";

/// What one job's attempts may use: the sandbox's grants and limits.
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// The job file that grants it, named in messages.
    pub job_file: PathBuf,
    /// The memory cap, bytes.
    pub memory: u64,
    /// How long an attempt may run.
    pub run_timeout: Duration,
    /// A host directory the guest sees at `/data`, opened once, and whether it is read-only.
    pub data_dir: Option<(GrantedDir, bool)>,
    /// Environment variables.
    pub env: Vec<(String, String)>,
    /// Where outbound requests may go, and their limits. Defaults to nowhere.
    pub outbound: Outbound,
    /// What `wasi:config/store` offers the guest. Defaults to nothing.
    pub config: BTreeMap<String, ConfigValue>,
    /// The program's arguments after `argv[0]`, which is the job's name. Defaults to none.
    pub args: Vec<String>,
}

impl Default for Sandbox {
    /// Nothing granted, the default limits, and no job file to name.
    fn default() -> Self {
        Sandbox {
            job_file: PathBuf::new(),
            memory: DEFAULT_MEMORY,
            run_timeout: DEFAULT_RUN_TIMEOUT,
            data_dir: None,
            env: Vec::new(),
            outbound: Outbound::default(),
            config: BTreeMap::new(),
            args: Vec::new(),
        }
    }
}

/// Why the host stopped a guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopCause {
    Lost,
    Fenced,
    StopTimeout,
    RunTimeout,
}

impl StopCause {
    fn code(self) -> u8 {
        match self {
            StopCause::Lost => 1,
            StopCause::Fenced => 2,
            StopCause::StopTimeout => 3,
            StopCause::RunTimeout => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => StopCause::Lost,
            2 => StopCause::Fenced,
            3 => StopCause::StopTimeout,
            4 => StopCause::RunTimeout,
            _ => return None,
        })
    }

    /// The abort reasons that stop a guest at once. A stopping host only sets the signal: the
    /// guest may still return, and is handed over.
    fn from_abort(reason: AbortReason) -> Option<Self> {
        match reason {
            AbortReason::Lost => Some(StopCause::Lost),
            AbortReason::Fenced => Some(StopCause::Fenced),
            AbortReason::StopTimeout => Some(StopCause::StopTimeout),
            AbortReason::Stopping | AbortReason::Paused => None,
        }
    }
}

/// The flag the epoch callback reads, and the wake-up for a guest blocked in a host call.
#[derive(Default)]
pub(crate) struct Interrupt {
    cause: AtomicU8,
    notify: Notify,
}

impl Interrupt {
    fn set(&self, cause: StopCause) {
        if self
            .cause
            .compare_exchange(0, cause.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.notify.notify_one();
        }
    }

    fn get(&self) -> Option<StopCause> {
        StopCause::from_code(self.cause.load(Ordering::Acquire))
    }
}

/// The error the epoch callback traps with when the host stops a guest.
#[derive(Debug, thiserror::Error)]
#[error("{}", stopped_message(*.cause, *.run_timeout))]
pub(crate) struct Stopped {
    cause: StopCause,
    run_timeout: Duration,
}

/// How every message about a guest the host stopped begins.
pub(crate) const STOPPED_PREFIX: &str = "interrupted by the host: ";

fn stopped_message(cause: StopCause, run_timeout: Duration) -> String {
    let why = stop_reason(cause, run_timeout);
    format!("{STOPPED_PREFIX}{why}")
}

/// Why a side effect of an attempt whose lease is lost was refused.
pub(crate) fn lost_reason(cause: StopCause) -> String {
    format!(
        "the attempt no longer holds its lease: {}",
        stop_reason(cause, Duration::ZERO)
    )
}

fn stop_reason(cause: StopCause, run_timeout: Duration) -> String {
    match cause {
        StopCause::Lost => {
            "the attempt lost its lease (the store refused a heartbeat or a state write)".into()
        }
        StopCause::Fenced => {
            "the attempt's lease deadline passed without a renewal (self-fenced)".into()
        }
        StopCause::StopTimeout => {
            "still running at the stop timeout; the lease is handed over".into()
        }
        StopCause::RunTimeout => format!(
            "ran past its run timeout of {} (limits.run_timeout)",
            baton_core::duration::format_duration(run_timeout)
        ),
    }
}

/// The error a memory grow past the cap traps with.
#[derive(Debug, thiserror::Error)]
#[error("{}", memory_message(*.cap, *.desired, .job_file))]
pub(crate) struct MemoryCapExceeded {
    cap: u64,
    desired: u64,
    job_file: PathBuf,
}

fn memory_message(cap: u64, desired: u64, job_file: &std::path::Path) -> String {
    format!(
        "memory cap exceeded: the guest asked for {} but its limit is {} (limits.memory in {}); raise limits.memory or use less memory",
        format_size(desired),
        format_size(cap),
        job_file.display()
    )
}

/// The memory cap, over all of the instance's memories together.
struct Limiter {
    cap: u64,
    used: u64,
    job_file: PathBuf,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let grow = desired.saturating_sub(current) as u64;
        let total = self.used.saturating_add(grow);
        if total > self.cap {
            return Err(MemoryCapExceeded {
                cap: self.cap,
                desired: total,
                job_file: self.job_file.clone(),
            }
            .into());
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// Everything one attempt's store holds.
pub(crate) struct AttemptState {
    wasi: WasiCtx,
    table: ResourceTable,
    http: WasiHttpCtx,
    hooks: Hooks,
    pub(crate) config: WasiConfigVariables,
    gate: Gate,
    limiter: Limiter,
    pub(crate) info: AttemptInfo,
    pub(crate) signal: Signal,
    pub(crate) log: AttemptLog,
    interrupt: Arc<Interrupt>,
    lease_deadline: LeaseDeadline,
    run_deadline: Instant,
    run_timeout: Duration,
    /// The job's state, fenced by the attempt's token (`baton:job/state`, see `state.rs`).
    pub(crate) state: Option<baton_core::state_handle::StateHandle>,
}

impl WasiView for AttemptState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for AttemptState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Runs on every call from the guest into the host: once the attempt's lease is lost, the
/// call is refused before it does anything, and the guest ends as a trap would. This is what
/// fences the data directory's writes (the WASI filesystem has no hook of its own). It cannot
/// tell one host function from another, so it refuses all of them, logging too; a stop
/// request does not close the gate, so a handing-over guest may still log and return.
fn on_call(state: &AttemptState, hook: CallHook) -> wasmtime::Result<()> {
    if !matches!(hook, CallHook::CallingHost) {
        return Ok(());
    }
    state.gate.check().map_err(|cause| {
        state.interrupt.set(cause);
        Stopped {
            cause,
            run_timeout: state.run_timeout,
        }
        .into()
    })
}

/// The epoch callback: trap if the attempt must stop, else yield to the executor so other
/// guests and tasks run.
fn on_epoch(state: &AttemptState) -> wasmtime::Result<UpdateDeadline> {
    if state.interrupt.get().is_none() {
        if state.lease_deadline.has_passed() {
            state.signal.abort(AbortReason::Fenced);
            state.interrupt.set(StopCause::Fenced);
        } else if Instant::now() >= state.run_deadline {
            state.interrupt.set(StopCause::RunTimeout);
        }
    }
    match state.interrupt.get() {
        Some(cause) => Err(Stopped {
            cause,
            run_timeout: state.run_timeout,
        }
        .into()),
        None => Ok(UpdateDeadline::Yield(1)),
    }
}

/// The guest's WASI context: its output into the attempt's log, no sockets, its arguments
/// (`argv[0]` the job's name), the granted variables and the run's facts (`BATON_*`), and the
/// granted data directory at [`DATA_DIR_IN_GUEST`].
fn wasi_ctx(sandbox: &Sandbox, log: &AttemptLog, ctx: &RunContext) -> Result<WasiCtx, String> {
    let mut b = WasiCtxBuilder::new();
    b.stdout(log.stream(LineSource::Stdout))
        .stderr(log.stream(LineSource::Stderr))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    b.arg(&ctx.job);
    b.args(&sandbox.args);
    // The job file cannot name a BATON_ variable (checked as it loads); a sandbox given by a
    // library user that does is overridden by the facts.
    for (k, v) in &sandbox.env {
        if !k.starts_with(crate::jobs::FACTS_PREFIX) {
            b.env(k, v);
        }
    }
    for (k, v) in run_facts(ctx) {
        b.env(k, v);
    }
    if let Some((dir, read_only)) = &sandbox.data_dir {
        let perms = if *read_only {
            FsPerms::ReadOnly
        } else {
            FsPerms::ReadWrite
        };
        // Through the handle opened when the job loaded, not the path: what was renamed or
        // swapped in at the path since does not redirect the guest.
        b.preopened_dir(dir.handle_path(), DATA_DIR_IN_GUEST, perms)
            .map_err(|e| {
                format!(
                    "cannot open the data directory {} granted by {}: {e:#}",
                    dir.path().display(),
                    sandbox.job_file.display()
                )
            })?;
    }
    Ok(b.build())
}

/// The run's facts, as every guest's environment gives them.
fn run_facts(ctx: &RunContext) -> [(&'static str, String); 7] {
    [
        ("BATON_JOB", ctx.job.clone()),
        ("BATON_SLOT", baton_core::schedule::format_utc(ctx.slot)),
        ("BATON_SLOT_MS", ctx.slot.to_string()),
        ("BATON_ATTEMPT", ctx.attempt.to_string()),
        ("BATON_REASON", ctx.reason.as_str().to_owned()),
        ("BATON_RUNNER", ctx.runner.clone()),
        ("BATON_FENCE", ctx.fence.to_string()),
    ]
}

/// The kind of a guest call's error, for [`super::TrapSink`].
fn trap_kind(e: &wasmtime::Error) -> &'static str {
    if let Some(stopped) = e.downcast_ref::<Stopped>() {
        return match stopped.cause {
            StopCause::Lost => "lost",
            StopCause::Fenced => "self-fenced",
            StopCause::StopTimeout => "stop-timeout",
            StopCause::RunTimeout => "run-timeout",
        };
    }
    if e.downcast_ref::<MemoryCapExceeded>().is_some() {
        return "memory-cap";
    }
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::UnreachableCodeReached) => "unreachable",
        Some(wasmtime::Trap::StackOverflow) => "stack-overflow",
        Some(wasmtime::Trap::MemoryOutOfBounds | wasmtime::Trap::TableOutOfBounds) => {
            "out-of-bounds"
        }
        Some(wasmtime::Trap::IntegerDivisionByZero) => "division-by-zero",
        Some(_) => "other",
        None => "host",
    }
}

/// What the host knows of a guest call that ended in an error.
fn describe(e: &wasmtime::Error, log: &AttemptLog) -> String {
    if let Some(stopped) = e.downcast_ref::<Stopped>() {
        return stopped.to_string();
    }
    if let Some(cap) = e.downcast_ref::<MemoryCapExceeded>() {
        return cap.to_string();
    }
    let mut message = match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => {
            let trap = trap.to_string();
            let trap = trap.strip_prefix("wasm trap: ").unwrap_or(&trap);
            format!("the guest trapped: {trap}")
        }
        None => format!("failed in the host: {}", e.root_cause()),
    };
    if let Some(tail) = log.stderr_tail() {
        message.push_str("; stderr: ");
        message.push_str(&tail);
    }
    message
}

/// Runs one attempt in a fresh store. Returns the guest's result, or what stopped it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    engine: &wasmtime::Engine,
    component: &LoadedComponent,
    sandbox: &Sandbox,
    log: AttemptLog,
    ctx: RunContext,
    on_trap: Option<&super::TrapSink>,
    on_request: Option<&super::OutboundSink>,
    started: impl FnOnce(),
) -> Result<(), String> {
    let interrupt = Arc::new(Interrupt::default());
    {
        let interrupt = interrupt.clone();
        let engine = engine.clone();
        ctx.signal.on_abort(move |reason| {
            if let Some(cause) = StopCause::from_abort(reason) {
                interrupt.set(cause);
                engine.increment_epoch();
            }
        });
    }
    let wasi = wasi_ctx(sandbox, &log, &ctx)?;
    let gate = Gate::new(ctx.signal.clone(), ctx.deadline.clone());
    let hooks = Hooks::new(
        gate.clone(),
        Arc::new(sandbox.outbound.clone()),
        sandbox.job_file.clone(),
        fence_headers(&ctx.job, ctx.slot, ctx.attempt, ctx.fence),
        log.clone(),
        on_request.cloned(),
    );
    let config = sandbox
        .config
        .iter()
        .map(|(k, v)| (k.as_str(), v.expose()))
        .collect();
    let state = AttemptState {
        wasi,
        table: ResourceTable::new(),
        http: WasiHttpCtx::new(),
        hooks,
        config,
        gate,
        limiter: Limiter {
            cap: sandbox.memory,
            used: 0,
            job_file: sandbox.job_file.clone(),
        },
        info: AttemptInfo {
            job: ctx.job.clone(),
            slot: ctx.slot,
            attempt: ctx.attempt,
            kind: ctx.reason,
            runner: ctx.runner.clone(),
            fence: ctx.fence,
        },
        signal: ctx.signal.clone(),
        log: log.clone(),
        interrupt: interrupt.clone(),
        lease_deadline: ctx.deadline.clone(),
        run_deadline: Instant::now() + sandbox.run_timeout,
        run_timeout: sandbox.run_timeout,
        state: ctx.state.clone(),
    };
    let run_deadline = state.run_deadline;
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|cx| on_epoch(cx.data()));
    store.call_hook(|cx, hook| on_call(cx.data(), hook));

    let call = component.pre.run(&mut store, started);
    // A guest blocked in a host call (a sleep, a read) runs no epoch check: it is stopped by
    // dropping its call.
    let stopped = async {
        interrupt.notify.notified().await;
        interrupt.get()
    };
    let result = tokio::select! {
        biased;
        r = call => r,
        cause = stopped => Err(Stopped {
            cause: cause.unwrap_or(StopCause::Lost),
            run_timeout: sandbox.run_timeout,
        }.into()),
        _ = tokio::time::sleep_until(run_deadline.into()) => Err(Stopped {
            cause: StopCause::RunTimeout,
            run_timeout: sandbox.run_timeout,
        }.into()),
    };
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => Err(log.redact(message)),
        Err(e) => {
            if let Some(sink) = on_trap {
                sink(trap_kind(&e));
            }
            Err(log.redact(describe(&e, &log)))
        }
    }
}
