//! Guest output as log lines: the `log` host function, stdout and stderr, each line tagged
//! with job, slot and attempt, under one budget per attempt. A flood is truncated and counted,
//! never fatal to the host or to the attempt.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use crate::config::Redactor;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// How many bytes of log lines, stdout and stderr together, one attempt may write: 64 KiB.
/// Lines past it are dropped and counted.
pub const LOG_BUDGET: usize = 64 * 1024;

/// The longest line kept whole: 4 KiB. A longer line is split.
pub const MAX_LINE: usize = 4 * 1024;

/// How many bytes of the end of stderr are kept to explain a trap: 1 KiB.
const STDERR_TAIL: usize = 1024;

/// Where a guest line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineSource {
    /// The `log` host function, at a level.
    Log(Level),
    /// The guest's stdout.
    Stdout,
    /// The guest's stderr.
    Stderr,
    /// The host, about the attempt's output (e.g. how much it dropped).
    Host,
}

/// How important a log line is, as the guest said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Detail for debugging.
    Debug,
    /// Normal progress.
    Info,
    /// Something unexpected that the job survived.
    Warn,
    /// Something failed.
    Error,
}

impl LineSource {
    /// The source's name in log lines: `log`, `stdout`, `stderr` or `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            LineSource::Log(_) => "log",
            LineSource::Stdout => "stdout",
            LineSource::Stderr => "stderr",
            LineSource::Host => "host",
        }
    }
}

/// One line of a guest's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestLine {
    /// The job.
    pub job: String,
    /// The slot, UTC ms.
    pub slot: i64,
    /// The attempt.
    pub attempt: u32,
    /// Where it came from.
    pub source: LineSource,
    /// The line, without its newline.
    pub message: String,
}

impl fmt::Display for GuestLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} #{} {}: {}",
            self.job,
            self.slot,
            self.attempt,
            self.source.as_str(),
            self.message
        )
    }
}

/// Where guest lines go. The default writes each as one `tracing` event.
pub type LogSink = Arc<dyn Fn(&GuestLine) + Send + Sync>;

/// The default sink: one `tracing` event per line, target `baton::guest`, with job, slot,
/// attempt and stream fields; stdout at info, stderr at warn, `log` at the guest's level.
pub fn tracing_sink() -> LogSink {
    Arc::new(|line: &GuestLine| {
        let slot = baton_core::schedule::format_utc(line.slot);
        let (job, attempt, stream, msg) =
            (&line.job, line.attempt, line.source.as_str(), &line.message);
        macro_rules! emit {
            ($level:expr) => {
                tracing::event!(target: "baton::guest", $level, job = %job, slot = %slot, attempt, stream, "{msg}")
            };
        }
        match line.source {
            LineSource::Log(Level::Trace) => emit!(tracing::Level::TRACE),
            LineSource::Log(Level::Debug) => emit!(tracing::Level::DEBUG),
            LineSource::Log(Level::Info) | LineSource::Stdout => emit!(tracing::Level::INFO),
            LineSource::Log(Level::Warn) | LineSource::Stderr | LineSource::Host => {
                emit!(tracing::Level::WARN)
            }
            LineSource::Log(Level::Error) => emit!(tracing::Level::ERROR),
        }
    })
}

struct State {
    used: usize,
    dropped_bytes: u64,
    dropped_lines: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stderr_tail: Vec<u8>,
}

