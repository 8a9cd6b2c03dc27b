//! Running one attempt of a handler directly, outside an instance: a context whose lease stays
//! alive, and the figures of repeated measurements.

use std::time::{Duration, Instant};

use baton_core::instance::{LeaseDeadline, RunContext, Signal};
use baton_core::lease::ClaimKind;

/// An attempt's context for `job`, with a lease that stays alive for an hour.
pub fn context(job: &str) -> RunContext {
    RunContext {
        job: job.to_owned(),
        slot: 1_767_225_600_000,
        attempt: 1,
        reason: ClaimKind::Scheduled,
        runner: "test-runner".to_owned(),
        fence: 7,
        signal: Signal::new(),
        deadline: LeaseDeadline::new(Instant::now() + Duration::from_secs(3600)),
        state: None,
    }
}

/// Min, median and max of some durations, in ms with a fraction.
pub fn summary(mut xs: Vec<Duration>) -> (f64, f64, f64) {
    xs.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(xs[0]), ms(xs[xs.len() / 2]), ms(xs[xs.len() - 1]))
}
