//! Guest lines captured in the test process: a [`LogSink`] that keeps every line, and the
//! lines of one job.

use std::sync::{Arc, Mutex};

use baton_wasm::{GuestLine, LogSink};

static LINES: Mutex<Vec<GuestLine>> = Mutex::new(Vec::new());

/// A sink that keeps every line, for [`lines_of`].
pub fn sink() -> LogSink {
    Arc::new(|line: &GuestLine| {
        LINES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line.clone())
    })
}

/// The lines the attempts of `job` wrote, the host's own lines about them included.
pub fn lines_of(job: &str) -> Vec<GuestLine> {
    LINES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|l| l.job == job)
        .cloned()
        .collect()
}