/// One attempt's output: its tags, its budget and its partial lines.
#[derive(Clone)]
pub(crate) struct AttemptLog {
    job: Arc<str>,
    slot: i64,
    attempt: u32,
    sink: LogSink,
    state: Arc<Mutex<State>>,
    redactor: Arc<Redactor>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AttemptLog {
    pub(crate) fn new(job: &str, slot: i64, attempt: u32, sink: LogSink) -> Self {
        AttemptLog {
            job: job.into(),
            slot,
            attempt,
            sink,
            state: Arc::new(Mutex::new(State {
                used: 0,
                dropped_bytes: 0,
                dropped_lines: 0,
                stdout: Vec::new(),
                stderr: Vec::new(),
                stderr_tail: Vec::new(),
            })),
            redactor: Arc::new(Redactor::default()),
        }
    }

    /// The same log, with these secrets replaced by `[redacted]` in every line.
    pub(crate) fn redacting(mut self, redactor: Redactor) -> Self {
        self.redactor = Arc::new(redactor);
        self
    }

    /// `text` with the job's secrets replaced by `[redacted]`.
    pub(crate) fn redact(&self, text: String) -> String {
        if self.redactor.is_empty() {
            text
        } else {
            self.redactor.redact(&text)
        }
    }

    fn emit_unbudgeted(&self, source: LineSource, message: String) {
        let message = self.redact(message);
        (self.sink)(&GuestLine {
            job: self.job.to_string(),
            slot: self.slot,
            attempt: self.attempt,
            source,
            message,
        });
    }

    /// Emits a whole line if it fits the budget, else counts it as dropped. The budget counts
    /// the line and its newline.
    fn line(&self, state: &mut State, source: LineSource, bytes: &[u8]) {
        let cost = bytes.len() + 1;
        if state.used + cost > LOG_BUDGET {
            state.dropped_bytes += cost as u64;
            state.dropped_lines += 1;
            return;
        }
        state.used += cost;
        self.emit_unbudgeted(source, String::from_utf8_lossy(bytes).into_owned());
    }

    /// A line from the `log` host function.
    pub(crate) fn log(&self, level: Level, message: &str) {
        let mut state = lock(&self.state);
        for line in message.lines() {
            self.line(&mut state, LineSource::Log(level), line.as_bytes());
        }
    }

    /// A line from the host about the attempt (e.g. a refused request), under the budget.
    pub(crate) fn host(&self, message: &str) {
        let mut state = lock(&self.state);
        self.line(&mut state, LineSource::Host, message.as_bytes());
    }

    /// Bytes written to stdout or stderr: complete lines are emitted, the rest waits.
    fn write(&self, source: LineSource, bytes: &[u8]) {
        let mut state = lock(&self.state);
        if source == LineSource::Stderr {
            let tail = &mut state.stderr_tail;
            tail.extend_from_slice(bytes);
            if tail.len() > STDERR_TAIL {
                let cut = tail.len() - STDERR_TAIL;
                tail.drain(..cut);
            }
        }
        let mut pending = std::mem::take(match source {
            LineSource::Stderr => &mut state.stderr,
            _ => &mut state.stdout,
        });
        pending.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(nl) = pending[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl;
            self.line(&mut state, source, &pending[start..end]);
            start = end + 1;
        }
        while pending.len() - start > MAX_LINE {
            self.line(&mut state, source, &pending[start..start + MAX_LINE]);
            start += MAX_LINE;
        }
        pending.drain(..start);
        *match source {
            LineSource::Stderr => &mut state.stderr,
            _ => &mut state.stdout,
        } = pending;
    }

    /// Emits partial lines and, if anything was dropped, one line from the host that says how
    /// much. Returns the number of dropped bytes.
    pub(crate) fn finish(&self) -> u64 {
        let mut state = lock(&self.state);
        for source in [LineSource::Stdout, LineSource::Stderr] {
            let pending = std::mem::take(match source {
                LineSource::Stderr => &mut state.stderr,
                _ => &mut state.stdout,
            });
            if !pending.is_empty() {
                self.line(&mut state, source, &pending);
            }
        }
        let dropped = state.dropped_bytes;
        if dropped > 0 {
            let lines = state.dropped_lines;
            drop(state);
            self.emit_unbudgeted(
                LineSource::Host,
                format!(
                    "output truncated: dropped {dropped} bytes ({lines} lines) past the attempt's log budget of {} KiB",
                    LOG_BUDGET / 1024
                ),
            );
        }
        dropped
    }

    /// The end of what the guest wrote to stderr, on one line, to explain a trap.
    pub(crate) fn stderr_tail(&self) -> Option<String> {
        let state = lock(&self.state);
        let text = String::from_utf8_lossy(&state.stderr_tail);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
            .collect();
        if lines.is_empty() {
            None
        } else {
            Some(lines.join(" "))
        }
    }

    /// A WASI output stream that writes into this log as `source`.
    pub(crate) fn stream(&self, source: LineSource) -> LogStream {
        LogStream {
            log: self.clone(),
            source,
        }
    }
}

/// The guest's stdout or stderr: always ready, never full, never an error.
#[derive(Clone)]
pub(crate) struct LogStream {
    log: AttemptLog,
    source: LineSource,
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for LogStream {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.log.write(self.source, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for LogStream {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for LogStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.log.write(self.source, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture() -> (LogSink, Arc<Mutex<Vec<GuestLine>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        let sink: LogSink = Arc::new(move |line: &GuestLine| lock(&l).push(line.clone()));
        (sink, lines)
    }

    #[test]
    fn partial_lines_wait_for_their_newline() {
        let (sink, lines) = capture();
        let log = AttemptLog::new("j", 1, 1, sink);
        log.write(LineSource::Stdout, b"hel");
        log.write(LineSource::Stdout, b"lo\nwor");
        assert_eq!(lock(&lines).len(), 1);
        assert_eq!(log.finish(), 0);
        let got: Vec<String> = lock(&lines).iter().map(|l| l.message.clone()).collect();
        assert_eq!(got, ["hello", "wor"]);
    }

    #[test]
    fn lines_past_the_budget_are_dropped_and_counted() {
        let (sink, lines) = capture();
        let log = AttemptLog::new("j", 1, 1, sink);
        let line = [b'x'; 1023];
        for _ in 0..100 {
            log.write(LineSource::Stdout, &line);
            log.write(LineSource::Stdout, b"\n");
        }
        assert_eq!(log.finish(), 36 * 1024);
        let lines = lock(&lines);
        assert_eq!(lines.len(), 65);
        assert!(
            lines[64].message.contains("dropped 36864 bytes (36 lines)"),
            "{}",
            lines[64].message
        );
    }
}
